"""Plans: calls checked and agreed once, their MPI calls bound, run as often as needed, blocking
(:meth:`Plan.run`) or not (:meth:`Plan.start` -> :class:`~mpicoll._handle.Handle`); their sequence
agreement (a rank that skips a run meets its peers' next call with another row, and every rank
raises the same error).
"""
from __future__ import annotations

import atexit
import json
import weakref
from functools import partial
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from . import _comm, _trace
from . import _validate as V
from ._agreement import flagged
from ._comm import LibComm
from ._errors import CollectiveError
from ._go import AGREE, COUNT, LOCAL, MPI_CALL, START, Part, Recorder, Step, bind_steps, nothing
from ._handle import Handle

_IDLE, _STARTED, _FREED = 0, 1, 2
_LIVE: "weakref.WeakSet[Plan]" = weakref.WeakSet()


class Plan:
    """Calls checked and agreed once, their MPI calls bound: run them as often as needed.

    Made by ``<Operation>.prepare(...)`` with the arguments ``execute`` takes (one call), or from a
    :class:`~mpicoll._go.Recorder` holding several calls (each a *part*). It keeps references to its input and
    output arrays and reads the inputs' current contents on every run; it owns its output (and
    scratch), so a run allocates nothing. Its steps run on the operations' own communicators: a
    started plan whose later collectives are not yet started waits in their queue, so that any
    later collective there starts after them, on every rank alike.

    Collective: every rank of the operation's communicator(s) prepares, runs, starts, waits for
    and frees its plans in the same order, as with any MPI collective.

    Attributes:
        op: the operator's name ("graph of N calls" for several).
        result: what :meth:`run` returns: the call's output, or a tuple of each call's.
        parts: the calls, in order (:class:`~mpicoll._go.Part`).
    """

    __slots__ = ("op", "result", "parts", "_owner", "_steps", "_used", "_tokens", "_persistent",
                 "_handle", "_state", "_go", "_where", "_fields", "__weakref__")

    def __init__(self, rec: Recorder, owner: Any, rounds: bool = False) -> None:
        self._owner = owner            # (the operation or graph that made it: its timeout is the plan's)
        self._tokens = rec.tokens
        self._used = tuple(dict.fromkeys(s.comm for s in rec.steps if s.comm is not None))
        self._steps, self.parts = _sequenced(rec, self._used, rounds, owner)
        self.op = self.parts[0].op if len(self.parts) == 1 else f"graph of {len(self.parts)} calls"
        self.result = self.parts[0].result if len(self.parts) == 1 else tuple(p.result for p in self.parts)
        self._where = [(p.op, None, "") for p in self.parts]
        self._persistent: list[MPI.Prequest | None] | None = None     # (made at the first start)
        self._handle: Handle | None = None
        self._state = _IDLE
        self._go: Callable[[], None] | None = None
        self._fields: str | None = None              # (its trace event's fields, made at its first traced run)
        _LIVE.add(self)

    @property
    def timeout(self) -> float | None:
        """The watchdog timeout of its runs: its maker's (the operation's or the graph's)."""
        return self._owner.timeout

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
        if _trace.ON:
            if self._fields is None:
                self._fields = (f'{{"comm": {json.dumps([c.label for c in self._used])}, "steps": {len(self._steps)}, '
                                '"path": "plan"')
            _trace.timed(self.op, "plan" if len(self.parts) == 1 else "graph", self._fields, self._go)
        else:
            self._go()
        return self.result

    def _bind(self) -> Callable[[], None]:
        """The steps as one callable (made at the first run)."""
        bound = bind_steps(self._steps, self.timeout, self._where, self._tokens)
        if not bound:
            return nothing
        return bound[0] if len(bound) == 1 else partial(_each, bound)

    def start(self, end: int | None = None) -> "Handle":
        """Start the calls non-blocking (MPI persistent requests); returns their :class:`~mpicoll._handle.Handle`.

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
            # (not the sequence rows, AGREE: a persistent collective matches only its own starts,
            # never the call a rank that skipped this run makes instead, which the row is there to meet)
            self._persistent = [s.comm.persistent(s.name, s.args) if s.kind in (MPI_CALL, START) else None
                                for s in self._steps]
        self._state = _STARTED
        handle = self._handle = Handle(self, self._steps, self._persistent, self._where, self._used,
                                       len(self._steps) if end is None else end, self._finished)
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
            self._handle.forget()
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
            self._handle.forget()

    def __del__(self) -> None:
        try:
            self._release()
        except Exception:  # noqa: BLE001 - at interpreter exit MPI may be gone
            pass

    def _finished(self, handle: Handle) -> None:
        """``handle``'s caller saw its run complete: the plan may run or start again."""
        if self._handle is handle:
            self._state, self._handle = _IDLE, None

    def _release(self) -> None:
        """Free the persistent requests (local; a run left parked then starts its collectives afresh)."""
        reqs, self._persistent = self._persistent, None
        if reqs and not MPI.Is_finalized():
            for i, r in enumerate(reqs):
                if r is not None:
                    r.Free()
                    reqs[i] = None

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


def _sequenced(rec: Recorder, used: tuple[LibComm, ...], rounds: bool, owner: Any) -> tuple[list[Step], list[Part]]:
    """The plan's steps and parts: ``rec``'s, with its sequence agreement.

    A prepared plan or a graph skips the per-call agreement. On each of its communicators that
    keeps a sequence (a watchdog or ``MPICOLL_DEBUG``: ``not plain``), its every run and start
    first agrees one header row (:func:`mpicoll._validate.plan_row`: a plan's run and the plan's
    serial number there: an AGREE step), as a validated call's header is agreed. A rank
    that skipped a run and then made another call (a validated one, or a run of another plan)
    meets it with a row that differs: every rank raises the same named error instead of
    finishing with another call's bytes. (A rank that skipped a run and runs the same plan
    again pairs with its peers' run: the same call.) The agreement is the plan's first steps
    after its count, so that a started plan starts it non-blocking like its other collectives;
    it costs one small ``Allgather`` per such communicator per run. ``rounds``: the parts are
    the rounds of one call, each released on its own (the Hccl client's commits): each round
    agrees its own row (the round's number in it), so that a rank that skipped a commit meets
    its peers' next round with another call, or another round, and all of them raise.
    """
    serials = {c: _next_serial(c) for c in used if not c.plain}
    if not serials:
        return rec.steps, rec.parts
    steps: list[Step] = []
    parts, begin = [], 0
    for k, p in enumerate(rec.parts):
        part = rec.steps[begin:p.end]
        begin = p.end
        if rounds or k == 0:
            at = 1 if part and part[0].kind == COUNT else 0
            checks = []
            for c, serial in serials.items():
                row = V.plan_row(c.size, serial, k)
                table = np.empty((c.size, row.size), dtype=np.int64)
                checks += [Step(AGREE, c, "Allgather", None, ([row, MPI.INT64_T], [table, MPI.INT64_T]), -1, k),
                           Step(LOCAL, None, "", check_sequence, (c, table, owner), -1, k)]
            part = part[:at] + checks + part[at:]
        steps += part
        parts.append(Part(p.op, p.comms, len(steps), p.result))
    return steps, parts


#: communicator -> how many sequenced plans were made on it (every member makes them in the same order)
_SERIALS: "weakref.WeakKeyDictionary[LibComm, int]" = weakref.WeakKeyDictionary()


def _next_serial(c: LibComm) -> int:
    k = _SERIALS[c] = _SERIALS.get(c, 0) + 1
    return k


def check_sequence(c: LibComm, table: np.ndarray, owner: Any) -> None:
    """The gathered sequence rows (:func:`_sequenced`): a peer's local error (its call failed to
    describe) is exchanged and raised, as a validated call's; any other difference is a named
    mismatch, the same on every rank."""
    failure = flagged(c, table, None, owner.timeout, (V.PLAN_RUN, None, ""))
    if failure is not None:
        raise failure
    V.check_agreed(c, V.PLAN_READS, table)


def _each(fns: tuple) -> None:
    for fn in fns:
        fn()


@atexit.register
def _free_live_plans() -> None:
    """Free the persistent requests of plans still alive at exit (MPICH warns about each)."""
    for plan in list(_LIVE):
        try:
            plan._release()
        except Exception:  # noqa: BLE001
            pass
