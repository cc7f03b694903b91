"""Every operator x dtype x case family against its numpy golden, on the world and on comm domains
(world ranks split by parity: odd rank counts give domains of different sizes)."""
from __future__ import annotations

import numpy as np
import pytest

import mpicoll
from mpicoll._golden import CHECKS, SEED, count_wrong
from mpicoll.check import layouts
from mpicoll.ops import _base

from _mpi import RANK, SIZE, WORLD

PAIRS = [(name, dtype) for name, spec in CHECKS.items() for dtype in spec.dtypes]


def _check_all_cases(name, dtype, label, validate=True):
    spec = CHECKS[name]
    name_of = dict(layouts(SIZE))[label]
    dom = name_of(RANK)
    members = [r for r in range(SIZE) if name_of(r) == dom]
    n, rank = len(members), members.index(RANK)
    failures = []
    for case in spec.cases(n):
        got, expected, exact = spec.run(case, dtype, dom, rank, n, SEED, validate=validate)
        wrong = count_wrong(got, expected, exact=exact, n=n)
        if wrong:
            failures.append(f"{case}: {wrong} wrong of {expected.size} (got {got!r:.200}, expected {expected!r:.200})")
    assert not failures, f"{name} {dtype} on {label} rank {RANK}: " + "; ".join(failures)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name,dtype", PAIRS)
def test_world(name, dtype):
    _check_all_cases(name, dtype, "world")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("name,dtype", PAIRS)
def test_split_domains(name, dtype):
    _check_all_cases(name, dtype, "split")


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("c_entry", [True, False], ids=["c", "python"])
@pytest.mark.parametrize("name", list(CHECKS))
def test_validation_off_same_results(name, c_entry, monkeypatch):
    # every dtype: the validation-off fast paths dispatch on the dtype (MPI_BY_NUM / NATIVE_MPI_BY_NUM),
    # through the C entry test or, without the extension, its Python twin (read when the op binds)
    if not c_entry:
        monkeypatch.setattr(_base, "HALF", None)
    elif _base.HALF is None:
        pytest.skip("the optional _half extension is not built")
    for dtype in CHECKS[name].dtypes:
        _check_all_cases(name, dtype, "world", validate=False)


def _x_only_calls():
    """(name, make op, call) for the operators whose execute takes x alone: their validation-off
    closures must hand every input they do not take (non-contiguous, Fortran-ordered, a list, a
    Python scalar type) to the general path, with the same results as validation on."""
    P = mpicoll
    n = SIZE
    plan = dict(send_counts=[3] * n, sdispls=[3 * j for j in range(n)], recv_counts=[3] * n,
                rdispls=[3 * j for j in range(n)])
    return [
        ("AllReduce", lambda v: P.AllReduceOperation(validate=v), lambda op, x: op.execute(x)),
        ("AllReduce-inplace", lambda v: P.AllReduceOperation(validate=v),
         lambda op, x: op.execute(*(lambda c: (c, c))(np.array(x)))),
        ("AllGather", lambda v: P.AllGatherOperation(validate=v), lambda op, x: op.execute(x)),
        ("ReduceScatter", lambda v: P.ReduceScatterOperation(validate=v), lambda op, x: op.execute(x)),
        ("AllToAll", lambda v: P.AllToAllOperation(validate=v), lambda op, x: op.execute(x)),
        ("AllToAllV", lambda v: P.AllToAllVOperation(P.AllToAllVParam(**plan), validate=v), lambda op, x: op.execute(x)),
        ("Broadcast", lambda v: P.BroadcastOperation(validate=v), lambda op, x: op.execute(np.array(x))),
    ]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name,make,call", _x_only_calls(), ids=[c[0] for c in _x_only_calls()])
@pytest.mark.parametrize("layout", ["contiguous", "strided", "fortran", "list", "int8", "float16"])
def test_validation_off_fast_path_hands_over_what_it_does_not_take(name, make, call, layout):
    base = (np.arange(SIZE * 3 * 2, dtype=np.float32).reshape(SIZE * 3, 2) + RANK)
    x = {"contiguous": base, "strided": np.repeat(base, 2, axis=1)[:, ::2], "fortran": np.asfortranarray(base),
         "list": base.tolist(), "int8": base.astype(np.int8), "float16": base.astype(np.float16)}[layout]
    if layout == "strided":
        assert not x.flags.c_contiguous
    if name.endswith("inplace") and layout in ("strided", "fortran", "list"):
        pytest.skip("out=x must be C-contiguous (validation on refuses it; off, as in raw MPI, it is the caller's)")
    if name == "Broadcast" and layout in ("strided", "fortran"):
        pytest.skip("x is filled in place: a non-contiguous x is refused (test_errors)")
    want = call(make(True), np.ascontiguousarray(x))
    off = make(False)
    for _ in range(2):                       # the first call binds; the second runs the closure
        got = call(off, x)
        assert got.shape == want.shape and got.dtype == want.dtype and np.array_equal(got, want), (name, layout)
    if layout == "contiguous":
        assert off.execute is not off._run  # the closure is in place


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("kind", ["ndarray", "int32", "list", "tuple"])
@pytest.mark.parametrize("equal", [False, True], ids=["unequal", "equal"])
def test_validation_off_v_operators_take_any_count_container(kind, equal):
    """Counts as int64/int32 arrays, lists or tuples, equal (ReduceScatterV: the block call) or not,
    packed or permuted: the same results as validated."""
    P, n = mpicoll, SIZE
    conv = {"ndarray": np.array, "int32": lambda v: np.array(v, dtype=np.int32), "list": list, "tuple": tuple}[kind]
    counts = [3] * n if equal else [j + 1 for j in range(n)]
    packed = np.concatenate(([0], np.cumsum(counts)[:-1])).tolist()
    permuted = list(reversed(np.concatenate(([0], np.cumsum(counts[::-1])[:-1])).tolist()))
    x = np.arange(sum(counts) + 2, dtype=np.float64) * (RANK + 1)      # longer than the blocks: allowed
    for displs in (packed, permuted):
        for v in (True, False):
            rsv = P.ReduceScatterVOperation(validate=v)
            got = [rsv.execute(x, conv(counts), conv(displs), counts[RANK]) for _ in range(2)]
            agv = P.AllGatherVOperation(validate=v)
            mine = x[:counts[RANK]]
            got += [agv.execute(mine, counts[RANK], conv(counts), conv(displs)) for _ in range(2)]
            eq = np.full(n, 2).tolist()
            got += [agv.execute(x[:2], 2, conv(eq), conv([2 * j for j in range(n)][::-1])) for _ in range(2)]
            vv2 = P.AllToAllVV2Operation(validate=v)
            got += [vv2.execute(x, conv(counts), conv(displs), conv([counts[RANK]] * n),
                                conv([counts[RANK] * j for j in range(n)])) for _ in range(2)]
            if v:
                want = got
            else:
                for a, b in zip(got, want):
                    assert np.array_equal(a, b), (kind, displs)


@pytest.mark.mpi(min_size=1)
def test_user_comm_is_duplicated_and_works():
    """A user comm (here a split of the world, reversed order) works and is not used directly."""
    user = WORLD.Split(0, SIZE - 1 - RANK)
    op = mpicoll.AllGatherOperation(mpicoll.AllGatherParam(comm=user))
    got = op.execute(np.array([RANK], dtype=np.int32))
    assert got.reshape(-1).tolist() == list(range(SIZE))[::-1]
    assert op.comm != user and op.comm.Compare(user) == mpicoll._domains.MPI.CONGRUENT
    # the duplicate is cached on the user comm: a second op reuses it
    assert mpicoll.AllGatherOperation(mpicoll.AllGatherParam(comm=user)).execute(np.zeros(1)).shape == (SIZE, 1)
    user.Free()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("rname", ["sum", "prod", "max", "min"])
def test_half_reductions_within_one_ulp_of_float32_golden(dtype, rname):
    """Random data: the float32-accumulated, once-rounded result, whatever the path and size."""
    from mpicoll._dtypes import DTYPES, reduce_op
    from mpicoll._golden import golden_reduce, rank_data
    dt, rop = DTYPES[dtype], reduce_op(rname)
    for size in (1, 5, 1000, 40_003, 2 * 65_536):
        xs = [rank_data(SEED, f"ulp/{dtype}/{rname}/{size}", r, size, dt, "random") for r in range(SIZE)]
        got = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(reduce_type=rname)).execute(xs[RANK])
        assert count_wrong(got, golden_reduce(xs, dt, rop), exact=False) == 0, size


@pytest.mark.mpi(min_size=1)
@pytest.mark.timeout_s(300)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_allreduce_64mib(dtype):
    """The largest size the spec names: 64 MiB per rank, integer-valued so any order is exact."""
    n = 64 * 2**20 // np.dtype(dtype).itemsize
    x = np.full(n, RANK + 1, dtype=dtype)
    x[::7] = -RANK
    got = mpicoll.AllReduceOperation(mpicoll.AllReduceParam()).execute(x)
    expected = np.full(n, SIZE * (SIZE + 1) // 2, dtype=dtype)
    expected[::7] = -SIZE * (SIZE - 1) // 2
    assert np.array_equal(got, expected)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", ["int8", "uint8"])
@pytest.mark.parametrize("rname", ["sum", "prod", "max", "min"])
def test_large_byte_allreduce_through_alltoall_matches_mpi(dtype, rname):
    """8-bit AllReduce >= 4 MiB (validation off) takes AllToAll + numpy: the same wrapping results."""
    from mpicoll._dtypes import DTYPES, reduce_op
    from mpicoll._golden import golden_reduce, rank_data
    n = (4 << 20) + 3
    xs = [rank_data(SEED, f"byte/{dtype}/{rname}", r, n, DTYPES[dtype]) * 20 for r in range(SIZE)]
    xs = [x.astype(dtype) for x in xs]
    op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(reduce_type=rname), validate=False)
    got = op.execute(xs[RANK])
    with np.errstate(over="ignore"):
        expected = golden_reduce(xs, DTYPES[dtype], reduce_op(rname))
    assert np.array_equal(got, expected)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", mpicoll.ALL_DTYPES)
def test_large_allreduce_in_pieces(monkeypatch, dtype):
    """From PIECED_BYTES up an AllReduce runs piece by piece (here with 48-byte pieces, so small
    arrays take the path): the same results, out of place and in place, whatever the dtype's path."""
    from mpicoll._dtypes import DTYPES, reduce_op
    from mpicoll._golden import golden_reduce, rank_data
    from mpicoll.ops import allreduce
    monkeypatch.setattr(allreduce, "PIECE_BYTES", 48)
    monkeypatch.setattr(allreduce, "PIECED_BYTES", 4 * 48)
    monkeypatch.setattr(allreduce, "SMALL_F32_BYTES", 16)    # 16-bit floats: the AllToAll path in pieces
    monkeypatch.setattr(allreduce, "BYTE_ALLTOALL_BYTES", 8)  # 8-bit ints too
    dt = DTYPES[dtype]
    for rname in ("sum", "max"):
        for shape in ((7, 31), (1000,)):
            xs = [rank_data(SEED, f"pieces/{dtype}/{rname}/{shape}", r, shape, dt) for r in range(SIZE)]
            expected = golden_reduce(xs, dt, reduce_op(rname))
            op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(reduce_type=rname), validate=False)
            assert np.array_equal(op.execute(xs[RANK]).view(np.uint8), expected.view(np.uint8)), (rname, shape)
            x = xs[RANK].copy()
            assert op.execute(x, out=x) is x and np.array_equal(x.view(np.uint8), expected.view(np.uint8))
            checked = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(reduce_type=rname))   # validation on
            assert np.array_equal(checked.execute(xs[RANK]).view(np.uint8), expected.view(np.uint8))


@pytest.mark.mpi(min_size=2)
def test_checked_sum_overflow_in_a_late_piece_leaves_out_untouched(monkeypatch):
    from mpicoll.ops import allreduce
    monkeypatch.setattr(allreduce, "PIECE_BYTES", 16)
    monkeypatch.setattr(allreduce, "PIECED_BYTES", 64)
    x = np.ones(100, np.int8)
    x[90] = 100                                   # 100 * SIZE > 127 from 2 ranks up: element 90 overflows
    out = np.full(100, 7, np.int8)
    with pytest.raises(mpicoll.CollectiveArgumentError, match="element 90 sums to"):
        mpicoll.AllReduceOperation().execute(x, out=out)
    assert (out == 7).all()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("validate", [True, False])
def test_reduce_scatter_v_counts_as_any_iterable(validate):
    """send_counts / sdispls as iterators (read once) on both paths, contiguous and strided x."""
    op = mpicoll.ReduceScatterVOperation(validate=validate)
    for counts in ([2] * SIZE, [j + 1 for j in range(SIZE)]):
        displs = np.concatenate(([0], np.cumsum(counts)[:-1])).tolist()
        base = np.arange(sum(counts), dtype=np.float64)
        want = SIZE * base[displs[RANK]:displs[RANK] + counts[RANK]] + sum(range(SIZE))
        for x in (base + RANK, np.repeat(base + RANK, 2)[::2]):
            got = op.execute(x, iter(counts), iter(displs), counts[RANK])
            assert np.array_equal(got, want), (counts, got)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("validate", [True, False])
def test_allgatherv_counts_as_any_iterable(validate):
    """recv_counts / rdispls as generators (read once) on both paths, equal and unequal counts."""
    op = mpicoll.AllGatherVOperation(validate=validate)
    for counts in ([2] * SIZE, [j + 1 for j in range(SIZE)]):
        displs = np.concatenate(([0], np.cumsum(counts)[:-1])).tolist()
        want = np.concatenate([np.arange(counts[i], dtype=np.float32) + 10 * i for i in range(SIZE)])
        for _ in range(2):
            got = op.execute(np.arange(counts[RANK], dtype=np.float32) + 10 * RANK, counts[RANK],
                             (c for c in counts), iter(displs))
            assert np.array_equal(got, want), (counts, got)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("total_bytes", [64, 1 << 20])
def test_allgatherv_equal_counts_closure_and_general_path_meet(total_bytes):
    """Equal counts: ranks alternate between a contiguous x (validation off: the closure) and a
    strided one (``_run``), packed and permuted; both make the same MPI call (Allgather), with the
    same result as validated."""
    c = max(total_bytes // 8 // SIZE, 1)
    counts = [c] * SIZE
    packed = [c * j for j in range(SIZE)]
    want_rows = [np.arange(c, dtype=np.float64) + 1000 * r for r in range(SIZE)]
    mine = want_rows[RANK]
    x = mine if RANK % 2 == 0 else np.repeat(mine, 2)[::2]
    for displs in (packed, packed[::-1]):
        want = np.empty(c * SIZE)
        for r in range(SIZE):
            want[displs[r]:displs[r] + c] = want_rows[r]
        for validate in (True, False):
            op = mpicoll.AllGatherVOperation(validate=validate)
            for _ in range(2):
                got = op.execute(x, c, np.array(counts), np.array(displs))
                assert np.array_equal(got, want), (validate, displs)


class _Spy:
    """A communicator stand-in that records which collective the operation calls."""

    CALLS = ("Reduce_scatter", "Reduce_scatter_block", "Allgather", "Allgatherv")

    def __init__(self, comm):
        self._comm, self.log = comm, []

    def __getattr__(self, name):
        attr = getattr(self._comm, name)
        if name not in self.CALLS:
            return attr

        def call(*args):
            self.log.append(name)
            return attr(*args)
        return call


def _spied(cls, validate):
    op = cls(validate=True)
    op._bind()
    op.comm = _Spy(op.comm)
    op.validate = validate          # (re)builds the validation-off closure over the spy's methods
    return op


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("equal", [True, False], ids=["equal", "unequal"])
@pytest.mark.parametrize("validate", [True, False])
def test_v_operators_make_the_same_mpi_call_on_every_rank(equal, validate):
    """Ranks alternate between a contiguous x (the validation-off closure) and a strided one (the
    general path), and between packed and permuted displacements: every rank calls the same MPI
    collective (the block form for equal counts) and gets the golden result."""
    counts = [3] * SIZE if equal else [j + 1 for j in range(SIZE)]
    packed = np.concatenate(([0], np.cumsum(counts)[:-1])).tolist()
    displs = packed if RANK % 2 == 0 else \
        list(reversed(np.concatenate(([0], np.cumsum(counts[::-1])[:-1])).tolist()))
    base = np.arange(sum(counts) + 2, dtype=np.float64) + 100 * RANK
    x = base if RANK % 3 != 1 else np.repeat(base, 2)[::2]
    every = WORLD.allgather(displs)
    rsv = _spied(mpicoll.ReduceScatterVOperation, validate)
    got = rsv.execute(x, np.array(counts), np.array(displs), counts[RANK])
    want = sum(np.arange(sum(counts) + 2, dtype=np.float64)[every[r][RANK]:every[r][RANK] + counts[RANK]] + 100 * r
               for r in range(SIZE))
    assert np.array_equal(got, want)
    agv = _spied(mpicoll.AllGatherVOperation, validate)
    mine = x[:counts[RANK]]
    got = agv.execute(mine, counts[RANK], np.array(counts), np.array(displs))
    want = np.empty(sum(counts))
    for r in range(SIZE):
        want[displs[r]:displs[r] + counts[r]] = np.arange(counts[r], dtype=np.float64) + 100 * r
    assert np.array_equal(got, want)
    logs = WORLD.allgather((rsv.comm.log, agv.comm.log))
    assert all(log == logs[0] for log in logs), logs
    block = equal or SIZE == 1
    # (with validation on, the header agreement's Allgather comes first)
    assert (logs[0][0][-1], logs[0][1][-1]) == (("Reduce_scatter_block", "Allgather") if block
                                                 else ("Reduce_scatter", "Allgatherv"))
