"""Every operator x dtype x case family against its numpy golden, on the world and on comm domains
(world ranks split by parity: odd rank counts give domains of different sizes)."""
from __future__ import annotations

import numpy as np
import pytest

import mpicoll
from mpicoll._comm import LibComm
from mpicoll import _env
from mpicoll.checks import CHECKS
from mpicoll.checks._golden import SEED, count_wrong
from mpicoll.check import layouts

from _mpi import BYTES, HALF_FLOATS, INTEGERS, OPEN_MPI, RANK, SAMPLE, SIZE, WORLD, reduce_ops

PAIRS = [(name, dtype) for name, spec in CHECKS.items() for dtype in spec.dtypes]


def _check_all_cases(name, dtype, label, validate=True):
    spec = CHECKS[name]
    name_of = dict(layouts(SIZE))[label]
    dom = name_of(RANK)
    members = [r for r in range(SIZE) if name_of(r) == dom]
    n, rank = len(members), members.index(RANK)
    cases = spec.cases_for(n, dtype)
    if not cases:         # (the same on every rank of the layout: n is)
        pytest.skip(f"{name}: {spec.why_none(n, dtype)}")
    failures = []
    for case in cases:
        c = spec.make(case, dtype, dom, rank, n, SEED, validate=validate)
        got = c.execute()
        wrong = count_wrong(got, c.expected, exact=c.exact, n=n)
        if wrong:
            failures.append(f"{case}: {wrong} wrong (got {got!r:.200}, expected {c.expected!r:.200})")
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
    for dtype in CHECKS[name].dtypes:
        _check_all_cases(name, dtype, "world", validate=False)


def _layouts(x: np.ndarray) -> dict:
    """The same values as other array layouts and containers (and, for floats, in other dtypes)."""
    out = {"strided": np.repeat(x, 2, axis=-1)[..., ::2] if x.ndim else None,
           "fortran": np.asfortranarray(x) if x.ndim > 1 else None, "list": x.tolist()}
    if x.dtype.kind == "f":
        out.update({"int8": x.astype(np.int8), "float16": x.astype(np.float16)})
    return {k: v for k, v in out.items() if v is not None}


def _in_dtype(expected, dtype):
    """The golden ``expected`` (an array, a tuple of them, or None) for inputs of the same values in
    ``dtype`` (an operator whose output has its input's dtype): cast, where the cast loses nothing
    (the first cases' values are small integers)."""
    if isinstance(expected, tuple):
        return tuple(_in_dtype(e, dtype) for e in expected)
    if expected is None:
        return None
    cast = expected.astype(dtype)
    assert np.array_equal(cast.astype(expected.dtype), expected), f"the golden is not exact in {dtype}"
    return cast


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name", sorted(mpicoll.OPERATIONS))
def test_any_input_layout(name):
    """Every operator's first golden case, its x given in every layout and container: the numpy
    golden (in the dtype the layout gives, for floats also int8 and float16), validation on and off,
    twice. An operator that fills x in place (Broadcast) refuses every layout it could not fill, on
    every rank (test_errors)."""
    spec = CHECKS[name]
    if not spec.cases(SIZE):
        pytest.skip(f"{name}: {spec.why_none(SIZE)}")
    case = spec.make(spec.cases(SIZE)[0], "float32" if "float32" in spec.dtypes else spec.dtypes[0], "", RANK,
                     SIZE, SEED)
    x, rest = case.args[0], case.args[1:]
    layouts = _layouts(np.asarray(x)) if isinstance(x, np.ndarray) else {}
    # (off the root Scatter's x is None: the layouts that change the dtype run only where every rank has x)
    seen = WORLD.allgather(set(layouts))
    names = sorted(set.intersection(*seen) | (set.union(*seen) & {"strided", "fortran"}))
    cls = type(case.op)
    for layout in names:
        v = layouts.get(layout, x)
        if isinstance(v, (np.ndarray, list)) and np.asarray(v).dtype.name not in spec.dtypes:
            v = x                        # (a dtype the operator does not take: this rank keeps its x)
        if cls.WRITES_X and layout in ("strided", "fortran", "list"):
            continue                     # (test_errors: Broadcast refuses what it cannot fill)
        same = v is None or np.asarray(v).dtype == x.dtype
        want = case.expected if same else _in_dtype(case.expected, np.asarray(v).dtype)   # (the layout's dtype)
        for validate in (True, False):
            op = cls(case.op.param, validate=validate)
            for _ in range(2):
                wrong = count_wrong(op.execute(v, *rest, **case.kwargs), want, exact=case.exact, n=SIZE)
                assert wrong == 0, (name, layout, validate, wrong)


def _v_goldens(counts, displs, n):
    """numpy: what rank RANK gets from test_validation_off_v_operators_take_any_count_container's
    four calls, rank r's x being ``arange * (r + 1)``."""
    c, d = counts[RANK], displs[RANK]
    base = np.arange(sum(counts) + 2, dtype=np.float64)
    rsv = base[d:d + c] * (n * (n + 1) // 2)                                   # the sum over ranks of block RANK
    agv = np.zeros(sum(counts))
    for j in range(n):
        agv[displs[j]:displs[j] + counts[j]] = base[:counts[j]] * (j + 1)
    agv_eq = np.zeros(2 * n)
    for j in range(n):                                                          # displacements reversed
        agv_eq[2 * (n - 1 - j):2 * (n - j)] = base[:2] * (j + 1)
    vv2 = np.concatenate([base[d:d + c] * (j + 1) for j in range(n)]).reshape(1, n * c)
    return rsv, agv, agv_eq, vv2


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("kind", ["ndarray", "int32", "list", "tuple"])
@pytest.mark.parametrize("equal", [False, True], ids=["unequal", "equal"])
def test_validation_off_v_operators_take_any_count_container(kind, equal):
    """Counts as int64/int32 arrays, lists or tuples, equal (ReduceScatterV: the block call) or not,
    packed or permuted: the numpy golden, validated or not, twice."""
    P, n = mpicoll, SIZE
    conv = {"ndarray": np.array, "int32": lambda v: np.array(v, dtype=np.int32), "list": list, "tuple": tuple}[kind]
    counts = [3] * n if equal else [j + 1 for j in range(n)]
    packed = np.concatenate(([0], np.cumsum(counts)[:-1])).tolist()
    permuted = list(reversed(np.concatenate(([0], np.cumsum(counts[::-1])[:-1])).tolist()))
    x = np.arange(sum(counts) + 2, dtype=np.float64) * (RANK + 1)      # longer than the blocks: allowed
    for displs in (packed, permuted):
        want = _v_goldens(counts, displs, n)
        for v in (True, False):
            rsv = P.ReduceScatterVOperation(validate=v)
            agv = P.AllGatherVOperation(validate=v)
            vv2 = P.AllToAllVV2Operation(validate=v)
            for _ in range(2):
                got = (rsv.execute(x, conv(counts), conv(displs), counts[RANK]),
                       agv.execute(x[:counts[RANK]], counts[RANK], conv(counts), conv(displs)),
                       agv.execute(x[:2], 2, conv([2] * n), conv([2 * j for j in range(n)][::-1])),
                       vv2.execute(x, conv(counts), conv(displs), conv([counts[RANK]] * n),
                                   conv([counts[RANK] * j for j in range(n)])))
                for g, w in zip(got, want):
                    assert g.shape == w.shape and np.array_equal(g, w), (kind, displs, v, g, w)


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
@pytest.mark.parametrize("dtype,rname", [(d, r) for d in HALF_FLOATS for r in reduce_ops(d)])
def test_half_reductions_equal_the_float32_golden(dtype, rname):
    """Random data: the float32-accumulated (rank order), once-rounded result bit for bit, whatever
    the path and size."""
    from mpicoll._dtypes import DTYPES, reduce_op
    from mpicoll.checks._golden import golden_reduce, rank_data
    dt, rop = DTYPES[dtype], reduce_op(rname)
    for size in (1, 5, 1000, 40_003, 2 * 65_536):
        xs = [rank_data(SEED, f"ulp/{dtype}/{rname}/{size}", r, size, dt, "random") for r in range(SIZE)]
        got = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(reduce_type=rname)).execute(xs[RANK])
        assert count_wrong(got, golden_reduce(xs, dt, rop), exact=_env.value("MPICOLL_EXACT")) == 0, size


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
@pytest.mark.parametrize("dtype,rname", [(d, r) for d in BYTES for r in reduce_ops(d)])
def test_large_byte_allreduce_through_alltoall_matches_mpi(dtype, rname):
    """8-bit AllReduce >= 4 MiB (validation off) takes AllToAll + numpy: the same wrapping results."""
    from mpicoll._dtypes import DTYPES, reduce_op
    from mpicoll.checks._golden import golden_reduce, rank_data
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
    """From ``allreduce.pieces`` up an AllReduce runs piece by piece (here with 48-byte pieces, so small
    arrays take the path): the same results, out of place and in place, whatever the dtype's path."""
    from mpicoll._dtypes import DTYPES, reduce_op
    from mpicoll.checks._golden import golden_reduce, rank_data
    from mpicoll._thresholds import VALUES
    monkeypatch.setitem(VALUES, "allreduce.pieces", (4 * 48, 48))    # (alike on every rank: they pick the MPI calls)
    monkeypatch.setitem(VALUES, "allreduce.f32", 16)    # 16-bit floats: the AllToAll path in pieces
    monkeypatch.setitem(VALUES, "allreduce.bytes_alltoall", 8)  # 8-bit ints too
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


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", [d for d in INTEGERS if np.dtype(d).itemsize <= 4])
@pytest.mark.parametrize("n", [3, (2 << 20) + 5])
def test_integer_sum_wraps_as_mpi_does_with_validation_on_and_off(dtype, n):
    """Results never depend on MPICOLL_VALIDATE: an overflowing integer SUM wraps, bit-identical to
    MPICH's own Allreduce, on the native path and on the 8-bit AllToAll path (n >= 1 MiB). (Open MPI
    5.0's own int8/int16 SUM saturates on parts of large arrays, in its vectorised op component; there
    mpicoll's native path inherits it, and only the independence of MPICOLL_VALIDATE is checked.)"""
    from mpi4py import MPI

    from mpicoll._dtypes import DTYPES
    info = np.iinfo(dtype)
    x = np.full(n, info.max // 2 + 1 + RANK, dtype=dtype)
    raw = np.empty_like(x)
    WORLD.Allreduce([x, DTYPES[dtype].mpi], [raw, DTYPES[dtype].mpi], MPI.SUM)
    wrapped = np.full(n, sum(int(info.max // 2 + 1 + r) for r in range(SIZE)), dtype=np.int64).astype(dtype)
    on, off = (mpicoll.AllReduceOperation(validate=v).execute(x) for v in (True, False))
    assert np.array_equal(on, off)
    if not OPEN_MPI:
        assert np.array_equal(raw, wrapped) and np.array_equal(on, wrapped)
    for cls in (mpicoll.ReduceScatterOperation, mpicoll.ReduceOperation):
        y = x[:n // SIZE * SIZE] if cls is mpicoll.ReduceScatterOperation else x
        a, b = (cls(validate=v).execute(y) for v in (True, False))
        assert (a is None and b is None) or np.array_equal(a, b)


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
def test_allgatherv_equal_counts_any_layout(total_bytes):
    """Equal counts: ranks alternate between a contiguous x and a strided one, packed and permuted
    displacements, validation on and off: the same result."""
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


def _spy_calls(monkeypatch, agreements: bool = True) -> list:
    """Record the name of every MPI collective mpicoll makes on this rank: blocking, bound into a
    plan, or started (``agreements``: the calls' agreements too, else only the calls that carry data
    or do the operator's own work)."""
    log = []
    call, bind, start = LibComm.call, LibComm.bind, LibComm.start

    def keep(name, where) -> bool:
        return agreements or "agreement" not in where[2]

    def spied_call(self, name, args, timeout, where):
        if keep(name, where):
            log.append(name)
        return call(self, name, args, timeout, where)

    def spied_bind(self, name, args, timeout, where):
        bound = bind(self, name, args, timeout, where)
        return (lambda: (log.append(name), bound())) if keep(name, where) else bound

    def spied_start(self, name, args, where, by=None):
        log.append(name if isinstance(name, str) else "persistent")
        return start(self, name, args, where, by)
    monkeypatch.setattr(LibComm, "call", spied_call)
    monkeypatch.setattr(LibComm, "bind", spied_bind)
    monkeypatch.setattr(LibComm, "start", spied_start)
    return log


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("equal", [True, False], ids=["equal", "unequal"])
@pytest.mark.parametrize("validate", [True, False])
def test_v_operators_make_the_same_mpi_call_on_every_rank(equal, validate, monkeypatch):
    """Ranks alternate between a contiguous x and a strided one, and between packed and permuted
    displacements: every rank calls the same MPI collective (the block form for equal counts) and
    gets the golden result. (Blocks larger than an agreement's slot: the data moves by its own call.)"""
    log = _spy_calls(monkeypatch)
    counts = [300] * SIZE if equal else [300 * (j + 1) for j in range(SIZE)]
    packed = np.concatenate(([0], np.cumsum(counts)[:-1])).tolist()
    displs = packed if RANK % 2 == 0 else \
        list(reversed(np.concatenate(([0], np.cumsum(counts[::-1])[:-1])).tolist()))
    base = np.arange(sum(counts) + 2, dtype=np.int64) + 100 * RANK      # (integers: MPI's own reduction)
    x = base if RANK % 3 != 1 else np.repeat(base, 2)[::2]
    every = WORLD.allgather(displs)
    got = mpicoll.ReduceScatterVOperation(validate=validate).execute(x, np.array(counts), np.array(displs),
                                                                    counts[RANK])
    want = sum(np.arange(sum(counts) + 2, dtype=np.int64)[every[r][RANK]:every[r][RANK] + counts[RANK]] + 100 * r
               for r in range(SIZE))
    assert np.array_equal(got, want)
    rsv_log = list(log)
    mine = x[:counts[RANK]]
    got = mpicoll.AllGatherVOperation(validate=validate).execute(mine, counts[RANK], np.array(counts),
                                                                 np.array(displs))
    want = np.empty(sum(counts), np.int64)
    for r in range(SIZE):
        want[displs[r]:displs[r] + counts[r]] = np.arange(counts[r], dtype=np.int64) + 100 * r
    assert np.array_equal(got, want)
    logs = WORLD.allgather((rsv_log, log[len(rsv_log):]))
    assert all(entry == logs[0] for entry in logs), logs
    block = equal or SIZE == 1
    # (with validation on, the header agreement's Allgather comes first)
    assert (logs[0][0][-1], logs[0][1][-1]) == (("Reduce_scatter_block", "Allgather") if block
                                                 else ("Reduce_scatter", "Allgatherv"))


@pytest.mark.mpi(min_size=1)
def test_uniform_v_counts_take_alltoall_where_agreed(monkeypatch):
    """Uniform packed counts run Alltoall where every rank's counts are agreed: AllToAllVV2 validated
    (its counts come with each call: with validation off it makes the Alltoallv its arguments
    describe, as raw code does, and no exchange of facts), AllToAllV validated or not (its Param's
    counts, agreed by its first call), and their plans. (Blocks larger than an agreement's slot:
    the data moves by its own call.)"""
    log = _spy_calls(monkeypatch)
    n, c = SIZE, 300
    x = np.arange(n * c, dtype=np.float32) + 100 * RANK
    want = np.concatenate([np.arange(RANK * c, RANK * c + c, dtype=np.float32) + 100 * r for r in range(n)])
    plan = ([c] * n, [c * j for j in range(n)], [c] * n, [c * j for j in range(n)])
    for validate in (True, False):
        del log[:]
        op = mpicoll.AllToAllVV2Operation(validate=validate)
        for k in range(2):
            assert np.array_equal(op.execute(x, *plan).reshape(-1), want)
            assert log[-1] == ("Alltoall" if validate or k == 0 else "Alltoallv"), (validate, log)
        if not validate:                    # (its first call agreed, as an operation's first call does)
            assert log == ["Allgather", "Alltoall", "Alltoallv"], log
        v = mpicoll.AllToAllVOperation(mpicoll.AllToAllVParam(
            send_counts=plan[0], sdispls=plan[1], recv_counts=plan[2], rdispls=plan[3]), validate=validate)
        for k in range(2):
            assert np.array_equal(v.execute(x).reshape(-1), want) and log[-1] == "Alltoall"
        for o in (op, v):
            args = (x, *plan) if o is op else (x,)
            with o.prepare(*args) as p:
                seq = [] if o._lib.plain else ["Allgather"]     # (a watchdog: its sequence agreement first)
                assert [s.name for s in p._steps if s.comm is not None] == seq + ["Alltoall"]
                assert np.array_equal(p.run().reshape(-1), want)
    if SIZE > 1:                      # one rank's layout permuted: not uniform on every rank
        sd = plan[1][::-1] if RANK == 0 else plan[1]
        mpicoll.AllToAllVV2Operation().execute(np.arange(n * c, dtype=np.float32), plan[0], sd, plan[2], plan[3])
        assert log[-1] == "Alltoallv"


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name", sorted(mpicoll.OPERATIONS))
def test_validation_never_changes_the_calls_that_carry_the_data(name, monkeypatch):
    """Every registered operator, every golden case whose data does not ride its agreement: the MPI
    calls a repeat makes besides its agreement are the same with validation on and off (the facts
    an operator needs about the other ranks are agreed either way), but where the choice needs every
    rank's counts of this call (AllToAllVV2's uniform counts: Alltoall where agreed, else the
    Alltoallv its arguments describe). A validated call whose every rank's payload fits its
    agreement's slot makes that one exchange only."""
    spec = CHECKS[name]
    dtype = "float32" if "float32" in spec.dtypes else spec.dtypes[0]
    cases = spec.cases_for(SIZE, dtype)
    if not cases:
        pytest.skip(f"{name}: {spec.why_none(SIZE, dtype)}")
    log = _spy_calls(monkeypatch, agreements=False)
    compared = 0
    for case in cases:
        seen = {}
        for validate in (True, False):
            c = spec.make(case, dtype, "", RANK, SIZE, SEED, validate=validate)
            c.execute()
            del log[:]
            c.execute()                             # (a repeat: set-up done, the call remembered where it can be)
            seen[validate] = list(log)
        if seen[True]:                              # (else it rode: its agreement carried the data)
            if mpicoll.OPERATIONS[name].SLOTS and seen[True] == ["Alltoall"]:
                seen[True] = ["Alltoallv"]          # (uniform counts, agreed only where validated)
            assert seen[True] == seen[False], (case, seen)
            compared += 1
    if not compared:
        pytest.skip(f"every case of {name} at {SIZE} rank(s) rides its agreement")
@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("validate", [True, False])
@pytest.mark.parametrize("dtype", SAMPLE)
def test_nccl_tests_in_place_forms(validate, dtype):
    """In place as nccl-tests defines it: AllGather with x = out[rank], ReduceScatter with out = x's
    block rank, AllToAll with out = x; execute and plans, against the golden."""
    from mpicoll._dtypes import DTYPES, reduce_op
    from mpicoll.checks._golden import golden_reduce, rank_data
    dt, n = DTYPES[dtype], SIZE
    xs = [rank_data(SEED, f"inplace/{dtype}", r, (2 * n, 3), dt) for r in range(n)]
    for how in ("execute", "plan"):
        out = np.zeros((n, 2 * n, 3), dt.np)
        out[RANK] = xs[RANK]
        op = mpicoll.AllGatherOperation(validate=validate)
        got = op.execute(out[RANK], out=out) if how == "execute" else op.prepare(out[RANK], out=out).run()
        assert got is out and out.tobytes() == np.stack(xs).tobytes()

        x = xs[RANK].copy()
        block = x[2 * RANK:2 * RANK + 2]
        op = mpicoll.ReduceScatterOperation(validate=validate)
        got = op.execute(x, out=block) if how == "execute" else op.prepare(x, out=block).run()
        expected = golden_reduce(xs, dt, reduce_op("sum"))[2 * RANK:2 * RANK + 2]
        assert got is block and block.tobytes() == expected.tobytes()

        x = xs[RANK].copy()
        op = mpicoll.AllToAllOperation(validate=validate)
        got = op.execute(x, out=x) if how == "execute" else op.prepare(x, out=x).run()
        expected = np.concatenate([xs[j][2 * RANK:2 * RANK + 2] for j in range(n)])
        assert got is x and x.tobytes() == expected.tobytes()
    if n == 1:
        return
    # any other overlap is still refused
    x = np.ones((2 * n, 3), dt.np)
    with pytest.raises(mpicoll.CollectiveError, match="must not overlap the input"):
        mpicoll.ReduceScatterOperation(validate=validate).execute(x, out=x[1:3])     # rows 1-2: no rank's block
