"""int8 quantized all-reduce: helpers, errors on every rank, and the documented example.
(The operator x case families run against the golden in tests/test_ops.py through the registry.)"""
from __future__ import annotations

import numpy as np
import pytest

import mpicoll
from mpicoll import CollectiveArgumentError, QuantAllReduceOperation, QuantAllReduceParam, dequantize, quantize
from mpicoll.checks import CHECKS
from mpicoll.checks._golden import SEED, count_wrong, golden_tree
from mpicoll import _numeric as N
from mpicoll._dtypes import DTYPES
from mpicoll.ops.quant import bytes_per_rank, plan_chunks

from _mpi import FLOATS, RANK, SIZE, raises_everywhere

#: pure functions (no MPI): checked once, in the 1-rank run
once = pytest.mark.skipif(SIZE != 1, reason="pure function: check it once")

mpi1 = pytest.mark.mpi(min_size=1)


@once
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("block", [1, 7, 32, 4096])
def test_quantize_round_trip_within_half_a_step(dtype, block):
    """Every float dtype (quantize takes them all)."""
    x = np.random.default_rng(block).standard_normal((5, 99)).astype(DTYPES[dtype].np)
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


# ----------------------------------------------------------------------------- C kernels and numpy path

kernels = pytest.mark.skipif(N.KERNELS is None, reason="the optional _kernels extension is not built")
PATHS = ["numpy", pytest.param("c-portable", marks=kernels), pytest.param("c-simd", marks=kernels)]


@pytest.fixture
def path(request, monkeypatch):
    """Run the test on one compute path: numpy (as without the C extension), the portable C loops,
    or the F16C/AVX2 loops (the default where the CPU has them)."""
    if request.param == "numpy":
        monkeypatch.setattr(N, "KERNELS", None)
        yield request.param
        return
    before = N.KERNELS.use_simd(request.param == "c-simd")
    try:
        yield request.param
    finally:
        N.KERNELS.use_simd(before)


def _same_bits(a, b):
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    u = f"u{a.itemsize}"
    return bool(((a.view(u) == b.view(u)) | (np.isnan(a) & np.isnan(b))).all())


def _reference_sum(q, scales, block):
    """The definition, row by row: sum_r float32(q[r]) * scale, in the tree order, in float32."""
    terms = []
    for r in range(q.shape[0]):
        per = np.repeat(scales[r], block)[:q.shape[1]] if block else np.full(q.shape[1], scales[r, 0], np.float32)
        terms.append(q[r].astype(np.float32) * per)
    return golden_tree(terms, np.add)


@once
@pytest.mark.parametrize("path", PATHS, indirect=True)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7])
@pytest.mark.parametrize("block", [0, 1, 3, 8, 100, 128, 5000])
def test_dequant_sum_is_bit_identical_to_the_definition(path, rows, block):
    rng = np.random.default_rng(rows * 10_000 + block)
    for c in (1, 7, 4097, 70_001):
        q = rng.integers(-128, 128, (rows, c), dtype=np.int8)
        scales = rng.uniform(0.001, 10, (rows, -(-c // block) if block else 1)).astype(np.float32)
        if rows > 1:      # IEEE corner cases: zero, huge (overflows), subnormal, inf, NaN, negative
            scales[1, :6] = np.array([0, 3e38, 1e-42, np.inf, np.nan, -0.5], np.float32)[:scales.shape[1]]
        with np.errstate(all="ignore"):
            expected = _reference_sum(q, scales, block)
            for dtype in (np.float16, np.float32):
                got = N.dequant_sum(q, scales, block, np.empty(c, dtype))
                assert _same_bits(got, expected.astype(dtype)), (c, dtype)


@once
@pytest.mark.parametrize("path", PATHS, indirect=True)
@pytest.mark.parametrize("block,qblock", [(0, 1), (0, 4097), (0, 70_001), (3, 3), (128, 128), (100, 100),
                                          (8, 5000), (0, 8)])
def test_fused_dequant_sum_quantize_equals_the_two_steps(path, block, qblock):
    rng = np.random.default_rng(block * 7 + qblock)
    for rows, c in ((1, 5), (3, 4097), (2, 70_001)):
        q = rng.integers(-128, 128, (rows, c), dtype=np.int8)
        scales = rng.uniform(0.001, 10, (rows, -(-c // block) if block else 1)).astype(np.float32)
        scales[-1, 0] = 3e38                 # an overflowing sum: inf / NaN scales, q 0, as quantize_into
        nq = -(-c // qblock)
        qout, sout = np.empty(c, np.int8), np.empty(nq, np.float32)
        with np.errstate(all="ignore"):
            N.dequant_sum_quantize(q, scales, block, qblock, qout, sout)
            rq, rs = N.quantize_into(N.dequant_sum(q, scales, block, np.empty(c, np.float32)), qblock)
        assert np.array_equal(qout, rq) and _same_bits(sout, rs), (rows, c)


@once
@pytest.mark.parametrize("path", PATHS, indirect=True)
def test_dequant_sum_keeps_the_sign_of_an_all_negative_zero_sum(path):
    q = np.array([[-3, 2, 0, -1]] * 3, np.int8)          # q * 0.0 is -0.0 where q < 0
    for dtype in (np.float16, np.float32):
        got = N.dequant_sum(q, np.zeros((3, 1), np.float32), 0, np.empty(4, dtype))
        assert np.signbit(got).tolist() == [True, False, False, True]


def _quantize_reference(x, block):
    """The definition, block by block (float32)."""
    qs, ss = [], []
    for b in range(0, x.size, block):
        v = x[b:b + block].astype(np.float32)
        s = np.float32(np.abs(v).max() / np.float32(127))
        inv = np.float32(1) / s if 0 < s < np.inf else np.float32(0)
        t = v / s if np.isinf(inv) else v * inv
        qs.append(np.clip(np.nan_to_num(np.rint(t)), -127, 127).astype(np.int8))
        ss.append(s)
    return np.concatenate(qs), np.array(ss, np.float32)


@once
@pytest.mark.parametrize("path", PATHS, indirect=True)
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("block", [1, 3, 8, 32, 100, 128, 4096])
def test_quantize_kernel_is_bit_identical_to_the_definition(path, dtype, block):
    rng = np.random.default_rng(block)
    for size in (1, 5, 127, 1000, 9001):
        x = (rng.standard_normal(size) * rng.choice([1e-3, 1, 100], size)).astype(dtype)
        if size > 100:       # a zero block, specials (allowed inside the pipeline), a subnormal block
            x[:block] = 0
            x[rng.integers(0, size, 6)] = np.array([0, np.inf, -np.inf, np.nan, 0, 1], dtype)
            if size >= 3 * block:                     # the last whole block: tiny values only
                start = (size // block - 1) * block
                x[start:start + block] = (np.arange(block) % 40 * (1e-42 if dtype == np.float32 else 6e-8)).astype(dtype)
        with np.errstate(all="ignore"):
            q, s = N.quantize_into(np.ascontiguousarray(x), block)
            rq, rs = _quantize_reference(x, block)
        assert np.array_equal(q, rq) and _same_bits(s, rs), size


@once
@pytest.mark.parametrize("path", PATHS, indirect=True)
def test_subnormal_scales_round_trip_within_half_a_step(path):
    x = np.zeros(96, np.float32)
    x[:32] = np.float32(1e-42) * np.arange(32)
    x[40:42] = [1e-40, -3e-39]
    for block in (5, 8, 32):
        q, s = quantize(x, block)
        back = dequantize(q, s, block, np.float32)
        # half a step, up to float32 rounding (subnormal steps are coarse: allow 64 units of 2**-149)
        assert np.all(np.abs(back - x) <= np.repeat(s, block)[:96] / 2 + 64 * 2.0 ** -149)


@mpi1
@pytest.mark.parametrize("path", PATHS, indirect=True)
def test_every_check_case_on_every_path(path):
    spec = CHECKS["QuantAllReduce"]
    for validate in (True, False):
        for case in spec.cases(SIZE):
            c = spec.make(case, "int8", "", RANK, SIZE, SEED, validate)
            got = c.execute()
            assert c.exact and count_wrong(got, c.expected, exact=True, n=SIZE) == 0, (case, validate)
            assert got.dtype == np.float16 and np.array_equal(np.signbit(got), np.signbit(c.expected)), case


@mpi1
def test_reused_scratch_buffers_give_fresh_results():
    op = QuantAllReduceOperation(QuantAllReduceParam(block_size=16, allgather_dtype="int8"), validate=False)
    for size, value in ((100, 1), (100, 2), (37, 3), (100, 4)):
        x = np.full(size, value, np.int8)
        got = op.execute(x, np.full(-(-size // 16), 0.5, np.float32))
        assert got.tolist() == [0.5 * value * SIZE] * size


@mpi1
def test_validation_off_still_checks_the_scale_count():
    op = QuantAllReduceOperation(QuantAllReduceParam(block_size=16), validate=False)
    with pytest.raises(CollectiveArgumentError, match="must hold 4 value"):
        op.execute(np.ones(64, np.int8), np.ones(3, np.float32))


@mpi1
def test_validation_off_still_checks_out():
    op = QuantAllReduceOperation(QuantAllReduceParam(), validate=False)
    for out in (np.empty(8, np.float32), np.empty(7, np.float16), np.empty(16, np.float16)[::2],
                np.empty((2, 4), np.float16)):
        with pytest.raises(CollectiveArgumentError, match="out="):
            op.execute(np.ones(8, np.int8), 0.5, out=out)
    out = np.empty(8, np.float16)
    assert op.execute(np.ones(8, np.int8), 0.5, out=out) is out and out.tolist() == [0.5 * SIZE] * 8
