"""Scatter: the root's rank-order blocks of dim 0, one to each rank. (Every dtype x case family
runs against the golden in test_ops.py; the generic error, plan and layout tests pick it up from
the registry.)"""
from __future__ import annotations

import numpy as np
import pytest

import mpicoll

from _mpi import RANK, SIZE, on, raises_everywhere

mpi1 = pytest.mark.mpi(min_size=1)


@mpi1
def test_documented_example():
    op = mpicoll.ScatterOperation(mpicoll.ScatterParam(rank_root=0))
    x = np.arange(2 * SIZE).reshape(SIZE, 2) if RANK == 0 else None
    got = op.execute(x) if RANK == 0 else op.execute(None, out=np.empty((1, 2), np.int64))
    assert got.tolist() == [[2 * RANK, 2 * RANK + 1]]


@mpi1
def test_in_place_on_the_root():
    """``out`` = the root's own block of x: it stays where it is (MPI_IN_PLACE)."""
    root = SIZE - 1
    op = mpicoll.ScatterOperation(mpicoll.ScatterParam(rank_root=root))
    if RANK == root:
        x = np.arange(3 * SIZE, dtype=np.float32)
        got = op.execute(x, out=x[3 * RANK:3 * RANK + 3])
        assert np.shares_memory(got, x) and got.tolist() == [3 * RANK, 3 * RANK + 1, 3 * RANK + 2]
    else:
        assert op.execute(None, out=np.empty(3, np.float32)).tolist() == [3 * RANK, 3 * RANK + 1, 3 * RANK + 2]


@mpi1
def test_out_is_required_off_the_root_and_agreed():
    op = mpicoll.ScatterOperation(mpicoll.ScatterParam(rank_root=0))
    x = np.ones(SIZE) if RANK == 0 else None
    if SIZE == 1:
        pytest.skip("every rank is the root")
    raises_everywhere(lambda: op.execute(x), mpicoll.CollectiveArgumentError,
                      f"Scatter: out=None {on(range(1, SIZE))}: required off the root")


@pytest.mark.mpi(min_size=2)
def test_a_block_shape_that_differs_from_the_root_s_is_agreed():
    op = mpicoll.ScatterOperation(mpicoll.ScatterParam(rank_root=0))
    x = np.ones((2 * SIZE, 3)) if RANK == 0 else None
    out = np.empty((2, 4 if RANK == SIZE - 1 else 3))
    raises_everywhere(lambda: op.execute(x, out=out if RANK else None), mpicoll.CollectiveMismatchError,
                      "Scatter: block shape (out.shape; x.shape[0] // rank_size on the root) differs across ranks", f"(2, 4) on rank {SIZE - 1}")


@mpi1
def test_plan_rereads_the_root_s_input():
    op = mpicoll.ScatterOperation()
    x = np.zeros((SIZE, 2), np.int32) if RANK == 0 else None
    out = np.empty((1, 2), np.int32)
    with op.prepare(x, out=out) as plan:
        for k in range(3):
            if RANK == 0:
                x[:] = np.arange(SIZE)[:, None] * 10 + k
            assert plan.run().tolist() == [[10 * RANK + k] * 2]
