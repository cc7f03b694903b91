"""Gather: every rank's data stacked on the root only (None on the other ranks). (Every dtype x case
family runs against the golden in test_ops.py.)"""
from __future__ import annotations

import numpy as np
import pytest

import mpicoll

from _mpi import RANK, SIZE

mpi1 = pytest.mark.mpi(min_size=1)


@mpi1
def test_documented_example():
    got = mpicoll.GatherOperation(mpicoll.GatherParam(rank_root=0)).execute(np.array([RANK], np.int32))
    assert got.tolist() == [[r] for r in range(SIZE)] if RANK == 0 else got is None


@mpi1
@pytest.mark.parametrize("root", ["first", "last"])
def test_out_on_the_root_ignored_elsewhere(root):
    root = 0 if root == "first" else SIZE - 1
    op = mpicoll.GatherOperation(mpicoll.GatherParam(rank_root=root))
    x = np.full((2, 1), RANK, np.int64)
    out = np.zeros((SIZE, 2, 1), np.int64)
    got = op.execute(x, out=out)
    if RANK == root:
        assert got is out and out[:, :, 0].tolist() == [[r, r] for r in range(SIZE)]
    else:
        assert got is None and not out.any()


@mpi1
def test_out_of_the_wrong_shape_on_the_root_is_agreed():
    from _mpi import raises_everywhere
    op = mpicoll.GatherOperation(mpicoll.GatherParam(rank_root=SIZE - 1))
    raises_everywhere(lambda: op.execute(np.ones(2), out=np.empty((SIZE, 3))), mpicoll.CollectiveArgumentError,
                      f"Gather: out='float64[{SIZE}, 3]' on rank {SIZE - 1}", f"must be float64[{SIZE}, 2]")


@mpi1
def test_plan():
    op = mpicoll.GatherOperation()
    x = np.zeros(2, np.float32)
    with op.prepare(x) as plan:
        for k in range(3):
            x[:] = k * 10 + RANK
            got = plan.run()
            assert (got[:, 0].tolist() == [k * 10 + r for r in range(SIZE)]) if RANK == 0 else got is None
