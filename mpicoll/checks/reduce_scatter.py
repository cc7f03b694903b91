"""ReduceScatter and ReduceScatterV (mpicoll/ops/reduce_scatter.py): golden cases and bench specs."""
from __future__ import annotations

import numpy as np

from .._dtypes import DTYPES, reduce_op
from ..ops.reduce_scatter import (ReduceScatterOperation, ReduceScatterParam, ReduceScatterVOperation,
                                 ReduceScatterVParam)
from ._golden import (TORCH_OPS, bench_data, counts_matrix, displs, golden_reduce, rank_data, raw_reduce_type,
                      reduce_case_names, torch_view)
from ._spec import BenchRun, BenchSpec, Case, CheckSpec


_RS_SHAPES = {"even": lambda n: (4 * n, 3), "zero": lambda n: (0, 3), "large": lambda n: (20_480 * n,)}


def _rs_case(case, dtype, comm_domain, rank, n, seed, validate=True) -> Case:
    family, rname = case.split(":")
    dt, rop = DTYPES[dtype], reduce_op(rname)
    inputs = [rank_data(seed, f"ReduceScatter/{case}/{dtype}", r, _RS_SHAPES[family](n), dt) for r in range(n)]
    full = golden_reduce(inputs, dt, rop)
    block = full.shape[0] // n
    op = ReduceScatterOperation(ReduceScatterParam(comm_domain=comm_domain, rank_size=n, reduce_type=rname),
                                validate=validate)
    return Case(op, (inputs[rank],), {}, full[rank * block:(rank + 1) * block])


def _rsv_case(case, dtype, comm_domain, rank, n, seed, validate=True) -> Case:
    family, rname = case.split(":")
    dt, rop = DTYPES[dtype], reduce_op(rname)
    sc = counts_matrix(family, n)[0]             # the same block sizes on every rank
    blocks, inputs, layouts = [], [], []
    for r in range(n):
        sd, length = displs(sc, gapped=(family == "gapped" and r % 2 == 0))
        x = rank_data(seed, f"ReduceScatterV/{case}/{dtype}", r, length, dt)
        inputs.append(x)
        layouts.append(sd)
        blocks.append(x[sd[rank]:sd[rank] + sc[rank]])
    op = ReduceScatterVOperation(ReduceScatterVParam(comm_domain=comm_domain, rank_size=n, reduce_type=rname),
                                 validate=validate)
    return Case(op, (inputs[rank], sc, layouts[rank], int(sc[rank])), {}, golden_reduce(blocks, dt, rop))


CHECKS = (
    CheckSpec("ReduceScatter", lambda n: reduce_case_names(["even", "large"]) + ["zero:sum"], _rs_case),
    CheckSpec("ReduceScatterV", lambda n: reduce_case_names(["uneven", "gapped"])
              + ["uniform:sum", "zero:sum", "spike:max", "skew:sum", "large:sum"], _rsv_case),
)


def _rs_bench(c, v=False) -> BenchRun:
    per = c.count // c.n
    x = bench_data(c.rank, c.count, c.dtype)
    out = np.empty(per, dtype=x.dtype)
    full = golden_reduce([bench_data(r, c.count, c.dtype) for r in range(c.n)], c.dtype, c.reduce)
    raw_t = raw_reduce_type(c.dtype)
    param = dict(comm_domain=c.comm_domain, rank_size=c.n, reduce_type=c.reduce.name)
    comm, mop = c.comm, c.reduce.mpi      # locals in the raw calls, as a user's loop has them
    if v:
        sc, sd = np.full(c.n, per), np.arange(c.n) * per
        op = ReduceScatterVOperation(ReduceScatterVParam(**param), validate=c.validate)
        args = (x, sc, sd, per)
        raw = None if raw_t is None else (lambda: comm.Reduce_scatter([x, raw_t], [out, raw_t], sc, mop))
        inplace = reset = None
    else:
        op = ReduceScatterOperation(ReduceScatterParam(**param), validate=c.validate)
        args = (x,)
        raw = None if raw_t is None else (lambda: comm.Reduce_scatter_block([x, raw_t], [out, raw_t], mop))
        work = x.copy()                                                      # nccl-tests: recv = send + rank*count
        inplace = ((work,), {"out": work[c.rank * per:(c.rank + 1) * per]})
        reset = lambda: np.copyto(work, x)  # noqa: E731

    def torch_call(dist, torch, group):
        t, o, rop = torch_view(torch, x), torch_view(torch, out), getattr(dist.ReduceOp, TORCH_OPS[c.reduce.name])
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor   # (renamed in torch 2.13)
        return lambda: scatter(o, t, rop, group=group)
    return BenchRun(op, args, full[c.rank * per:(c.rank + 1) * per], kwargs={"out": out}, raw=raw,
                    inplace=inplace, reset=reset, torch_call=torch_call)


BENCHES = (
    BenchSpec("ReduceScatter", _rs_bench, lambda n: (n - 1) / n if n else 0, count_multiple=lambda n: n,
              uses_reduce=True),
    BenchSpec("ReduceScatterV", lambda c: _rs_bench(c, v=True), lambda n: (n - 1) / n if n else 0,
              count_multiple=lambda n: n, uses_reduce=True),
)
