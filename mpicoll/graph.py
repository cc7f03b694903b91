"""Graph mode: capture a sequence of collectives once, agree it once, replay it many times.

    from mpicoll import functional as dist, graph

    with graph.capture() as g:          # collective over the group (default: the world)
        dist.all_reduce(grad)           # described, not run
        dist.broadcast(w, src=0)
    g.replay()                          # every call, in order, on the arrays' current contents
    g.replay()
    g.free()

Inside the block, functional calls (:mod:`mpicoll.functional`) and operator calls
(``op.execute(...)``) are described, not run: they return their (not yet filled) outputs, and an
``async_op=True`` call returns a :class:`~mpicoll.functional.Work` that completes with the replay. At
the end of the block every rank of the group agrees the whole sequence at once (one exchange, not
one per call): a rank that captured another sequence, call or shape makes every rank raise the same
:class:`~mpicoll.CollectiveMismatchError`, naming the first differing call by its index and
operator. Then the calls are issued into one recorded :class:`~mpicoll.Plan`, after the passes:

* **coalescing**: calls of the same kind, communicator, dtype, reduce op and root (AllReduce,
  Broadcast, AllGather and the functional calls on them) run as one MPI call over a staging buffer,
  where every output stays bit-identical to eager execution (AllReduce: every reduction whose
  bits cannot depend on the message, ``ops._paths.invariant``: all of them with ``MPICOLL_EXACT``
  on, docs/reproducibility.md; with it off, a float reduction over more than 2 ranks stays apart).
  A call may move up to an earlier call of its group only if its
  arrays touch no array of any call before it (on every rank of its communicator): calls that
  touch the same memory keep their order.
* **once, not per replay**: validation, dtype mapping, counts, datatypes and the MPI calls' bound
  arguments are the plan's (docs/plans.md).

The graph keeps references to every array of its calls and reads them at every replay: keep them
alive and do not move them (no resize or reallocation; change their contents only).
"""
from __future__ import annotations

import numpy as np

from typing import Any

from ._errors import CollectiveError, arg_error, as_collective_error
from ._async import submit
from ._call import CAPTURING, Call
from ._go import COLLECTIVES, Recorder
from ._plan import Plan
from ._domains import resolve_group
from .functional import Work
from .ops._agree import agree_calls
from .ops._base import Operation
from .ops._modes import ASYNC, PREPARE, Mode

__all__ = ["Graph", "capture"]


def capture(group: Any = None, timeout: float | None = None, exact: bool = True) -> "_Capture":
    """Capture the collectives made inside a ``with`` block into a :class:`Graph`.

    Args:
        group: the ranks that capture together (their agreement runs over it): None (the world),
            a comm-domain name, or an mpi4py communicator. Every call captured must run on it or
            on a communicator inside it.
        timeout: the agreement's and the replay's watchdog, seconds (default: the group's own,
            e.g. a torch group's ``timeout=``, else ``MPICOLL_TIMEOUT``; 0: none).
        exact: merge calls only where every output stays bit-identical to eager execution (the
            default; with ``MPICOLL_EXACT`` on, every call). False also merges, under
            ``MPICOLL_EXACT=0``, float reductions over more than 2 ranks, whose last bits may then
            differ from eager ones (MPI picks its reduction order by message size).

    Returns:
        a context manager whose ``__enter__`` returns the :class:`Graph`.
    """
    return _Capture(Graph(group, timeout, exact))


class _Capture:
    def __init__(self, graph: "Graph") -> None:
        self.graph = graph

    def __enter__(self) -> "Graph":
        if CAPTURING:
            raise CollectiveError("graph.capture inside another capture: captures do not nest", op="graph",
                                  param="capture")
        CAPTURING.append(self.graph)
        return self.graph

    def __exit__(self, exc_type, exc, tb) -> None:
        CAPTURING.remove(self.graph)
        if exc is not None and not isinstance(exc, Exception):
            # Ctrl-C, sys.exit, GeneratorExit: the program is stopping, not a call failing. It goes on
            # unchanged and starts no agreement, which could wait for ever; the peers, waiting in
            # theirs, end with the job (python -m mpi4py aborts it) or at the graph's timeout.
            return
        failure = None if exc is None else as_collective_error(exc, "graph", self.graph._rank())
        self.graph._build(failure)     # (collective: a rank whose block failed still agrees, and all raise)


class _Captured:
    """What a captured ``async_op=True`` call's Work holds: nothing runs until the replay (whose
    own Work, with ``async_op``, says when it has finished), so it is complete at once."""

    def wait(self, timeout: float | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def exception(self) -> None:
        return None


_CAPTURED = _Captured()


class Graph:
    """A captured sequence of collectives, agreed once, replayed as one plan (see the module).

    Collective: every rank of the graph's group ends the capture, replays and frees the graph
    together, as with any collective.
    """

    def __init__(self, group: Any = None, timeout: float | None = None, exact: bool = True) -> None:
        self.group, self.exact = group, exact
        self._timeout = timeout                 # (as given: the group's call_timeout takes it: _build)
        self.timeout: float | None = None
        self._entries: list[tuple[Operation, Any, BaseException | None]] = []
        self._plan: Plan | None = None
        self._results: tuple = ()
        self._replays: list = []                # its async replays (Jobs) not known to be finished
        self._mpi_calls = 0
        self._groups: list[list[int]] = []

    # -- capture ---------------------------------------------------------------------------------
    def sink(self, mode: Any) -> "_Sink":
        """How a call made while capturing ends its pipeline (``Operation._call``): described, taken
        into the graph, agreed with the others at the capture's end."""
        if mode is PREPARE:
            raise arg_error("graph", "prepare", "inside graph.capture()", self._rank(), "a plan is prepared outside "
                            "a capture (the graph is itself the plan of its calls)")
        return _Sink(self, mode is ASYNC)

    def add(self, op: Operation, call: Call | None, err: BaseException | None, async_op: bool = False) -> Any:
        """Take one described call of ``op`` into the graph (made while capturing, with or without
        ``async_op``); returns its outputs, filled at each replay (an async call: a complete handle)."""
        if self._plan is not None or self._entries is None:
            raise CollectiveError("graph: a call added after the capture ended", op="graph", param="capture")
        if err is not None:
            err = type(err)(f"graph call {len(self._entries)} ({op.NAME}): {err}", op=getattr(err, "op", None),
                            param=getattr(err, "param", None), rank=getattr(err, "rank", None))
        self._entries.append((op, call, err))
        result = None if call is None else call.result
        return _CAPTURED if async_op else result

    def _rank(self) -> int:
        try:
            return resolve_group("graph", self.group).rank
        except Exception:  # noqa: BLE001 - only for a message
            return -1

    def _build(self, failure: BaseException | None) -> None:
        """Agree every captured call at once, then record them (with the passes) into one plan."""
        lib = resolve_group("graph", self.group)
        try:
            self.timeout = lib.call_timeout(self._timeout, "graph")
        except CollectiveError as exc:          # (a bad timeout= on this rank: agreed, as a failed block)
            failure = failure or exc
        entries = self._entries
        if failure is not None:           # the block failed on this rank: agree that, every rank raises
            entries = entries + [(_Failed(lib), None, failure)]
        keys = [None if call is None else op.coalesce_key(call, self.exact) for op, call, _ in entries]
        joins = self._joins(entries, keys)
        agreed = agree_calls(lib, entries, self.timeout, joins)
        rec, groups, last = Recorder(), [], {}
        for i, ((op, call, _), key, (_, join)) in enumerate(zip(entries, keys, agreed)):
            if key is not None and join and key in last:
                last[key].append(i)
            else:
                groups.append([i])
                if key is not None:
                    last[key] = groups[-1]
        for g in groups:
            op, call, _ = entries[g[0]]
            if len(g) == 1:
                op._record(call, agreed[g[0]][0], rec)
                continue
            calls = [entries[i][1] for i in g]
            rec.begin(op.NAME, op._comms)
            for step in (s for c in calls for s in c.before):     # (each call's local work around the merged one)
                rec.local(*step)
            op.issue_many(calls, rec)
            for step in (s for c in calls for s in c.after):
                rec.local(*step)
            rec.end(tuple(c.result for c in calls))
        self._plan = Plan(rec, self)
        self._results = tuple(call.result for _, call, _ in entries)
        self._groups = groups
        self._mpi_calls = sum(s.kind in COLLECTIVES for s in rec.steps)
        self._entries = [(op, call, None) for op, call, _ in entries]

    @staticmethod
    def _joins(entries: list, keys: list) -> list[bool]:
        """This rank's view of which calls may join the previous call of their key: those whose
        arrays touch no array of any call before them (agreed across the members afterwards)."""
        joins, seen, earlier = [], set(), []
        for (op, call, _), key in zip(entries, keys):
            mine = [] if call is None else buffers(call)
            ok = key is not None and key in seen and not any(np.may_share_memory(a, b) for a in mine
                                                              for b in earlier)
            joins.append(ok)
            if key is not None:
                seen.add(key)
            earlier.extend(mine)
        return joins

    # -- replay ----------------------------------------------------------------------------------
    def replay(self, async_op: bool = False) -> Any:
        """Run every captured call, in order, on the arrays' current contents (blocking), and
        return their outputs (a tuple, one per captured call); with ``async_op`` a
        :class:`~mpicoll.functional.Work` instead.

        With ``async_op`` the replay runs on the group's worker thread while the caller goes on
        (as any ``async_op=True`` call: :mod:`mpicoll._async`); a call or replay made after it on
        the same communicators runs after it, and :meth:`free` (the end of a ``with`` block) waits
        for it.

        Raises:
            CollectiveError: the graph is freed.
        """
        plan = self._ready("replay")
        if async_op:
            comms = plan._used or (resolve_group("graph", self.group),)
            self._replays = [job for job in self._replays if not job.is_completed()]
            job = submit(comms, plan.run)
            self._replays.append(job)
            return Work(job, list(self._results), "graph.replay")
        plan.run()
        return self._results

    def free(self) -> None:
        """Release the graph's plan (its persistent requests), after its async replays have
        finished; freeing twice is fine."""
        for job in self._replays:
            job.issue_all()                 # (waits for it: the same on every rank)
        self._replays = []
        if self._plan is not None:
            self._plan.free()

    def summary(self) -> str:
        """How many MPI calls a replay makes for how many captured calls, and what was merged."""
        self._ready("summary")
        merged = [g for g in self._groups if len(g) > 1]
        text = f"{len(self._entries)} captured call(s) -> {self._mpi_calls} MPI call(s) per replay"
        if merged:
            text += "; merged: " + ", ".join(f"{self._entries[g[0]][0].NAME} calls {g}" for g in merged)
        return text

    def _ready(self, what: str) -> Plan:
        if self._plan is None:
            raise CollectiveError(f"graph: {what}() before the capture ended", op="graph", param="capture")
        return self._plan

    def __repr__(self) -> str:
        return f"<Graph: {self.summary() if self._plan is not None else 'capturing'}>"

    def __enter__(self) -> "Graph":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        for job in self._replays:
            job.issue_all()
        self._replays = []
        if exc_type is not None and self._plan is not None and not self._plan.idle:
            self._plan._abandon()
            return
        self.free()


class _Sink(Mode):
    """The last stage of a call's pipeline while capturing: the described call goes into the graph
    (not counted, not agreed now: the graph agrees all its calls at its end)."""

    compiles = rides = False
    defers = True

    def __init__(self, graph: Graph, async_op: bool) -> None:
        self.graph, self.async_op = graph, async_op

    def take(self, op: Operation, call: Call | None, err: BaseException | None) -> Any:
        return self.graph.add(op, call, err, self.async_op)


def buffers(call: Call) -> list[np.ndarray]:
    """Every array a call reads or writes (its x, out, src, result, and its local steps'): what a
    graph compares to keep calls that touch the same memory in order."""
    found: list[np.ndarray] = []

    def walk(v: Any) -> None:
        if isinstance(v, np.ndarray):
            found.append(v)
        elif isinstance(v, (list, tuple)):
            for w in v:
                walk(w)
    walk((call.x, call.out, call.src, call.result, call.before, call.after))
    return found


class _Failed(Operation):
    """Stands for a rank's failed capture block in the graph's agreement."""

    NAME, PUBLIC = "graph capture", False

    def __init__(self, lib) -> None:
        super().__init__()
        self._lib, self._comms = lib, (lib,)
