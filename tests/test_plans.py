"""Prepared plans: every registered operator's plan gives execute's results (run, start/wait,
start/test), re-reads its inputs on every run, owns its output, and refuses misuse clearly."""
from __future__ import annotations

import numpy as np
import pytest

import mpicoll
from mpicoll import CollectiveError, CollectiveMismatchError
from mpicoll.checks import CHECKS
from mpicoll.checks._golden import SEED, count_wrong
from mpicoll.ops._modes import ASYNC, PREPARE, RUN

from _mpi import RANK, SAMPLE, SIZE, WORLD, raises_everywhere

mpi1 = pytest.mark.mpi(min_size=1)
PAIRS = [(name, dtype) for name, spec in CHECKS.items() for dtype in SAMPLE
         if dtype in spec.dtypes and name in mpicoll.OPERATIONS]      # (operators: not the Hccl task kinds)


def _arrays(case):
    """The case's ndarray arguments, in order (positional, then keyword)."""
    return [a for a in (*case.args, *case.kwargs.values()) if isinstance(a, np.ndarray)]


def _others(case):
    return [a for a in (*case.args, *case.kwargs.values()) if not isinstance(a, np.ndarray)]


def _same(a, b) -> bool:
    try:
        return bool(np.array_equal(np.asarray(a), np.asarray(b)))
    except Exception:  # noqa: BLE001 - not comparable: not the same
        return False


def _wrong(got, case) -> int:
    return count_wrong(got, case.expected, exact=case.exact, n=SIZE)


@mpi1
@pytest.mark.parametrize("name,dtype", PAIRS)
def test_plan_equals_execute(name, dtype):
    spec = CHECKS[name]
    if not spec.cases_for(SIZE, dtype):
        pytest.skip(f"{name}: {spec.why_none(SIZE, dtype)}")
    failures, reread = [], 0
    for case_name in spec.cases_for(SIZE, dtype):
        c = spec.make(case_name, dtype, "", RANK, SIZE, SEED)
        pristine = [a.copy() for a in _arrays(c)]

        def restore():
            for a, p in zip(_arrays(c), pristine):
                np.copyto(a, p)
        plan = c.op.prepare(*c.args, **c.kwargs)
        outputs = []
        for how in ("run", "run again", "start/wait", "start/test"):
            restore()
            if how.startswith("run"):
                got = plan.run()
            elif how == "start/wait":
                got = plan.start().wait()
            else:
                handle = plan.start()
                while not handle.test():
                    pass
                got = handle.wait()
            outputs.append(got)
            if _wrong(got, c):
                failures.append(f"{case_name} {how}: {_wrong(got, c)} wrong")
        # the plan owns its output: the same arrays every time
        if outputs[0] is not None:
            first = outputs[0] if isinstance(outputs[0], tuple) else (outputs[0],)
            for o in outputs[1:]:
                assert all(a is b for a, b in zip(first, o if isinstance(o, tuple) else (o,))), case_name
        # the inputs' current contents on every run: another seed's data, copied into the same arrays.
        # (Not where the seed changes a value argument, e.g. QuantAllReduce's scalar scale: a plan binds
        # its values. Decided alike on every rank: the rerun is collective.)
        c2 = spec.make(case_name, dtype, "", RANK, SIZE, SEED + 1)
        if all(WORLD.allgather(all(_same(a, b) for a, b in zip(_others(c), _others(c2))))):
            for a, b in zip(_arrays(c), _arrays(c2)):
                np.copyto(a, b)
            wrong = _wrong(plan.run(), c2)
            if wrong:
                failures.append(f"{case_name}: the rerun with new inputs gives {wrong} wrong")
            reread += count_wrong(c2.expected, c.expected) > 0     # (a plan that kept the old inputs fails it)
        plan.free()
    assert not failures, f"{name} {dtype} rank {RANK}: {failures}"
    assert WORLD.allreduce(reread), f"{name} {dtype}: no case's new inputs change its output: re-reading is untested"


@mpi1
def test_plan_on_a_domain_and_validation_off():
    """A plan over a sub-domain; an operation with validation off still checks and agrees at prepare."""
    name = f"plans.{RANK % 2}"
    n = len(range(RANK % 2, SIZE, 2))
    op = mpicoll.AllGatherOperation(mpicoll.AllGatherParam(comm_domain=name, rank_size=n), validate=False)
    x = np.array([RANK], np.int64)
    with op.prepare(x) as plan:
        assert plan.run().reshape(-1).tolist() == list(range(RANK % 2, SIZE, 2))
        x[0] = 100 + RANK
        assert plan.start().wait().reshape(-1).tolist() == [100 + r for r in range(RANK % 2, SIZE, 2)]


@pytest.mark.mpi(min_size=2)
def test_prepare_agrees_even_with_validation_off():
    x = np.ones(2 + (RANK == 1), np.float32)
    op = mpicoll.AllReduceOperation(validate=False)
    raises_everywhere(lambda: op.prepare(x), CollectiveMismatchError, "AllReduce: x.shape differs across ranks")


@mpi1
def test_misuse_is_refused():
    op = mpicoll.AllReduceOperation()
    x = np.ones(4, np.float32)
    plan = op.prepare(x)
    handle = plan.start()
    for what, call in (("start", plan.start), ("run", plan.run), ("free", plan.free)):
        with pytest.raises(CollectiveError, match=f"{what}\\(\\) on a plan that is started and not yet waited for"):
            call()
    assert handle.wait().tolist() == [SIZE] * 4 and handle.wait() is plan.result   # waiting twice is fine
    plan.free()
    plan.free()                                                                    # so is freeing twice
    for what, call in (("run", plan.run), ("start", plan.start)):
        with pytest.raises(CollectiveError, match=f"{what}\\(\\) on a freed plan"):
            call()
    with op.prepare(x) as p:
        assert p.run().tolist() == [SIZE] * 4
    with pytest.raises(CollectiveError, match="freed"):
        p.run()
    assert "freed" in repr(p)


@mpi1
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_many_plans_in_flight_beside_other_collectives(dtype):
    """Plans started together, other collectives on the same communicator in between, waited in
    another order: multi-step plans (float16 AllReduce of 1 MiB: AllToAll, reduction, AllGather)
    run in program order on the communicator (through the shared window on one node: complete at
    start), so nothing interleaves wrongly."""
    n = 1 << 19
    xs = [np.full(n, k + RANK, dtype) for k in range(3)]
    ar = mpicoll.AllReduceOperation()
    plans = [ar.prepare(x) for x in xs]
    handles = [p.start() for p in plans]
    gathered = mpicoll.AllGatherOperation().execute(np.array([RANK]))      # meanwhile, on the world
    assert gathered.reshape(-1).tolist() == list(range(SIZE))
    assert ar.execute(np.ones(3, np.float32)).tolist() == [SIZE] * 3
    for k in (2, 0, 1):
        got = handles[k].wait()
        assert np.array_equal(got, np.full(n, k * SIZE + sum(range(SIZE)), dtype)), k
    for p in plans:
        p.free()


@mpi1
def test_run_and_execute_interleave_on_one_operation():
    op = mpicoll.ReduceScatterOperation()
    x = np.arange(4 * SIZE, dtype=np.float64)
    with op.prepare(x) as plan:
        for _ in range(20):
            a = plan.run().copy()
            b = op.execute(x)
            assert np.array_equal(a, b) and np.array_equal(a, x[4 * RANK:4 * RANK + 4] * SIZE)


@mpi1
def test_a_list_input_is_fixed_at_prepare():
    """Only arrays are buffers: a list is converted once, at prepare."""
    op = mpicoll.AllReduceOperation()
    values = [1.0, 2.0]
    with op.prepare(values) as plan:
        values[0] = 100.0
        assert plan.run().tolist() == [SIZE, 2.0 * SIZE]


@mpi1
def test_a_strided_input_is_re_read():
    """A non-contiguous input is copied into the plan's buffer before every run."""
    base = np.zeros((4, 2), np.float32)
    x = base[:, 0]
    op = mpicoll.AllGatherOperation()
    with op.prepare(x) as plan:
        base[:, 0] = RANK + 1
        assert plan.run()[:, 0].tolist() == list(range(1, SIZE + 1))
        base[:, 0] = -RANK
        assert plan.start().wait()[:, 0].tolist() == [-r for r in range(SIZE)]


@mpi1
def test_plans_count_as_calls_for_the_watchdog():
    """Each run and start is a call of the operator on its communicator, as the user counts them
    (where the count is read: a timeout on the operation, or a watchdog)."""
    from mpicoll._domains import world
    op = mpicoll.BroadcastOperation(timeout=600)
    x = np.zeros(3)
    before = world().calls.get("Broadcast", 0)
    with op.prepare(x) as plan:          # (prepare itself agrees: a call)
        plan.run()
        plan.start().wait()
    assert world().calls["Broadcast"] == before + 3
    WORLD.Barrier()


# ----------------------------------------------------------------------------- steps in flight

class _Overlap(mpicoll.Operation):
    """A test-only operator (not public): two AllReduces kept in flight while local work runs
    between them; ``out = 2 * allreduce(x) + allreduce(x + 1)``."""

    NAME = "Test.Overlap"
    PUBLIC = False

    def execute(self, x, out=None):
        return self._call((x, out), RUN)

    def prepare(self, x, out=None):
        return self._call((x, out), PREPARE)

    def describe(self, x, out=None):
        from mpicoll._call import Call
        x, dt, _ = self._data(x)
        call = Call(dt, x, self._out(out, x.shape, x.dtype), x.shape)
        call.args = (np.empty_like(x), np.empty_like(x), np.empty_like(x))
        return call

    def issue(self, call, table, go):
        a, b, xp1 = call.args
        m = call.dt.mpi
        t1 = go.start(self._lib, "Allreduce", [call.x, m], [a, m], MPI.SUM)
        go.local(np.add, call.x, 1, xp1)                       # local work while t1 is in flight
        t2 = go.start(self._lib, "Allreduce", [xp1, m], [b, m], MPI.SUM)
        go.wait(t1)
        go.local(np.multiply, a, 2, call.out)
        go.wait(t2)
        go.local(np.add, call.out, b, call.out)


from mpi4py import MPI  # noqa: E402


@mpi1
def test_steps_in_flight_in_execute_plans_and_one_shot_starts():
    op = _Overlap()
    x = np.arange(6, dtype=np.float64) + RANK
    want = 2 * (SIZE * np.arange(6) + sum(range(SIZE))) + SIZE * (np.arange(6) + 1) + sum(range(SIZE))
    assert np.array_equal(op.execute(x), want)
    with op.prepare(x) as plan:
        assert np.array_equal(plan.run(), want)
        assert np.array_equal(plan.start().wait(), want)
        h = plan.start()
        while not h.test():
            pass
        assert np.array_equal(h.wait(), want)
    job = op._call((x,), ASYNC)                   # (async_op=True: the call on the communicator's worker)
    assert job.wait() and np.array_equal(job.value, want)


@mpi1
def test_at_most_max_in_flight():
    """A start beyond MAX_IN_FLIGHT first waits for the oldest, in execute and in plans alike."""
    from mpicoll._go import MAX_IN_FLIGHT, Recorder, START, WAIT

    class Many(_Overlap):
        NAME = "Test.Many"

        def issue(self, call, table, go):
            outs = call.args[0].reshape(1, -1).repeat(40, axis=0)
            call.result = outs
            m = call.dt.mpi
            tokens = [go.start(self._lib, "Allreduce", [call.x, m], [outs[k], m], MPI.SUM) for k in range(40)]
            for t in tokens:
                go.wait(t)

    op = Many()
    x = np.full(3, RANK + 1.0)
    assert (op.execute(x) == SIZE * (SIZE + 1) / 2).all()
    rec = Recorder()
    call = op.describe(x)
    op._record(call, None, rec)
    open_, most = 0, 0
    for s in rec.steps:
        open_ += (s.kind == START) - (s.kind == WAIT)
        most = max(most, open_)
    assert most == MAX_IN_FLIGHT and open_ == 0
    with op.prepare(x) as plan:
        assert (plan.run() == SIZE * (SIZE + 1) / 2).all()


@mpi1
@pytest.mark.parametrize("progress", ["none", "rank 0 tests", "every rank tests"])
def test_started_work_keeps_the_program_order_on_its_communicator(progress):
    """Multi-step plans started on one communicator, tested on some ranks only (so each rank's
    handles stand at different steps), other collectives in between, waited in another order:
    every collective still starts in program order on every rank (no communicator copies)."""
    n = 1 << 17                                   # float16 of 256 KiB: AllToAll, reduction, AllGather
    xs = [np.full(n, k + RANK, np.float16) for k in range(3)]
    ar = mpicoll.AllReduceOperation()
    plans = [ar.prepare(x) for x in xs]
    handles = []
    for p in plans:
        handles.append(p.start())
        if progress == "every rank tests" or (progress == "rank 0 tests" and RANK == 0):
            for h in handles:
                h.test()
    assert mpicoll.AllGatherOperation().execute(np.array([RANK])).reshape(-1).tolist() == list(range(SIZE))
    tail = _Overlap()._call((np.ones(4),), ASYNC)
    for k in (2, 0, 1):
        assert np.array_equal(handles[k].wait(), np.full(n, k * SIZE + sum(range(SIZE)), np.float16)), k
    assert tail.wait() and tail.value.tolist() == [4 * SIZE] * 4            # 2 * SIZE + SIZE * 2
    for p in plans:
        p.free()
    assert not mpicoll._domains.world().pending


# ----------------------------------------------------------------------------- the remembered call

@mpi1
def test_a_repeated_call_runs_its_recorded_plan_and_sees_every_change():
    """Validation off, the very same call repeated runs compiled; new contents, counts changed in
    place (lists and arrays), an array reshaped in place, or no ``out`` are other calls."""
    n = SIZE
    ar = mpicoll.AllReduceOperation(validate=False)
    x, y = np.zeros(4, np.int64), np.empty(4, np.int64)
    for k in range(4):
        x[:] = k + RANK
        assert ar.execute(x, out=y) is y and y.tolist() == [k * n + sum(range(n))] * 4
    assert ar._last is not None and ar._last.args[0] is x          # (the repeats ran it compiled)
    x.shape = (2, 2)                                      # reshaped in place: another call
    y2 = np.empty((2, 2), np.int64)
    assert ar.execute(x, out=y2).shape == (2, 2)
    first, second = ar.execute(x), ar.execute(x)          # no out: a fresh output each time
    assert first is not second and np.array_equal(first, second)
    vv2 = mpicoll.AllToAllVV2Operation(validate=False)
    data = np.arange(3 * n, dtype=np.float64) + 100 * RANK
    counts, displs = [1] * n, list(range(n))
    out = np.zeros((1, 3 * n))
    for k in range(3):
        if k == 2:                                        # the same list objects, changed in place
            counts[:] = [3] * n
            displs[:] = [3 * j for j in range(n)]
        got = vv2.execute(data, counts, displs, list(counts), list(displs), None, out[:, :sum(counts)]
                          if k < 2 else out)
        c = counts[0]
        want = np.concatenate([np.arange(RANK * c, RANK * c + c) + 100 * r for r in range(n)])
        assert np.array_equal(got.reshape(-1), want), (k, got)
    sc = np.ones(n, np.int64)                             # counts as an array changed in place
    for k in range(3):
        if k == 2:
            sc[:] = 2
        c = int(sc[0])
        got = vv2.execute(data, sc, np.arange(n) * c, sc, np.arange(n) * c, None, out[:, :c * n])
        want = np.concatenate([np.arange(RANK * c, RANK * c + c) + 100 * r for r in range(n)])
        assert np.array_equal(got.reshape(-1), want), (k, got)


SKIPPED = """
    import numpy as np, mpicoll
    from mpi4py import MPI
    r = MPI.COMM_WORLD.Get_rank()
    op = mpicoll.AllReduceOperation()
    x, out = np.ones(4, np.float32), np.empty(4, np.float32)
    plan = op.prepare(x, out)
    plan.start().wait()                     # (its persistent requests are made at the first start)
    try:
        if r != 0:
            plan.start().wait()             # rank 0 skips this start
        op.execute(x, out=out)
        say("no error")
    except mpicoll.CollectiveError as e:
        say(f"{type(e).__name__}: {e}")
"""


@pytest.mark.skipif(SIZE != 1, reason="runs its own mpirun jobs once")
@pytest.mark.parametrize("env", [{"MPICOLL_DEBUG": "1"}, {"MPICOLL_TIMEOUT": "30"}], ids=["debug", "watchdog"])
def test_a_rank_that_skips_a_start_gets_the_named_error_everywhere(tmp_path, env):
    """A rank that skips one start() of a (persistent) plan and makes another call meets its peers'
    sequence row with that call: the same named mismatch on every rank, as for a skipped run(), under
    MPICOLL_DEBUG (it hung: a blocking call never matches a started one) and the watchdog (the row
    was a persistent request, which only its own starts match)."""
    from _mpi import said
    lines = said(tmp_path, SKIPPED, 3, env=env)
    assert len(lines) == 3 and len({line.split(": ", 1)[1] for line in lines}) == 1, lines
    assert "CollectiveMismatchError: AllReduce vs plan run: operation differs across ranks" in lines[0], lines
