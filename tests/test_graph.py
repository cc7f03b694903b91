"""Graph mode: capture, one agreement, replay on the arrays' current contents; merged calls
bit-identical to eager ones; order kept where arrays are shared; a capture that differs on one rank
raises on every rank, never hangs."""
from __future__ import annotations

import re

import numpy as np
import pytest

import mpicoll
from mpicoll import CollectiveError, CollectiveMismatchError
from mpicoll import functional as F
from mpicoll import graph
from mpicoll._dtypes import DTYPES, REDUCE_OPS
from mpicoll import _env
from mpicoll.checks._golden import SEED, count_wrong, golden_reduce, rank_data

from _mpi import OPEN_MPI, RANK, SAMPLE, SIZE, raises_everywhere, remove, run_job, within

mpi1 = pytest.mark.mpi(min_size=1)
mpi2 = pytest.mark.mpi(min_size=2)


SHAPES = [(2,), (7,), (3, 4), (1,), (64,), (5,), (8, 2), (3,)]


def _arrays(dtype: str, seed: int, rank: int = RANK):
    """A mix of small arrays (16 calls' worth), ``rank``'s contents for ``seed``."""
    dt = DTYPES[dtype]
    kind = "random" if dt.np.kind == "f" else "int"
    return [rank_data(SEED + seed, f"graph/{dtype}/{k}", rank, s, dt, kind) for k, s in enumerate(SHAPES)]


def _program(xs, outs):
    """16 small collectives on independent arrays: AllReduce, Broadcast and AllGather mixed."""
    n = SIZE
    for k, x in enumerate(xs):
        F.all_reduce(x)
        if k % 2:
            F.broadcast(outs["b"][k], src=n - 1)
        else:
            F.all_gather_into_tensor(outs["g"][k], outs["gin"][k])


def _buffers(xs):
    n = SIZE
    return {"b": [np.full_like(x, RANK) for x in xs], "gin": [x.copy() for x in xs],
            "g": [np.zeros((n * x.shape[0], *x.shape[1:]), x.dtype) for x in xs]}


def _fill(xs, outs, dtype, seed):
    for x, y in zip(xs, _arrays(dtype, seed)):
        x[...] = y
    for k, x in enumerate(xs):
        outs["b"][k][...] = RANK + seed
        outs["gin"][k][...] = x


def _snapshot(xs, outs):
    return [a.copy() for a in (*xs, *outs["b"], *outs["g"])]


def _golden(dtype, seed):
    """numpy, from every rank's seeded inputs: what _program leaves in (x, b, g) after _fill(seed)."""
    dt = DTYPES[dtype]
    every = list(zip(*(_arrays(dtype, seed, r) for r in range(SIZE))))       # every[k]: each rank's x k
    x = [golden_reduce(list(inputs), dt, REDUCE_OPS["sum"]) for inputs in every]
    b = [np.full(s, SIZE - 1 + seed, dt.np) for s in SHAPES]                  # broadcast from the last rank
    g = [np.concatenate(inputs) for inputs in every]                          # every rank's x, before its sum
    return x, b, g


@mpi1
@pytest.mark.parametrize("dtype", SAMPLE)
def test_replay_equals_eager_bit_for_bit_with_new_contents(dtype):
    """Replays read the arrays' current contents and give the numpy golden bit for bit (every float
    sum in rank order: docs/reproducibility.md) and eager execution's bytes exactly. Every call
    merges: the AllReduce calls too, since merged they give the same bits."""
    xs = _arrays(dtype, 0)
    outs = _buffers(xs)
    with graph.capture() as g:
        _program(xs, outs)
    eager_x, eager_o = [x.copy() for x in xs], _buffers(xs)
    exact = _env.value("MPICOLL_EXACT") or dtype.startswith("int") or SIZE <= 2   # (also where AllReduces merge)
    for seed in (1, 2):                                    # twice, the contents changed in between
        _fill(xs, outs, dtype, seed)
        _fill(eager_x, eager_o, dtype, seed)
        g.replay()
        _program(eager_x, eager_o)
        want_x, want_b, want_g = _golden(dtype, seed)
        for k in range(len(xs)):
            assert count_wrong(xs[k], want_x[k], exact=exact, n=SIZE) == 0, (dtype, seed, k, xs[k], want_x[k])
            if k % 2:
                assert outs["b"][k].tobytes() == want_b[k].tobytes(), (dtype, seed, k)
            else:
                assert outs["g"][k].tobytes() == want_g[k].tobytes(), (dtype, seed, k)
        for a, b in zip(_snapshot(xs, outs), _snapshot(eager_x, eager_o)):
            assert a.tobytes() == b.tobytes(), (dtype, seed)
    text = g.summary()
    assert text.startswith(f"16 captured call(s) -> {3 if exact else 10} MPI call(s) per replay; merged: "), text
    assert ("all_reduce calls [0, 2, 4, 6, 8, 10, 12, 14]" in text) == exact, text
    assert "all_gather_into_tensor calls [1, 5, 9, 13]" in text and "broadcast calls [3, 7, 11, 15]" in text, text
    g.free()


@mpi1
def test_shared_arrays_keep_their_order_and_operator_calls_are_captured():
    a = np.full(4, RANK + 1, np.int64)
    b = np.zeros(4, np.int64)
    op = mpicoll.AllReduceOperation()
    with graph.capture() as g:
        F.all_reduce(a)                                    # a = sum
        F.all_reduce(a)                                    # a = SIZE * sum: must not merge with the first
        out = op.execute(b, b)                             # an operator call, captured
    assert out is b and "calls [0, 1" not in g.summary()       # (b, independent, may join the second)
    for k in range(2):
        a[:] = RANK + 1 + k
        b[:] = k
        g.replay()
        assert a.tolist() == [SIZE * sum(r + 1 + k for r in range(SIZE))] * 4
        assert b.tolist() == [k * SIZE] * 4
    g.free()


@mpi1
def test_async_replay_free_and_misuse():
    t = np.ones(3, np.int32)
    with graph.capture() as g:
        w = F.all_reduce(t, async_op=True)                 # completes with the replay
    assert w.wait()
    work = g.replay(async_op=True)
    assert work.wait() and t.tolist() == [SIZE] * 3
    with pytest.raises(CollectiveError, match="captures do not nest"):
        with graph.capture():
            with graph.capture():
                pass
    g.free()
    with pytest.raises(CollectiveError, match="on a freed plan"):
        g.replay()
    g.free()
    with pytest.raises(CollectiveError, match="before the capture ended"):
        graph.Graph().replay()


@mpi2
@pytest.mark.parametrize("case", ["different op", "different shape", "extra call", "missing on a domain"])
def test_a_capture_that_differs_on_one_rank_raises_everywhere(case):
    last = SIZE - 1
    a, b = np.ones(4, np.float32), np.ones(4, np.float32)
    if case == "missing on a domain":                      # (formed first: forming needs every member)
        mpicoll.declare_domains({"graph.pair": [0, 1]})
        if RANK < 2:
            F.all_reduce(np.ones(1), group="graph.pair")

    def capture():
        with graph.capture() as g:
            F.all_reduce(a)
            if case == "different op":
                (F.broadcast if RANK == last else F.all_reduce)(b)
            elif case == "different shape":
                F.all_reduce(b if RANK != last else b[:3])
            elif case == "extra call":
                F.all_reduce(b)
                if RANK == last:
                    F.all_reduce(b)
            elif RANK == 0:                                 # rank 1, a member, does not capture it
                F.all_reduce(b, group="graph.pair")
        return g
    fragments = {"different op": ("graph call 1 (", "operation differs across ranks"),
                 "different shape": ("graph call 1 (all_reduce): all_reduce: tensor.shape differs",
                                     f"(3,) on rank {last}"),
                 "extra call": ("graph call 2 (all_reduce) on world rank", "has no counterpart"),
                 "missing on a domain": ("graph call 1 (all_reduce) runs on a communicator of 2 ranks",
                                         "only world ranks [0]")}[case]
    raises_everywhere(capture, CollectiveMismatchError, *fragments)
    assert F.all_reduce(np.ones(1)) is None                # still in step


@mpi2
def test_an_exception_inside_the_block_on_one_rank_is_raised_everywhere():
    """A user exception in the block on the last rank only: every rank raises the same
    CollectiveError, naming that rank and the exception, and the ranks stay in step."""
    def capture():
        with graph.capture():
            F.all_reduce(np.ones(2))
            if RANK == SIZE - 1:
                raise ValueError("boom")
    raises_everywhere(capture, CollectiveError, "graph", f"on rank {SIZE - 1}", "ValueError: boom")
    assert F.all_reduce(np.ones(1)) is None                # still in step


STOPPED = """
    import sys
    import numpy as np
    from mpi4py import MPI
    from mpicoll import functional as F, graph
    with graph.capture():
        F.all_reduce(np.ones(2))
        if MPI.COMM_WORLD.Get_rank() == 1:
            STOP
"""


@pytest.mark.skipif(SIZE != 1, reason="runs its own mpirun jobs once")
@pytest.mark.parametrize("stop,word,rc", [("raise KeyboardInterrupt", "\nKeyboardInterrupt", 130),
                                          ("sys.exit(3)", r"[Ee]rrorcode:? 3" if OPEN_MPI else r"Abort\(3\)", 3)])
def test_ctrl_c_inside_a_capture_stays_ctrl_c(tmp_path, stop, word, rc):
    """A KeyboardInterrupt (or SystemExit) on one rank leaves the block unchanged, starting no
    agreement: python -m mpi4py aborts the job with its status (130 for Ctrl-C; the peer waits in
    its agreement until then; MPICH reports the abort as ``Abort(3)``, Open MPI as ``Errorcode: 3``,
    4.x ``errorcode 3``).
    (The launcher may cut the aborting rank's last lines under load: its status says what it raised
    then.)"""
    res, seconds, left = run_job(tmp_path, STOPPED.replace("STOP", stop), np_=2, env={"MPICOLL_TIMEOUT": "30"})
    remove(left)
    assert res.returncode == rc and seconds < within(20), (seconds, res.returncode, res.stderr[-2000:])
    assert "CollectiveArgumentError" not in res.stderr, res.stderr[-2000:]
    # (the launcher may drop every line of the aborting rank's stderr under load: its status said it)
    assert not res.stderr or re.search(word, res.stderr) or "Traceback" in res.stderr, res.stderr[-2000:]


@mpi1
def test_a_bad_call_inside_a_capture_is_agreed_at_its_end():
    bad = np.zeros((4, 2))[:, 0]                            # not contiguous: all_reduce refuses it
    def capture():
        with graph.capture():
            F.all_reduce(np.ones(2))
            F.all_reduce(bad if RANK == SIZE - 1 else np.ones(4))
    raises_everywhere(capture, CollectiveError, "graph call 1 (all_reduce): all_reduce: tensor=",
                      f"on rank {SIZE - 1}")


@mpi1
def test_inexact_capture_merges_float_reductions_too():
    xs = [np.full(k + 1, RANK + 0.1 * k, np.float32) for k in range(4)]
    with graph.capture(exact=False) as g:
        for x in xs:
            F.all_reduce(x)
    assert "merged: all_reduce calls [0, 1, 2, 3]" in g.summary() and " 1 MPI call(s)" in g.summary()
    g.replay()
    for k, x in enumerate(xs):
        assert np.allclose(x, sum(r + 0.1 * k for r in range(SIZE)), rtol=1e-6)
    g.free()


@mpi1
def test_a_graph_takes_its_groups_own_timeout():
    """No ``timeout=``: the graph takes its group's own timeout (a torch group's ``timeout=``), as
    an operation does, else ``MPICOLL_TIMEOUT``'s; a ``timeout=`` given wins. The replay is right."""
    from mpi4py import MPI
    from mpicoll._domains import user_comm
    from mpicoll._watchdog import timeout_default
    comm = MPI.COMM_WORLD.Dup()
    comm.Set_name("graph timeout")
    try:
        user_comm(comm, 30.0)                             # (as mpicoll.torch makes a group's)
        x = np.ones(3)
        for given, want in ((None, 30.0), (5, 5.0), (0, None)):
            with graph.capture(group=comm, timeout=given) as g:
                F.all_reduce(x, group=comm)
            x[:] = 1
            g.replay()
            assert g.timeout == want and x.tolist() == [float(SIZE)] * 3, (given, g.timeout)
            g.free()
        with graph.capture() as g:
            F.all_reduce(x)
        assert g.timeout == timeout_default()
        g.free()
    finally:
        comm.Free()


@mpi1
def test_a_list_group_captures_as_the_functional_calls_take_it():
    """graph.capture takes every group form the functional calls take, a list of world ranks too."""
    ranks = list(range(SIZE))
    t = np.full(2, float(RANK))
    with graph.capture(group=ranks) as g:
        F.all_reduce(t, group=ranks)
    assert t.tolist() == [float(RANK)] * 2          # (described, not run)
    g.replay()
    assert t.tolist() == [SIZE * (SIZE - 1) / 2] * 2
    g.free()


@mpi2
@pytest.mark.parametrize("bad", ["abc", float("nan"), float("inf")])
def test_a_bad_timeout_on_one_rank_is_agreed(bad):
    """``timeout=`` that is not a number of seconds, given to graph.capture or an Operation on one
    rank, is a named CollectiveArgumentError on every rank (at the capture's end, at the first call)."""
    last = SIZE - 1

    def capture():
        with graph.capture(timeout=bad if RANK == last else None):
            F.all_reduce(np.ones(2))
    raises_everywhere(capture, mpicoll.CollectiveArgumentError, "graph: timeout=", f"on rank {last}",
                      "must be a finite number of seconds")
    op = mpicoll.AllReduceOperation(timeout=bad if RANK == last else None)
    raises_everywhere(lambda: op.execute(np.ones(2)), mpicoll.CollectiveArgumentError, "AllReduce: timeout=",
                      f"on rank {last}", "must be a finite number of seconds")


@pytest.mark.mpi(min_size=2)
def test_an_async_replay_over_two_groups_queued_behind_a_call_and_before_another_finishes():
    """A graph over the world and [0, 1], replayed with async_op behind an async world call (rank 1
    comes late), then an async call on [0, 1]: the replay's own calls on [0, 1] wait only for what
    was queued before it there (it deadlocked with the later call's worker); free() waits for it."""
    import time
    a, b, c, big = np.ones(4), np.ones(4), np.ones(4), np.ones(1 << 16)
    pair = [0, 1]
    F.all_reduce(c, group=pair)
    with graph.capture() as g:
        F.all_reduce(a)
        F.all_reduce(b, group=pair)
    if RANK == 1:
        time.sleep(0.3)
    w0 = F.all_reduce(big, async_op=True)
    w1 = g.replay(async_op=True)
    w2 = F.all_reduce(c, group=pair, async_op=True)
    g.free()                                   # (waits for the replay, on every rank)
    assert w1.is_completed() and w0.wait() and w1.wait()
    assert (w2 is None or w2.wait()) and a.tolist() == [SIZE] * 4 and big[0] == SIZE
    if RANK in pair:
        assert b.tolist() == [2.0] * 4 and c.tolist() == [4.0] * 4


@pytest.mark.mpi(min_size=2)
def test_a_callback_s_call_keeps_its_place_before_the_callers_next_call():
    """A call made by a callback of an async call (a torch future's ``then``, on the worker) runs
    before the caller's next call on that communicator, on every rank (the caller's call used to
    meet the callback's inside the communicator: 'another thread ... is inside a call')."""
    a, b, c = np.ones(8), np.ones(1 << 12), np.ones(8)
    seen: list = []
    for _ in range(30):
        w = F.all_reduce(a, async_op=True)
        w._handle.then(lambda job: seen.append(F.all_reduce(b, async_op=True).exception()))
        w.wait()
        F.all_reduce(c)
    assert seen == [None] * 30
