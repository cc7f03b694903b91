"""Bad input on one rank, and cross-rank mismatches: the same CollectiveError on every rank, before
any data moves, naming the op, the parameter, the value, the rank and the rule; never a hang."""
from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest

import mpicoll
from mpicoll import CollectiveArgumentError, CollectiveError, CollectiveMismatchError
from mpicoll._dtypes import DTYPES
from mpicoll.checks import CHECKS
from mpicoll.checks._golden import SEED

from _mpi import RANK, SIZE, WORLD, raises_everywhere, setting

mpi1 = pytest.mark.mpi(min_size=1)
mpi2 = pytest.mark.mpi(min_size=2)


def _v2(plan_of_rank, x=None, **kw):
    """Run AllToAllVV2 with rank-specific plans (a function rank -> (sc, sd, rc, rd))."""
    sc, sd, rc, rd = plan_of_rank(RANK)
    x = np.arange(64, dtype=np.float32) if x is None else x
    return mpicoll.AllToAllVV2Operation(mpicoll.AllToAllVV2Param(), **kw).execute(x, sc, sd, rc, rd)


def _ones(rank):
    return [1] * SIZE, list(range(SIZE)), [1] * SIZE, list(range(SIZE))


def test_errors_are_value_errors_and_collective_errors():
    assert issubclass(CollectiveArgumentError, ValueError)
    assert issubclass(CollectiveMismatchError, CollectiveError)


@mpi2
def test_negative_count_on_one_rank():
    def plan(r):
        sc, sd, rc, rd = _ones(r)
        if r == 1:
            sc[0] = -1
        return sc, sd, rc, rd
    msg = raises_everywhere(lambda: _v2(plan), CollectiveArgumentError, "AllToAllVV2", "send_counts[0]=-1",
                            "rank 1", ">= 0")
    assert mpicoll.AllReduceOperation().execute(np.ones(3)).tolist() == [SIZE] * 3, msg  # still usable


@mpi2
@pytest.mark.parametrize("direction", ["expects_more", "expects_fewer"])
def test_alltoallv_cross_rank_count_mismatch(direction):
    def plan(r):
        sc, sd, rc, rd = _ones(r)
        if r == 0:  # rank 0 expects 2 (or 0) elements from rank 1, which sends 1
            rc[1] = 2 if direction == "expects_more" else 0
            rd = list(np.concatenate(([0], np.cumsum(rc)[:-1])))
        return sc, sd, rc, rd
    raises_everywhere(lambda: _v2(plan), CollectiveMismatchError, "AllToAllVV2", "recv_counts[1]=",
                      "on rank 0", "rank 1 has send_counts[0]=1")


@mpi2
def test_allgatherv_mismatch():
    x = np.arange(10, dtype=np.int16)
    send_count = 3 if RANK == 1 else 2
    recv = [2] * SIZE
    disp = [2 * i for i in range(SIZE)]
    raises_everywhere(lambda: mpicoll.AllGatherVOperation().execute(x, send_count, recv, disp),
                      CollectiveMismatchError, "AllGatherV", "recv_counts[1]=2", "rank 1 has send_count=3")


@mpi2
def test_reducescatterv_mismatch():
    x = np.ones(10, dtype=np.float32)
    sc = [2] * SIZE
    recv = 3 if RANK == 1 else 2
    raises_everywhere(lambda: mpicoll.ReduceScatterVOperation().execute(x, sc, [2 * i for i in range(SIZE)], recv),
                      CollectiveMismatchError, "ReduceScatterV", "recv_count=3 on rank 1", "send_counts[1]=2")


def _valid_call(opname, dtype=np.float32):
    """A call of ``opname`` that is valid on its own on every rank (x of ``dtype``): the first
    golden case of its check spec (every registered operator has one)."""
    spec = CHECKS[opname]
    name = next((d for d in spec.dtypes if DTYPES[d].np == np.dtype(dtype)), spec.dtypes[0])
    cases = spec.cases_for(SIZE, name)
    if not cases:
        pytest.skip(f"{opname}: {spec.why_none(SIZE, name)}")
    case = spec.make(cases[0], name, "", RANK, SIZE, SEED)
    case.op._bind()                  # (on every rank: binding may form domains, with every member)
    return case.execute


ALL_OPS = sorted(mpicoll.OPERATIONS)


def _case_of(opname, dtype="float32", want=None):
    """The first golden case of ``opname`` (in ``dtype`` if it takes it) that ``want(case of the
    last rank)`` accepts, built for this rank; the same choice on every rank (each rebuilds the
    last rank's case), or None."""
    spec = CHECKS[opname]
    name = dtype if dtype in spec.dtypes else spec.dtypes[0]
    for case in spec.cases_for(SIZE, name):
        if want is None or want(spec.make(case, name, "", SIZE - 1, SIZE, SEED)):
            return spec.make(case, name, "", RANK, SIZE, SEED)
    return None


def _describes_a_shape(c) -> bool:
    """Whether the operator's header carries a shape (the V operators' do not: counts instead)."""
    c.op._bind()
    return c.op.describe(*c.args, **c.kwargs).shape is not None


def _doubled(a):
    return np.concatenate([a, a]) if isinstance(a, np.ndarray) and a.ndim else a


@mpi2
@pytest.mark.parametrize("opname", [o for o in ALL_OPS if len(CHECKS[o].dtypes) > 1])
def test_dtype_differs_on_one_rank(opname):
    dtypes = CHECKS[opname].dtypes
    a, b = ("float32", "float64") if {"float32", "float64"} <= set(dtypes) else dtypes[:2]
    call = _valid_call(opname, np.dtype(DTYPES[b if RANK == 1 else a].np))
    raises_everywhere(call, CollectiveMismatchError, f"{opname}: dtype differs across ranks",
                      f"{a} on rank{'s' if SIZE > 2 else ''} {[r for r in range(SIZE) if r != 1] if SIZE > 2 else 0}",
                      f"{b} on rank 1")


@mpi2
@pytest.mark.parametrize("opname", ALL_OPS)
def test_shape_differs_on_one_rank(opname):
    """Every array argument of the last rank doubled along dim 0: every operator whose header
    carries a shape names it (the V operators check counts instead: test_v_operator_bad_counts...)."""
    c = _case_of(opname, want=lambda last: any(isinstance(a, np.ndarray) and a.ndim and a.size for a in last.args))
    if c is None or not _describes_a_shape(c):
        pytest.skip(f"{opname} agrees counts, not a shape")
    args, kwargs = c.args, c.kwargs
    if RANK == SIZE - 1:
        args, kwargs = tuple(_doubled(a) for a in args), {k: _doubled(v) for k, v in kwargs.items()}
    raises_everywhere(lambda: c.op.execute(*args, **kwargs), CollectiveMismatchError, opname, "shape",
                      f"on rank {SIZE - 1}")


REDUCE_OPS = [o for o in ALL_OPS if "reduce_type" in {f.name for f in dataclasses.fields(mpicoll.OPERATIONS[o].PARAM)}]


@mpi2
@pytest.mark.parametrize("opname", REDUCE_OPS)
def test_reduce_type_differs(opname):
    c = _case_of(opname)
    param = dataclasses.replace(c.op.param, reduce_type="max" if RANK == 1 else "sum")
    op = type(c.op)(param)
    raises_everywhere(lambda: op.execute(*c.args, **c.kwargs), CollectiveMismatchError,
                      f"{opname}: reduce_type differs across ranks", "'sum' on rank", "'max' on rank 1")


@mpi2
def test_root_differs():
    p = mpicoll.BroadcastParam(rank_root=1 if RANK == 1 else 0)
    x = np.full(4, RANK, dtype=np.int64)
    raises_everywhere(lambda: mpicoll.BroadcastOperation(p).execute(x), CollectiveMismatchError, "rank_root",
                      "0 on rank", "1 on rank 1")
    assert x.tolist() == [RANK] * 4  # nothing moved


@mpi2
def test_different_operators_on_different_ranks():
    x = np.ones(2 * SIZE, dtype=np.float32)
    op = mpicoll.AllGatherOperation() if RANK == 1 else mpicoll.AllReduceOperation()
    others = [r for r in range(SIZE) if r != 1]
    raises_everywhere(lambda: op.execute(x), CollectiveMismatchError, "AllReduce vs AllGather: operation differs",
                      f"AllReduce on rank{'s' if len(others) > 1 else ''} {others if len(others) > 1 else 0}",
                      "AllGather on rank 1", "every rank must call the same collective")


@mpi2
@pytest.mark.parametrize("other", [o for o in ALL_OPS if o != "AllReduce"])
def test_every_operator_against_another(other):
    """The last rank calls ``other`` (V operators and QuantAllReduce included), the rest AllReduce:
    every header has the same length, so they meet in one Allgather and are told apart."""
    last = SIZE - 1
    mine, theirs = _valid_call(other), _valid_call("AllReduce")        # (both bound on every rank)
    call = mine if RANK == last else theirs
    raises_everywhere(call, CollectiveMismatchError, f"AllReduce vs {other}: operation differs across ranks",
                      "AllReduce on rank", f"{other} on rank {last}", "every rank must call the same")
    assert _valid_call("AllReduce")() is not None      # still in step


@mpi1
@pytest.mark.parametrize("field,value,fragment", [
    ("rank", 99, "rank=99"), ("rank_size", 0, "cannot be 0"), ("rank_size", 99, "rank_size=99"),
    ("rank_root", -1, "rank_root=-1"), ("backend", "gloo", "backend='gloo'"), ("reduce_type", "median", "'median'")])
def test_bad_param_on_last_rank(field, value, fragment):
    kwargs = {field: value} if RANK == SIZE - 1 else {}
    op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(**kwargs))
    raises_everywhere(lambda: op.execute(np.ones(3)), CollectiveArgumentError, "AllReduce", fragment,
                      f"rank {SIZE - 1}")


@mpi1
def test_multi_thread_mode_needs_a_user_comm():
    op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm_mode=mpicoll.CommMode.MULTI_THREAD))
    raises_everywhere(lambda: op.execute(np.ones(3)), CollectiveArgumentError, "comm_mode", "user comm")


@mpi1
@pytest.mark.parametrize("case,fragment", [
    ("not_divisible", "must be divisible by rank_size"), ("unsupported_dtype", "unsupported"),
    ("not_array", "x.dtype='object'"), ("out_alias", "must not overlap")])
def test_local_bad_input_on_last_rank(case, fragment):
    if case == "not_divisible" and SIZE == 1:
        pytest.skip("every length divides by 1")
    x = np.ones(2 * SIZE, dtype=np.float32)
    out = None
    if RANK == SIZE - 1:
        if case == "not_divisible":
            x = np.ones(2 * SIZE + 1, dtype=np.float32)
        elif case == "unsupported_dtype":
            x = np.ones(2 * SIZE, dtype=np.complex64)
        elif case == "not_array":
            x = object()
        else:                          # (out=x itself is the in-place form; a shifted view overlaps)
            buf = np.ones(2 * SIZE + 1, dtype=np.float32)
            x, out = buf[:2 * SIZE], buf[1:]
    op = mpicoll.AllToAllOperation()
    raises_everywhere(lambda: op.execute(x, out=out), CollectiveArgumentError, "AllToAll", fragment,
                      f"rank {SIZE - 1}")


@mpi1
@pytest.mark.parametrize("change,fragment", [
    (lambda p: p[0].__setitem__(0, p[0][0] + 100), "must be <= x.size"),
    (lambda p: p[3].__setitem__(0, 10_000), "must be <= sum(recv_counts)"),
    (lambda p: p.__setitem__(0, p[0][:-1]), "exactly rank_size"),
    (lambda p: p.__setitem__(1, [0.5] * SIZE), "integers"),
])
def test_alltoallv_plan_out_of_range_on_last_rank(change, fragment):
    def plan(r):
        p = [list(v) for v in _ones(r)]
        if r == SIZE - 1:
            change(p)
        return p
    raises_everywhere(lambda: _v2(plan, x=np.arange(SIZE, dtype=np.float32)), CollectiveArgumentError,
                      "AllToAllVV2", fragment, f"rank {SIZE - 1}")


@mpi2
def test_overlapping_receive_regions():
    def plan(r):
        sc, sd, rc, rd = _ones(r)
        if r == 0:
            rd = [0] * SIZE
        return sc, sd, rc, rd
    raises_everywhere(lambda: _v2(plan), CollectiveArgumentError, "overlaps", "rank 0")


@mpi1
def test_broadcast_non_contiguous_is_refused():
    x = np.zeros((4, 4))[:, 0]
    raises_everywhere(lambda: mpicoll.BroadcastOperation().execute(x), CollectiveArgumentError, "Broadcast",
                      "C-contiguous")


@mpi1
def test_validation_switch(monkeypatch):
    setting(monkeypatch, "MPICOLL_VALIDATE", "0")
    assert mpicoll.AllReduceOperation().validate is False
    setting(monkeypatch, "MPICOLL_VALIDATE", "1")
    assert mpicoll.AllReduceOperation().validate is True
    assert mpicoll.AllReduceOperation(validate=False).validate is False
    # with validation off the result is the same
    assert mpicoll.AllReduceOperation(validate=False).execute(np.ones(2)).tolist() == [SIZE, SIZE]


@mpi1
def test_int64_sums_wrap_and_prod_wraps():
    """No wider accumulator for 64-bit integers, nor for products: they wrap, as in MPI."""
    x = np.full(2, np.iinfo(np.int64).max, dtype=np.int64)
    with np.errstate(over="ignore"):
        expected = np.full(2, np.iinfo(np.int64).max, dtype=np.int64) * np.int64(SIZE)
    assert mpicoll.AllReduceOperation().execute(x).tolist() == expected.tolist()
    y = np.full(2, 100, dtype=np.int8)
    assert mpicoll.AllReduceOperation(mpicoll.AllReduceParam(reduce_type="prod")).execute(y).tolist() == \
        [int(np.array(100 ** SIZE).astype(np.int64).astype(np.int8))] * 2


@mpi1
def test_reduce_scatter_v_with_a_longer_input():
    x = np.arange(3 * SIZE + 5, dtype=np.int32)
    got = mpicoll.ReduceScatterVOperation().execute(x, [3] * SIZE, [3 * i for i in range(SIZE)], 3)
    assert got.tolist() == [SIZE * v for v in range(3 * RANK, 3 * RANK + 3)]


@mpi1
def test_param_is_bound_at_first_execute():
    """The first call reads the Param and freezes it: a later change raises instead of being ignored."""
    p = mpicoll.AllReduceParam(reduce_type="sum")
    op = mpicoll.AllReduceOperation(p)
    p.reduce_type = "sum"               # (before the first call: read by it)
    assert op.execute(np.ones(2)).tolist() == [SIZE, SIZE]
    with pytest.raises(CollectiveArgumentError, match=r"AllReduceParam.reduce_type: this Param is bound"):
        p.reduce_type = "max"
    assert op.execute(np.ones(2)).tolist() == [SIZE, SIZE]
    q = dataclasses.replace(p, reduce_type="max")
    assert mpicoll.AllReduceOperation(q).execute(np.ones(2)).tolist() == [1, 1]


@mpi1
def test_hccl_reduce_op_codes_and_conflicting_comm_and_domain():
    assert mpicoll.AllReduceOperation(mpicoll.AllReduceParam(reduce_type=2)).execute(np.ones(1)).tolist() == [1]
    op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=WORLD, comm_domain="x"))
    raises_everywhere(lambda: op.execute(np.ones(1)), CollectiveArgumentError, "not both")


@mpi1
def test_a_call_outside_the_signature_is_python_s_own_type_error():
    """execute has its real signature: Python itself refuses an unexpected argument, on the rank
    that passes it, before any communication (as mpi4py does)."""
    with pytest.raises(TypeError, match="out"):
        mpicoll.BroadcastOperation().execute(np.zeros(2), out=np.zeros(2))
    assert mpicoll.BroadcastOperation().execute(np.full(2, RANK)).tolist() == [0, 0]     # nothing started


def _debug_comm(monkeypatch, on=True):
    """A fresh user comm, so that mpicoll makes its library communicator (and reads MPICOLL_DEBUG,
    which its members agree once) after the variable is set."""
    if on:
        setting(monkeypatch, "MPICOLL_DEBUG", "1")
    else:
        setting(monkeypatch, "MPICOLL_DEBUG", None)
    return WORLD.Dup()


@mpi2
def test_debug_mode_names_the_disagreeing_ranks(monkeypatch):
    comm = _debug_comm(monkeypatch)
    op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=comm), validate=False)
    op.execute(np.ones(2, np.float32))
    assert op.validate                                 # debug mode turns validation back on
    x = np.ones(2, np.float16 if RANK == 1 else np.float32)
    raises_everywhere(lambda: op.execute(x), CollectiveMismatchError, "dtype differs", "float16 on rank 1")
    comm.Free()


@mpi2
def test_debug_mode_accepts_valid_v_plans(monkeypatch):
    comm = _debug_comm(monkeypatch)
    counts = [RANK + 1] * SIZE                 # each rank sends a different count: legitimate
    recv = list(range(1, SIZE + 1))
    rd = [sum(recv[:i]) for i in range(SIZE)]
    got = mpicoll.AllToAllVV2Operation(mpicoll.AllToAllVV2Param(comm=comm)).execute(
        np.full(SIZE * (RANK + 1), RANK, np.int32), counts, [i * (RANK + 1) for i in range(SIZE)], recv, rd)
    assert got.reshape(-1).tolist() == [r for r in range(SIZE) for _ in range(r + 1)]
    got = mpicoll.AllGatherVOperation(mpicoll.AllGatherVParam(comm=comm)).execute(np.full(RANK + 1, RANK), RANK + 1,
                                                                                  recv, rd)
    assert got.tolist() == [r for r in range(SIZE) for _ in range(r + 1)]
    comm.Free()


# ----------------------------------------------------------------------------- every row, every operator

@mpi1
@pytest.mark.parametrize("root", ["size", -1, 0.0, True])
def test_broadcast_root_out_of_range_on_last_rank(root):
    root = SIZE if root == "size" else root
    op = mpicoll.BroadcastOperation(mpicoll.BroadcastParam(rank_root=root if RANK == SIZE - 1 else 0))
    x = np.full(3, RANK, dtype=np.int32)
    raises_everywhere(lambda: op.execute(x), CollectiveArgumentError,
                      f"Broadcast: rank_root={root!r} on rank {SIZE - 1}: must be in [0, rank_size={SIZE})")
    assert x.tolist() == [RANK] * 3


@mpi2
def test_root_differs_at_every_rank_count():
    """Half the ranks name root 0, the other half root 1: nothing moves."""
    p = mpicoll.BroadcastParam(rank_root=RANK % 2)
    x = np.full(4, RANK, dtype=np.int64)
    evens, odds = list(range(0, SIZE, 2)), list(range(1, SIZE, 2))
    show = lambda rs: f"rank {rs[0]}" if len(rs) == 1 else f"ranks {rs}"  # noqa: E731
    raises_everywhere(lambda: mpicoll.BroadcastOperation(p).execute(x), CollectiveMismatchError,
                      f"Broadcast: rank_root differs across ranks: 0 on {show(evens)}; 1 on {show(odds)}")
    assert x.tolist() == [RANK] * 4


def _agv(x, send_count, recv_counts, rdispls, **kw):
    return lambda: mpicoll.AllGatherVOperation().execute(x, send_count, recv_counts, rdispls, **kw)


def _rsv(x, send_counts, sdispls, recv_count, **kw):
    return lambda: mpicoll.ReduceScatterVOperation().execute(x, send_counts, sdispls, recv_count, **kw)


_BLOCKS = [2 * i for i in range(SIZE)]
_LAST = SIZE - 1
LOCAL_V_CASES = {
    # name: (the last rank's call, the other ranks' call, fragments)
    "agv_negative_send_count": (_agv(np.ones(2), -1, [2] * SIZE, _BLOCKS), "send_count=-1", "must be >= 0"),
    "agv_send_count_gt_size": (_agv(np.ones(2), 3, [2] * SIZE, _BLOCKS), "send_count=3", "must be <= x.size=2"),
    "agv_float_send_count": (_agv(np.ones(2), 2.0, [2] * SIZE, _BLOCKS), "send_count=2.0", "must be an integer"),
    "agv_negative_recv_count": (_agv(np.ones(2), 2, [-1] + [2] * (SIZE - 1), _BLOCKS), "recv_counts[0]=-1",
                                "must be >= 0"),
    "agv_negative_rdispl": (_agv(np.ones(2), 2, [2] * SIZE, [-2] + _BLOCKS[1:]), "rdispls[0]=-2", "must be >= 0"),
    "agv_rdispl_out_of_range": (_agv(np.ones(2), 2, [2] * SIZE, [b + 1 for b in _BLOCKS]),
                                f"rdispls[{_LAST}]+recv_counts[{_LAST}]={2 * SIZE + 1}",
                                f"must be <= sum(recv_counts)={2 * SIZE}"),
    "agv_short_recv_counts": (_agv(np.ones(2), 2, [2] * (SIZE + 1), _BLOCKS), "recv_counts=",
                              f"must hold exactly rank_size={SIZE} entries"),
    "agv_float_array_counts": (_agv(np.ones(2), 2, np.full(SIZE, 2.0), _BLOCKS), "recv_counts=",
                               "entries must be integers, not float64"),
    "agv_shape_size": (_agv(np.ones(2), 2, [2] * SIZE, _BLOCKS, shape=(2 * SIZE + 1,)), "shape=",
                       f"must be dims >= 0 holding sum(recv_counts)={2 * SIZE} elements"),
    "agv_shape_negative_dims": (_agv(np.ones(2), 2, [2] * SIZE, _BLOCKS, shape=(-1, -2 * SIZE)), "shape=(-1, ",
                                "must be dims >= 0"),
    "rsv_negative_send_count": (_rsv(np.ones(2 * SIZE), [-1] + [2] * (SIZE - 1), _BLOCKS, 2), "send_counts[0]=-1",
                                "must be >= 0"),
    "rsv_sdispl_out_of_range": (_rsv(np.ones(2 * SIZE), [2] * SIZE, [b + 1 for b in _BLOCKS], 2),
                                f"sdispls[{_LAST}]+send_counts[{_LAST}]={2 * SIZE + 1}",
                                f"must be <= x.size={2 * SIZE}"),
    "rsv_negative_sdispl": (_rsv(np.ones(2 * SIZE), [2] * SIZE, [-1] + _BLOCKS[1:], 2), "sdispls[0]=-1",
                            "must be >= 0"),
    "rsv_negative_recv_count": (_rsv(np.ones(2 * SIZE), [2] * SIZE, _BLOCKS, -2), "recv_count=-2", "must be >= 0"),
    "rsv_float_recv_count": (_rsv(np.ones(2 * SIZE), [2] * SIZE, _BLOCKS, 2.5), "recv_count=2.5",
                             "must be an integer"),
    "rsv_short_sdispls": (_rsv(np.ones(2 * SIZE), [2] * SIZE, _BLOCKS[:-1], 2), "sdispls=",
                          f"must hold exactly rank_size={SIZE} entries"),
    "a2av_param_negative": (lambda: mpicoll.AllToAllVOperation(mpicoll.AllToAllVParam(
        send_counts=[1] * SIZE, sdispls=[-1] + list(range(1, SIZE)), recv_counts=[1] * SIZE,
        rdispls=list(range(SIZE)))).execute(np.ones(SIZE)), "sdispls[0]=-1", "must be >= 0"),
    "a2av_param_missing": (lambda: mpicoll.AllToAllVOperation(mpicoll.AllToAllVParam(
        send_counts=[1] * SIZE, sdispls=list(range(SIZE)), recv_counts=[1] * SIZE)).execute(np.ones(SIZE)),
        "rdispls=None", "the plan (send_counts, sdispls, recv_counts, rdispls) is required"),
}
_GOOD = {"agv": _agv(np.ones(2), 2, [2] * SIZE, _BLOCKS), "rsv": _rsv(np.ones(2 * SIZE), [2] * SIZE, _BLOCKS, 2),
         "a2av": _valid_call("AllToAllV", np.float64)}
_OPNAME = {"agv": "AllGatherV", "rsv": "ReduceScatterV", "a2av": "AllToAllV"}


@mpi1
@pytest.mark.parametrize("case", list(LOCAL_V_CASES))
def test_v_operator_bad_counts_on_last_rank(case):
    """Negative, non-integer, short and out-of-range counts/displacements of AllGatherV,
    ReduceScatterV and AllToAllV (Param plan), on the last rank only; the others pass a valid call."""
    bad, *fragments = LOCAL_V_CASES[case]
    kind = case.split("_")[0]
    call = bad if RANK == _LAST else _GOOD[kind]
    raises_everywhere(call, CollectiveArgumentError, f"{_OPNAME[kind]}: ", f"on rank {_LAST}", *fragments)


@mpi2
@pytest.mark.parametrize("direction", ["expects_more", "expects_fewer"])
def test_allgatherv_count_mismatch_both_directions(direction):
    """Rank 0 expects 3 (or 1) elements from rank 1, which sends 2."""
    x = np.arange(4, dtype=np.int16)
    recv = [2] * SIZE
    if RANK == 0:
        recv[1] = 3 if direction == "expects_more" else 1
    disp = [sum(recv[:i]) for i in range(SIZE)]
    raises_everywhere(_agv(x, 2, recv, disp), CollectiveMismatchError, "AllGatherV: recv_counts[1] differs",
                      f"recv_counts[1]={3 if direction == 'expects_more' else 1} on rank 0 but rank 1 has send_count=2")


@mpi2
@pytest.mark.parametrize("direction", ["expects_more", "expects_fewer"])
def test_reducescatterv_count_mismatch_both_directions(direction):
    """Rank 1 expects 3 (or 1) reduced elements where every rank sends it 2."""
    recv = (3 if direction == "expects_more" else 1) if RANK == 1 else 2
    raises_everywhere(_rsv(np.ones(3 * SIZE, np.float32), [2] * SIZE, _BLOCKS, recv), CollectiveMismatchError,
                      "ReduceScatterV: recv_count differs", f"recv_count={3 if direction == 'expects_more' else 1} "
                      "on rank 1 but rank 0 has send_counts[1]=2")


@mpi2
@pytest.mark.parametrize("direction", ["expects_more", "expects_fewer"])
def test_alltoallv_param_count_mismatch_both_directions(direction):
    """The same rule for AllToAllV, whose plan lives in the Param."""
    rc = [1] * SIZE
    if RANK == 0:
        rc[1] = 2 if direction == "expects_more" else 0
    p = mpicoll.AllToAllVParam(send_counts=[1] * SIZE, sdispls=list(range(SIZE)), recv_counts=rc,
                               rdispls=[sum(rc[:i]) for i in range(SIZE)])
    raises_everywhere(lambda: mpicoll.AllToAllVOperation(p).execute(np.ones(SIZE, np.float32)),
                      CollectiveMismatchError, "AllToAllV: recv_counts[1] differs",
                      f"recv_counts[1]={2 if direction == 'expects_more' else 0} on rank 0 but rank 1 has "
                      "send_counts[0]=1")


ALIAS_OPS = [o for o in ALL_OPS if "out" in inspect.signature(mpicoll.OPERATIONS[o].execute).parameters]


def _single_output(last) -> bool:
    x = last.args[0] if last.args else None
    return isinstance(last.expected, np.ndarray) and last.expected.size and isinstance(x, np.ndarray) and \
        x.size > 1 and "out" not in last.kwargs


@mpi1
@pytest.mark.parametrize("opname", ALIAS_OPS)
def test_out_aliasing_x_through_a_view_on_last_rank(opname):
    """MPI raises on every rank for sendbuf is recvbuf; a partial overlap through a view is worse
    (undefined). mpicoll refuses any overlap but the in-place forms (AllReduce and AllToAll:
    ``out=x`` itself; AllGather: ``x=out[rank]``; ReduceScatter and Scatter: ``out`` = x's block
    rank). On the last rank, x and out share one buffer, out shifted by one element."""
    c = _case_of(opname, "float64", _single_output)
    if c is None:
        pytest.skip(f"{opname} has no case with one array output on the last rank")
    call = c.execute
    if RANK == _LAST:
        x, e = c.args[0], c.expected
        buf = np.zeros(x.nbytes + 2 * e.nbytes, np.uint8)
        xv = buf[:x.nbytes].view(x.dtype).reshape(x.shape)
        xv[...] = x
        ov = buf[e.itemsize:e.itemsize + e.nbytes].view(e.dtype).reshape(e.shape)
        call = lambda: c.op.execute(xv, *c.args[1:], **{**c.kwargs, "out": ov})  # noqa: E731
    raises_everywhere(call, CollectiveArgumentError, f"{opname}: out='aliases x' on rank {_LAST}",
                      "must not overlap the input")


@mpi1
def test_allreduce_out_is_x_is_in_place():
    x = np.full(3, RANK + 1, dtype=np.int32)
    assert mpicoll.AllReduceOperation().execute(x, out=x) is x
    assert x.tolist() == [SIZE * (SIZE + 1) // 2] * 3


@mpi1
@pytest.mark.parametrize("opname", [o for o in ALL_OPS if mpicoll.OPERATIONS[o].PAIR_NAMES] + ["AllToAll"])
def test_all_counts_zero_is_fine(opname):
    """Every operator with per-peer counts (the registry's), and AllToAll of no rows."""
    n = SIZE
    z = [0] * n
    calls = {
        "AllGatherV": lambda: mpicoll.AllGatherVOperation().execute(np.ones(3), 0, z, z),
        "ReduceScatterV": lambda: mpicoll.ReduceScatterVOperation().execute(np.ones(3, np.int8), z, z, 0),
        "AllToAllV": lambda: mpicoll.AllToAllVOperation(mpicoll.AllToAllVParam(
            send_counts=z, sdispls=z, recv_counts=z, rdispls=z)).execute(np.ones(3)),
        "AllToAllVV2": lambda: mpicoll.AllToAllVV2Operation().execute(np.ones(3), z, z, z, z),
        "AllToAll": lambda: mpicoll.AllToAllOperation().execute(np.ones((0, 3))),
    }
    assert calls[opname]().size == 0


@mpi2
def test_shape_beyond_eight_dims_differs():
    """Same size and leading dims, different trailing dims (9-D): still a shape mismatch."""
    x = np.ones((1,) * 7 + ((3, 2) if RANK == 1 else (2, 3)), dtype=np.float32)
    raises_everywhere(lambda: mpicoll.AllGatherOperation().execute(x), CollectiveMismatchError,
                      "AllGather: x.shape differs across ranks", "[9 dims, 6 elements, trailing dims #", "on rank 1")


@mpi2
def test_debug_mode_names_a_rank_out_of_step(monkeypatch):
    """Debug mode carries the communicator's collective count in every header: a rank that made
    one collective more on it is named."""
    comm = _debug_comm(monkeypatch)
    op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=comm))
    op.execute(np.ones(2, np.float32))
    lib = mpicoll._domains.user_comm(comm)
    if RANK == SIZE - 1:
        lib.seq += 1                    # as if this rank had run one more collective there
    raises_everywhere(lambda: op.execute(np.ones(2, np.float32)), CollectiveMismatchError,
                      "AllReduce: sequence number (MPICOLL_DEBUG or MPICOLL_TIMEOUT) differs across ranks", f"on rank {SIZE - 1}",
                      "user comm", "a rank skipped or added a call")
    comm.Free()


@mpi2
def test_debug_mode_set_on_some_ranks_only_raises_everywhere(monkeypatch):
    """It decides whether headers carry sequence numbers: its members agree it when mpicoll makes
    a communicator, and every member raises the same error."""
    comm = _debug_comm(monkeypatch, on=RANK == 0)
    op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=comm))
    raises_everywhere(lambda: op.execute(np.ones(2)), CollectiveMismatchError,
                      "MPICOLL_DEBUG differs across ranks: on for ranks [0], off for ranks",
                      "set it alike on every rank")
    setting(monkeypatch, "MPICOLL_DEBUG", None)
    assert mpicoll.AllReduceOperation().execute(np.ones(2)).tolist() == [SIZE] * 2    # still in step
    comm.Free()


@mpi2
@pytest.mark.parametrize("name", ["MPICOLL_VALIDATE", "MPICOLL_SHM", "MPICOLL_EXACT"])
def test_a_setting_on_some_ranks_only_raises_everywhere(monkeypatch, name):
    """Agreed likewise when mpicoll makes the communicator: MPICOLL_VALIDATE decides whether a rank
    makes the header Allgather, MPICOLL_SHM whether it takes the shared window's Barriers or MPI's
    collective, MPICOLL_EXACT whether a float sum runs in MPI's reduction or in rank order."""
    if RANK == 0:
        setting(monkeypatch, name, "0")
    comm = WORLD.Dup()
    raises_everywhere(lambda: mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=comm)).execute(np.ones(2)),
                      CollectiveMismatchError, f"{name} differs across ranks: on for ranks",
                      "off for ranks [0]")
    comm.Free()


@mpi1
@pytest.mark.parametrize("timeout", [None, 30.0])
def test_operations_and_plans_on_a_freed_communicator_raise(timeout):
    """``Comm.Free`` of a user communicator frees mpicoll's: an operation or plan made on it
    raises, naming it, instead of calling MPI on a freed handle (Open MPI's non-blocking calls,
    the timed path, crash there); a new operation on the freed comm is a bad ``comm``."""
    c = WORLD.Dup()
    op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=c), timeout=timeout)
    plan = op.prepare(np.ones(4, np.float32))
    assert plan.run()[0] == SIZE
    c.Free()
    for call in (plan.run, plan.start, lambda: op.execute(np.ones(4, np.float32)),
                 lambda: op.prepare(np.ones(4, np.float32))):
        with pytest.raises(CollectiveError, match="AllReduce: .* was freed \\(Comm.Free\\)") as info:
            call()
        assert (info.value.param, info.value.rank) == ("comm", RANK)
    with pytest.raises(CollectiveArgumentError, match="comm is MPI.COMM_NULL"):
        mpicoll.AllGatherOperation(mpicoll.AllGatherParam(comm=c)).execute(np.ones(4))
    plan.free()


@mpi1
def test_the_functional_api_hccl_tasks_and_graphs_on_a_freed_communicator_raise():
    """The same for the paths built on operations: ``async_op=True`` (a one-shot start), an Hccl
    task's next round (its run parked between rounds), a graph captured on the freed comm."""
    from mpicoll import functional as F, graph
    c = WORLD.Dup()
    F.all_reduce(np.ones(4, np.float32), group=c)
    hccl = mpicoll.Hccl().init(c)
    x, y = np.ones(8, np.float32), np.empty(8, np.float32)
    task = hccl.all_reduce(x, y, 4, mpicoll.HcclDataType.FP32, "sum", repeat=2)
    hccl.commit(task)
    while hccl.query(task) < 1:
        pass
    op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=c))
    op.execute(np.ones(4, np.float32))
    c.Free()
    freed = "AllReduce: .* was freed \\(Comm.Free\\)"
    with pytest.raises(CollectiveError, match=freed.replace("AllReduce", "all_reduce")):
        F.all_reduce(np.ones(4, np.float32), group=c, async_op=True)
    with pytest.raises(CollectiveError, match="of 2 calls: .* was freed"):      # (a task of 2 rounds)
        hccl.commit(task)
    with pytest.raises(CollectiveError, match=freed):
        with graph.capture():                   # (the world's graph; the call's comm is freed)
            op.execute(np.ones(4, np.float32))
