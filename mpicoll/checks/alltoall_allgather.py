"""AllToAllAllGather (mpicoll/ops/alltoall_allgather.py): golden cases and bench spec."""
from __future__ import annotations

import numpy as np

from .._dtypes import DTYPES
from ..ops.alltoall_allgather import AllToAllAllGatherOperation, AllToAllAllGatherParam
from ._golden import bench_data, rank_data
from ._spec import BenchRun, BenchSpec, Case, CheckSpec


def mesh_shape(n: int) -> tuple[int, int]:
    """``(ep, tp)`` for ``n`` ranks in the checks and the bench: tp 2 when n is even, else 1."""
    tp = 2 if n % 2 == 0 else 1
    return n // tp, tp


def _param(comm_domain: str, rank: int, n: int, validate: bool) -> AllToAllAllGatherOperation:
    """The operator over ``comm_domain`` (n ranks, this one ``rank``), tp-contiguous: rank = s * tp + t."""
    ep, tp = mesh_shape(n)
    s, t = divmod(rank, tp)
    base = f"a2aag.{comm_domain or 'world'}"
    return AllToAllAllGatherOperation(AllToAllAllGatherParam(
        comm_domain=comm_domain, rank_size=n, group_ep=f"{base}.ep{t}", group_tp=f"{base}.tp{s}", ep_world_size=ep,
        tp_world_size=tp), validate=validate)


def golden(inputs: list[np.ndarray], rank: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(z, y)`` of ``rank`` from every rank's input."""
    ep, tp = mesh_shape(n)

    def z_of(r):
        s, t = divmod(r, tp)
        return np.concatenate([np.split(inputs[s2 * tp + t], ep)[s] for s2 in range(ep)])
    s = rank // tp
    return z_of(rank), np.stack([z_of(s * tp + t2) for t2 in range(tp)])


def _case(case, dtype, comm_domain, rank, n, seed, validate=True) -> Case:
    ep, _ = mesh_shape(n)
    shape = {"even": (2 * ep, 3), "zero": (0, 2), "large": (8192 * ep,)}[case]
    inputs = [rank_data(seed, f"AllToAllAllGather/{case}/{dtype}", r, shape, DTYPES[dtype]) for r in range(n)]
    return Case(_param(comm_domain, rank, n, validate), (inputs[rank],), {}, golden(inputs, rank, n))


CHECKS = (
    CheckSpec("AllToAllAllGather", lambda n: ["even", "zero", "large"], _case),
)


def _bench(c) -> BenchRun:
    ep, tp = mesh_shape(c.n)
    x = bench_data(c.rank, c.count, c.dtype)
    z, y = np.empty_like(x), np.empty((tp, c.count), dtype=x.dtype)
    s, t = divmod(c.rank, tp)
    raw_ep, raw_tp = c.comm.Split(t, c.rank), c.comm.Split(s, c.rank)     # (collective: every rank sets up)
    m = c.dtype.mpi

    def raw():
        raw_ep.Alltoall([x, m], [z, m])
        raw_tp.Allgather([z, m], [y, m])
    return BenchRun(_param(c.comm_domain, c.rank, c.n, c.validate), (x,),
                    golden([bench_data(r, c.count, c.dtype) for r in range(c.n)], c.rank, c.n),
                    kwargs={"out": (z, y)}, raw=raw, close=lambda: (raw_ep.Free(), raw_tp.Free()))


def _bus_factor(n: int) -> float:
    """Bytes each rank moves per byte of x: (ep-1)/ep in the AllToAll, tp-1 in the AllGather."""
    ep, tp = mesh_shape(n)
    return (ep - 1) / ep + (tp - 1) if n else 0


BENCHES = (
    BenchSpec("AllToAllAllGather", _bench, _bus_factor, count_multiple=lambda n: mesh_shape(n)[0]),
)
