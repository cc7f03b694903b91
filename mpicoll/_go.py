"""What ``issue`` talks to: the *go* objects, which run a described call's steps at once or record
them.

An operator's ``issue`` turns a call (and, when agreed, the header table) into MPI calls and local
work, by talking to a *go* object:

* ``go.mpi(comm, name, *args)``: the blocking collective ``comm.mpi.<name>(*args)`` (an mpi4py
  method name, e.g. ``"Allreduce"``) on a :class:`~mpicoll._comm.LibComm`;
* ``go.local(fn, *args)``: local work ``fn(*args)`` (a reduction, a copy) between collectives;
* ``go.scratch(make, *key)``: scratch buffers ``make(*key)``, reused by ``execute`` from one call to
  the next with the same key, owned by a plan;
* ``token = go.start(comm, name, *args)`` and ``go.wait(token)``: the same collective kept in flight
  while the steps between them run (local work, other collectives), at most ``MAX_IN_FLIGHT`` at
  once (a start beyond that first waits for the oldest); ``go.test(token)`` between long local
  steps lets MPI move it on (MPICH progresses a non-blocking collective only inside MPI calls);
* ``go.hold(True)`` ... ``go.hold(False)``: steps that must run in one go in a started plan.

``execute`` hands ``issue`` a :class:`Runner`, which does each step at once. ``prepare`` (and a
compiled call, and a captured graph) hands it a :class:`Recorder`, which keeps the steps, each of
a kind (:class:`Step`), in *parts*: one per call, each labelled with its operator. Recorded steps
are bound once (:func:`bind_steps`: a compiled call's, a plan's blocking run) or driven by a
started plan's :class:`~mpicoll._handle.Handle`. So ``issue``, the only place that picks an MPI
call, serves every mode.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable

from ._comm import LibComm

#: the most collectives one call keeps in flight at once (``go.start``); a start beyond it first
#: waits for the oldest, on every rank alike
MAX_IN_FLIGHT = 16


# ----------------------------------------------------------------------------- execute: at once

class Runner:
    """``go`` for ``execute``: each step at once, on the spot (one per operation, reused, under the
    operation's timeout)."""

    __slots__ = ("where", "op", "_flight", "_next", "_scratch", "taken")

    def __init__(self, op: Any) -> None:
        self.where, self.op = (op.NAME, None, ""), op
        self._flight: dict[int, tuple] = {}         # token -> (comm, name, request), oldest first
        self._next = 0
        self._scratch: tuple = (None, None)
        self.taken: str | None = None               # the path issue last said its call took (took)

    def took(self, path: str) -> None:
        """``issue`` says which path its call takes (:mod:`mpicoll.ops._paths`; a trace shows it)."""
        self.taken = path

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


# ----------------------------------------------------------------------------- recorded steps

#: the kinds of a recorded :class:`Step`
COUNT, MPI_CALL, START, WAIT, LOCAL, TEST, HOLD, RELEASE, AGREE = range(9)
#: the kinds that start a collective on the step's communicator
COLLECTIVES = (MPI_CALL, START, AGREE)


class Step:
    """One recorded step, of a ``kind``: COUNT (a part begins: count its call, ``args``), MPI_CALL (a
    blocking collective ``name`` on ``comm``), START / WAIT / TEST (a collective kept in flight, by
    ``token``: a WAIT names its START's ``comm`` and ``name``), LOCAL (``fn(*args)``), HOLD / RELEASE
    (the steps between share state with other runs on their communicator: a started run goes
    through them in one go, :meth:`Recorder.hold`), or AGREE (a plan's sequence row, ``Allgather``:
    a blocking collective that is started afresh on every run, never a persistent request, since
    it must meet whatever call a rank that skipped a run makes instead). ``part``: the index of the
    call it belongs to."""

    __slots__ = ("kind", "comm", "name", "fn", "args", "token", "part")

    def __init__(self, kind: int, comm: LibComm | None, name: str, fn: Callable | None, args: tuple,
                 token: int, part: int) -> None:
        self.kind, self.comm, self.name, self.fn, self.args, self.token, self.part = \
            kind, comm, name, fn, args, token, part


class Part:
    """One call among recorded steps: its operator, the communicators it is counted on, where its
    steps end, and what it returns."""

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
        self._open: dict[int, Step] = {}          # token -> its START, oldest first
        self._part = -1
        self._op: tuple | None = None
        self.taken: str | None = None               # the path issue said its call takes (took)

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

    def took(self, path: str) -> None:
        """``issue`` says which path its call takes (a compiled call keeps it for its trace)."""
        self.taken = path

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
        self.steps.append(Step(HOLD if on else RELEASE, None, "", None, (), -1, self._part))

    def start(self, comm: LibComm, name: str, *args: Any) -> int:
        if len(self._open) >= MAX_IN_FLIGHT:
            self.wait(next(iter(self._open)))
        token = self.tokens
        self.tokens += 1
        self._open[token] = step = Step(START, comm, name, None, args, token, self._part)
        self.steps.append(step)
        return token

    def wait(self, token: int) -> None:
        first = self._open.pop(token, None)
        if first is not None:
            self.steps.append(Step(WAIT, first.comm, first.name, None, (), token, self._part))

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
    """Recorded steps as callables that run them, blocking, in order, one per step (a plan's run, a
    compiled call's): each collective bound once (:meth:`LibComm.bind`: straight to MPI where
    nothing watches it), each collective kept in flight started into and waited for from its
    token's slot (``tokens`` of them), each local step a ``partial``, a HOLD or RELEASE nothing (a
    blocking run goes through every step in one go). ``where[part]`` names a step's call."""
    slots: list = [None] * tokens
    bound = []
    for s in steps:
        kind = s.kind
        if kind == COUNT:
            bound.append(partial(count_call, *s.args))
        elif kind == MPI_CALL or kind == AGREE:
            bound.append(s.comm.bind(s.name, s.args, timeout, where[s.part]))
        elif kind == START:
            bound.append(partial(_start_into, slots, s.token, s.comm, s.name, s.args, where[s.part]))
        elif kind == WAIT:
            bound.append(partial(_wait_from, slots, s.token, s.comm, timeout, s.name, where[s.part]))
        elif kind == TEST:
            bound.append(partial(_test_in, slots, s.token))
        elif kind == LOCAL:
            bound.append(partial(s.fn, *s.args))
        else:
            bound.append(nothing)
    return tuple(bound)


def nothing() -> None:
    """A step that does nothing (a HOLD or RELEASE in a blocking run)."""


def _start_into(slots: list, token: int, comm: LibComm, name: str, args: tuple, where: tuple) -> None:
    slots[token] = comm.start(name, args, where)


def _test_in(slots: list, token: int) -> None:
    slots[token].Test()


def _wait_from(slots: list, token: int, comm: LibComm, timeout: float | None, name: str, where: tuple) -> None:
    req, slots[token] = slots[token], None
    comm.wait([req], timeout, name, where)
