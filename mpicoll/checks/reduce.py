"""Reduce (mpicoll/ops/reduce.py): golden cases and bench spec."""
from __future__ import annotations

import numpy as np

from .._dtypes import DTYPES, reduce_op
from ..ops.reduce import ReduceOperation, ReduceParam
from ._golden import TORCH_OPS, bench_data, golden_reduce, rank_data, raw_reduce_type, reduce_case_names, torch_view
from ._spec import BenchRun, BenchSpec, Case, CheckSpec


# Root-only results: the golden is None on every other rank, where execute must return None.

_SHAPES = {"even": lambda n: (4 * n, 3), "uneven": lambda n: (37,), "zero": lambda n: (0,), "scalar": lambda n: (),
           "large": lambda n: (40_003,)}


def _cases(n: int) -> list[str]:
    return [f"{c}:root{r}" for c in reduce_case_names(["even", "uneven"]) for r in range(n)] + \
        ["zero:sum:root0", "scalar:max:root0", f"large:sum:root{n - 1}", "inplace:sum:root0"]


def _case(case, dtype, comm_domain, rank, n, seed, validate=True) -> Case:
    family, rname, root = case.split(":")
    root = int(root.removeprefix("root"))
    dt, rop = DTYPES[dtype], reduce_op(rname)
    shape = _SHAPES.get(family, lambda n: (1000,))(n)
    inputs = [rank_data(seed, f"Reduce/{case}/{dtype}", r, shape, dt) for r in range(n)]
    op = ReduceOperation(ReduceParam(comm_domain=comm_domain, rank_size=n, reduce_type=rname, rank_root=root),
                         validate=validate)
    x = inputs[rank].copy()
    expected = golden_reduce(inputs, dt, rop) if rank == root else None
    return Case(op, (x,), {"out": x} if family == "inplace" else {}, expected)


CHECKS = (
    CheckSpec("Reduce", _cases, _case),
)


def _bench(c) -> BenchRun:
    x = bench_data(c.rank, c.count, c.dtype)
    out = np.empty_like(x)
    root = c.root
    op = ReduceOperation(ReduceParam(comm_domain=c.comm_domain, rank_size=c.n, reduce_type=c.reduce.name,
                                     rank_root=root), validate=c.validate)
    raw_t = raw_reduce_type(c.dtype)
    comm, mop = c.comm, c.reduce.mpi
    recv = out if c.rank == root else None
    raw = None if raw_t is None else (lambda: comm.Reduce([x, raw_t], None if recv is None else [recv, raw_t], mop,
                                                          root))
    expected = golden_reduce([bench_data(r, c.count, c.dtype) for r in range(c.n)], c.dtype, c.reduce) \
        if c.rank == root else None

    def torch_call(dist, torch, group):
        work = x.copy()
        t, rop = torch_view(torch, work), getattr(dist.ReduceOp, TORCH_OPS[c.reduce.name])
        return lambda: dist.reduce(t, group_dst=root, op=rop, group=group)
    return BenchRun(op, (x,), expected, kwargs={"out": out}, raw=raw, torch_call=torch_call)


BENCHES = (
    BenchSpec("Reduce", _bench, lambda n: 1.0, uses_reduce=True, uses_root=True),
)
