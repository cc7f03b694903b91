"""The documented examples (shared/seeds), with their literal outputs."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import mpicoll

from _mpi import RANK, SIZE

SEED_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.float32, np.float16, ml_dtypes.bfloat16]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dtype", SEED_DTYPES)
def test_alltoallvv2_two_rank_example(dtype):
    if SIZE != 2:
        pytest.skip("the documented example is for exactly 2 ranks")
    x = [np.array([[0, 1, 2, 3], [4, 5, 6, 7]]), np.array([[0, 1, 2], [3, 4, 6]])][RANK].astype(dtype)
    send_counts, sdispls, recv_counts, rdispls = [([2, 4], [0, 2], [2, 2], [0, 2]),
                                                  ([2, 1], [0, 2], [4, 1], [0, 4])][RANK]
    infer = np.array([3] * sum(recv_counts))
    out = mpicoll.AllToAllVV2Operation(mpicoll.AllToAllVV2Param.from_json(
        f'{{"rank": {RANK}, "rankSize": 2, "rankRoot": 0, "backend": "hccl"}}')).execute(
        x, np.array(send_counts, np.int64), np.array(sdispls, np.int64), np.array(recv_counts, np.int64),
        np.array(rdispls, np.int64), infer)
    golden = [np.array([[0, 1, 0, 1]]), np.array([[2, 3, 4, 5, 2]])][RANK].astype(dtype)
    assert out.dtype == np.dtype(dtype) and out.shape == golden.shape
    assert np.array_equal(out, golden)


@pytest.mark.mpi(min_size=2)
def test_alltoallv_param_form_of_the_example():
    if SIZE != 2:
        pytest.skip("the documented example is for exactly 2 ranks")
    x = [np.array([[0, 1, 2, 3], [4, 5, 6, 7]]), np.array([[0, 1, 2], [3, 4, 6]])][RANK].astype(np.float16)
    plan = [{"sendCounts": [2, 4], "sdispls": [0, 2], "recvCounts": [2, 2], "rdispls": [0, 2]},
            {"sendCounts": [2, 1], "sdispls": [0, 2], "recvCounts": [4, 1], "rdispls": [0, 4]}][RANK]
    out = mpicoll.AllToAllVOperation(mpicoll.AllToAllVParam.from_dict({"rank": RANK, "rankSize": 2, **plan})).execute(x)
    assert out.tolist() == [[[0, 1, 0, 1]], [[2, 3, 4, 5, 2]]][RANK]


@pytest.mark.mpi(min_size=1)
def test_mindspore_examples_at_any_rank_count():
    """ATB's documented example (4 cards: AllReduce -> 6, AllGather -> [0,1,2,3], ReduceScatter -> 4*rank, Broadcast -> 0)."""
    x = np.array([[RANK]], dtype=np.float32)
    assert mpicoll.AllReduceOperation().execute(x).tolist() == [[SIZE * (SIZE - 1) / 2]]
    assert mpicoll.AllGatherOperation().execute(x).reshape(SIZE, 1).tolist() == [[float(r)] for r in range(SIZE)]
    rs = mpicoll.ReduceScatterOperation().execute(np.arange(SIZE, dtype=np.float32).reshape(SIZE, 1))
    assert rs.tolist() == [[float(SIZE * RANK)]]
    b = np.array([[RANK]], dtype=np.int32)
    assert mpicoll.BroadcastOperation(mpicoll.BroadcastParam(rank_root=0)).execute(b) is b
    assert b.tolist() == [[0]]


@pytest.mark.mpi(min_size=4)
def test_mindspore_examples_literal_four_ranks():
    if SIZE != 4:
        pytest.skip("literal outputs are for 4 ranks")
    x = np.array([[RANK]], dtype=np.float32)
    assert mpicoll.AllReduceOperation().execute(x).tolist() == [[6.0]]
    assert mpicoll.AllGatherOperation().execute(x).tolist() == [[[0.0]], [[1.0]], [[2.0]], [[3.0]]]
    rs = mpicoll.ReduceScatterOperation().execute(np.array([[0], [1], [2], [3]], dtype=np.float32))
    assert rs.tolist() == [[[0.0]], [[4.0]], [[8.0]], [[12.0]]][RANK]
