"""The validated path's plain case (``Operation._checked``): a plain call fills exactly the header
``_check`` would fill, mixes with general-path calls on other ranks in one ``Allgather``, and the
C tests agree with their Python twins."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import mpicoll
from mpicoll import _errors, _validate as V
from mpicoll._errors import CollectiveArgumentError, CollectiveMismatchError
from mpicoll._golden import CHECKS
from mpicoll.ops import _base

from _mpi import RANK, SIZE, raises_everywhere
from test_ops import _check_all_cases

half = pytest.mark.skipif(not hasattr(_base.HALF, "plain_header"), reason="the _half extension is not built")
P, n = mpicoll, SIZE


def _packed(counts):
    return np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)


def _cases():
    """(label, op factory, call, plain?) for the operators with a ``_checked`` closure."""
    f4 = np.arange(2 * n * 3, dtype=np.float32).reshape(2 * n, 3) + RANK
    counts = np.arange(1, n + 1)
    xv = np.arange(int(counts.sum()) + 2, dtype=np.float64)
    rc = int(counts[RANK])
    return [
        ("AllReduce", P.AllReduceOperation, lambda op: op.execute(f4), True),
        ("AllReduce-out", P.AllReduceOperation, lambda op: op.execute(f4, out=np.empty_like(f4)), True),
        ("AllReduce-out-positional", P.AllReduceOperation, lambda op: op.execute(f4, np.empty_like(f4)), True),
        ("AllReduce-bf16", P.AllReduceOperation, lambda op: op.execute(f4.astype(ml_dtypes.bfloat16)), True),
        ("AllReduce-int8", P.AllReduceOperation, lambda op: op.execute(f4.astype(np.int8)), True),
        ("AllReduce-0d", P.AllReduceOperation, lambda op: op.execute(np.array(2.0)), True),
        ("AllReduce-9d", P.AllReduceOperation, lambda op: op.execute(np.ones((1,) * 8 + (2,))), False),
        ("AllReduce-inplace", P.AllReduceOperation, lambda op: (lambda y: op.execute(y, out=y))(f4.copy()), False),
        ("AllReduce-fortran", P.AllReduceOperation, lambda op: op.execute(np.asfortranarray(f4)), False),
        ("AllReduce-bigendian", P.AllReduceOperation, lambda op: op.execute(f4.astype(">f4")), None),
        ("AllReduce-list", P.AllReduceOperation, lambda op: op.execute(f4.tolist()), False),
        ("AllGather", P.AllGatherOperation, lambda op: op.execute(f4), True),
        ("AllGather-out", P.AllGatherOperation, lambda op: op.execute(f4, out=np.empty((n, *f4.shape), f4.dtype)),
         True),
        ("AllGather-out-f8", P.AllGatherOperation,
         lambda op: op.execute(f4, out=np.empty((n, *f4.shape), np.float64)), None),
        ("ReduceScatter", P.ReduceScatterOperation, lambda op: op.execute(f4), True),
        ("ReduceScatter-out", P.ReduceScatterOperation, lambda op: op.execute(f4, out=np.empty((2, 3), f4.dtype)),
         True),
        ("ReduceScatter-int16-sum", P.ReduceScatterOperation, lambda op: op.execute(f4.astype(np.int16)), True),
        ("AllToAll", P.AllToAllOperation, lambda op: op.execute(f4), True),
        ("AllToAll-out-readonly", P.AllToAllOperation,
         lambda op: op.execute(f4, out=(lambda o: (o.setflags(write=False), o)[1])(np.empty_like(f4))), None),
        ("Broadcast", P.BroadcastOperation, lambda op: op.execute(f4.copy()), True),
        ("Broadcast-fp16", P.BroadcastOperation, lambda op: op.execute(f4.astype(np.float16)), True),
        ("ReduceScatterV", P.ReduceScatterVOperation, lambda op: op.execute(xv, counts, _packed(counts), rc), True),
        ("ReduceScatterV-int32-out", P.ReduceScatterVOperation,
         lambda op: op.execute(xv, counts.astype(np.int32), _packed(counts).astype(np.int32), rc,
                               out=np.empty(rc)), True),
        ("ReduceScatterV-positional-out", P.ReduceScatterVOperation,
         lambda op: op.execute(xv, counts, _packed(counts), rc, np.empty(rc)), True),
        ("ReduceScatterV-lists", P.ReduceScatterVOperation,
         lambda op: op.execute(xv, counts.tolist(), _packed(counts).tolist(), rc), False),
        ("ReduceScatterV-numpy-int", P.ReduceScatterVOperation,
         lambda op: op.execute(xv, counts, _packed(counts), np.int64(rc)), False),
        ("ReduceScatterV-permuted", P.ReduceScatterVOperation,
         lambda op: op.execute(xv, counts, _packed(counts[::-1])[::-1].copy(), rc), False if n > 1 else True),
    ]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("label,make,call,plain", _cases(), ids=[c[0] for c in _cases()])
def test_plain_header_is_the_header_check_fills(label, make, call, plain, monkeypatch):
    """Every call on every rank: the header sent is the one ``_check`` fills for the same
    arguments, whichever path took it; plain calls skip ``_check``; the result equals the general
    path's (the method, as every call ran before ``_checked``)."""
    sent, checks = [], []
    real_gather = _errors.gather

    def spy_gather(comm, h):
        sent.append(h.copy())
        return real_gather(comm, h)
    monkeypatch.setattr(_errors, "gather", spy_gather)
    op = make()
    cls = type(op)
    real_check = cls._check

    def spy_check(self, args, kwargs, h):
        checks.append((args, kwargs))
        return real_check(self, args, kwargs, h)
    monkeypatch.setattr(cls, "_check", spy_check)
    try:
        want = call(op)         # the first execute binds and runs the general path; then the closure is in place
    except CollectiveArgumentError:
        want = None
    for _ in range(2):
        sent.clear(), checks.clear()
        try:
            got = call(op)
        except CollectiveArgumentError:
            assert want is None and plain is None, label
            continue
        assert sent, label          # (a checked integer sum agrees once more, on overflow)
        assert op.execute is not None and "execute" in op.__dict__, label
        if plain is not None:
            if label.startswith("ReduceScatterV") and not hasattr(_base.HALF, "packed_layout"):
                plain = False         # (its count-layout test is in C only: without it, the general path)
            assert (not checks) == plain, (label, "plain" if plain else "general")
        # what _check fills for these arguments, on a fresh header
        args, kwargs = _args_of(label, call, op)
        h = V.header(op.size, op.CODE)
        real_check(op, args, kwargs, h)
        assert sent[0].tolist() == h.tolist(), label
        assert np.array_equal(np.asarray(got), np.asarray(want)) and np.asarray(got).dtype == np.asarray(want).dtype


def _args_of(label, call, op):
    """The arguments ``call`` passes to ``op.execute`` (recorded by a stand-in execute)."""
    seen = []
    real = op.__dict__["execute"]
    op.execute = lambda *a, **k: seen.append((a, k))
    try:
        call(op)
    finally:
        op.execute = real
    return seen[0]


@pytest.mark.mpi(min_size=2)
def test_plain_and_general_calls_mix_across_ranks():
    """Rank 0 plain (integer-array counts), the others general (lists): one Allgather, the golden
    result; then a mismatch and a local error on the last rank raise the same error everywhere."""
    counts = np.arange(1, n + 1)
    x = np.arange(int(counts.sum()), dtype=np.float32) * (RANK + 1)
    conv = (lambda v: v) if RANK == 0 else (lambda v: v.tolist())
    op = P.ReduceScatterVOperation()
    d = int(_packed(counts)[RANK])
    want = np.arange(int(counts.sum()), dtype=np.float32)[d:d + counts[RANK]] * sum(range(1, n + 1))
    for _ in range(2):
        got = op.execute(x, conv(counts), conv(_packed(counts)), int(counts[RANK]))
        assert np.array_equal(got, want)
    bad = int(counts[RANK]) + (1 if RANK == n - 1 else 0)
    raises_everywhere(lambda: op.execute(x, conv(counts), conv(_packed(counts)), bad), CollectiveMismatchError,
                      "ReduceScatterV: recv_count differs", f"recv_count={int(counts[-1]) + 1} on rank {n - 1}")
    neg = -1 if RANK == n - 1 else int(counts[RANK])
    raises_everywhere(lambda: op.execute(x, conv(counts), conv(_packed(counts)), neg), CollectiveArgumentError,
                      "recv_count=-1", f"on rank {n - 1}")
    # the other way round: the last rank plain, the others general
    ar = P.AllReduceOperation()
    y = np.ones((2, 3), np.float32)
    arg = y if RANK == n - 1 else np.asfortranarray(y)       # (Fortran order: the general path)
    for _ in range(2):
        assert np.array_equal(ar.execute(arg), y * n)
    z = np.ones((3, 2), np.float32)       # rank 0's shape differs (plain there too)
    raises_everywhere(lambda: ar.execute(z if RANK == 0 else arg), CollectiveMismatchError, "x.shape")


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name", ["AllReduce", "AllGather", "ReduceScatter", "ReduceScatterV", "Broadcast",
                                  "AllToAll"])
def test_validated_results_with_the_python_twins(name, monkeypatch):
    """Validation on without the C tests (the extension absent): the Python twins take the plain
    calls, with the golden results for every dtype and case family."""
    monkeypatch.setattr(V, "plain_header_fn", V.plain_header)
    monkeypatch.setattr(V, "plain_out_fn", V.plain_out)
    monkeypatch.setattr(V, "_first_diff_row", None)
    monkeypatch.setattr(V, "_pair_mismatch_c", None)
    monkeypatch.setattr(V, "_fill_shape_c", None)
    for dtype in CHECKS[name].dtypes:
        _check_all_cases(name, dtype, "world", validate=True)


@half
def test_plain_tests_in_c_agree_with_their_twins():
    """plain_header, plain_out, first_diff_row, pair_mismatch and fill_shape: C and Python give
    the same answers over dtypes, byte orders, layouts, shapes and tables."""
    from mpicoll._dtypes import CODE_BY_NUM
    H = _base.HALF
    tmpl = V.header(3, 12345)
    tmpl[V.H_REDUCE] = 2
    dtypes = [np.dtype(c).newbyteorder(b) for c in np.typecodes["All"] for b in "<>"]
    dtypes += [np.dtype(ml_dtypes.bfloat16), np.dtype([("a", "f4")]), np.dtype(("i4", [("lo", "i2"), ("hi", "i2")]))]
    shapes = [(), (0,), (5,), (2, 3), (2, 0, 3), (1,) * 8, (1,) * 9]
    arrays = []
    for dt in dtypes:
        for shape in shapes:
            try:
                a = np.zeros(shape, dt)
            except TypeError:
                continue
            arrays += [a, a.T, np.asfortranarray(a)]
            if a.ndim:
                arrays.append(a[::2])
    arrays += [np.ma.zeros(3), [1.0, 2.0], 3.0, None]
    for x in arrays:
        for shape_at in (V.H_SIZE, -1):
            c = H.plain_header(x, tmpl, CODE_BY_NUM, V.H_DTYPE, shape_at, V.MAX_DIMS)
            py = V.plain_header(x, tmpl, CODE_BY_NUM, V.H_DTYPE, shape_at, V.MAX_DIMS)
            assert (c is None) == (py is None), (getattr(x, "dtype", type(x)), getattr(x, "shape", None))
            if c is not None:
                assert c.tolist() == py.tolist() and c is not tmpl and tmpl[V.H_DTYPE] == 0
                h = V.header(3, 12345)
                h[V.H_REDUCE] = 2
                V.check_array("t", "x", x, 0)     # what _check_x fills, for comparison
                h[V.H_DTYPE] = V.of_array(x).code
                if shape_at >= 0:
                    V.fill_shape(h, x)
                assert c.tolist() == h.tolist()
    base = np.zeros((4, 3), np.float32)
    outs = [np.empty((4, 3), np.float32), np.empty((4, 3), ">f4"), np.empty((4, 3), np.float64), base, base[:2],
            np.empty((3, 4), np.float32), np.empty((4, 3), np.float32, order="F"), np.ma.zeros((4, 3)),
            np.empty((4, 3), np.float32)[::1], np.zeros(0, np.float32), [0.0]]
    ro = np.empty((4, 3), np.float32)
    ro.setflags(write=False)
    outs.append(ro)
    for x in (base, base[1:3], np.zeros((4, 3), ">f4"), np.zeros((4, 3), np.float32, order="F")):
        for o in outs:
            for shape in ((4, 3), (2, 3), (12,)):
                assert H.plain_out(o, x, shape) == V.plain_out(o, x, shape), (o, x.shape, shape)
    rng = np.random.default_rng(5)
    for _ in range(300):
        rows, cols = int(rng.integers(1, 6)), int(rng.integers(1, 30))
        t = np.tile(rng.integers(0, 3, cols), (rows, 1)).astype(np.int64)
        if rng.random() < 0.7:
            t[rng.integers(0, rows), rng.integers(0, cols)] += 1
        lo, hi = sorted(rng.integers(0, cols + 1, 2).tolist())
        rows_l = t.tolist()
        want = next((i for i in range(1, rows) if rows_l[i][lo:hi] != rows_l[0][lo:hi]), -1)
        assert H.first_diff_row(t, lo, hi) == want
        so, eo = int(rng.integers(0, cols)), int(rng.integers(0, cols))
        ss, es = int(rng.integers(0, 2)), int(rng.integers(0, 2))
        got = H.pair_mismatch(t, so, ss, eo, es)
        if so + (rows - 1) * ss < cols and eo + (rows - 1) * es < cols:
            assert got == V.pair_mismatch(t, so, ss, eo, es)
        else:
            assert got == -2
    assert H.first_diff_row(np.zeros((2, 3), np.int32), 0, 1) == -2
    assert H.first_diff_row(np.zeros((2, 3), np.int64), 0, 4) == -2
    assert H.pair_mismatch(np.zeros((2, 3), np.int64).T, 0, 1, 0, 1) == -2
    h = np.zeros(V.H_LEN, np.int64)
    assert H.fill_shape(h, np.zeros((1,) * 9), V.H_SIZE, V.MAX_DIMS) is False and not h.any()
    assert H.fill_shape(h[::2], np.zeros(3), V.H_SIZE, V.MAX_DIMS) is False


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("with_out", [False, True])
def test_recv_count_past_int64_on_one_rank_is_agreed(with_out):
    """A Python int recv_count >= 2**63 does not fit the header: the plain test passes it to the
    general path, whose error every rank raises (it must not raise on that rank alone)."""
    counts = np.full(n, 2)
    x = np.ones(2 * n, np.float32)
    rc = 2 ** 63 if RANK == n - 1 else 2
    kw = {"out": np.zeros(2, np.float32)} if with_out else {}
    op = P.ReduceScatterVOperation()
    assert np.array_equal(op.execute(x, counts, _packed(counts), 2, **kw), np.full(2, n, np.float32))
    raises_everywhere(lambda: op.execute(x, counts, _packed(counts), rc, **kw), CollectiveArgumentError,
                      f"on rank {n - 1}")


@pytest.mark.mpi(min_size=1)
def test_a_subclass_overriding_check_keeps_its_rules():
    """The plain closure stands in for ``_check``: a subclass with its own ``_check`` runs it."""
    class Strict(P.AllReduceOperation):
        def _check(self, args, kwargs, h):
            if args[0].size > 3:
                raise ValueError("at most 3 elements")
            return super()._check(args, kwargs, h)
    op = Strict()
    for _ in range(2):
        raises_everywhere(lambda: op.execute(np.ones(4)), CollectiveArgumentError, "at most 3 elements")
    assert "execute" not in op.__dict__
    plain = P.AllReduceOperation()
    plain.execute(np.ones(4))
    assert "execute" in plain.__dict__
    assert mpicoll.OPERATIONS["AllReduce"] is P.AllReduceOperation      # (the registry keeps the operator)
