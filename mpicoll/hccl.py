"""Kernel-style handle API: the ``Hccl`` client (prepare / commit / wait / query / finalize).

Accelerator kernels issue collectives as tasks: prepare one and get an int handle, compute,
commit it, wait for it later (the Ascend C Hccl API; docs/hccl.md). Each task
kind is an internal operation (``Hccl.AllReduce``, ...: :mod:`mpicoll._hccl_tasks`) on the client's
domain, so a prepare is the ``prepare`` of every operation: describe, agree across the ranks once,
record; its :class:`~mpicoll.Plan` has one part per round of ``repeat`` (``Call.rounds``). A commit
releases one more round to MPI's persistent collectives; query and wait move them on.

Every rank of the domain prepares, commits and waits for its tasks in the same order, as with any
collective. A client is used by one thread.
"""
from __future__ import annotations

import itertools
import time
import weakref
from bisect import bisect_right
from typing import Any

import numpy as np
from mpi4py import MPI

from . import _trace
from ._comm import LibComm
from ._domains import group_fields
from ._dtypes import HcclDataType, HcclReduceOp
from ._errors import CollectiveError
from ._hccl_tasks import KINDS, AllGather, AllReduce, AllToAll, AllToAllV, ReduceScatter, Task
from ._params import CommParam
from ._plan import Plan
from ._watchdog import timeout_seconds
from .ops._modes import PREPARE

__all__ = ["Hccl", "HcclDataType", "HcclReduceOp", "MAX_PREPARES"]

#: The documented limit of prepares per domain between ``init`` and ``finalize`` (``Hccl(max_prepares=)``).
MAX_PREPARES = 32

_HANDLES = itertools.count()                      # handles are unique in the process
_OWNERS: "weakref.WeakValueDictionary[int, Hccl]" = weakref.WeakValueDictionary()


class _Entry:
    """A prepared task: its operation, its plan (one part per round), where each round's steps
    end, and its state."""

    __slots__ = ("op", "plan", "ends", "repeat", "committed", "finished", "ever", "run", "t0")

    def __init__(self, op: Task, plan: Plan) -> None:
        self.op, self.plan = op, plan
        self.ends = [p.end for p in plan.parts]
        self.repeat = len(self.ends)
        self.committed = self.finished = 0        # in the current cycle of `repeat` rounds
        self.ever = False                         # committed at least once
        self.run = None                           # the plan's Handle while rounds are in flight
        self.t0 = 0                               # when its rounds were first released (a trace's event)

    def progress(self, block: bool) -> None:
        """Move the committed rounds on (blocking: until they are all complete)."""
        if self.run is None:
            return
        if block:
            self.run.wait()
        else:
            self.run.test()
        done = self.run.steps_done
        self.finished = bisect_right(self.ends, done)
        if done == self.ends[-1]:                 # every round done (a wait() starts a new cycle)
            self.run = None
            if _trace.ON and self.t0:             # (the task's event: its first commit to its end)
                _trace.event(self.op.NAME, "hccl", self.t0, time.time_ns(), {"comm": self.op._lib.label,
                             "rounds": self.repeat, "path": "plan", "outcome": "ok"})


class Hccl:
    """The kernel-style client: ``Hccl().init(domain)``, prepare calls returning int handles,
    ``commit`` / ``wait`` / ``query``, ``finalize``.

    Args:
        max_prepares: prepares allowed between ``init`` and ``finalize`` (default 32, the documented
            limit); the next one raises :class:`~mpicoll.CollectiveError` on every rank.
        timeout: seconds before a collective that some rank never joins raises
            :class:`~mpicoll.CollectiveTimeout` (default ``MPICOLL_TIMEOUT``; unset = wait forever;
            0: none), taken by its tasks as an operation's ``timeout=`` (:attr:`timeout`).

    Example (every rank; 300 float16 per rank gathered as 2 tiles of 128 and a tail of 44)::

        hccl = Hccl().init("")                     # the world; or a domain name, or an MPI.Comm
        h1 = hccl.all_gather(x, y, 128, HcclDataType.FP16, stride_count=300, repeat=2, commit=True)
        h2 = hccl.all_gather(x[256:], y[256:], 44, HcclDataType.FP16, stride_count=300, commit=True)
        hccl.wait(h1); hccl.wait(h2)
        hccl.finalize()                            # y equals the untiled AllGather of x
    """

    def __init__(self, *, max_prepares: int = MAX_PREPARES, timeout: float | None = None) -> None:
        self.max_prepares = int(max_prepares)
        self._timeout = timeout                   # (as given: each task operation reads it at binding)
        self._lib: LibComm | None = None
        self._tasks: dict[int, Task] = {}
        self._prepares = 0
        self._active = False

    @property
    def timeout(self) -> float | None:
        """The watchdog timeout of the client's tasks in seconds (None: none): after ``init``, the
        one they run with (an operation's rule: ``timeout=``, else the communicator's own, else
        ``MPICOLL_TIMEOUT``'s)."""
        return self._ops[AllReduce].timeout if self._active else timeout_seconds(self._timeout)

    # -- lifecycle -------------------------------------------------------------------------------
    def init(self, domain: str | MPI.Comm | None = None, rank_size: int | None = None) -> "Hccl":
        """Bind the client to a communication domain: a domain name ("" or None: the world) or an
        mpi4py communicator. Collective over the domain on its first use, as any operation's.

        Args:
            domain: the domain name, or a communicator.
            rank_size: the domain's size, needed to form a domain not yet formed or declared
                (as an operator Param's ``rank_size``).

        Returns:
            the client (so ``hccl = Hccl().init("tp")`` and ``with Hccl().init("tp") as hccl:`` work).

        Raises:
            CollectiveError: the client is initialised and not finalized.
        """
        if self._active:
            raise CollectiveError("Hccl.init: the client is already initialised: finalize() it first",
                                  op="Hccl.init", param="domain")
        param = CommParam(rank_size=rank_size, **group_fields(domain, "Hccl.init", "domain"))
        # one operation per task kind, bound as every operation is (a Param error, such as a
        # rank_size that is not the domain's, is raised on every rank by the first prepare)
        self._ops = {cls: cls(param, self._timeout) for cls in KINDS}
        for op in self._ops.values():
            op._bind()
        self._lib = self._ops[AllReduce]._lib
        self._tasks, self._prepares, self._active = {}, 0, True
        return self

    def finalize(self) -> None:
        """Wait for every committed round, release every task; further prepares raise until
        ``init`` is called again. Collective over the domain (it completes the committed rounds);
        freeing the tasks' requests and datatypes is local. A second call does nothing."""
        if not self._active:
            return
        for task in self._tasks.values():
            task.progress(block=True)
        for h, task in self._tasks.items():
            task.plan.free()
            _OWNERS.pop(h, None)
        for op in self._ops.values():
            for t in op.types:
                t.Free()
            op.types.clear()
        self._tasks, self._active = {}, False

    def __enter__(self) -> "Hccl":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finalize()
        else:                             # a rank failed in the block: no more collectives on it
            self._tasks, self._active = {}, False

    # -- prepare calls -----------------------------------------------------------------------------
    def all_reduce(self, send: np.ndarray, recv: np.ndarray, count: int, dtype: Any, op: Any,
                   repeat: int = 1, commit: bool = False) -> int:
        """Prepare an AllReduce of ``count`` elements: round k reduces ``send[k*count :
        (k+1)*count]`` over the ranks into the same range of ``recv`` (``recv`` may be ``send``).

        Args:
            send, recv: C-contiguous arrays of ``dtype``, read flat, at least ``repeat*count`` elements.
            count: elements per round.
            dtype: an :class:`HcclDataType`, numpy dtype or name; the buffers' dtype.
            op: an :class:`HcclReduceOp` or "sum" / "prod" / "max" / "min".
            repeat: rounds (>= 1), each a commit.
            commit: commit every round now (the template flag ``AllReduce<true>``).

        Returns:
            the task's handle (an int >= 0).
        """
        return self._prepare(AllReduce, commit, send, recv, count, dtype, op, 0, repeat)

    def all_gather(self, send: np.ndarray, recv: np.ndarray, send_count: int, dtype: Any, stride_count: int = 0,
                   repeat: int = 1, commit: bool = False) -> int:
        """Prepare an AllGather: in round k, rank i's ``send[k*send_count : (k+1)*send_count]``
        lands at ``recv[k*send_count + i*stride :]``, ``stride = stride_count or send_count``.

        ``recv`` needs ``(repeat-1)*send_count + (rank_size-1)*stride + send_count`` elements; with
        ``repeat > 1`` the stride must leave room for every round (``stride >= repeat*send_count``).
        Other arguments as in :meth:`all_reduce`.
        """
        return self._prepare(AllGather, commit, send, recv, send_count, dtype, None, stride_count, repeat)

    def reduce_scatter(self, send: np.ndarray, recv: np.ndarray, recv_count: int, dtype: Any, op: Any,
                       stride_count: int = 0, repeat: int = 1, commit: bool = False) -> int:
        """Prepare a ReduceScatter: in round k, rank i's block is ``send[k*recv_count + i*stride :]``
        (``recv_count`` elements, ``stride = stride_count or recv_count``); rank r gets the
        reduction of every rank's block r at ``recv[k*recv_count :]``. Other arguments as in
        :meth:`all_reduce`.
        """
        return self._prepare(ReduceScatter, commit, send, recv, recv_count, dtype, op, stride_count, repeat)

    def all_to_all(self, send: np.ndarray, recv: np.ndarray, data_count: int, dtype: Any, stride_count: int = 0,
                   repeat: int = 1, commit: bool = False) -> int:
        """Prepare an AllToAll: in round k, block j (``data_count`` elements at ``send[k*data_count
        + j*stride :]``) goes to rank j, landing at ``recv[k*data_count + i*stride :]`` (i: this
        rank), ``stride = stride_count or data_count``. Other arguments as in :meth:`all_gather`.
        """
        return self._prepare(AllToAll, commit, send, recv, data_count, dtype, None, stride_count, repeat)

    def all_to_all_v(self, send: np.ndarray, send_counts, sdispls, recv: np.ndarray, recv_counts, rdispls,
                     dtype: Any, repeat: int = 1, commit: bool = False) -> int:
        """Prepare an AllToAllV: block j (``send_counts[j]`` elements at ``sdispls[j]``) goes to
        rank j, landing at its ``rdispls[i]``; ``recv_counts[i]`` must equal rank i's
        ``send_counts[j]``. Round k advances ``sdispls[j]`` by ``k*send_counts[j]`` and
        ``rdispls[i]`` by ``k*recv_counts[i]``. Other arguments as in :meth:`all_reduce`.
        """
        return self._prepare(AllToAllV, commit, send, (send_counts, sdispls), recv, (recv_counts, rdispls),
                             dtype, repeat)

    # -- commit / wait / query ---------------------------------------------------------------------
    def commit(self, handle: int) -> None:
        """Release the task's next round to MPI (it progresses while the caller computes). Once
        ``wait`` has returned with all ``repeat`` rounds done, the task may be committed again: its
        rounds run anew on the buffers' current contents.

        Raises:
            CollectiveError: a foreign or stale handle, or more than ``repeat`` commits without a
                ``wait`` that completes them.
        """
        task = self._task(handle, "commit")
        if task.committed == task.repeat:
            raise CollectiveError(f"{task.op.NAME}: commit(handle {handle}) on rank {self._lib.rank}: committed "
                                  f"more than repeat={task.repeat} times (wait() for its rounds before committing "
                                  "it again)",
                                  op=task.op.NAME, param="handle", rank=self._lib.rank)
        self._release(task, task.committed + 1)

    def wait(self, handle: int) -> int:
        """Block until every committed round of the task is complete.

        Returns:
            the number of rounds finished (see :meth:`query`).

        Raises:
            CollectiveError: a foreign or stale handle, or a task never committed.
        """
        task = self._task(handle, "wait")
        if not task.ever:
            raise CollectiveError(f"{task.op.NAME}: wait(handle {handle}) on rank {self._lib.rank}: the task was "
                                  "never committed: commit it first (or prepare it with commit=True)",
                                  op=task.op.NAME, param="handle", rank=self._lib.rank)
        task.progress(block=True)
        if task.run is None:                      # every round done and seen: it may be committed again
            task.committed = 0
        return task.finished

    def query(self, handle: int) -> int:
        """Move the task on without blocking; returns how many of its rounds are finished (at most
        ``repeat``; after a full cycle, ``repeat`` until the next commit)."""
        task = self._task(handle, "query")
        task.progress(block=False)
        return task.finished

    # -- internals ---------------------------------------------------------------------------------
    def _task(self, handle: Any, what: str) -> Task:
        task = self._tasks.get(handle) if isinstance(handle, (int, np.integer)) else None
        if task is not None:
            return task
        rank = self._lib.rank if self._lib is not None else -1
        owner = _OWNERS.get(handle) if isinstance(handle, (int, np.integer)) else None
        if owner is not None and owner is not self:
            rule = f"it belongs to another Hccl client (on {owner._lib.label})"
        elif not self._active:
            rule = "the client is not initialised (init() it, and use handles from after that)"
        else:
            rule = "no task of this client has it (handles end with finalize())"
        raise CollectiveError(f"Hccl.{what}: handle={handle!r} on rank {rank}: {rule}", op=f"Hccl.{what}",
                              param="handle", rank=rank)

    def _release(self, task: Task, rounds: int) -> None:
        end = task.ends[rounds - 1]
        if task.run is None:
            task.finished = 0
            task.t0 = time.time_ns() if _trace.ON else 0
            task.run = task.plan.start(end)
        else:
            task.run.release(end)
        task.committed, task.ever = rounds, True

    def _refusal(self, op: str, rank: int) -> CollectiveError | None:
        """What the client's own rules say of one more prepare (agreed with the task's call, as an
        error of its describe is: the call's ``failed``), or None."""
        if not self._active:
            return CollectiveError(f"{op} on rank {rank}: prepare after finalize(): call init() again", op=op,
                                   param="init", rank=rank)
        if self._prepares >= self.max_prepares:
            return CollectiveError(f"{op} on rank {rank}: more than max_prepares={self.max_prepares} prepares on "
                                   f"{self._lib.label} between init() and finalize()", op=op, param="max_prepares",
                                   rank=rank)
        return None

    def _prepare(self, kind: type[Task], commit: bool, *args: Any) -> int:
        """The task's operation prepares it (describe -> agree -> one plan part per round)."""
        if self._lib is None:
            raise CollectiveError(f"{kind.NAME}: prepare before init(): call Hccl().init(domain) first",
                                  op=kind.NAME, param="init")
        op = self._ops[kind]
        plan = op._call(args, PREPARE, self._refusal(op.NAME, op.rank))
        handle = next(_HANDLES)
        self._tasks[handle] = task = _Entry(op, plan)
        _OWNERS[handle] = self
        self._prepares += 1
        if commit:
            self._release(task, task.repeat)
        return handle

    def __repr__(self) -> str:
        where = self._lib.label if self._lib is not None else "no domain"
        return f"<Hccl on {where}: {len(self._tasks)} task(s){'' if self._active else ', not initialised'}>"
