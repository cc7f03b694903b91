"""The optional C float16 kernels give exactly numpy's results, and the numpy fallback still works."""
from __future__ import annotations

import numpy as np
import pytest

from mpicoll._golden import CHECKS, SEED, count_wrong
from mpicoll.ops import _base

from _mpi import RANK, SIZE

half = pytest.mark.skipif(_base.HALF is None, reason="the optional _half extension is not built")
SPECIAL = np.array([np.nan, 0, -0.0, 1, -1, np.inf, -np.inf, 2, 6e-8, 65504, -3.5, 1e-3], np.float16)


@half
@pytest.mark.parametrize("rows,cols", [(1, 7), (2, 4099), (3, 13), (4, 1000), (5, 8)])
@pytest.mark.parametrize("op", range(4))
def test_reduce_is_bit_identical_to_numpy(rows, cols, op):
    rng = np.random.default_rng(rows * 100 + cols + op)
    parts = np.where(rng.random((rows, cols)) < 0.3, rng.choice(SPECIAL, (rows, cols)),
                     rng.standard_normal((rows, cols)) * 100).astype(np.float16)
    out = np.empty(cols, np.float16)
    _base.HALF.reduce_f16(parts, out, rows, op)
    ufunc = (np.add, np.multiply, np.maximum, np.minimum)[op]
    acc = parts[0].astype(np.float32)
    with np.errstate(all="ignore"):
        for r in range(1, rows):
            acc = ufunc(acc, parts[r].astype(np.float32))
        expected = acc.astype(np.float16)
    same = (out.view(np.uint16) == expected.view(np.uint16)) | (np.isnan(out) & np.isnan(expected))
    assert same.all()


@half
@pytest.mark.parametrize("op", range(4))
def test_bfloat16_reduce_is_bit_identical_to_ml_dtypes(op):
    import ml_dtypes
    rng = np.random.default_rng(op)
    vals = np.array([np.nan, 0, -0.0, 1, -1, np.inf, -np.inf, 3e38, -3e38, 1e-40], np.float32)
    parts = np.where(rng.random((3, 5001)) < 0.3, rng.choice(vals, (3, 5001)),
                     rng.standard_normal((3, 5001)) * 100).astype(ml_dtypes.bfloat16)
    out = np.empty(5001, ml_dtypes.bfloat16)
    _base.HALF.reduce_bf16(parts.view(np.uint16), out.view(np.uint16), 3, op)
    ufunc = (np.add, np.multiply, np.maximum, np.minimum)[op]
    with np.errstate(all="ignore"):
        acc = parts[0].astype(np.float32)
        for r in range(1, 3):
            acc = ufunc(acc, parts[r].astype(np.float32))
        expected = acc.astype(ml_dtypes.bfloat16)
    # bit for bit, except which NaN a NaN-producing step returns (x86 keeps an operand's payload)
    nan = np.isnan(out.astype(np.float32)) & np.isnan(expected.astype(np.float32))
    assert np.array_equal(out.view(np.uint16)[~nan], expected.view(np.uint16)[~nan])


@half
def test_conversions_are_bit_identical_to_numpy():
    rng = np.random.default_rng(3)
    h = np.concatenate([SPECIAL, rng.standard_normal(10_001).astype(np.float16)])
    f = np.empty(h.size, np.float32)
    _base.HALF.f16_to_f32(h, f)
    assert np.array_equal(f.view(np.uint32), h.astype(np.float32).view(np.uint32))
    f32 = np.concatenate([f, rng.standard_normal(999).astype(np.float32) * 1e5, [1e-9, 7e4, 65519.9, 65520]])
    f32 = f32.astype(np.float32)
    o = np.empty(f32.size, np.float16)
    _base.HALF.f32_to_f16(f32, o)
    with np.errstate(over="ignore"):
        expected = f32.astype(np.float16)
    same = (o.view(np.uint16) == expected.view(np.uint16)) | (np.isnan(o) & np.isnan(expected))
    assert same.all()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name", ["AllReduce", "ReduceScatter", "ReduceScatterV"])
def test_numpy_fallback_path(monkeypatch, name):
    monkeypatch.setattr(_base, "HALF", None)
    import mpicoll.ops.allreduce as ar
    monkeypatch.setattr(ar, "to_f32", _base.to_f32)
    spec = CHECKS[name]
    for dtype in ("float16", "bfloat16"):
        for case in spec.cases(SIZE):
            got, expected, exact = spec.run(case, dtype, "", RANK, SIZE, SEED)
            assert count_wrong(got, expected, exact=exact, n=SIZE) == 0, (dtype, case)


@half
@pytest.mark.skipif(not hasattr(_base.HALF, "use_simd"), reason="an older build without use_simd")
def test_portable_loops_are_bit_identical_too():
    """The loops used where the CPU lacks F16C/AVX2 (switched on here with use_simd(False))."""
    before = _base.HALF.use_simd(False)
    try:
        assert _base.HALF.use_simd(False) is False
        for op in range(4):
            test_reduce_is_bit_identical_to_numpy(3, 1001, op)
            test_bfloat16_reduce_is_bit_identical_to_ml_dtypes(op)
        test_conversions_are_bit_identical_to_numpy()
    finally:
        _base.HALF.use_simd(before)
    assert _base.HALF.use_simd(before) == bool(before and _base.HALF.F16C)


@half
@pytest.mark.skipif(not hasattr(_base.HALF, "packed_layout"), reason="an older build without packed_layout")
def test_packed_layout_in_c_agrees_with_python():
    from hypothesis import given, settings, strategies as st
    from mpicoll._validate import packed_layout

    @settings(max_examples=300, deadline=None)
    @given(st.one_of(st.lists(st.integers(0, 1 << 20), max_size=9),
                     st.tuples(st.integers(0, 1 << 20), st.integers(1, 9)).map(lambda t: [t[0]] * t[1])),
           st.sampled_from(["packed", "shifted", "random"]), st.sampled_from([np.int64, np.int32]), st.data())
    def check(counts, layout, itype, data):
        displs = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)[:len(counts)].tolist()
        if layout == "shifted" and counts:
            displs[data.draw(st.integers(0, len(counts) - 1))] += 1
        elif layout == "random":
            displs = data.draw(st.lists(st.integers(0, 1 << 21), min_size=len(counts), max_size=len(counts)))
        c, d = np.array(counts, dtype=itype), np.array(displs, dtype=itype)
        got = _base.HALF.packed_layout(c, d)
        assert got == packed_layout(counts, displs) == packed_layout(c, d)
        assert got[1] == (counts[0] if counts and len(set(counts)) == 1 else -1)
    check()
    c = np.array([2, 3])
    for other in ([0, 2], (0, 2), np.array([0.0, 2.0]), np.array([[0, 2]]), np.array([0, 2, 5]),
                  np.array([0, 9, 2, 9])[::2]):
        want = (-2, -1) if not (isinstance(other, np.ndarray) and other.dtype.kind == "i" and other.ndim == 1
                                and other.size == 2 and other.flags.c_contiguous) else packed_layout(c, other)
        assert _base.HALF.packed_layout(c, other) == want, other
    assert packed_layout([2, 2], [0, 2, 4]) == (-1, 2)      # (lengths differ: not packed)
    # negative entries and sums past 2**63 - 1 are left to the Python twin
    big = 2 ** 62
    for counts, displs in (([-1, 1], [0, -1]), ([1, 1], [0, -1]), ([big] * 4, [0, big, 2 * big - 1, 0]),
                           ([2 ** 63 - 1, 2 ** 63 - 1], [0, 2 ** 63 - 1])):
        assert _base.HALF.packed_layout(np.array(counts, np.int64), np.array(displs, np.int64)) == (-2, -1)


@pytest.mark.mpi(min_size=1)
def test_reduce_scatter_v_fast_path_without_the_c_check(monkeypatch):
    """Validation off without the C extension: the Python layout check takes over (equal counts: the
    block call)."""
    import mpicoll
    monkeypatch.setattr(_base, "HALF", None)
    for counts in ([j + 2 for j in range(SIZE)], [3] * SIZE):
        x = np.arange(sum(counts), dtype=np.int32) + RANK
        packed = np.concatenate(([0], np.cumsum(counts)[:-1]))
        want_sum = sum(np.arange(sum(counts), dtype=np.int32) + r for r in range(SIZE))
        for displs in (packed, packed[::-1].copy() if SIZE > 1 else packed):
            op = mpicoll.ReduceScatterVOperation(validate=False)
            for _ in range(2):
                got = op.execute(x, np.array(counts), displs, counts[RANK])
                d = int(displs[RANK])          # every rank's block RANK starts at the same displacement
                assert np.array_equal(got, want_sum[d:d + counts[RANK]])


def test_mpi_of_agrees_with_the_dtype_table():
    """The validation-off entry test, in C and its Python twin, maps exactly what the dtype table's
    dtype equality maps: every numpy type code in every byte order, ml_dtypes types, structured and
    metadata-carrying dtypes; anything but a C-contiguous plain ndarray gives None."""
    import ml_dtypes
    from mpicoll import _dtypes as D
    twins = [D.mpi_of] + ([_base.HALF.mpi_of] if hasattr(_base.HALF, "mpi_of") else [])
    tables = [(D.MPI_BY_NUM, {d.np: d.mpi for d in D.DTYPES.values()}),
              (D.NATIVE_MPI_BY_NUM, {d.np: d.mpi for d in D.DTYPES.values() if d.reduce == "native"})]
    dtypes = [np.dtype(c).newbyteorder(b) for c in np.typecodes["All"] for b in "<>=|"]
    dtypes += [np.dtype(t) for t in (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, [("a", "f4")])]
    dtypes += [np.dtype("f4", metadata={"a": 1}), np.dtype(("i4", [("lo", "i2"), ("hi", "i2")])),
               np.dtype(("i2", [("x", ">u2")]))]          # (unions: the base type's number, not the base type)
    for dt in dtypes:
        x = np.zeros((2, 3), dt)
        for table, by_dtype in tables:
            want = by_dtype.get(dt)
            for mpi_of in twins:
                assert mpi_of(x, table) is want, (dt, mpi_of)
                assert mpi_of(x[0], table) is want and mpi_of(x[:, 0], table) is None, (dt, mpi_of)
                assert mpi_of(x.T, table) is (want if x.T.flags.c_contiguous else None), (dt, mpi_of)
    x = np.zeros(4, np.float32)
    for mpi_of in twins:
        for other in (x.view(np.matrix), x.tolist(), np.float32(1), memoryview(x), None):
            assert mpi_of(other, D.MPI_BY_NUM) is None, (other, mpi_of)
        assert mpi_of(x, ()) is None                      # (a number past the table's end)
