"""Scatter (mpicoll/ops/scatter.py): golden cases and bench spec."""
from __future__ import annotations

import numpy as np

from .._dtypes import DTYPES
from ..ops.scatter import ScatterOperation, ScatterParam
from ._golden import bench_data, rank_data, torch_view
from ._spec import BenchRun, BenchSpec, Case, CheckSpec


# Only the root's input matters: the others pass None and an output of the block's shape.

_SHAPES = {"even": lambda n: (2 * n, 3), "zero": lambda n: (0, 2), "large": lambda n: (25_000 * n,),
           "inplace": lambda n: (3 * n,)}


def _case(case, dtype, comm_domain, rank, n, seed, validate=True) -> Case:
    family, root = case.split(":")
    root = int(root.removeprefix("root"))
    dt = DTYPES[dtype]
    x = rank_data(seed, f"Scatter/{case}/{dtype}", root, _SHAPES[family](n), dt)
    k = x.shape[0] // n
    expected = x[rank * k:(rank + 1) * k].copy()
    op = ScatterOperation(ScatterParam(comm_domain=comm_domain, rank_size=n, rank_root=root), validate=validate)
    if rank != root:
        return Case(op, (None,), {"out": np.empty_like(expected)}, expected)
    return Case(op, (x,), {"out": x[rank * k:(rank + 1) * k]} if family == "inplace" else {}, expected)


CHECKS = (
    CheckSpec("Scatter", lambda n: [f"even:root{r}" for r in range(n)] + ["zero:root0", f"large:root{n - 1}",
                                                                          "inplace:root0"], _case),
)


def _bench(c) -> BenchRun:
    per = c.count // c.n
    root, comm, t = c.root, c.comm, c.dtype.mpi
    x = bench_data(root, c.count, c.dtype) if c.rank == root else None
    out = np.empty(per, dtype=c.dtype.np)
    op = ScatterOperation(ScatterParam(comm_domain=c.comm_domain, rank_size=c.n, rank_root=root), validate=c.validate)
    send = None if x is None else [x, t]
    expected = bench_data(root, c.count, c.dtype)[c.rank * per:(c.rank + 1) * per]

    def torch_call(dist, torch, group):
        o = torch_view(torch, out)
        parts = None if x is None else [torch_view(torch, p) for p in np.split(x, c.n)]
        return lambda: dist.scatter(o, parts, group=group, group_src=root)
    return BenchRun(op, (x,), expected, kwargs={"out": out}, raw=lambda: comm.Scatter(send, [out, t], root),
                    torch_call=torch_call)


BENCHES = (
    BenchSpec("Scatter", _bench, lambda n: (n - 1) / n if n else 0, count_multiple=lambda n: n,
              uses_root=True),
)
