"""Reduce: the reduction on the root only (None on the other ranks); 16-bit floats accumulated in
float32; in place on the root. (Every dtype x case family runs against the golden in test_ops.py.)"""
from __future__ import annotations

import numpy as np
import pytest

import mpicoll
from mpicoll._dtypes import DTYPES, reduce_op
from mpicoll import _env
from mpicoll.checks._golden import SEED, count_wrong, golden_reduce, rank_data

from _mpi import HALF_FLOATS, RANK, SIZE, reduce_ops

mpi1 = pytest.mark.mpi(min_size=1)


@mpi1
def test_documented_example():
    x = np.array([RANK], np.float32)
    got = mpicoll.ReduceOperation(mpicoll.ReduceParam(rank_root=0)).execute(x)
    assert got.tolist() == [sum(range(SIZE))] if RANK == 0 else got is None


@mpi1
@pytest.mark.parametrize("root", ["first", "last"])
def test_out_and_in_place_on_the_root_ignored_elsewhere(root):
    root = 0 if root == "first" else SIZE - 1
    op = mpicoll.ReduceOperation(mpicoll.ReduceParam(rank_root=root, reduce_type="max"))
    x = np.array([RANK, -RANK], np.int32)
    out = np.full(2, 7, np.int32)
    got = op.execute(x, out=out)
    assert (got is out and out.tolist() == [SIZE - 1, 0]) if RANK == root else (got is None and out.tolist() == [7, 7])
    got = op.execute(x, out=x)                             # in place on the root
    assert (got is x and x.tolist() == [SIZE - 1, 0]) if RANK == root else (got is None and x.tolist() == [RANK, -RANK])


@mpi1
@pytest.mark.parametrize("dtype,rname", [(d, r) for d in HALF_FLOATS for r in reduce_ops(d)])
def test_half_reductions_equal_the_float32_golden(dtype, rname):
    """Random data: the float32-accumulated (rank order), once-rounded result bit for bit."""
    dt, rop = DTYPES[dtype], reduce_op(rname)
    for size in (1, 1000, 40_003):
        xs = [rank_data(SEED, f"reduce-ulp/{dtype}/{rname}/{size}", r, size, dt, "random") for r in range(SIZE)]
        got = mpicoll.ReduceOperation(mpicoll.ReduceParam(reduce_type=rname)).execute(xs[RANK])
        if RANK == 0:
            assert count_wrong(got, golden_reduce(xs, dt, rop), exact=_env.value("MPICOLL_EXACT")) == 0, size
        else:
            assert got is None


@mpi1
def test_plan_returns_none_off_the_root_and_re_reads():
    op = mpicoll.ReduceOperation(mpicoll.ReduceParam(rank_root=SIZE - 1))
    x = np.ones(3, np.float16)
    with op.prepare(x) as plan:
        for k in range(3):
            x[:] = k + RANK
            got = plan.start().wait()
            if RANK == SIZE - 1:
                assert got.tolist() == [k * SIZE + sum(range(SIZE))] * 3
            else:
                assert got is None
