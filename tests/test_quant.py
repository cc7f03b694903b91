"""int8 quantized all-reduce: helpers, errors on every rank, and the documented example.
(The operator x case families run against the golden in tests/test_ops.py through the registry.)"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import mpicoll
from mpicoll import CollectiveArgumentError, QuantAllReduceOperation, QuantAllReduceParam, dequantize, quantize
from mpicoll.quant import bytes_per_rank, plan_chunks

from _mpi import RANK, SIZE, raises_everywhere

mpi1 = pytest.mark.mpi(min_size=1)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64])
@pytest.mark.parametrize("block", [1, 7, 32, 4096])
def test_quantize_round_trip_within_half_a_step(dtype, block):
    x = np.random.default_rng(block).standard_normal((5, 99)).astype(dtype)
    q, s = quantize(x, block)
    assert q.dtype == np.int8 and q.shape == x.shape and s.dtype == np.float32 and s.size == -(-x.size // block)
    assert np.abs(q).max() <= 127
    back = dequantize(q, s, block, np.float32)
    step = np.repeat(s, block)[:x.size].reshape(x.shape)
    assert np.all(np.abs(back - x.astype(np.float32)) <= step / 2 * 1.0001 + 1e-7)


def test_all_zero_block_has_scale_zero():
    x = np.zeros(10, np.float32)
    x[5:] = [1, -2, 3, 0, 4]
    q, s = quantize(x, 5)
    assert s[0] == 0 and not q[:5].any() and s[1] == np.float32(4 / 127)
    assert dequantize(q, s, 5, np.float32)[:5].tolist() == [0] * 5


@pytest.mark.parametrize("call,fragment", [
    (lambda: quantize(np.arange(4), 2), "float dtype"),
    (lambda: quantize(np.array([1.0, np.nan]), 2), "finite"),
    (lambda: quantize(np.ones(4), 0), "block_size=0"),
    (lambda: quantize(np.ones(4), -3), "block_size=-3"),
    (lambda: dequantize(np.ones(4), 1.0), "int8"),
    (lambda: dequantize(np.ones(4, np.int8), np.ones(3), 2), "must hold 2"),
])
def test_helper_errors(call, fragment):
    with pytest.raises(CollectiveArgumentError, match=fragment.replace("(", r"\(")):
        call()


def test_chunks_follow_block_boundaries():
    counts, displs, bcounts, bdispls = plan_chunks(1000, 3, 128)
    assert counts.tolist() == [384, 384, 232] and displs.tolist() == [0, 384, 768]
    assert bcounts.tolist() == [3, 3, 2] and bdispls.tolist() == [0, 3, 6]
    assert plan_chunks(10, 4, 0)[0].tolist() == [3, 3, 2, 2]


def test_bytes_per_rank_half_of_fp16_reduce_phase():
    n, size = 4, 1 << 20
    fp16_allreduce = 2 * size * 2 * (n - 1) / n          # reduce-scatter + all-gather, 2 bytes each
    assert bytes_per_rank(size, n, 0) == int(size * 3 * (n - 1) / n)
    assert bytes_per_rank(size, n, 0) / fp16_allreduce == pytest.approx(0.75)


@mpi1
def test_documented_example():
    x = np.full(4, RANK + 1, np.int8)
    got = QuantAllReduceOperation(QuantAllReduceParam()).execute(x, 0.5)
    assert got.dtype == np.float16 and got.tolist() == [0.5 * SIZE * (SIZE + 1) / 2] * 4


@mpi1
@pytest.mark.parametrize("gather", ["float16", "int8"])
def test_per_block_scales_and_shape(gather):
    x = (np.arange(6 * 50).reshape(6, 50) % 200 - 100).astype(np.int8)
    scales = np.full(-(-x.size // 64), 0.01 * (RANK + 1), np.float32)
    got = QuantAllReduceOperation(QuantAllReduceParam(block_size=64, allgather_dtype=gather)).execute(x, scales)
    exact = x.astype(np.float32) * 0.01 * SIZE * (SIZE + 1) / 2
    assert got.shape == x.shape and got.dtype == np.float16
    tol = 2e-3 if gather == "float16" else np.abs(exact).max() / 127
    assert np.abs(got.astype(np.float32) - exact).max() <= tol * max(1, np.abs(exact).max()) + tol


@mpi1
@pytest.mark.parametrize("case,fragment", [
    ("float_x", "must be int8"), ("scale_shape", "must hold"), ("nan_scale", "finite"), ("neg_scale", ">= 0")])
def test_bad_input_on_last_rank(case, fragment):
    x, scale = np.ones(64, np.int8), np.full(2, 0.1, np.float32)
    if RANK == SIZE - 1:
        if case == "float_x":
            x = np.ones(64, np.float16)
        elif case == "scale_shape":
            scale = np.ones(3, np.float32)
        elif case == "nan_scale":
            scale[1] = np.nan
        else:
            scale[0] = -1
    op = QuantAllReduceOperation(QuantAllReduceParam(block_size=32))
    raises_everywhere(lambda: op.execute(x, scale), CollectiveArgumentError, "QuantAllReduce", fragment,
                      f"rank {SIZE - 1}")


@mpi1
@pytest.mark.parametrize("field,value", [("block_size", -1), ("allgather_dtype", "bfloat16")])
def test_bad_param(field, value):
    op = QuantAllReduceOperation(QuantAllReduceParam(**{field: value}))
    raises_everywhere(lambda: op.execute(np.ones(4, np.int8), 1.0), CollectiveArgumentError, field)


def test_json_keys():
    p = QuantAllReduceParam.from_json('{"rankSize": 2, "blockSize": 128, "allgatherDtype": "int8"}')
    assert (p.block_size, p.allgather_dtype) == (128, "int8")
    assert mpicoll.OPERATIONS["QuantAllReduce"] is QuantAllReduceOperation


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("field,value", [("block_size", 64), ("allgather_dtype", "int8")])
def test_param_mismatch_across_ranks_is_agreed(field, value):
    kwargs = {"block_size": 32, field: value} if RANK == 1 else {"block_size": 32}
    op = QuantAllReduceOperation(QuantAllReduceParam(**kwargs))
    scale = np.full(64 // kwargs["block_size"], 0.1, np.float32)
    raises_everywhere(lambda: op.execute(np.ones(64, np.int8), scale), mpicoll.CollectiveMismatchError,
                      "operator parameters", "on rank 1")


@mpi1
def test_int8_gather_of_an_overflowing_sum_does_not_hang():
    huge = np.full(1, 3e38, np.float32)
    x = np.full(8, 127, np.int8)
    got = QuantAllReduceOperation(QuantAllReduceParam(block_size=8, allgather_dtype="int8")).execute(x, huge)
    assert got.shape == (8,) and (SIZE == 1 or not np.isfinite(got.astype(np.float32)).any())


@mpi1
def test_non_int8_message_is_specific():
    raises_everywhere(lambda: QuantAllReduceOperation().execute(np.ones(4, np.complex64), 1.0),
                      CollectiveArgumentError, "x.dtype='complex64'", "must be int8")
