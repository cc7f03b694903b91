"""How a described call runs: the call record, the ``go`` objects ``issue`` talks to, and plans.

An operator's ``describe`` turns its arguments into a :class:`Call`; its ``issue`` turns a call
(and, when validated, the agreed header table) into MPI calls and local work, by talking to a
*go* object:

* ``go.mpi(comm, name, *args)``: the blocking collective ``comm.mpi.<name>(*args)`` (an mpi4py
  method name, e.g. ``"Allreduce"``) on a :class:`~mpicoll._comm.LibComm`;
* ``go.local(fn, *args)``: local work ``fn(*args)`` (a reduction, a copy) between collectives;
* ``go.scratch(make, *key)``: scratch buffers ``make(*key)``, reused by ``execute`` from one call to
  the next with the same key, owned by a plan;
* ``token = go.start(comm, name, *args)`` and ``go.wait(token)``: the same collective kept in flight
  while the steps between them run (local work, other collectives), at most ``MAX_IN_FLIGHT`` at
  once (a start beyond that first waits for the oldest); ``go.test(token)`` between long local
  steps lets MPI move it on (MPICH progresses a non-blocking collective only inside MPI calls).

``execute`` hands ``issue`` a :class:`Runner`, which does each step at once. ``prepare`` (and the
one-shot non-blocking call, and a captured graph) hands it a :class:`Recorder`, which keeps the
steps, in *parts*: one per call, each labelled with its operator. A :class:`Plan` binds the steps
once and runs them many times, blocking (:meth:`Plan.run`) or not (:meth:`Plan.start` ->
:class:`Handle`). So ``issue``, the only place that picks an MPI call, serves all of them.

A call's local work before and after its MPI calls (refreshing a copy of a strided input, packing a
list, dividing an average) is part of its :class:`Call` (``src``, ``before``, ``after``): every
mode runs it around the call, whether ``issue`` made the MPI calls or the agreement carried the
data (:func:`prologue`, :func:`epilogue`).
"""
from __future__ import annotations

import atexit
import time
import weakref
from functools import partial
from typing import Any, Callable

from mpi4py import MPI

import numpy as np

from . import _comm
from . import _validate as V
from ._comm import LibComm
from ._agreement import ERROR_STEP, settle
from ._errors import CollectiveError
from ._watchdog import done

#: the most collectives one call keeps in flight at once (``go.start``); a start beyond it first
#: waits for the oldest, on every rank alike
MAX_IN_FLIGHT = 16
#: graphs being captured, innermost last (``mpicoll.graph.capture``): while it is not empty, an
#: operation's execute (and one-shot start) is described into the graph instead of run
CAPTURING: list = []



class Call:
    """One rank's description of one call: what ``describe`` returns and ``issue`` reads.

    Attributes:
        dt: the dtype row of the data (None for an operator without one).
        x: the array MPI reads (C-contiguous); ``src``: the caller's array when x is a copy of it
            (the copy is refreshed from it before every run).
        out: the array MPI writes (or None: a non-root rank of a rooted operator).
        result: what ``execute`` returns (default ``out``).
        shape, root, reduce, params: what must agree across ranks (shape None: not compared).
        info: per-rank facts the issuer may read from the agreed table (layout bits).
        send, recv: per-peer counts for the count-pair rule (V operators), else None.
        args: the operator's own normalised arguments (counts, displacements, ...).
        rounds, round: a plan records ``rounds`` parts of the call (the Hccl client's ``repeat``),
            ``issue`` reading which one from ``round``.
        before, after: local steps ``(fn, *args)`` around the call's data movement (after ``src``'s
            copy, before the result is returned).
        unit: the elements of one entry of ``send`` (an adapter counting rows: their elements).

    The constructor takes the fields every call has; ``describe`` sets the others it needs, the
    class defaults standing otherwise (a plain class and positional arguments: the cheapest record
    to build on every ``execute``).
    """

    src = reduce = send = recv = None
    root = params = info = round = 0
    rounds = unit = 1
    args: tuple = ()
    before: tuple = ()
    after: tuple = ()

    def __init__(self, dt, x, out, shape: tuple | None = None) -> None:
        self.dt, self.x, self.out, self.result, self.shape = dt, x, out, out, shape


# ----------------------------------------------------------------------------- execute: at once

def prologue(call: Call) -> None:
    """The call's local work before its data moves: ``src``'s copy, then its ``before`` steps."""
    if call.src is not None:
        np.copyto(call.x, call.src)
    for step in call.before:
        step[0](*step[1:])


def epilogue(call: Call) -> None:
    """The call's local work once its data has moved: its ``after`` steps."""
    for step in call.after:
        step[0](*step[1:])


class Runner:
    """``go`` for ``execute``: each step at once, on the spot (one per operation, reused, under the
    operation's timeout)."""

    __slots__ = ("where", "op", "_flight", "_next", "_scratch")

    def __init__(self, op: Any) -> None:
        self.where, self.op = (op.NAME, None, ""), op
        self._flight: dict[int, tuple] = {}         # token -> (comm, name, request), oldest first
        self._next = 0
        self._scratch: tuple = (None, None)

    def scratch(self, make: Callable, *key: Any) -> Any:
        """``make(*key)``: scratch buffers for a call, kept for the next call with the same ``key``
        (the operation's last; a fresh large array page-faults on every call)."""
        if self._scratch[0] != key:
            self._scratch = (key, make(*key))
        return self._scratch[1]

    def mpi(self, comm: LibComm, name: str, *args: Any) -> None:
        comm.call(name, args, self.op.timeout, self.where)

    def local(self, fn: Callable, *args: Any) -> None:
        fn(*args)

    def hold(self, on: bool) -> None:
        """(Recorded steps between ``hold(True)`` and ``hold(False)`` run in one go: see
        :meth:`Recorder.hold`; here every step does.)"""

    def start(self, comm: LibComm, name: str, *args: Any) -> int:
        if len(self._flight) >= MAX_IN_FLIGHT:
            self.wait(next(iter(self._flight)))
        token = self._next
        self._next += 1
        self._flight[token] = (comm, name, comm.start(name, args, self.where))
        return token

    def wait(self, token: int) -> None:
        entry = self._flight.pop(token, None)
        if entry is not None:                 # (already waited for: nothing to do)
            comm, name, req = entry
            comm.wait([req], self.op.timeout, name, self.where)

    def test(self, token: int) -> None:
        entry = self._flight.get(token)
        if entry is not None:
            entry[2].Test()


# ----------------------------------------------------------------------------- prepare: recorded

COUNT, MPI_CALL, START, WAIT, LOCAL, TEST = range(6)


class Step:
    """One recorded step: ``kind`` COUNT (a part begins: count its call), MPI_CALL (a blocking
    collective), START / WAIT / TEST (a collective kept in flight, by ``token``) or LOCAL (``fn``);
    ``part``: the index of the call it belongs to."""

    __slots__ = ("kind", "comm", "name", "fn", "args", "token", "part")

    def __init__(self, kind: int, comm: LibComm | None, name: str, fn: Callable | None, args: tuple,
                 token: int, part: int) -> None:
        self.kind, self.comm, self.name, self.fn, self.args, self.token, self.part = \
            kind, comm, name, fn, args, token, part


class Part:
    """One call in a plan: its operator, the communicators it is counted on, where its steps end,
    and what it returns."""

    __slots__ = ("op", "comms", "end", "result")

    def __init__(self, op: str, comms: tuple[LibComm, ...], end: int, result: Any) -> None:
        self.op, self.comms, self.end, self.result = op, comms, end, result


class Recorder:
    """``go`` that keeps the steps, call by call: ``begin(op, comms)``, the call's ``issue``,
    ``end(result)`` (which waits for whatever the call left in flight): one *part* per call.
    ``counts``: each part counts its call when it runs (a plan run many times; a call run once as a
    plan was counted by its pipeline already)."""

    def __init__(self, counts: bool = True) -> None:
        self.counts = counts
        self.steps: list[Step] = []
        self.parts: list[Part] = []
        self.tokens = 0
        self._open: list[int] = []
        self._part = -1
        self._op: tuple | None = None

    def begin(self, op: str, comms: tuple[LibComm, ...]) -> None:
        """A call of ``op`` begins (counted on ``comms`` each time it runs, if the plan ``counts``)."""
        self._part, self._op = len(self.parts), (op, comms)
        if self.counts:
            self.steps.append(Step(COUNT, None, op, None, (comms, op), -1, self._part))

    def end(self, result: Any) -> None:
        for token in list(self._open):
            self.wait(token)
        op, comms = self._op
        self.parts.append(Part(op, comms, len(self.steps), result))

    def mpi(self, comm: LibComm, name: str, *args: Any) -> None:
        self.steps.append(Step(MPI_CALL, comm, name, None, args, -1, self._part))

    def scratch(self, make: Callable, *key: Any) -> Any:
        """``make(*key)``: a plan owns its scratch buffers (plans of one operation may be in flight
        at once)."""
        return make(*key)

    def local(self, fn: Callable, *args: Any) -> None:
        self.steps.append(Step(LOCAL, None, "", fn, args, -1, self._part))

    def hold(self, on: bool) -> None:
        """The steps recorded from ``hold(True)`` to ``hold(False)`` share state with other runs on
        their communicator between their collectives (the node's shared window): a started run
        goes through them in one go, blocking, so that no other run's steps come in between."""
        self.local(_held if on else _released)

    def start(self, comm: LibComm, name: str, *args: Any) -> int:
        if len(self._open) >= MAX_IN_FLIGHT:
            self.wait(self._open[0])
        token = self.tokens
        self.tokens += 1
        self._open.append(token)
        self.steps.append(Step(START, comm, name, None, args, token, self._part))
        return token

    def wait(self, token: int) -> None:
        if token in self._open:
            self._open.remove(token)
            self.steps.append(Step(WAIT, None, "", None, (), token, self._part))

    def test(self, token: int) -> None:
        if token in self._open:
            self.steps.append(Step(TEST, None, "", None, (), token, self._part))


def count_call(comms: tuple[LibComm, ...], op: str) -> int:
    """Count one call of ``op`` on each of its communicators (the one way calls are counted: by the
    call pipeline, and by each COUNT step of a plan); returns its number on the first."""
    calls = comms[0].calls
    number = calls[op] = calls.get(op, 0) + 1
    if len(comms) > 1:
        for c in comms[1:]:
            c.calls[op] = c.calls.get(op, 0) + 1
    return number


def bind_steps(steps: list[Step], timeout: float | None, where: list, tokens: int) -> tuple[Callable[[], None], ...]:
    """Recorded steps as callables that run them, blocking, in order (a plan's run, a compiled
    call's): each collective bound once (:meth:`LibComm.bind`: straight to MPI where nothing
    watches it), each collective kept in flight started into and waited for from its token's slot
    (``tokens`` of them), each local step a ``partial``. ``where[part]`` names a step's call."""
    slots: list = [None] * tokens
    bound = []
    for s in steps:
        if s.kind == COUNT:
            bound.append(partial(count_call, *s.args))
        elif s.kind == MPI_CALL:
            bound.append(s.comm.bind(s.name, s.args, timeout, where[s.part]))
        elif s.kind == START:
            bound.append(partial(_start_into, slots, s.token, s.comm, s.name, s.args, where[s.part]))
        elif s.kind == WAIT:
            first = next(t for t in steps if t.kind == START and t.token == s.token)
            bound.append(partial(_wait_from, slots, s.token, first.comm, timeout, first.name, where[s.part]))
        elif s.kind == TEST:
            bound.append(partial(_test_in, slots, s.token))
        else:
            bound.append(partial(s.fn, *s.args))
    return tuple(bound)


# ----------------------------------------------------------------------------- plans

_IDLE, _STARTED, _FREED = 0, 1, 2
_LIVE: "weakref.WeakSet[Plan]" = weakref.WeakSet()


class Plan:
    """Calls checked and agreed once, their MPI calls bound: run them as often as needed.

    Made by ``<Operation>.prepare(...)`` with the arguments ``execute`` takes (one call), or from a
    :class:`Recorder` holding several calls (each a *part*). It keeps references to its input and
    output arrays and reads the inputs' current contents on every run; it owns its output (and
    scratch), so a run allocates nothing. Its steps run on the operations' own communicators: a
    started plan whose later collectives are not yet started waits in their queue, so that any
    later collective there starts after them, on every rank alike.

    Collective: every rank of the operation's communicator(s) prepares, runs, starts, waits for
    and frees its plans in the same order, as with any MPI collective.

    Attributes:
        op: the operator's name ("graph of N calls" for several).
        result: what :meth:`run` returns: the call's output, or a tuple of each call's.
        parts: the calls, in order (:class:`Part`).
    """

    __slots__ = ("op", "result", "parts", "_owner", "_steps", "_used", "_tokens", "_persistent",
                 "_handle", "_state", "_go", "_where", "__weakref__")

    def __init__(self, rec: Recorder, owner: Any, rounds: bool = False) -> None:
        self.parts = rec.parts
        self.op = self.parts[0].op if len(self.parts) == 1 else f"graph of {len(self.parts)} calls"
        self.result = self.parts[0].result if len(self.parts) == 1 else tuple(p.result for p in self.parts)
        self._owner = owner            # (the operation or graph that made it: its timeout is the plan's)
        self._tokens = rec.tokens
        self._used = tuple(dict.fromkeys(s.comm for s in rec.steps if s.comm is not None))
        self._steps = rec.steps
        self._sequence(rounds)
        self._where = [(p.op, None, "") for p in self.parts]
        self._persistent: list[MPI.Prequest | None] | None = None     # (made at the first start)
        self._handle: Handle | None = None
        self._state = _IDLE
        self._go: Callable[[], None] | None = None
        _LIVE.add(self)

    @property
    def _timeout(self) -> float | None:
        return self._owner.timeout

    def _sequence(self, rounds: bool) -> None:
        """A prepared plan or a graph skips the per-call agreement. On each of its communicators that
        keeps a sequence (a watchdog or ``MPICOLL_DEBUG``: ``not plain``), its every run and start
        first agrees one header row (:func:`mpicoll._validate.plan_row`: a plan's run and the plan's
        serial number there), as a validated call's header is agreed. A rank
        that skipped a run and then made another call (a validated one, or a run of another plan)
        meets it with a row that differs: every rank raises the same named error instead of
        finishing with another call's bytes. (A rank that skipped a run and runs the same plan
        again pairs with its peers' run: the same call.) The agreement is the plan's first steps
        after its count, so that a started plan starts it non-blocking like its other collectives;
        it costs one small ``Allgather`` per such communicator per run. ``rounds``: the parts are
        the rounds of one call, each released on its own (the Hccl client's commits): each round
        agrees its own row (the round's number in it), so that a rank that skipped a commit meets
        its peers' next round with another call, or another round, and all of them raise."""
        serials = {c: _next_serial(c) for c in self._used if not c.plain}
        if not serials:
            return
        steps, begin = [], 0
        checked = self.parts if rounds else self.parts[:1]
        for k, p in enumerate(checked):
            part = self._steps[begin:p.end]
            at = 1 if part and part[0].kind == COUNT else 0
            checks = []
            for c, serial in serials.items():
                row = V.plan_row(c.size, serial, k)
                table = np.empty((c.size, row.size), dtype=np.int64)
                checks += [Step(MPI_CALL, c, "Allgather", _check_sequence, ([row, MPI.INT64_T], [table, MPI.INT64_T]),
                                -1, k),
                           Step(LOCAL, None, "", _check_sequence, (c, table, self._owner), -1, k)]
            steps += part[:at] + checks + part[at:]
            begin = p.end
            p.end = len(steps)
        shift = len(steps) - begin                  # (the parts after the checked ones move by this)
        for p in self.parts[len(checked):]:
            p.end += shift
        self._steps = steps + self._steps[begin:]

    def run(self) -> Any:
        """Run the calls once, blocking; returns the output (the same arrays on every run).

        Raises:
            CollectiveError: the plan is freed, or started and not yet waited for.
        """
        if self._state or _comm.FREED:              # (MPI finalizing counts: _comm._finalizing)
            if self._state or MPI.Is_finalized():
                self._refuse("run")
            _comm.check_live(self._used, self.op)
        if self._go is None:
            self._go = self._bind()
        if _comm.QUEUED:
            for c in self._used:
                if c.pending:
                    c.drain(None)
        self._go()
        return self.result

    def _bind(self) -> Callable[[], None]:
        """The steps as one callable (made at the first run)."""
        bound = bind_steps(self._steps, self._timeout, self._where, self._tokens)
        if not bound:
            return _nothing
        return bound[0] if len(bound) == 1 else partial(_each, bound)

    def start(self, end: int | None = None) -> "Handle":
        """Start the calls non-blocking (MPI persistent requests); returns their :class:`Handle`.

        Args:
            end: run only the first ``end`` steps for now; :meth:`Handle.release` lets the run go
                further (the Hccl client's committed rounds). Default: every step.

        Raises:
            CollectiveError: the plan is freed, or already started and not yet waited for.
        """
        if self._state or MPI.Is_finalized():
            self._refuse("start")
        _comm.check_live(self._used, self.op)
        if self._persistent is None:      # made at the first start, on every rank at the same point
            # (not the sequence rows: a persistent collective matches only its own starts, never
            # the call a rank that skipped this run makes instead, which the row is there to meet)
            self._persistent = [s.comm.persistent(s.name, s.args) if s.kind in (MPI_CALL, START)
                                and s.fn is not _check_sequence else None for s in self._steps]
        self._state = _STARTED
        handle = self._handle = Handle(self, len(self._steps) if end is None else end)
        handle._advance(block=False)      # (the plan stays started until the caller sees it complete)
        return handle

    def free(self) -> None:
        """Release the plan's persistent requests. A freed plan refuses to run; freeing twice is fine.

        Raises:
            CollectiveError: the plan is started and not yet waited for.
        """
        if self._state == _FREED:
            return
        if self._state == _STARTED and not self._handle.parked:
            self._refuse("free")
        if self._handle is not None:
            self._handle._forget()
        self._state = _FREED
        self._release()

    def __enter__(self) -> "Plan":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and self._state == _STARTED:
            self._abandon()               # a run is in flight and the block failed: no more MPI calls
            return
        self.free()

    def _abandon(self) -> None:
        """Leave a started run as it is (MPI cannot free active requests): no more MPI calls for it
        (docs/plans.md, "When a started plan is abandoned")."""
        self._state = _FREED
        if self._handle is not None:
            self._handle._forget()

    def __del__(self) -> None:
        try:
            self._release()
        except Exception:  # noqa: BLE001 - at interpreter exit MPI may be gone
            pass

    def _release(self) -> None:
        """Free the persistent requests (local)."""
        reqs, self._persistent = self._persistent, None
        if reqs and not MPI.Is_finalized():
            for r in reqs:
                if r is not None:
                    r.Free()

    def _refuse(self, what: str) -> None:
        if MPI.Is_finalized():
            raise _comm.finalized(self.op, f"{what}()")
        if self._state == _FREED:
            raise CollectiveError(f"{self.op}: {what}() on a freed plan: prepare a new one", op=self.op,
                                  param="plan")
        raise CollectiveError(f"{self.op}: {what}() on a plan that is started and not yet waited for: call "
                              "wait() on its handle first", op=self.op, param="plan")

    @property
    def idle(self) -> bool:
        """Whether the plan may run or start now (not started, not freed)."""
        return self._state == _IDLE

    def __repr__(self) -> str:
        state = ("idle", "started", "freed")[self._state]
        return f"<Plan {self.op}: {len(self._steps)} step(s), {state}>"


#: communicator -> how many sequenced plans were made on it (every member makes them in the same order)
_SERIALS: "weakref.WeakKeyDictionary[LibComm, int]" = weakref.WeakKeyDictionary()


def _next_serial(c: LibComm) -> int:
    k = _SERIALS[c] = _SERIALS.get(c, 0) + 1
    return k


def _check_sequence(c: LibComm, table: np.ndarray, owner: Any) -> None:
    """The gathered sequence rows (:meth:`Plan._sequence`): a peer's local error (its call failed to
    describe) is exchanged and raised, as a validated call's; any other difference is a named
    mismatch, the same on every rank."""
    if any(table[:, 0].tolist()):          # (as _agreement.agree does after its Allgather)
        settle(c, None, owner.timeout, (V.PLAN_RUN, None, ERROR_STEP))
    V.check_agreed(c, V.PLAN_READS, table)


def _each(fns: tuple) -> None:
    for fn in fns:
        fn()


def _nothing() -> None:
    pass


def _start_into(slots: list, token: int, comm: LibComm, name: str, args: tuple, where: tuple) -> None:
    slots[token] = comm.start(name, args, where)


def _test_in(slots: list, token: int) -> None:
    slots[token].Test()


def _wait_from(slots: list, token: int, comm: LibComm, timeout: float | None, name: str, where: tuple) -> None:
    req, slots[token] = slots[token], None
    comm.wait([req], timeout, name, where)


class Handle:
    """A started run of a :class:`Plan` (what :meth:`Plan.start` returns).

    ``wait()`` completes it and returns the output; ``test()`` makes progress without blocking and
    says whether it is complete. MPI moves a non-blocking collective forward only inside MPI
    calls, so calling ``test()`` now and then during long local work helps it along.
    """

    __slots__ = ("_plan", "_i", "_end", "_cur", "_open", "_started", "_done", "_queued", "_last")

    def __init__(self, plan: Plan, end: int) -> None:
        self._plan = plan
        self._i, self._end, self._cur, self._done = 0, end, None, False
        self._open: dict[int, MPI.Request] = {}
        self._started = time.monotonic()
        self._queued: tuple[LibComm, ...] = ()
        self._last = _last_collective(plan._steps, end)

    @property
    def steps_done(self) -> int:
        """How many of the plan's steps are complete."""
        return self._i

    @property
    def parked(self) -> bool:
        """Whether the run stopped at its ``end`` before the plan's last step (nothing in flight)."""
        return self._i == self._end < len(self._plan._steps) and not self._open and self._cur is None

    def release(self, end: int) -> None:
        """Let the run go on up to step ``end`` (a run started with ``Plan.start(end)``), starting
        what it can at once."""
        _comm.check_live(self._plan._used, self._plan.op)
        if end > self._end:
            self._end = end
            self._last = _last_collective(self._plan._steps, end)
            self._advance(block=False)

    def test(self) -> bool:
        """Make progress without blocking; True once the run is complete (the plan may then be run
        or started again)."""
        if MPI.Is_finalized():
            raise _comm.finalized(self._plan.op, "test()")
        if self._advance(block=False):
            self._finish()
            return True
        return False

    def wait(self) -> Any:
        """Complete the run (blocking; under the watchdog when the operation has a timeout) and
        return the plan's output. A run started with an ``end`` completes the steps released so
        far; the plan stays started until every step is done."""
        if MPI.Is_finalized():
            raise _comm.finalized(self._plan.op, "wait()")
        if self._advance(block=True):
            self._finish()
        return self._plan.result

    def issue_all(self) -> None:
        """Start every released collective not yet started (blocking for what they need first):
        what a communicator asks of the work queued ahead of a new collective."""
        if self._unstarted() <= self._last:
            self._advance(block=True, upto=self._last)
        self._unqueue()

    def _unstarted(self) -> int:
        """The index of the first step not yet started."""
        return self._i + (self._cur is not None)

    def _finish(self) -> None:
        plan = self._plan
        if plan._handle is self:
            plan._state, plan._handle = _IDLE, None

    def _forget(self) -> None:
        """The plan is freed or abandoned: leave the communicators' queues."""
        self._unqueue()

    def _queue(self) -> None:
        """Wait in the queue of every communicator with a released collective not yet started."""
        first = self._unstarted()
        if first > self._last or self._queued:
            return
        steps = self._plan._steps
        self._queued = tuple(dict.fromkeys(s.comm for s in steps[first:self._last + 1] if s.comm is not None))
        with _comm.LOCK:                  # (a worker thread changes these too)
            for c in self._queued:
                c.pending.append(self)
            _comm.QUEUED += 1

    def _unqueue(self) -> None:
        if not self._queued:
            return
        with _comm.LOCK:
            for c in self._queued:
                if self in c.pending:
                    c.pending.remove(self)
            _comm.QUEUED -= 1
        self._queued = ()

    def _advance(self, block: bool, upto: int | None = None) -> bool:
        """Run the released steps in order; False when one is not complete yet (not blocking), or
        once step ``upto`` is started. Work with collectives still to start waits in the queues. A
        collective a step makes itself (the error path of its sequence check) drives only the work
        queued ahead of this run (``RUNNING.job``, as a worker's job does)."""
        if self._done:
            return True
        running = getattr(_comm.RUNNING, "job", None)
        _comm.RUNNING.job = self
        try:
            self._done = self._run_steps(block, upto)
        finally:
            _comm.RUNNING.job = running
            if not self._done:
                self._queue()
        return self._done

    def _run_steps(self, block: bool, upto: int | None) -> bool:
        plan = self._plan
        steps, persistent = plan._steps, plan._persistent
        held, asked = False, block    # (between Recorder.hold's marks: block, and do not stop at upto)
        while self._i < self._end:
            s = steps[self._i]
            kind = s.kind
            if kind == LOCAL:
                s.fn(*s.args)
                if s.fn is _held or s.fn is _released:
                    held = s.fn is _held
                    block = asked or held
            elif kind == COUNT:
                count_call(*s.args)
            elif kind == WAIT:
                if not self._complete([self._open[s.token]], block, steps[_start_of(steps, self._i, s.token)]):
                    return False
                del self._open[s.token]
            elif kind == TEST:
                self._open[s.token].Test()
            elif self._cur is None or kind == START:
                made = None if persistent is None else persistent[self._i]
                req = s.comm.start(s.name if made is None else made, s.args, plan._where[s.part], self)
                if kind == MPI_CALL:
                    self._cur, self._started = req, time.monotonic()   # (the timeout counts per collective)
                    if self._queued and self._i >= self._last:
                        self._unqueue()
                    if upto is not None and self._i >= upto and not held:
                        return False
                    continue
                self._open[s.token] = req
            else:                                       # MPI_CALL in flight
                if not self._complete([self._cur], block, s):
                    return False
                self._cur = None
            self._i += 1
            if self._queued and self._i > self._last:
                self._unqueue()
            if upto is not None and self._i > upto and not held:
                return False
        return self._i == len(steps)

    def _complete(self, reqs: list, block: bool, step: Step) -> bool:
        plan = self._plan
        timeout, (op, number, _) = plan._timeout, plan._where[step.part]
        where = (op, number, f"MPI {step.name} (started by Plan.start)")
        if block:
            left = None if timeout is None else max(timeout - (time.monotonic() - self._started), 0.0)
            step.comm.wait(reqs, left, step.name, where)
            return True
        if done(reqs):
            return True
        if timeout is not None and time.monotonic() - self._started > timeout:
            step.comm.wait(reqs, 0.0, step.name, where)
        return False


def _held() -> None:
    """The mark :meth:`Recorder.hold` records where steps that must run in one go begin."""


def _released() -> None:
    """The mark where they end."""


def _last_collective(steps: list[Step], end: int) -> int:
    """The index of the last collective start among the first ``end`` steps (-1: none)."""
    for i in range(min(end, len(steps)) - 1, -1, -1):
        if steps[i].kind in (MPI_CALL, START):
            return i
    return -1


def _start_of(steps: list[Step], i: int, token: int) -> int:
    while steps[i].kind != START or steps[i].token != token:
        i -= 1
    return i


@atexit.register
def _free_live_plans() -> None:
    """Free the persistent requests of plans still alive at exit (MPICH warns about each)."""
    for plan in list(_LIVE):
        try:
            plan._release()
        except Exception:  # noqa: BLE001
            pass
