"""The functional API (torch.distributed names) against numpy goldens: every function, several
dtypes, even, uneven and zero-size splits, groups, async Works; torch's errors agreed on every rank;
the operation cache and the remembered call."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

import mpicoll
from mpicoll import CollectiveArgumentError, CollectiveMismatchError
from mpicoll import functional as F
from mpicoll import graph
from mpicoll._dtypes import DTYPES
from mpicoll.checks._golden import SEED, golden_reduce, rank_data

from _mpi import RANK, SAMPLE, SIZE, WORLD, on, raises_everywhere, raises_on, setting

mpi1 = pytest.mark.mpi(min_size=1)
mpi2 = pytest.mark.mpi(min_size=2)
DTYPES_TRIED = SAMPLE


def _data(key: str, shape, dtype: str, rank: int = RANK) -> np.ndarray:
    return rank_data(SEED, f"functional/{key}", rank, shape, DTYPES[dtype])


def _all(key: str, shape_of, dtype: str) -> list[np.ndarray]:
    """Every rank's input (each rank rebuilds them all), ``shape_of(rank)``."""
    return [_data(key, shape_of(r), dtype, r) for r in range(SIZE)]


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    return got.shape == want.shape and got.dtype == want.dtype and got.tobytes() == want.tobytes()


def _finish(work, async_op):
    if async_op:
        assert isinstance(work, F.Work)
        assert work.wait() is True and work.is_completed()
        return work.result()
    assert work is None
    return None


@mpi1
@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("dtype", DTYPES_TRIED)
def test_all_reduce_broadcast_reduce(dtype, async_op):
    xs = _all("ar", lambda r: (5, 3), dtype)
    t = xs[RANK].copy()
    res = _finish(F.all_reduce(t, op="max", async_op=async_op), async_op)
    assert _same(t, golden_reduce(xs, DTYPES[dtype], mpicoll._dtypes.REDUCE_OPS["max"]))
    assert res is None or res[0] is t
    t = xs[RANK].copy()
    _finish(F.broadcast(t, src=SIZE - 1, async_op=async_op), async_op)
    assert _same(t, xs[SIZE - 1])
    t = xs[RANK].copy()
    _finish(F.reduce(t, dst=SIZE - 1, async_op=async_op), async_op)
    assert _same(t, golden_reduce(xs, DTYPES[dtype], mpicoll._dtypes.REDUCE_OPS["sum"]) if RANK == SIZE - 1
                 else xs[RANK])


@mpi1
@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("dtype", DTYPES_TRIED)
def test_gathers_and_scatters(dtype, async_op):
    n = SIZE
    xs = _all("ag", lambda r: (2, 3), dtype)
    out = np.empty((2 * n, 3), xs[0].dtype)
    _finish(F.all_gather_into_tensor(out, xs[RANK], async_op=async_op), async_op)
    assert _same(out, np.concatenate(xs))
    stacked = np.empty((n, 2, 3), xs[0].dtype)
    _finish(F.all_gather_into_tensor(stacked, xs[RANK], async_op=async_op), async_op)
    assert _same(stacked, np.stack(xs))
    lst = [np.empty((2, 3), xs[0].dtype) for _ in range(n)]
    _finish(F.all_gather(lst, xs[RANK], async_op=async_op), async_op)
    assert all(_same(a, b) for a, b in zip(lst, xs))
    gl = [np.empty((2, 3), xs[0].dtype) for _ in range(n)] if RANK == 0 else None
    _finish(F.gather(xs[RANK], gl, dst=0, async_op=async_op), async_op)
    assert RANK != 0 or all(_same(a, b) for a, b in zip(gl, xs))
    parts = _all("sc", lambda r: (4,), dtype)                   # the source's list: parts[r] for rank r
    t = np.empty(4, xs[0].dtype)
    _finish(F.scatter(t, parts if RANK == n - 1 else None, src=n - 1, async_op=async_op), async_op)
    assert _same(t, parts[RANK])


@mpi1
@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("dtype", DTYPES_TRIED)
def test_reduce_scatters(dtype, async_op):
    n, dt = SIZE, DTYPES[dtype]
    total = golden_reduce(_all("rs", lambda r: (2 * n, 3), dtype), dt, mpicoll._dtypes.REDUCE_OPS["sum"])
    out = np.empty((2, 3), dt.np)
    _finish(F.reduce_scatter_tensor(out, _data("rs", (2 * n, 3), dtype), async_op=async_op), async_op)
    assert _same(out, total[2 * RANK:2 * RANK + 2])
    lists = [[_data(f"rsl{k}", (3,), dtype, r) for k in range(n)] for r in range(n)]
    out = np.empty(3, dt.np)
    _finish(F.reduce_scatter(out, lists[RANK], async_op=async_op), async_op)
    assert _same(out, golden_reduce([lists[r][RANK] for r in range(n)], dt, mpicoll._dtypes.REDUCE_OPS["sum"]))
    splits = [(k * 2 + 1) % 4 for k in range(n)]               # uneven, with zeros when n > 1 ... (1, 3, 1, 3)
    splits[0] = 0
    xs = _all("rsu", lambda r: (sum(splits), 2), dtype)
    out = np.empty((splits[RANK], 2), dt.np)
    _finish(F.reduce_scatter_tensor_uneven(out, xs[RANK], splits, async_op=async_op), async_op)
    start = sum(splits[:RANK])
    assert _same(out, golden_reduce([x[start:start + splits[RANK]] for x in xs], dt,
                                    mpicoll._dtypes.REDUCE_OPS["sum"]))


@mpi1
@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("dtype", DTYPES_TRIED)
@pytest.mark.parametrize("kind", ["even", "uneven", "zeros"])
def test_all_to_all_single_and_all_to_all(dtype, kind, async_op):
    n = SIZE
    # split[i][j]: rows rank i sends to rank j
    if kind == "even":
        split = [[2] * n for _ in range(n)]
    elif kind == "uneven":
        split = [[(i * 3 + j) % 4 for j in range(n)] for i in range(n)]
    else:
        split = [[0 if (i + j) % 2 else 2 for j in range(n)] for i in range(n)]
    xs = [_data(f"a2a/{kind}", (sum(split[r]), 3), dtype, r) for r in range(n)]
    so = [split[i][RANK] for i in range(n)]
    out = np.empty((sum(so), 3), xs[0].dtype)
    si = None if kind == "even" else split[RANK]
    _finish(F.all_to_all_single(out, xs[RANK], None if kind == "even" else so, si, async_op=async_op), async_op)
    want = np.concatenate([xs[i][sum(split[i][:RANK]):sum(split[i][:RANK + 1])] for i in range(n)])
    assert _same(out, want)
    ins = [xs[RANK][sum(split[RANK][:j]):sum(split[RANK][:j + 1])].copy() for j in range(n)]
    outs = [np.empty((split[i][RANK], 3), xs[0].dtype) for i in range(n)]
    _finish(F.all_to_all(outs, ins, async_op=async_op), async_op)
    assert all(_same(o, w) for o, w in zip(outs, np.split(want, np.cumsum(so)[:-1])))


@mpi1
@pytest.mark.parametrize("dtype", DTYPES_TRIED)
def test_all_gather_into_tensor_uneven(dtype):
    n = SIZE
    rows = [(r * 2) % 3 for r in range(n)]                      # zeros included (rank 0 sends none)
    xs = _all("agu", lambda r: (rows[r], 2), dtype)
    out = np.empty((sum(rows), 2), xs[0].dtype)
    F.all_gather_into_tensor_uneven(out, xs[RANK], rows)
    assert _same(out, np.concatenate(xs))
    even = np.empty((2 * n, 2), xs[0].dtype)
    F.all_gather_into_tensor_uneven(even, _data("ague", (2, 2), dtype))   # None: even
    assert _same(even, np.concatenate(_all("ague", lambda r: (2, 2), dtype)))


@mpi1
def test_in_place_forms_and_barrier():
    n = SIZE
    out = np.zeros((n, 3), np.float32)
    out[RANK] = RANK + 1
    F.all_gather_into_tensor(out, out[RANK])                     # input is output's own block
    assert out[:, 0].tolist() == [r + 1 for r in range(n)]
    assert F.barrier() is None
    work = F.barrier(async_op=True)
    assert work.wait() and work.result() == []


@mpi2
def test_groups_as_lists_names_and_roots():
    """A list group (declared once, as new_group): ranks outside it make no call and get None; src
    is a world rank, group_src a rank in the group."""
    members = list(range(1, SIZE))                               # every rank but 0
    t = np.array([RANK], np.int64)
    assert F.all_reduce(t, group=members) is None
    assert t[0] == (sum(members) if RANK else 0)
    b = np.array([RANK * 10], np.int64)
    F.broadcast(b, src=SIZE - 1, group=members)
    assert b[0] == ((SIZE - 1) * 10 if RANK else 0)
    b = np.array([RANK * 10], np.int64)
    F.broadcast(b, group_src=0, group=members)                   # group rank 0 = world rank 1
    assert b[0] == (10 if RANK else 0)
    mpicoll.declare_domains({"functional.pair": [0, 1]})
    if RANK < 2:
        t = np.array([RANK + 1.0])
        F.all_reduce(t, group="functional.pair")
        assert t[0] == 3.0
    assert F.all_reduce(np.ones(1), group=WORLD.Dup()) is None


@mpi2
def test_a_root_outside_the_group_is_agreed():
    members = list(range(SIZE - 1))                              # every rank but the last
    sub = WORLD.Split(0 if RANK in members else 1, RANK)
    if RANK in members:
        raises_on(sub, lambda: F.broadcast(np.zeros(2), src=SIZE - 1, group=members), CollectiveArgumentError,
                  f"broadcast: src={SIZE - 1} {on(range(SIZE - 1))}: must be a world rank in the group ({members})")
    sub.Free()


@mpi2
@pytest.mark.parametrize("case,fragment", [
    ("splits_sum", "input_split_sizes=[1"),
    ("splits_count", "must hold exactly rank_size"),
    ("output_shape", "all_gather_into_tensor: output.shape="),
    ("non_contiguous", "must be a C-contiguous writable numpy array"),
])
def test_torch_errors_on_one_rank_are_agreed(case, fragment):
    n, last = SIZE, SIZE - 1

    def call():
        if case == "splits_sum":
            out, inp = np.empty((n, 2)), np.empty((n, 2))
            splits = [1] * n
            if RANK == last:
                splits = [1] * (n - 1) + [2]                     # sums to n + 1, not input.shape[0]
            return F.all_to_all_single(out, inp, [1] * n, splits)
        if case == "splits_count":
            splits = [1] * (n + 1 if RANK == last else n)
            return F.all_to_all_single(np.empty((n, 2)), np.empty((n, 2)), None, splits)
        if case == "output_shape":
            return F.all_gather_into_tensor(np.empty((n + (RANK == last), 2)), np.empty((1, 2)))
        t = np.zeros((4, 2))
        return F.all_reduce(t[:, 0] if RANK == last else t[:, 0].copy())
    msg = raises_everywhere(call, CollectiveArgumentError, fragment, f"on rank {last}")
    assert msg.split(":")[0] in ("all_to_all_single", "all_gather_into_tensor", "all_reduce")


@mpi2
def test_split_sizes_that_disagree_across_ranks():
    """Rank 0 expects one row more from rank 1 than rank 1 sends: named in torch's terms."""
    n = SIZE
    so = [1] * n
    if RANK == 0:
        so[1] = 2
    raises_everywhere(lambda: F.all_to_all_single(np.empty((sum(so), 2)), np.empty((n, 2)), so, [1] * n),
                      CollectiveMismatchError, "all_to_all_single: output_split_sizes[1] differs across ranks",
                      "output_split_sizes[1]=2 on rank 0 but rank 1 has input_split_sizes[0]=1")


@mpi2
@pytest.mark.timeout_s(60)
@pytest.mark.parametrize("case,fragment", [
    ("op", "all_reduce: op='bogus' on rank {last}: must be one of 'sum', 'prod', 'max', 'min'"),
    ("op, async", "all_reduce: op='bogus' on rank {last}: must be one of"),
    ("op, the peers' max", "reduce: op='bogus' on rank {last}: must be one of"),
    ("op, captured", "graph call 0 (all_reduce): all_reduce: op='bogus' on rank {last}: must be one of"),
    ("group", "all_reduce: group=3.5 on rank {last}: must be None, a domain name, a list of world ranks or an "
              "mpi4py communicator"),
    ("src outside", "broadcast: src={n} on rank {last}: must be a world rank in the group"),
    ("src a list", "broadcast: src=[0] on rank {last}: must be a world rank in the group"),
    ("tensor", "all_reduce: tensor='list' on rank {last}: must be a numpy array"),
    ("gather_list", "gather: gather_list='ndarray of {n}' on rank {last}: must be a list of world_size={n} arrays"),
    ("splits", "all_to_all_single: input_split_sizes=5 on rank {last}: must be a sequence of integers"),
])
def test_a_bad_argument_on_the_last_rank_is_raised_on_every_rank(case, fragment, monkeypatch):
    """Only the last rank passes the bad value: every rank raises the same error, naming it and that
    rank, including the rules checked before there is an operation (op, group, an unhashable src).
    Under a timeout, so that peers left waiting abort the job instead of hanging it."""
    setting(monkeypatch, "MPICOLL_TIMEOUT", "20")
    monkeypatch.setattr(F, "_OPS", OrderedDict())               # (fresh operations, under that timeout)
    n, last = SIZE, SIZE - 1
    bad = RANK == last
    t = np.ones(2)

    def call():
        if case == "op":
            return F.all_reduce(t, op="bogus" if bad else "sum")
        if case == "op, async":
            return F.all_reduce(t, op="bogus" if bad else "sum", async_op=True).wait()
        if case == "op, the peers' max":
            return F.reduce(t, dst=0, op="bogus" if bad else "max")
        if case == "op, captured":
            with graph.capture():
                F.all_reduce(t, op="bogus" if bad else "sum")
        if case == "group":
            return F.all_reduce(t, group=3.5 if bad else None)
        if case == "src outside":
            return F.broadcast(t, src=n if bad else 0)
        if case == "src a list":
            return F.broadcast(t, src=[0] if bad else 0)
        if case == "tensor":
            return F.all_reduce([1.0, 1.0] if bad else t)
        if case == "gather_list":
            return F.gather(t, np.empty((n, 2)) if bad else None, dst=last)
        return F.all_to_all_single(np.empty((n, 2)), np.empty((n, 2)), None, 5 if bad else [1] * n)
    raises_everywhere(call, CollectiveArgumentError, fragment.format(n=n, last=last))
    t = np.ones(1)
    F.all_reduce(t)                                               # still in step
    assert t[0] == n


@mpi1
@pytest.mark.timeout_s(60)
def test_a_list_group_that_is_not_of_world_ranks_is_agreed_over_the_world(monkeypatch):
    """Refused on every rank alike (over the world, as no group can be formed from it), not by
    declare_domains on its members alone while the others take themselves for outsiders."""
    setting(monkeypatch, "MPICOLL_TIMEOUT", "20")
    monkeypatch.setattr(F, "_OPS", OrderedDict())
    raises_everywhere(lambda: F.all_reduce(np.ones(2), group=[0, SIZE]), CollectiveArgumentError,
                      f"all_reduce: group=[0, {SIZE}] {on(range(SIZE))}: must be a list of world ranks, in [0, {SIZE})")


@mpi1
def test_operations_are_cached_bounded_and_the_call_remembered(monkeypatch):
    from mpicoll import functional
    monkeypatch.setattr(functional, "MAX_CACHED", 4)
    monkeypatch.setattr(functional, "_OPS", OrderedDict())     # (a cache of its own: it turns validation off)
    t = np.ones(3)
    for _ in range(3):
        F.all_reduce(t)
    assert len(functional._OPS) == 1
    op = next(iter(functional._OPS.values()))
    for o in ("sum", "max", "min", "prod", "sum"):
        F.all_reduce(np.ones(2), op=o)
    assert len(functional._OPS) == 4                              # the least recently used went out
    off = [op for op in functional._OPS.values()]
    for o in off:
        o.validate = False
    t = np.arange(3.0)
    for k in range(3):
        t[:] = k
        F.all_reduce(t, op="sum")
        assert t.tolist() == [k * SIZE] * 3
    op = functional._OPS[next(k for k in functional._OPS if k[3] == "sum")]
    assert op._last is not None and op._last.args[0] is t          # (the repeats ran it compiled)
    del op


@mpi2
def test_avg_and_bool_are_reduce_ops_and_dtypes_the_ranks_agree():
    """AVG is a reduce op of its own (the sum divided by the group size, in the dtype), and bool a
    dtype of its own (SUM and MAX a logical or, PROD and MIN an and): AVG on one rank against SUM
    on the others, or bool against uint8, is an agreed mismatch naming the reduce op or the dtype."""
    t = np.array([RANK + 1.0, 2.0], np.float32)
    F.all_reduce(t, "avg")
    assert t.tolist() == [(SIZE + 1) / 2, 2.0]
    b = np.array([RANK == 0, False, True])
    F.all_reduce(b, "sum")
    assert b.dtype == np.bool_ and b.tolist() == [True, False, True]
    b = np.array([RANK == 0, False, True])
    F.all_reduce(b, "prod")
    assert b.tolist() == [SIZE == 1, False, True]
    last = SIZE - 1
    raises_everywhere(lambda: F.all_reduce(np.ones(2, np.float32), "avg" if RANK == last else "sum"),
                      CollectiveMismatchError, "reduce_type differs across ranks", f"'avg' on rank {last}")
    raises_everywhere(lambda: F.all_reduce(np.ones(3, np.bool_) if RANK == last else np.ones(3, np.uint8)),
                      CollectiveMismatchError, "dtype differs across ranks", f"bool on rank {last}")
    raises_everywhere(lambda: F.all_reduce(np.ones(3, np.int32), "avg"), CollectiveArgumentError,
                      "reduce_type='avg'", "averages floating-point dtypes only, not int32")


@mpi1
@pytest.mark.parametrize("group,rule", [([0, 10 ** 6], "must be a list of world ranks"),
                                        (3.5, "must be None, a domain name, a list of world ranks or an mpi4py")])
def test_a_message_with_a_bad_group_is_an_argument_error(group, rule):
    """isend / irecv with a group they cannot read raise CollectiveArgumentError naming the group
    (a message has no collective to agree in: on the rank that gave it)."""
    for fn in (F.isend, F.irecv):
        with pytest.raises(CollectiveArgumentError, match=rule) as info:
            fn(np.ones(2), 0, group=group)
        assert info.value.param == "group" and info.value.rank == RANK


@mpi2
def test_a_message_inside_a_capture_is_refused_on_every_rank():
    """send / recv inside graph.capture() are refused (a graph records collectives only): the rank
    that tried raises, and the capture's agreement raises it on every rank; nothing ran."""
    t = np.ones(2)

    def capture():
        with graph.capture():
            F.all_reduce(t)
            if RANK == 0:
                F.isend(np.ones(2), dst=1)
    raises_everywhere(capture, CollectiveArgumentError, "point-to-point messages are not captured", "on rank 0")
    assert t.tolist() == [1.0, 1.0]


@pytest.mark.skipif(SIZE != 1, reason="pure function: check it once")
def test_a_node_is_crowded_when_its_ranks_outnumber_their_cores(monkeypatch):
    """MPICOLL_WAIT=auto sleeps between polls where a node runs more ranks than cores: the members'
    CPU sets there (their union: the cores) against the larger of their count and the launcher's
    count of the node's ranks (MPICH's MPI_LOCALNRANKS, Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE)."""
    from mpicoll._watchdog import crowded, sleeps
    for name in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert not crowded([{0, 1}, {0, 1}]) and not crowded([{0}, {1}]) and not crowded([{3}])
    assert crowded([{0}, {0}]) and crowded([{0, 1}, {0, 1}, {0, 1}])       # (taskset -c 0; 3 ranks, 2 cores)
    for name in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        monkeypatch.setenv(name, "2")
        assert not crowded([{0, 1}])
        monkeypatch.setenv(name, "3")                   # (the job's other ranks on the node compete too)
        assert crowded([{0, 1}])
        monkeypatch.setenv(name, "junk")
        assert not crowded([{0, 1}])
        monkeypatch.delenv(name)
    for how, on_crowded, elsewhere in (("auto", True, False), ("spin", False, False), ("sleep", True, True)):
        setting(monkeypatch, "MPICOLL_WAIT", how)
        assert (sleeps(True), sleeps(False)) == (on_crowded, elsewhere), how


@mpi2
@pytest.mark.parametrize("timed", [False, True], ids=["untimed", "timed"])
def test_messages_waited_for_between_sleeps_arrive_whole(monkeypatch, timed):
    """A rank that sleeps between polls (MPICOLL_WAIT=sleep, as on a crowded node) gets its messages
    whole, in order, from a sender that is late (it sleeps 50 ms first), with and without a wait
    timeout; its waits take that path (untimed: the sleeping poll; timed: the watchdog's wait with
    no spinning phase)."""
    import time
    from mpicoll import _messages, _watchdog
    setting(monkeypatch, "MPICOLL_WAIT", "sleep")
    taken = []

    def spy(module, name, tag, timed=False):
        fn = getattr(module, name)

        def call(*args, **kwargs):
            if not timed or args[1] is not None:      # (the watched wait's timeout)
                taken.append((tag, kwargs.get("polite")))
            return fn(*args, **kwargs)
        monkeypatch.setattr(module, name, call)
    spy(_watchdog, "poll", "poll")
    spy(_messages, "wait", "watched_wait", timed=True)
    to, frm = (RANK + 1) % SIZE, (RANK - 1) % SIZE
    sent = [_data(f"sleeping/{k}", (5 + 3 * k,), "float64") for k in range(3)]
    want = [_data(f"sleeping/{k}", (5 + 3 * k,), "float64", frm) for k in range(3)]
    got = [np.empty_like(w) for w in want]
    works = [F.irecv(g, src=frm) for g in got]
    if RANK == 0:
        time.sleep(0.05)
    sends = [F.isend(s, dst=to) for s in sent]
    for w in works + sends:
        assert w.wait(timeout=30.0 if timed else None) is True and w.is_completed()
    assert all(_same(g, w) for g, w in zip(got, want))
    assert F.source(works[0]) == frm
    if RANK == 1:                       # (its first receive waited for rank 0's late send: not complete at once)
        assert taken and set(taken) == ({("watched_wait", True)} if timed else {("poll", None)}), taken


#: ``wait(timeout=)`` values refused by name (what an Operation's ``timeout=`` refuses; inf and nan as
#: ``timeout_seconds`` decides them), and taken (None: no limit; 0 or less: none)
BAD_WAITS = ["abc", float("inf"), float("nan"), -float("inf"), True, [1.0], np.float32("inf")]
GOOD_WAITS = [None, 0, -1, 30, 30.0, np.float64(30), np.int32(30)]


@mpi1
def test_wait_takes_what_timeout_takes_and_refuses_the_rest_by_name():
    """Every functional Work's ``wait(timeout=)`` (an async collective's, a message's, a graph
    replay's) takes what an Operation's ``timeout=`` takes (seconds, a timedelta; 0 or less: none)
    and refuses anything else with a CollectiveArgumentError naming the call and ``timeout``, the
    same whether the call is still in flight (a receive whose send is not posted yet) or done."""
    from datetime import timedelta
    from mpicoll._watchdog import timeout_seconds
    for bad in BAD_WAITS:                         # (what Operation's timeout= refuses too)
        with pytest.raises(CollectiveArgumentError):
            timeout_seconds(bad)
    to, frm = (RANK + 1) % SIZE, (RANK - 1) % SIZE
    got = np.zeros(3)
    recv = F.irecv(got, src=frm, tag=3)           # (in flight until its send below)
    with graph.capture() as g:
        captured = F.all_reduce(np.ones(2), async_op=True)       # (complete at once: runs with the replay)
    works = {"irecv": recv, "all_reduce": F.all_reduce(np.ones(2), async_op=True),
             "graph.replay": g.replay(async_op=True), "all_reduce (captured)": captured}
    for name, work in works.items():
        name = name.split()[0]
        for bad in BAD_WAITS:
            with pytest.raises(CollectiveArgumentError) as info:
                work.wait(timeout=bad)
            assert info.value.param == "timeout" and str(info.value).startswith(
                f"{name}: wait(timeout={bad!r}) on rank ") and "must be a finite number of seconds" in str(info.value)
    send = F.isend(np.full(3, float(RANK)), dst=to, tag=3)
    for name, work in {**works, "isend": send}.items():
        assert work.wait(timeout=timedelta(seconds=30)) is True, name
        for good in GOOD_WAITS:
            assert work.wait(timeout=good) is True, (name, good)
        with pytest.raises(CollectiveArgumentError, match=r"wait\(timeout=inf\)"):
            work.wait(float("inf"))               # (done: refused alike)
    assert got.tolist() == [float(frm)] * 3
    g.free()
