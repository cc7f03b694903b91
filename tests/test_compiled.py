"""Compiled calls (mpicoll/ops/_compiled.py): a call's layout compiled once, its slots filled by
later calls. Every registered operator, every golden case: the first call, a repeat with the very
same arrays, a call with other arrays of the same layout, and one with new views of those, each
against the golden, validated and not; and the MPI calls a compiled call makes."""
from __future__ import annotations

import array
import collections

import numpy as np
import pytest

import mpicoll
from mpicoll._dtypes import DTYPES, REDUCE_OPS
from mpicoll.checks import BENCHES, CHECKS
from mpicoll.checks._golden import SEED, count_wrong
from mpicoll.checks._spec import BenchCase

from _mpi import RANK, SIZE, WORLD

NAMES = sorted(name for name in CHECKS if name in mpicoll.OPERATIONS)     # (the Hccl client runs plans)


def _remade(v, memo: dict, make):
    """``v`` (a call's arguments) with every array ``a`` replaced by ``memo[id(a)]``, made by
    ``make(a)`` the first time (the same array given twice stays one array: in place)."""
    if isinstance(v, np.ndarray):
        if id(v) not in memo:
            memo[id(v)] = make(v)
        return memo[id(v)]
    if isinstance(v, list):
        return [_remade(w, memo, make) for w in v]
    if isinstance(v, tuple):
        return tuple(_remade(w, memo, make) for w in v)
    if isinstance(v, dict):
        return {k: _remade(w, memo, make) for k, w in v.items()}
    return v


def _arrays(v, found: dict) -> dict:
    """id -> (array, a copy of its contents), for every array in ``v``."""
    if isinstance(v, np.ndarray):
        found.setdefault(id(v), (v, v.copy()))
    elif isinstance(v, (list, tuple)):
        for w in v:
            _arrays(w, found)
    elif isinstance(v, dict):
        for w in v.values():
            _arrays(w, found)
    return found


def _other(a: np.ndarray) -> np.ndarray:
    """A new array of ``a``'s layout (a strided one: a copy, another layout)."""
    return np.empty_like(a) if a.flags.c_contiguous else a.copy()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("validate", [True, False], ids=["validated", "off"])
@pytest.mark.parametrize("name", NAMES)
def test_compiled_calls_fill_other_arrays(name, validate):
    """The first call compiles; a repeat runs it again; other arrays of its layout fill its slots
    (twice: then a repeat of those); new views of them too: every result is the golden's, and an
    output the call allocates is a new array every call."""
    spec = CHECKS[name]
    dtype = "float32" if "float32" in spec.dtypes else spec.dtypes[0]
    cases = spec.cases_for(SIZE, dtype)
    if not cases:
        pytest.skip(f"{name} has no case at {SIZE} rank(s)")
    failures = []
    for case in cases:
        c = spec.make(case, dtype, "", RANK, SIZE, SEED, validate=validate)
        given = (c.args, c.kwargs)
        pristine = _arrays(given, {})
        same: dict = {}
        other: dict = {}
        views: dict = {}
        arrays = [_remade(given, same, lambda a: a), _remade(given, same, lambda a: a),
                  _remade(given, other, _other), _remade(given, other, _other),
                  _remade(given, views, lambda a: other[id(a)][...])]
        results = []
        for k, ((args, kwargs), memo) in enumerate(zip(arrays, (same, same, other, other, views))):
            for key, (first, contents) in pristine.items():     # (the inputs as the golden has them)
                if memo[key].flags.writeable:
                    np.copyto(memo[key], contents)
            got = c.op.execute(*args, **kwargs)
            wrong = count_wrong(got, c.expected, exact=c.exact, n=SIZE)
            if wrong:
                failures.append(f"{case} call {k}: {wrong} wrong (got {got!r:.120}, expected {c.expected!r:.120})")
            results.append(got)
        given_ids = {id(a) for memo in (same, other, views) for a in memo.values()}
        made = [r for r in results if isinstance(r, np.ndarray) and id(r) not in given_ids
                and not any(np.may_share_memory(r, a) for memo in (same, other, views) for a in memo.values())]
        if len({id(r) for r in made}) != len(made):
            failures.append(f"{case}: an output it allocated came back from another call")
    assert not failures, f"{name} rank {RANK}: " + "; ".join(failures)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("validate", [True, False], ids=["validated", "off"])
@pytest.mark.parametrize("name", sorted(BENCHES))
def test_one_operation_alternating_forms_of_one_layout(name, validate):
    """The bench's calls: one operation called in turn out of place and in place (``out`` a block of
    ``x``: the same dtypes, shapes and strides, but overlapping), at sizes on every path: each form
    is its own compiled call (how the arrays overlap is part of the layout), every result the
    golden's. (A fill of the in-place call's steps with arrays apart wrote the result into x.)"""
    spec = BENCHES[name]
    if spec.skip_at(SIZE):
        pytest.skip(spec.skip_at(SIZE))
    dt = DTYPES["float32" if "float32" in spec.dtypes else spec.dtypes[0]]
    comm = WORLD.Dup()
    try:
        for count in (8 * SIZE, 4096 * SIZE, 65536 * SIZE):
            c = BenchCase(count - count % spec.count_multiple(SIZE), dt,
                          REDUCE_OPS["sum"] if spec.uses_reduce else None, 0, SIZE, RANK, "", validate, comm, RANK)
            b = spec.setup(c)
            forms = [f for f in ((b.args, b.kwargs), b.inplace) if f is not None and f[0] is not None]
            for k in range(3):
                for args, kwargs in forms:
                    if b.reset is not None:
                        b.reset()
                    got = b.op.execute(*args, **kwargs)
                    assert count_wrong(got, b.expected, exact=b.exact, n=SIZE) == 0, (name, count, k, args is b.args)
            if b.close is not None:
                b.close()
    finally:
        comm.Free()


def _pool():
    """Arrays a call's arguments are drawn from: owners, views of them (whole, a block, strided),
    read-only ones, other dtypes and shapes; None and scalars."""
    a, b = np.zeros(8, np.float32), np.zeros(8, np.float32)
    ro = np.zeros(8, np.float32)
    ro.flags.writeable = False
    return [a, b, a[...], a[:4], a[4:], a[::2], b.reshape(2, 4), np.zeros(8, np.float64), ro, None, 3, 2.0, True]


@pytest.mark.mpi(min_size=1)
def test_a_layout_checked_in_place_is_the_layouts_key():
    """``of_layout`` (a call of a compiled call's layout, checked without a key) accepts exactly the
    calls whose layout key (``layout``) is its own, over every pair of argument tuples drawn from a
    pool of arrays, views, overlapping blocks, dtypes, None and scalars."""
    import itertools
    from mpicoll.ops._slots import layout
    op = mpicoll.AllGatherOperation(validate=False)
    pool = _pool()
    tuples = [t for t in itertools.product(range(len(pool)), repeat=2)]
    checked = 0
    for first in tuples:
        args = tuple(pool[i] for i in first)
        key, mine, looks = layout(args, frozenset(), frozenset())
        if key is None or not mine:
            continue
        shape = mpicoll.ops._slots.flat_shape(args, op)
        overlapping = mpicoll.ops._slots.overlaps(mine) if any(m.base is not None for m in mine) else None
        for second in tuples:
            other = tuple(pool[i] for i in second)
            k2 = layout(other, frozenset(), frozenset())[0]
            found = mpicoll.ops._slots.of_layout(other, shape, looks, overlapping)
            assert (found is not None) == (k2 == key), (first, second)
            checked += 1
    assert checked > 100


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("validate", [True, False], ids=["validated", "off"])
@pytest.mark.parametrize("kind", [np.array, list, lambda v: array.array("q", v), collections.deque],
                         ids=["ndarray", "list", "array.array", "deque"])
def test_values_changed_in_place_are_read_again(kind, validate):
    """Counts and displacements given in a container that can change in place (an array, a list, any
    iterable) and changed between two calls with the very same arguments: the second call follows
    the new values (a repeat compares their contents, not only the containers' identity)."""
    def _set(c, values):
        if isinstance(c, collections.deque):
            c.clear()
            c.extend(values)
        else:
            c[:] = type(c)("q", values) if isinstance(c, array.array) else values

    n = SIZE
    x = np.arange(4, dtype=np.float32) + 10 * RANK
    rc, rd = kind([4] * n), kind([4 * k for k in range(n)])
    out = np.zeros(4 * n, np.float32)
    gather = mpicoll.AllGatherVOperation(validate=validate)
    gather.execute(x, 4, rc, rd, out=out)
    _set(rd, [4 * (n - 1 - k) for k in range(n)])        # (the blocks in reverse rank order, in place)
    gather.execute(x, 4, rc, rd, out=out)
    want = np.concatenate([np.arange(4, dtype=np.float32) + 10 * k for k in reversed(range(n))])
    assert np.array_equal(out, want), out
    y = np.arange(2 * n, dtype=np.float32) * (RANK + 1)
    sc, sd = kind([2] * n), kind([2 * k for k in range(n)])
    block = np.zeros(2, np.float32)
    rs = mpicoll.ReduceScatterVOperation(mpicoll.ReduceScatterVParam(reduce_type="sum"), validate=validate)
    rs.execute(y, sc, sd, 2, out=block)
    _set(sd, [2 * (n - 1 - k) for k in range(n)])        # (rank j now gets the block at 2 (n - 1 - j))
    rs.execute(y, sc, sd, 2, out=block)
    j = n - 1 - RANK
    assert np.array_equal(block, np.arange(2 * j, 2 * j + 2, dtype=np.float32) * sum(range(1, n + 1))), block


def _routing(step: int, n: int, big: bool = False) -> np.ndarray:
    """``[i, j]``: how many elements rank i sends rank j at ``step`` (the same on every rank; new
    every step, some uniform, some zero, ``big`` too large to ride an agreement)."""
    rng = np.random.default_rng(SEED + step)
    if step % 3 == 2:
        return np.full((n, n), 3 if not big else 700, np.int64)
    return rng.integers(0, 5 if not big else 900, (n, n))


def _exchange(op, step: int, n: int, big: bool = False, out=None):
    route = _routing(step, n, big)
    sc, rc = route[RANK], route[:, RANK]
    x = np.zeros(900 * n, np.float32)            # (of a fixed capacity, as a MoE layer's tokens)
    blocks = np.concatenate([1000 * RANK + 100 * j + np.arange(c, dtype=np.float32) for j, c in enumerate(sc)])
    x[:blocks.size] = blocks
    sd, rd = np.concatenate([[0], np.cumsum(sc)[:-1]]), np.concatenate([[0], np.cumsum(rc)[:-1]])
    got = op.execute(x, sc, sd, rc, rd, out=out)
    want = np.concatenate([1000 * i + 100 * RANK + np.arange(c, dtype=np.float32) for i, c in enumerate(rc)])
    return got, want, (x, sc, sd, rc, rd)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("validate", [True, False], ids=["validated", "off"])
def test_alltoallvv2_counts_are_the_slots_of_one_compiled_call(validate):
    """AllToAllVV2 with new counts every call (a MoE layer's routing: uniform ones, zeros, blocks
    too large to ride the agreement between small ones): every call against the golden, all of
    them run by one compiled call (``Slotted``: its counts are slots, never a new layout)."""
    n = SIZE
    op = mpicoll.AllToAllVV2Operation(validate=validate)
    for step in range(9):
        got, want, _ = _exchange(op, step, n, big=step in (4, 5))
        assert got.shape == (1, want.size) and np.array_equal(got.ravel(), want), (step, got, want)
    slotted = op._last
    assert type(slotted).__name__ == "Slotted"
    route = _routing(9, n)
    out = np.full((1, int(route[:, RANK].sum())), -1, np.float32)
    got, want, _ = _exchange(op, 9, n, out=out)            # (a given output: the same compiled call)
    assert got is out and np.array_equal(out.ravel(), want)
    assert op._last is slotted


@pytest.mark.mpi(min_size=1)
def test_alltoallvv2_compiled_errors_are_raised_on_every_rank_and_the_next_call_runs():
    """A compiled AllToAllVV2 (validated) whose counts break a rule: a count pair that does not
    match (rank 0 expects one element more from the last rank), a negative count on the last rank
    only, and another dtype on the last rank only: every rank raises the same error, naming the
    parameter; the next valid call runs."""
    n = SIZE
    op = mpicoll.AllToAllVV2Operation(validate=True)
    for step in range(3):
        got, want, _ = _exchange(op, step, n)
        assert np.array_equal(got.ravel(), want)
    route = _routing(3, n)
    sc, rc = route[RANK].copy(), route[:, RANK].copy()
    if RANK == 0:
        rc[n - 1] += 1
    x = np.zeros(int(sc.sum()), np.float32)
    sd, rd = np.concatenate([[0], np.cumsum(sc)[:-1]]), np.concatenate([[0], np.cumsum(rc)[:-1]])
    with pytest.raises(mpicoll.CollectiveMismatchError, match=rf"recv_counts\[{n - 1}\]"):
        op.execute(x, sc, sd, rc, rd)
    sc = route[RANK].copy()
    if RANK == n - 1:
        sc[0] = -1
    with pytest.raises(mpicoll.CollectiveArgumentError, match=rf"send_counts\[0\]=-1 on rank {n - 1}"):
        op.execute(x, sc, sd, route[:, RANK], rd)
    if n > 1:                                              # (another dtype on the last rank only)
        y = x.astype(np.float64) if RANK == n - 1 else x
        with pytest.raises(mpicoll.CollectiveMismatchError, match="dtype"):
            op.execute(y, route[RANK], np.concatenate([[0], np.cumsum(route[RANK])[:-1]]), route[:, RANK],
                       np.concatenate([[0], np.cumsum(route[:, RANK])[:-1]]))
    got, want, _ = _exchange(op, 4, n)
    assert np.array_equal(got.ravel(), want)
    assert type(op._last).__name__ == "Slotted"


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("validate", [True, False], ids=["validated", "off"])
def test_alltoallvv2_counts_given_as_iterators_are_read_once(validate):
    """Counts given as iterators (``any iterable, read once``) to a compiled AllToAllVV2: a valid
    call of another dtype runs (its compiled call described it, and handed that to the pipeline,
    which compiles it again: it is not described twice); a bad rdispls on the last rank is named
    as rdispls on every rank (not send_counts, read empty by a second describe)."""
    n = SIZE
    op = mpicoll.AllToAllVV2Operation(validate=validate)
    c, d = [1] * n, list(range(n))
    op.execute(np.arange(n, dtype=np.float32), c, d, c, d)
    got = op.execute(np.arange(n, dtype=np.float64), iter(c), iter(d), iter(c), iter(d))
    assert got.dtype == np.float64 and np.array_equal(got.ravel(), np.full(n, RANK, np.float64))
    if not validate:
        return                                  # (an error is agreed only where calls agree)
    bad = [-1] + d[1:] if RANK == n - 1 else d
    with pytest.raises(mpicoll.CollectiveArgumentError, match=rf"rdispls\[0\]=-1 on rank {n - 1}"):
        op.execute(np.arange(n, dtype=np.float64), iter(c), iter(d), iter(c), iter(bad))
