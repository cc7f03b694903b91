"""How a described call runs: the call record, the two things ``issue`` talks to, and plans.

An operator's ``describe`` turns its arguments into a :class:`Call`; its ``issue`` turns a call
(and, when validated, the agreed header table) into MPI calls and local work, by talking to a
*go* object with two methods:

* ``go.mpi(comm, name, *args)``: the collective ``comm.mpi.<name>(*args)`` (a blocking mpi4py
  method name, e.g. ``"Allreduce"``) on a :class:`~mpicoll._comm.LibComm`;
* ``go.local(fn, *args)``: local work ``fn(*args)`` (a reduction, a copy) between collectives.

``execute`` hands ``issue`` a :class:`Runner`, which does each step at once. ``prepare`` hands it a
:class:`Recorder`, which keeps the steps; a :class:`Plan` binds them once and runs them many
times, blocking (:meth:`Plan.run`) or not (:meth:`Plan.start` -> :class:`Handle`). So ``issue``,
the only place that picks an MPI call, serves both.
"""
from __future__ import annotations

import atexit
import time
import weakref
from functools import partial
from typing import Any, Callable

from mpi4py import MPI

from ._comm import LibComm
from ._errors import CollectiveError
from ._watchdog import done


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

    The constructor takes the fields every call has; ``describe`` sets the others it needs, the
    class defaults standing otherwise (a plain class and positional arguments: the cheapest record
    to build on every ``execute``).
    """

    src = reduce = send = recv = None
    root = params = info = 0
    args: tuple = ()

    def __init__(self, dt, x, out, shape: tuple | None = None) -> None:
        self.dt, self.x, self.out, self.result, self.shape = dt, x, out, out, shape


class Runner:
    """``go`` for ``execute``: each step at once, on the spot."""

    __slots__ = ("where", "timeout")

    def __init__(self, op: str, timeout: float | None) -> None:
        self.where, self.timeout = (op, None, ""), timeout

    def mpi(self, comm: LibComm, name: str, *args: Any) -> None:
        comm.call(name, args, self.timeout, self.where)

    def local(self, fn: Callable, *args: Any) -> None:
        fn(*args)


class Step:
    """One recorded step: a collective (``comm`` set, ``name`` its blocking mpi4py method) or local
    work (``comm`` None, ``fn``)."""

    __slots__ = ("comm", "name", "fn", "args")

    def __init__(self, comm: LibComm | None, name: str, fn: Callable | None, args: tuple) -> None:
        self.comm, self.name, self.fn, self.args = comm, name, fn, args


class Recorder:
    """``go`` for ``prepare``: keeps the steps for a :class:`Plan`."""

    def __init__(self) -> None:
        self.steps: list[Step] = []

    def mpi(self, comm: LibComm, name: str, *args: Any) -> None:
        self.steps.append(Step(comm, name, None, args))

    def local(self, fn: Callable, *args: Any) -> None:
        self.steps.append(Step(None, "", fn, args))


_IDLE, _STARTED, _FREED = 0, 1, 2
_LIVE: "weakref.WeakSet[Plan]" = weakref.WeakSet()


class Plan:
    """A call checked and agreed once, its MPI calls bound: run it as often as needed.

    Made by ``<Operation>.prepare(...)`` with the arguments ``execute`` takes. It keeps references
    to its input and output arrays and reads the inputs' current contents on every run; it owns
    its output (and scratch), so a run allocates nothing. A plan whose steps include more than one
    collective runs them on private copies of its communicators, so that its non-blocking form
    cannot interleave with other collectives on them.

    Collective: every rank of the operation's communicator(s) prepares, runs, starts, waits for
    and frees its plans in the same order, as with any MPI collective.
    """

    __slots__ = ("op", "call", "result", "_timeout", "_private", "_steps", "_comms", "_calls", "_more",
                 "_persistent", "_handle", "_state", "_go", "__weakref__")

    def __init__(self, op_name: str, call: Call, steps: list[Step], comms: tuple[LibComm, ...],
                 timeout: float | None) -> None:
        self.op = op_name
        self.call = call
        self.result = call.result
        self._timeout = timeout
        if sum(s.comm is not None for s in steps) > 1:      # collectives issued while others may run
            used = list(dict.fromkeys(s.comm for s in steps if s.comm is not None))
            copies = {c: c.dup(f"a plan's copy of {c.label}", timeout) for c in used}
            steps = [Step(copies[s.comm], s.name, s.fn, s.args) if s.comm is not None else s for s in steps]
            self._private = tuple(copies.values())
            comms = tuple(copies.get(c, c) for c in comms)   # (a copy counts calls with its original)
        else:
            self._private = ()
        self._steps = steps
        self._comms = comms
        self._calls, self._more = comms[0].calls, comms[1:]     # (run() counts its calls)
        self._calls.setdefault(op_name, 0)
        self._persistent: list[MPI.Prequest | None] | None = None
        self._handle: Handle | None = None
        self._state = _IDLE
        where = (op_name, None, "")
        bound = [partial(s.fn, *s.args) if s.comm is None else
                 partial(getattr(s.comm.mpi, s.name), *s.args) if timeout is None and not s.comm.watched
                 and not s.comm.debug else                  # (the watchdog's marks, debug's sequence numbers)
                 partial(s.comm.call, s.name, s.args, timeout, where) for s in steps]
        self._go = bound[0] if len(bound) == 1 else partial(_each, tuple(bound))
        _LIVE.add(self)

    def run(self) -> Any:
        """Run the call once, blocking; returns the output (the same arrays on every run).

        Raises:
            CollectiveError: the plan is freed, or started and not yet waited for.
        """
        if self._state:
            self._refuse("run")
        self._calls[self.op] += 1
        if self._more:
            for c in self._more:
                c.count(self.op)
        self._go()
        return self.result

    def start(self, end: int | None = None) -> "Handle":
        """Start the call non-blocking (MPI persistent requests); returns its :class:`Handle`.

        Args:
            end: run only the first ``end`` steps for now; :meth:`Handle.release` lets the run go
                further (the Hccl client's committed rounds). Default: every step.

        Raises:
            CollectiveError: the plan is freed, or already started and not yet waited for.
        """
        if self._state:
            self._refuse("start")
        if self._persistent is None:       # made at the first start, on every rank at the same point
            self._persistent = [None if s.comm is None else getattr(s.comm.mpi, s.name + "_init")(*s.args)
                                for s in self._steps]
        self._state = _STARTED
        handle = self._handle = Handle(self, tuple(c.count(self.op) for c in self._comms),
                                       len(self._steps) if end is None else end)
        handle._advance(block=False)      # (the plan stays started until the caller sees it complete)
        return handle

    def free(self) -> None:
        """Release the plan's MPI resources (collective when it holds private communicators). A
        freed plan refuses to run; freeing twice is fine.

        Raises:
            CollectiveError: the plan is started and not yet waited for.
        """
        if self._state == _FREED:
            return
        if self._state == _STARTED and not self._handle.parked:
            self._refuse("free")
        self._state = _FREED
        self._release()
        for c in self._private:
            c.free()
        self._private = ()

    def __enter__(self) -> "Plan":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and self._state == _STARTED:
            self._state = _FREED      # a run is in flight and the block failed: no more MPI calls
            return
        self.free()

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
        if self._state == _FREED:
            raise CollectiveError(f"{self.op}: {what}() on a freed plan: prepare a new one", op=self.op,
                                  param="plan")
        raise CollectiveError(f"{self.op}: {what}() on a plan that is started and not yet waited for: call "
                              "wait() on its handle first", op=self.op, param="plan")

    def __repr__(self) -> str:
        state = ("idle", "started", "freed")[self._state]
        return f"<Plan {self.op}: {len(self._steps)} step(s), {state}>"


def _each(fns: tuple) -> None:
    for fn in fns:
        fn()


class Handle:
    """A started run of a :class:`Plan` (what :meth:`Plan.start` returns).

    ``wait()`` completes it and returns the output; ``test()`` makes progress without blocking and
    says whether it is complete. MPI moves a non-blocking collective forward only inside MPI
    calls, so calling ``test()`` now and then during long local work helps it along.
    """

    __slots__ = ("_plan", "_numbers", "_i", "_end", "_reqs", "_started", "_done")

    def __init__(self, plan: Plan, numbers: tuple, end: int) -> None:
        self._plan, self._numbers = plan, numbers
        self._i, self._end, self._reqs, self._done = 0, end, None, False
        self._started = time.monotonic()

    @property
    def steps_done(self) -> int:
        """How many of the plan's steps are complete."""
        return self._i

    @property
    def parked(self) -> bool:
        """Whether the run stopped at its ``end`` before the plan's last step (nothing in flight)."""
        return self._i == self._end < len(self._plan._steps)

    def release(self, end: int) -> None:
        """Let the run go on up to step ``end`` (a run started with ``Plan.start(end)``)."""
        self._end = max(self._end, end)

    def test(self) -> bool:
        """Make progress without blocking; True once the run is complete (the plan may then be run
        or started again)."""
        if self._advance(block=False):
            self._finish()
            return True
        return False

    def wait(self) -> Any:
        """Complete the run (blocking; under the watchdog when the operation has a timeout) and
        return the plan's output. A run started with an ``end`` completes the steps released so
        far; the plan stays started until every step is done."""
        if self._advance(block=True):
            self._finish()
        return self._plan.result

    def _finish(self) -> None:
        plan = self._plan
        if plan._handle is self:
            plan._state, plan._handle = _IDLE, None

    def _advance(self, block: bool) -> bool:
        if self._done:
            return True
        plan = self._plan
        steps, timeout = plan._steps, plan._timeout
        while self._i < self._end:
            step = steps[self._i]
            if step.comm is None:
                step.fn(*step.args)
                self._i += 1
                continue
            where = (plan.op, self._numbers[plan._comms.index(step.comm)], f"MPI {step.name} (started by Plan.start)") \
                if timeout is not None or step.comm.watched else None        # (only the watchdog reads it)
            if self._reqs is None:
                self._reqs = [step.comm.start(plan._persistent[self._i], (), where)]
                self._started = time.monotonic()          # (the timeout counts per collective)
            if block:
                left = None if timeout is None else max(timeout - (time.monotonic() - self._started), 0.0)
                step.comm.wait(self._reqs, left, lambda s=step, w=where: s.comm.expired(timeout, s.name, w))
            elif not done(self._reqs):
                if timeout is not None and time.monotonic() - self._started > timeout:
                    step.comm.wait(self._reqs, 0.0, lambda s=step, w=where: s.comm.expired(timeout, s.name, w))
                return False
            self._reqs = None
            self._i += 1
        self._done = self._i == len(steps)
        return self._done


@atexit.register
def _free_live_plans() -> None:
    """Free the persistent requests of plans still alive at exit (MPICH warns about each)."""
    for plan in list(_LIVE):
        try:
            plan._release()
        except Exception:  # noqa: BLE001
            pass
