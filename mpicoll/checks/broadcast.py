"""Broadcast (mpicoll/ops/broadcast.py): golden cases and bench spec."""
from __future__ import annotations

import numpy as np

from .._dtypes import DTYPES
from ..ops.broadcast import BroadcastOperation, BroadcastParam
from ._golden import bench_data, rank_data, torch_view
from ._spec import BenchRun, BenchSpec, Case, CheckSpec


_SHAPES = {"small": (4, 3), "zero": (0,), "scalar": (), "large": (300_001,)}


def _cases(n):
    return [f"{s}:root{r}" for s in ("small",) for r in range(n)] + ["zero:root0", "scalar:root0",
                                                                     f"large:root{n - 1}"]


def _case(case, dtype, comm_domain, rank, n, seed, validate=True) -> Case:
    family, root = case.split(":")
    root = int(root.removeprefix("root"))
    dt = DTYPES[dtype]
    inputs = [rank_data(seed, f"Broadcast/{case}/{dtype}", r, _SHAPES[family], dt) for r in range(n)]
    op = BroadcastOperation(BroadcastParam(comm_domain=comm_domain, rank_size=n, rank_root=root), validate=validate)
    return Case(op, (inputs[rank].copy(),), {}, inputs[root])


CHECKS = (
    CheckSpec("Broadcast", _cases, _case),
)


def _bench(c) -> BenchRun:
    x = bench_data(c.rank, c.count, c.dtype)
    work = x.copy()
    op = BroadcastOperation(BroadcastParam(comm_domain=c.comm_domain, rank_size=c.n, rank_root=c.root),
                            validate=c.validate)
    comm, t, root = c.comm, c.dtype.mpi, c.root    # locals in the raw call, as a user's loop has them

    def torch_call(dist, torch, group):
        t = torch_view(torch, work)
        return lambda: dist.broadcast(t, group=group, group_src=c.root)
    return BenchRun(op, None, bench_data(c.root, c.count, c.dtype), inplace=((work,), {}),
                    reset=lambda: np.copyto(work, x), raw=lambda: comm.Bcast([work, t], root), torch_call=torch_call)


BENCHES = (
    BenchSpec("Broadcast", _bench, lambda n: 1.0, uses_root=True),
)
