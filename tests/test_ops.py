"""Every operator x dtype x case family against its numpy golden, on the world and on comm domains
(world ranks split by parity: odd rank counts give domains of different sizes)."""
from __future__ import annotations

import numpy as np
import pytest

import mpicoll
from mpicoll._golden import CHECKS, SEED, count_wrong
from mpicoll.check import layouts

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
@pytest.mark.parametrize("name", list(CHECKS))
def test_validation_off_same_results(name):
    for dtype in ("int8", "float16", "bfloat16", "float64"):
        _check_all_cases(name, dtype, "world", validate=False)


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
