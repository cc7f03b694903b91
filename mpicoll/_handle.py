"""A started run of a plan (:meth:`mpicoll.Plan.start`): its recorded steps driven one after the
other, non-blocking where it can, each by its kind (:class:`~mpicoll._go.Step`).

MPI requires the collectives of one communicator to start in the same order on every rank. A
started run whose later steps need its earlier ones to complete (a float16 AllReduce: AllToAll, a
local reduction, AllGather) starts those later steps lazily, in ``test()`` or ``wait()``, at
different moments on different ranks; so while it has collectives not yet started, it waits in the
``pending`` queue of each communicator they run on, and any later collective there first drives it
until it has started them all (``LibComm.drain`` -> :meth:`Handle.issue_all`).
"""
from __future__ import annotations

import time
from typing import Any, Callable

from mpi4py import MPI

from . import _comm
from ._comm import LibComm
from ._go import AGREE, COLLECTIVES, COUNT, HOLD, LOCAL, MPI_CALL, RELEASE, START, TEST, WAIT, Step, count_call
from ._watchdog import done


class Handle:
    """A started run of a :class:`~mpicoll.Plan` (what :meth:`Plan.start` returns).

    ``wait()`` completes it and returns the output; ``test()`` makes progress without blocking and
    says whether it is complete. MPI moves a non-blocking collective forward only inside MPI
    calls, so calling ``test()`` now and then during long local work helps it along.
    """

    __slots__ = ("_plan", "_steps", "_persistent", "_where", "_used", "_finished", "_i", "_end", "_cur", "_open",
                 "_started", "_done", "_queued", "_last")

    def __init__(self, plan: Any, steps: list[Step], persistent: list, where: list, used: tuple, end: int,
                 finished: Callable[["Handle"], None]) -> None:
        """``plan``: what it runs (its ``op``, ``result``, ``timeout``); its ``steps``, their
        ``persistent`` requests (None: started afresh), how each part names its call (``where``),
        the communicators it ``used``; the first ``end`` steps released; ``finished(self)`` once the
        caller sees it complete."""
        self._plan, self._steps, self._persistent, self._finished = plan, steps, persistent, finished
        self._where, self._used = where, used
        self._i, self._end, self._cur, self._done = 0, end, None, False
        self._open: dict[int, MPI.Request] = {}
        self._started = time.monotonic()
        self._queued: tuple[LibComm, ...] = ()
        self._last = _last_collective(steps, end)

    @property
    def steps_done(self) -> int:
        """How many of the plan's steps are complete."""
        return self._i

    @property
    def parked(self) -> bool:
        """Whether the run stopped at its ``end`` before the plan's last step (nothing in flight)."""
        return self._i == self._end < len(self._steps) and not self._open and self._cur is None

    def release(self, end: int) -> None:
        """Let the run go on up to step ``end`` (a run started with ``Plan.start(end)``), starting
        what it can at once."""
        _comm.check_live(self._used, self._plan.op)
        if end > self._end:
            self._end = end
            self._last = _last_collective(self._steps, end)
            self._advance(block=False)

    def test(self) -> bool:
        """Make progress without blocking; True once the run is complete (the plan may then be run
        or started again)."""
        if MPI.Is_finalized():
            raise _comm.finalized(self._plan.op, "test()")
        if self._advance(block=False):
            self._finished(self)
            return True
        return False

    def wait(self) -> Any:
        """Complete the run (blocking; under the watchdog when the operation has a timeout) and
        return the plan's output. A run started with an ``end`` completes the steps released so
        far; the plan stays started until every step is done."""
        if MPI.Is_finalized():
            raise _comm.finalized(self._plan.op, "wait()")
        if self._advance(block=True):
            self._finished(self)
        return self._plan.result

    def issue_all(self) -> None:
        """Start every released collective not yet started (blocking for what they need first):
        what a communicator asks of the work queued ahead of a new collective."""
        if self._unstarted() <= self._last:
            self._advance(block=True, upto=self._last)
        self._unqueue()

    def forget(self) -> None:
        """The plan is freed or abandoned: leave the communicators' queues."""
        self._unqueue()

    def _unstarted(self) -> int:
        """The index of the first step not yet started."""
        return self._i + (self._cur is not None)

    def _queue(self) -> None:
        """Wait in the queue of every communicator with a released collective not yet started."""
        first = self._unstarted()
        if first > self._last or self._queued:
            return
        self._queued = tuple(dict.fromkeys(s.comm for s in self._steps[first:self._last + 1]
                                           if s.kind in COLLECTIVES))
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
        steps, persistent, where = self._steps, self._persistent, self._where
        held, asked = False, block    # (from a HOLD to its RELEASE: block, and do not stop at upto)
        while self._i < self._end:
            s = steps[self._i]
            kind = s.kind
            if kind == LOCAL:
                s.fn(*s.args)
            elif kind == HOLD or kind == RELEASE:
                held = kind == HOLD
                block = asked or held
            elif kind == COUNT:
                count_call(*s.args)
            elif kind == WAIT:
                if not self._complete([self._open[s.token]], block, s):
                    return False
                del self._open[s.token]
            elif kind == TEST:
                self._open[s.token].Test()
            elif self._cur is None or kind == START:      # (a collective: MPI_CALL, AGREE or START)
                made = persistent[self._i]
                req = s.comm.start(s.name if made is None else made, s.args, where[s.part], self)
                if kind == MPI_CALL or kind == AGREE:
                    self._cur, self._started = req, time.monotonic()   # (the timeout counts per collective)
                    if self._queued and self._i >= self._last:
                        self._unqueue()
                    if upto is not None and self._i >= upto and not held:
                        return False
                    continue
                self._open[s.token] = req
            else:                                       # (a blocking collective in flight)
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
        timeout, (op, number, _) = self._plan.timeout, self._where[step.part]
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


def _last_collective(steps: list[Step], end: int) -> int:
    """The index of the last collective start among the first ``end`` steps (-1: none)."""
    for i in range(min(end, len(steps)) - 1, -1, -1):
        if steps[i].kind in COLLECTIVES:
            return i
    return -1
