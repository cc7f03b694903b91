"""AllGather and AllGatherV (mpicoll/ops/allgather.py): golden cases and bench specs."""
from __future__ import annotations

import numpy as np

from .._dtypes import DTYPES
from ..ops.allgather import AllGatherOperation, AllGatherParam, AllGatherVOperation, AllGatherVParam
from ._golden import bench_data, counts_matrix, displs, rank_data, torch_view
from ._spec import BenchRun, BenchSpec, Case, CheckSpec


_SHAPES = {"even": (3, 2), "zero": (0,), "scalar": (), "large": (50_001,)}


def _ag_case(case, dtype, comm_domain, rank, n, seed, validate=True) -> Case:
    dt = DTYPES[dtype]
    inputs = [rank_data(seed, f"AllGather/{case}/{dtype}", r, _SHAPES[case], dt) for r in range(n)]
    op = AllGatherOperation(AllGatherParam(comm_domain=comm_domain, rank_size=n), validate=validate)
    return Case(op, (inputs[rank],), {}, np.stack(inputs))


def _agv_plan(case, n):
    """Per-rank send counts, and the receive displacements (in reverse rank order for "gapped" and
    "permuted", the latter with equal counts: the Allgather path with blocks moved into place)."""
    sc = counts_matrix("uniform" if case == "permuted" else case, n)[:, 0]
    if case in ("gapped", "permuted"):
        order = np.arange(n)[::-1]
        rd = np.empty(n, dtype=np.int64)
        rd[order] = np.concatenate(([0], np.cumsum(sc[order])[:-1]))
    else:
        rd = displs(sc, False)[0]
    return sc, rd


def _agv_case(case, dtype, comm_domain, rank, n, seed, validate=True) -> Case:
    dt = DTYPES[dtype]
    sc, rd = _agv_plan(case, n)
    inputs = [rank_data(seed, f"AllGatherV/{case}/{dtype}", r, int(sc[r]) + 2, dt) for r in range(n)]
    expected = np.empty(int(sc.sum()), dtype=dt.np)
    for i in range(n):
        expected[rd[i]:rd[i] + sc[i]] = inputs[i][:sc[i]]
    op = AllGatherVOperation(AllGatherVParam(comm_domain=comm_domain, rank_size=n), validate=validate)
    return Case(op, (inputs[rank], int(sc[rank]), sc, rd), {}, expected)


CHECKS = (
    CheckSpec("AllGather", lambda n: list(_SHAPES), _ag_case),
    CheckSpec("AllGatherV", lambda n: ["uniform", "permuted", "uneven", "zero", "spike", "skew", "gapped",
                                        "large"], _agv_case),
)


def _ag_bench(c, v=False) -> BenchRun:
    per = c.count // c.n
    x = bench_data(c.rank, per, c.dtype)
    out = np.empty((c.n, per), dtype=x.dtype)
    expected = np.stack([bench_data(r, per, c.dtype) for r in range(c.n)])
    comm, t = c.comm, c.dtype.mpi         # locals in the raw calls, as a user's loop has them
    if v:
        rc, rd = np.full(c.n, per), np.arange(c.n) * per
        op = AllGatherVOperation(AllGatherVParam(comm_domain=c.comm_domain, rank_size=c.n), validate=c.validate)
        flat = out.reshape(-1)
        args, kwargs, expected = (x, per, rc, rd), {"out": flat}, expected.reshape(-1)
        raw = lambda: comm.Allgatherv([x, t], [flat, (rc, rd), t])  # noqa: E731
        inplace = reset = None
    else:
        op = AllGatherOperation(AllGatherParam(comm_domain=c.comm_domain, rank_size=c.n), validate=c.validate)
        args, kwargs = (x,), {"out": out}
        raw = lambda: comm.Allgather([x, t], [out, t])  # noqa: E731
        work = np.empty_like(out)                                            # nccl-tests: send = recv + rank*count
        inplace, reset = ((work[c.rank],), {"out": work}), lambda: np.copyto(work[c.rank], x)

    def torch_call(dist, torch, group):
        t, o = torch_view(torch, x), torch_view(torch, out.reshape(-1))
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor   # (renamed in torch 2.13)
        return lambda: gather(o, t, group=group)
    return BenchRun(op, args, expected, kwargs=kwargs, raw=raw, inplace=inplace, reset=reset, torch_call=torch_call)


BENCHES = (
    BenchSpec("AllGather", _ag_bench, lambda n: (n - 1) / n if n else 0, count_multiple=lambda n: n),
    BenchSpec("AllGatherV", lambda c: _ag_bench(c, v=True), lambda n: (n - 1) / n if n else 0,
              count_multiple=lambda n: n),
)
