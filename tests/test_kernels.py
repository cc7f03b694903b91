"""The optional C numeric kernels give exactly numpy's results, the numpy fallback still works, and
only the dtype table's dtypes are taken."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from mpicoll.checks import CHECKS
from mpicoll.checks._golden import SEED, count_wrong, golden_tree
from mpicoll import CollectiveArgumentError
from mpicoll._numeric import KERNELS
from mpicoll import _env, _numeric

from mpicoll._dtypes import DTYPES

from _mpi import FLOATS, NATIVE_FLOATS, RANK, SAMPLE, SIZE

#: pure functions (no MPI): checked once, in the 1-rank run
once = pytest.mark.skipif(SIZE != 1, reason="pure function: check it once")

half = pytest.mark.skipif(KERNELS is None, reason="the optional _kernels extension is not built")
SPECIAL = np.array([np.nan, 0, -0.0, 1, -1, np.inf, -np.inf, 2, 6e-8, 65504, -3.5, 1e-3], np.float16)


@pytest.fixture(params=["avx512", "avx2", "portable"])
def simd(request):
    """Each loop the CPU has: AVX-512 (F and BW; float16 16 lanes a step, bfloat16 32), F16C/AVX2
    (8 and 16), the portable C loops."""
    if request.param == "avx512" and not KERNELS.AVX512 or request.param == "avx2" and not KERNELS.F16C:
        pytest.skip(f"this CPU has no {request.param}")
    simd, avx512 = KERNELS.use_simd(request.param != "portable"), KERNELS.use_avx512(request.param == "avx512")
    yield request.param
    KERNELS.use_simd(simd)
    KERNELS.use_avx512(avx512)


@once
@half
@pytest.mark.parametrize("rows,cols", [(1, 7), (2, 4099), (3, 13), (4, 1000), (5, 8), (2, 47), (6, 37), (8, 129)])
@pytest.mark.parametrize("op", range(4))
def test_reduce_is_bit_identical_to_numpy(rows, cols, op, simd):
    rng = np.random.default_rng(rows * 100 + cols + op)
    parts = np.where(rng.random((rows, cols)) < 0.3, rng.choice(SPECIAL, (rows, cols)),
                     rng.standard_normal((rows, cols)) * 100).astype(np.float16)
    out = np.empty(cols, np.float16)
    KERNELS.reduce_f16(list(parts), out, op)
    ufunc = (np.add, np.multiply, np.maximum, np.minimum)[op]
    with np.errstate(all="ignore"):                           # (the tree order, in float32, rounded once)
        expected = golden_tree([p.astype(np.float32) for p in parts], ufunc).astype(np.float16)
    same = (out.view(np.uint16) == expected.view(np.uint16)) | (np.isnan(out) & np.isnan(expected))
    assert same.all()


@once
@half
@pytest.mark.parametrize("op", range(4))
def test_bfloat16_reduce_is_bit_identical_to_ml_dtypes(op, simd):
    import ml_dtypes
    rng = np.random.default_rng(op)
    vals = np.array([np.nan, 0, -0.0, 1, -1, np.inf, -np.inf, 3e38, -3e38, 1e-40], np.float32)
    parts = np.where(rng.random((3, 5021)) < 0.3, rng.choice(vals, (3, 5021)),      # (5021 = 156 * 32 + 16 + 13:
                     rng.standard_normal((3, 5021)) * 100).astype(ml_dtypes.bfloat16)   # every loop takes a part)
    out = np.empty(5021, ml_dtypes.bfloat16)
    KERNELS.reduce_bf16(list(parts.view(np.uint16)), out.view(np.uint16), op)
    ufunc = (np.add, np.multiply, np.maximum, np.minimum)[op]
    with np.errstate(all="ignore"):
        expected = golden_tree([p.astype(np.float32) for p in parts], ufunc).astype(ml_dtypes.bfloat16)
    # bit for bit, except which NaN a NaN-producing step returns (x86 keeps an operand's payload)
    nan = np.isnan(out.astype(np.float32)) & np.isnan(expected.astype(np.float32))
    assert np.array_equal(out.view(np.uint16)[~nan], expected.view(np.uint16)[~nan])


@once
@half
@pytest.mark.parametrize("dtype", NATIVE_FLOATS)
@pytest.mark.parametrize("op", range(2))
@pytest.mark.parametrize("rows,cols", [(1, 7), (2, 4099), (4, 1000), (3, 2049), (7, 1025), (8, 3000)])
def test_native_float_reduce_is_bit_identical_to_numpy(dtype, op, rows, cols, simd):
    """float32 / float64 SUM and PROD in C: the rows in the tree order, in their own precision, infinities and
    NaNs included, out-of-place and in place (out is row 0), as numpy's ufuncs give them."""
    rng = np.random.default_rng(rows * 10 + cols + op)
    special = np.array([np.nan, 0, -0.0, np.inf, -np.inf, 3e38, -3e38, 1e-40], dtype)
    parts = np.where(rng.random((rows, cols)) < 0.2, rng.choice(special, (rows, cols)),
                     rng.standard_normal((rows, cols)) * 100).astype(dtype)
    ufunc = (np.add, np.multiply)[op]
    with np.errstate(all="ignore"):
        expected = golden_tree(list(parts), ufunc)
    kernel = KERNELS.reduce_f32 if dtype == "float32" else KERNELS.reduce_f64
    out = np.empty(cols, dtype)
    kernel(list(parts), out, op)
    nan = np.isnan(out) & np.isnan(expected)                  # (which NaN a NaN step returns: the CPU's)
    assert np.array_equal(out[~nan].view(np.uint8), expected[~nan].view(np.uint8))
    first = parts[0].copy()
    kernel([first, *parts[1:]], first, op)                    # in place: out is the first row
    assert np.array_equal(np.isnan(first), np.isnan(expected)) and np.array_equal(first[~nan], expected[~nan])


@once
@half
def test_conversions_are_bit_identical_to_numpy():
    rng = np.random.default_rng(3)
    h = np.concatenate([SPECIAL, rng.standard_normal(10_001).astype(np.float16)])
    f = np.empty(h.size, np.float32)
    KERNELS.f16_to_f32(h, f)
    assert np.array_equal(f.view(np.uint32), h.astype(np.float32).view(np.uint32))
    f32 = np.concatenate([f, rng.standard_normal(999).astype(np.float32) * 1e5, [1e-9, 7e4, 65519.9, 65520]])
    f32 = f32.astype(np.float32)
    o = np.empty(f32.size, np.float16)
    KERNELS.f32_to_f16(f32, o)
    with np.errstate(over="ignore"):
        expected = f32.astype(np.float16)
    same = (o.view(np.uint16) == expected.view(np.uint16)) | (np.isnan(o) & np.isnan(expected))
    assert same.all()


@once
@half
def test_bfloat16_conversions_are_bit_identical_to_ml_dtypes(simd):
    """Every bfloat16 to float32; float32 of every class (random bits: NaNs with payloads,
    subnormals, infinities, ties) to bfloat16, at lengths around the vector widths."""
    import ml_dtypes
    every = np.arange(1 << 16, dtype=np.uint16).view(ml_dtypes.bfloat16)
    f = np.empty(every.size, np.float32)
    KERNELS.bf16_to_f32(every, f)
    assert np.array_equal(f.view(np.uint32), every.astype(np.float32).view(np.uint32))
    bits = np.random.default_rng(4).integers(0, 1 << 32, 100_003, dtype=np.uint32)
    bits[:8] = [0x7f800001, 0xffc00001, 0x7f800000, 0x00000001, 0x80000000, 0x3f808000, 0x3f818000, 0x7f7fffff]
    f32 = bits.view(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        expected = f32.astype(ml_dtypes.bfloat16)
    for n in (0, 1, 15, 16, 17, 33, f32.size):
        o = np.empty(n, ml_dtypes.bfloat16)
        KERNELS.f32_to_bf16(f32[:n], o)
        assert np.array_equal(o.view(np.uint16), expected[:n].view(np.uint16)), n


#: the sample's dtypes a kernel serves: its floats (conversion, tree-order reduction) and its 8-bit
#: integer (quantization)
KERNEL_DTYPES = [d for d in SAMPLE if DTYPES[d].floating or DTYPES[d].np.kind == "i" and DTYPES[d].itemsize == 1]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name", list(CHECKS))
def test_numpy_fallback_path(monkeypatch, name):
    """Every golden case of every operator (and Hccl task kind) in the dtypes the kernels serve,
    on the numpy twins."""
    monkeypatch.setattr(_numeric, "KERNELS", None)
    spec = CHECKS[name]
    runs = [(d, case) for d in KERNEL_DTYPES if d in spec.dtypes for case in spec.cases_for(SIZE, d)]
    if not runs:                        # (the same on every rank)
        pytest.skip(f"{name}: {spec.skip_at(SIZE) or f'it has no case at {SIZE} rank(s) in {KERNEL_DTYPES}'}")
    for dtype, case in runs:
        c = spec.make(case, dtype, "", RANK, SIZE, SEED)
        assert count_wrong(c.execute(), c.expected, exact=c.exact, n=SIZE) == 0, (dtype, case)


@once
@half
def test_portable_loops_are_bit_identical_too():
    """The conversions used where the CPU lacks F16C/AVX2 (switched on here with use_simd(False))."""
    before = KERNELS.use_simd(False)
    try:
        assert KERNELS.use_simd(False) is False
        test_conversions_are_bit_identical_to_numpy()      # (the reductions: the simd fixture's "portable")
    finally:
        KERNELS.use_simd(before)
    assert KERNELS.use_simd(before) == bool(before and KERNELS.F16C)


@once
def test_only_the_dtype_table_is_supported():
    """Every numpy type code in every byte order, ml_dtypes types, structured, union and
    metadata-carrying dtypes: an array is taken exactly when its dtype equals a table row's (a
    union dtype carries its base type's number but is not that type)."""
    import ml_dtypes
    from mpicoll import _dtypes as D
    from mpicoll._validate import array
    dtypes = [np.dtype(c).newbyteorder(b) for c in np.typecodes["All"] for b in "<>=|"]
    dtypes += [np.dtype(t) for t in (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, [("a", "f4")])]
    dtypes += [np.dtype("f4", metadata={"a": 1}), np.dtype(("i4", [("lo", "i2"), ("hi", "i2")])),
               np.dtype(("i2", [("x", ">u2")]))]
    rows = {d.np: d for d in D.DTYPES.values()}
    for dt in dtypes:
        want = rows.get(dt)
        try:
            got = array("T", "x", np.zeros((2, 3), dt), 0)[1]
        except CollectiveArgumentError as exc:
            assert want is None and "unsupported" in str(exc), dt
        else:
            assert got is want, dt


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler here")
@pytest.mark.skipif(not _env.value("MPICOLL_KERNELS"), reason="MPICOLL_KERNELS=0")
def test_the_kernels_run_where_the_readme_runs():
    """The README's commands run from the repository root, where ``import mpicoll`` is the source
    tree: the install puts the built kernels there too (setup.py), so they are in use, and the
    CLI's headers say so."""
    assert _numeric.kernels_in_use() == "C (mpicoll._kernels)", (_numeric.__file__, _numeric.kernels_in_use())


@once
@pytest.mark.parametrize("length", [0, 1, 31, 32, 33, 127, 128, 129, 4099])
@pytest.mark.parametrize("offset", [0, 1, 7, 31])
def test_stream_copy_equals_a_copy(length, offset):
    from mpicoll._numeric import stream_copy
    src = np.arange(length + 64, dtype=np.uint8)[3:3 + length]
    dst = np.zeros(length + 64, dtype=np.uint8)
    stream_copy(dst[offset:offset + length], src)
    assert np.array_equal(dst[offset:offset + length], src)
    assert not dst[:offset].any() and not dst[offset + length:].any()


@once
@pytest.mark.parametrize("kernels", ["C", "numpy"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_reduce_rows_is_the_tree_order_for_any_row_count(kernels, dtype, monkeypatch):
    """``reduce_rows`` (one pass, a binary counter) equals the recursive definition of the tree order
    (``golden_reduce``) at 1-17 rows, every op, across tiles (numpy's 65536, C's 1024) and SIMD tails,
    out of place and in place."""
    from mpicoll._dtypes import REDUCE_OPS
    from mpicoll.checks._golden import golden_reduce
    if kernels == "C" and KERNELS is None:
        pytest.skip("the optional _kernels extension is not built")
    monkeypatch.setattr(_numeric, "KERNELS", KERNELS if kernels == "C" else None)
    dt = DTYPES[dtype]
    rng = np.random.default_rng(17)
    for rows in range(1, 18):
        for name in [r for r, op in REDUCE_OPS.items() if not op.average]:     # (AVG: a SUM, then divided)
            rop = REDUCE_OPS[name].on(dt)
            for cols in (5, 1037) if rows > 4 else (5, 1037, 70_001):
                spread = 1 + 0.01 * rng.standard_normal((rows, cols)) if name == "prod" else \
                    rng.standard_normal((rows, cols)) * 10.0 ** rng.integers(-4, 5, (rows, cols))
                parts = list(spread.astype(dt.np))
                want = golden_reduce(parts, dt, rop)
                got = _numeric.reduce_rows(parts, dt, rop, np.empty(cols, dt.np))
                assert got.tobytes() == want.tobytes(), (rows, name, cols)
                first = parts[0].copy()
                _numeric.reduce_rows([first, *parts[1:]], dt, rop, first)
                assert first.tobytes() == want.tobytes(), (rows, name, cols, "in place")
    if dtype == "bfloat16":                   # one row: a NaN comes out as the quiet NaN, as from any tree
        nan = np.array([0x7fc1, 0xffc3, 0x3f80], np.uint16).view(dt.np)
        got = _numeric.reduce_rows([nan], dt, REDUCE_OPS["sum"], np.empty(3, dt.np))
        assert got.tobytes() == golden_reduce([nan], dt, REDUCE_OPS["sum"]).tobytes()
