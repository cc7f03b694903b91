"""AllReduce (mpicoll/ops/allreduce.py): golden cases and bench spec."""
from __future__ import annotations

import numpy as np

from .. import _env
from .._dtypes import DTYPES, reduce_op
from ..ops.allreduce import AllReduceOperation, AllReduceParam
from ._golden import TORCH_OPS, bench_data, golden_reduce, rank_data, raw_reduce_type, reduce_case_names, torch_view
from ._spec import BenchRun, BenchSpec, Case, CheckSpec


_SHAPES = {"even": lambda n: (8 * n, 3), "uneven": lambda n: (37,), "zero": lambda n: (0, 4),
           "scalar": lambda n: (), "large": lambda n: (40_003,), "large-even": lambda n: (n * 20_480,)}


def _cases(n: int) -> list[str]:
    return reduce_case_names(["even", "uneven", "large", "large-even"]) + ["zero:sum", "scalar:max", "random:sum",
                                                                             "inplace:sum"]


def _case(case, dtype, comm_domain, rank, n, seed, validate=True) -> Case:
    family, rname = case.split(":")
    dt, rop = DTYPES[dtype], reduce_op(rname)
    kind = "random" if family == "random" and dt.np.kind == "f" else "int"
    shape = _SHAPES.get(family, lambda n: (1000,))(n)
    inputs = [rank_data(seed, f"AllReduce/{case}/{dtype}", r, shape, dt, kind) for r in range(n)]
    op = AllReduceOperation(AllReduceParam(comm_domain=comm_domain, rank_size=n, reduce_type=rname),
                            validate=validate)
    x = inputs[rank].copy()
    # (bit for bit: integers are exact; floats reduce in the golden's tree order with MPICOLL_EXACT on)
    return Case(op, (x,), {"out": x} if family == "inplace" else {}, golden_reduce(inputs, dt, rop),
                kind == "int" or _env.value("MPICOLL_EXACT"))


CHECKS = (
    CheckSpec("AllReduce", _cases, _case),
)


def _bench(c) -> BenchRun:
    x = bench_data(c.rank, c.count, c.dtype)
    out, work = np.empty_like(x), x.copy()
    op = AllReduceOperation(AllReduceParam(comm_domain=c.comm_domain, rank_size=c.n, reduce_type=c.reduce.name),
                            validate=c.validate)
    raw_t = raw_reduce_type(c.dtype)
    comm, mop = c.comm, c.reduce.mpi      # locals in the raw call, as a user's loop has them
    raw = None if raw_t is None else (lambda: comm.Allreduce([x, raw_t], [out, raw_t], mop))

    def torch_call(dist, torch, group):
        t, rop = torch_view(torch, work), getattr(dist.ReduceOp, TORCH_OPS[c.reduce.name])
        return lambda: dist.all_reduce(t, rop, group=group)
    return BenchRun(op, (x,), golden_reduce([bench_data(r, c.count, c.dtype) for r in range(c.n)],
                                               c.dtype, c.reduce),
                    kwargs={"out": out}, raw=raw, inplace=((work,), {"out": work}), reset=lambda: np.copyto(work, x),
                    torch_call=torch_call)


BENCHES = (
    BenchSpec("AllReduce", _bench, lambda n: 2 * (n - 1) / n if n else 0, uses_reduce=True),
)
