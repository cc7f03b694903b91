"""Gather (mpicoll/ops/gather.py): golden cases and bench spec."""
from __future__ import annotations

import numpy as np

from .._dtypes import DTYPES
from ..ops.gather import GatherOperation, GatherParam
from ._golden import bench_data, rank_data
from ._spec import BenchRun, BenchSpec, Case, CheckSpec


# Root-only results: the golden is None on every other rank, where execute must return None.

_SHAPES = {"even": (3, 2), "zero": (0,), "scalar": (), "large": (50_001,)}


def _case(case, dtype, comm_domain, rank, n, seed, validate=True) -> Case:
    family, root = case.split(":")
    root = int(root.removeprefix("root"))
    dt = DTYPES[dtype]
    inputs = [rank_data(seed, f"Gather/{case}/{dtype}", r, _SHAPES[family], dt) for r in range(n)]
    op = GatherOperation(GatherParam(comm_domain=comm_domain, rank_size=n, rank_root=root), validate=validate)
    return Case(op, (inputs[rank],), {}, np.stack(inputs) if rank == root else None)


CHECKS = (
    CheckSpec("Gather", lambda n: [f"even:root{r}" for r in range(n)] + ["zero:root0", "scalar:root0",
                                                                          f"large:root{n - 1}"], _case),
)


def _bench(c) -> BenchRun:
    per = c.count // c.n
    x = bench_data(c.rank, per, c.dtype)
    out = np.empty((c.n, per), dtype=x.dtype)
    root, comm, t = c.root, c.comm, c.dtype.mpi
    op = GatherOperation(GatherParam(comm_domain=c.comm_domain, rank_size=c.n, rank_root=root), validate=c.validate)
    recv = [out, t] if c.rank == root else None
    expected = np.stack([bench_data(r, per, c.dtype) for r in range(c.n)]) if c.rank == root else None
    return BenchRun(op, (x,), expected, kwargs={"out": out}, raw=lambda: comm.Gather([x, t], recv, root))


BENCHES = (
    BenchSpec("Gather", _bench, lambda n: (n - 1) / n if n else 0, count_multiple=lambda n: n,
              uses_root=True),
)
