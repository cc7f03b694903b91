"""Point-to-point messages (``isend``/``irecv``/``send``/``recv``; docs/functional.md).

A message between two ranks has no collective to agree in: a bad argument raises on the rank that
gave it, alone (its peer's matching call then waits, or times out under the watchdog). Messages go
on the group's library communicator (:meth:`~mpicoll._comm.LibComm.message`: mpicoll's own
duplicate, never the user's world), as raw bytes: a receiver's tensor must have the sender's size in
bytes; they are not collectives, so they neither wait for the calls queued on the communicator's
worker nor count as its calls.

A posted :class:`Message` completes in one of two ways. A thread that waits on it (``wait()``)
completes it there and then (MPI's own wait: the fastest, what a blocking ``send``/``recv`` pays; on
a node with more ranks than cores, polls between sleeps: ``MPICOLL_WAIT``, :mod:`mpicoll._watchdog`).
Until someone does, the process's message thread (one per process, made at the first message)
polls it now and then, so that it moves while the caller computes (MPI moves a message only inside
MPI calls) and so that ``is_completed()``, callbacks (a torch future's) and the watchdog's limit
(``MPICOLL_TIMEOUT``, or the communicator's own) hold for a message nobody waits on.
"""
from __future__ import annotations

import atexit
import functools
import threading
import time
import traceback
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from . import _trace
from . import _validate as V
from ._domains import group_fields, resolve
from ._errors import CollectiveError, CollectiveTimeout, as_collective_error
from ._call import CAPTURING
from ._watchdog import expire, sleeps, wait

#: the longest the message thread sleeps between two looks at the messages in flight, seconds
MAX_PAUSE = 1e-3


class Message:
    """A posted send or receive. ``wait()``, ``is_completed()``, ``exception()``, ``then(fn)``; once
    a receive is complete, ``source`` is its sender's rank in the communicator."""

    __slots__ = ("fn", "req", "status", "lib", "peer", "tag", "nbytes", "timeout", "deadline", "source", "error",
                 "_lock", "_done", "_then", "_due", "t0")

    def __init__(self, fn: str, lib: Any, peer: int, tag: int, data: np.ndarray) -> None:
        self.fn, self.lib, self.peer, self.tag, self.nbytes = fn, lib, peer, tag, data.size
        self.status, self.timeout, self.source, self.error = MPI.Status(), lib.call_timeout(), None, None
        self.deadline = None if self.timeout is None else time.monotonic() + self.timeout
        self._lock = threading.Lock()     # (held by the thread that calls MPI on the request)
        self._done = threading.Event()
        self._then: list[Callable[["Message"], None]] = []
        self._due: list[Callable[["Message"], None]] = []    # (callbacks of its end, run once unlocked)
        self.t0 = time.time_ns() if _trace.ON else 0           # (a trace's event: from its post to its end)
        self.req = lib.message(fn.endswith("send"), data, peer, tag)
        _PROGRESS.add(self)

    # -- what a caller asks ----------------------------------------------------------------------
    @property
    def rank(self) -> int:
        """This rank in the message's communicator."""
        return self.lib.rank

    def wait(self, timeout: float | None = None) -> bool:
        """Complete the message here; raise its error. ``timeout`` (seconds; None: none): False
        once that long has passed with the message still posted (it stays posted)."""
        if not self._done.is_set():
            end = None if timeout is None else time.monotonic() + timeout
            if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
                if not self._done.is_set():
                    return False            # (another thread completes it, and took longer)
            else:
                try:
                    if not self._done.is_set() and \
                            not self._complete(None if end is None else max(end - time.monotonic(), 0.0)):
                        return False
                finally:
                    self._unlock()
        if self.error is not None:
            raise self.error
        return True

    def is_completed(self) -> bool:
        """Whether the message is complete (or failed), moving it along without blocking."""
        if not self._done.is_set() and self._lock.acquire(False):
            try:
                if not self._done.is_set() and self._test():
                    self._end(None)
            except CollectiveError as exc:
                self._end(exc)
            finally:
                self._unlock()
        return self._done.is_set()

    def exception(self) -> BaseException | None:
        return self.error

    def cancel(self) -> None:
        """Withdraw a receive ``wait(timeout)`` gave up on: its buffer is the caller's again (one that
        arrived meanwhile is received, as ``wait()`` would)."""
        self._lock.acquire()
        try:
            if not self._done.is_set():
                self._end(CollectiveError(f"{self.fn}: withdrawn (cancelled)", op=self.fn, rank=self.lib.rank),
                          cancel=True)
        finally:
            self._unlock()

    def then(self, fn: Callable[["Message"], None]) -> None:
        """Run ``fn(message)`` once it is complete (here at once if it is)."""
        with _PROGRESS.cond:
            if not self._done.is_set():
                self._then.append(fn)
                return
        fn(self)

    # -- completing it (under ``_lock``) ---------------------------------------------------------
    def _complete(self, timeout: float | None) -> bool:
        """Wait for the request: under the watchdog (its limit, and the caller's ``timeout`` if
        sooner), or untimed: MPI's own wait, or polls between sleeps (``MPICOLL_WAIT``,
        :func:`~mpicoll._watchdog.sleeps`). False: the caller's ``timeout`` passed first."""
        limit, mine = self.deadline, None
        if timeout is not None:
            mine = time.monotonic() + timeout
            limit = mine if limit is None else min(limit, mine)
        callers = limit is not None and limit == mine
        expired = (lambda: CollectiveTimeout(f"{self.fn}: wait(timeout)", param="timeout")) if callers else self._expired
        try:
            wait([self], None if limit is None else max(limit - time.monotonic(), 0.0), expired,
                 own=callers or self.lib.own, polite=sleeps(self.lib.crowded))
        except CollectiveTimeout:
            if callers:
                return False               # (the caller's own limit: the message stays posted)
            self._end(self._expired(), cancel=True)
            return True
        except CollectiveError as exc:
            self._end(exc)
            return True
        self._end(None)
        return True

    def Test(self) -> bool:  # noqa: N802 - the watched wait takes requests by MPI's names
        return self._test()

    def Wait(self) -> None:  # noqa: N802
        self._mpi(self.req.Wait)

    def _test(self) -> bool:
        return self._mpi(self.req.Test)

    def _mpi(self, fn: Any) -> Any:
        """``fn(status)``: a message larger than the tensor is this call's argument error."""
        try:
            return fn(self.status)
        except MPI.Exception as exc:
            if exc.Get_error_class() != MPI.ERR_TRUNCATE:
                raise
            got = self.status.Get_count(MPI.BYTE)    # (Open MPI: the message's size; MPICH: the bytes received)
            raise self._size_error(f"has {got} bytes" if got > self.nbytes else "is larger") from None

    def _size_error(self, size: str) -> CollectiveError:
        return V.arg_error(self.fn, "tensor.nbytes", self.nbytes, self.lib.rank, f"the message from rank "
                           f"{self.status.Get_source()} (tag {self.tag}) {size}: give a tensor of the sender's size "
                           "and dtype")

    def _end(self, error: BaseException | None, cancel: bool = False) -> None:
        """Complete (under ``_lock``): a receive that failed with ``cancel`` is withdrawn first (a
        late message must not land in a buffer given back to the caller; one that arrived after all
        is received); check a receive's size, keep its source or the error. Its callbacks run once
        the lock is released (:meth:`_unlock`)."""
        receives = not self.fn.endswith("send")
        if error is not None and cancel and receives:
            self.req.Cancel()
            try:
                self._mpi(self.req.Wait)
                if not self.status.Is_cancelled():
                    error = None
            except CollectiveError as exc:
                error = exc
        if error is None and receives:
            got = self.status.Get_count(MPI.BYTE)
            if got != self.nbytes:
                error = self._size_error(f"has {got} bytes")
        if error is None:
            self.source = self.status.Get_source() if self.peer == MPI.ANY_SOURCE else self.peer
        self.error = error
        if self.t0 and _trace.ON:
            _trace.event(self.fn, "message", self.t0, time.time_ns(), {"comm": self.lib.label, "peer": self.peer,
                         "tag": self.tag, "bytes": self.nbytes, "path": "mpi",
                         "outcome": "ok" if error is None else type(error).__name__})
        with _PROGRESS.cond:
            self._done.set()
            self._due, self._then = self._then, []

    def _unlock(self) -> None:
        """Release ``_lock``, then run the callbacks of the end this thread made (never under the
        lock: a callback may wait on another message)."""
        due, self._due = self._due, []
        self._lock.release()
        for fn in due:
            try:
                fn(self)
            except Exception:  # noqa: BLE001 - a callback's failure must not end the message thread
                traceback.print_exc()

    def _peer(self) -> str:
        if self.peer == MPI.ANY_SOURCE:
            return "any rank"
        return f"rank {self.peer} (world rank {self.lib.world_ranks[self.peer]})"

    def _expired(self) -> CollectiveTimeout:
        way = "to" if self.fn.endswith("send") else "from"
        return CollectiveTimeout(f"{self.fn}: timed out after {self.timeout:g} s on rank {self.lib.rank} of "
                                 f"{self.lib.label}, waiting for the message {way} {self._peer()} (tag {self.tag}): "
                                 "its peer never made the matching call", op=self.fn, param="timeout",
                                 rank=self.lib.rank, seconds=self.timeout)


class _Progress:
    """The process's message thread: looks at the messages in flight nobody is waiting on, from
    every ``MAX_PAUSE`` to at once after one completed, and ends them at the watchdog's limit."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.inflight: list[Message] = []
        self.thread: threading.Thread | None = None
        self.stopped = False

    def add(self, message: Message) -> None:
        with self.cond:
            self.inflight.append(message)
            if self.thread is None or not self.thread.is_alive():
                if self.thread is None:
                    atexit.register(self.stop)      # (before mpi4py's finalizer: atexit is LIFO)
                self.thread = threading.Thread(target=self._run, name="mpicoll messages", daemon=True)
                self.thread.start()
            self.cond.notify()

    def stop(self) -> None:
        """End the thread (the process exits: no MPI call of its may run into MPI_Finalize)."""
        with self.cond:
            self.stopped = True
            self.cond.notify()
        if self.thread is not None:
            self.thread.join(1.0)

    def _run(self) -> None:
        pause = 0.0
        while True:
            with self.cond:
                self.inflight = [m for m in self.inflight if not m._done.is_set()]
                if self.stopped:
                    return
                if not self.inflight:
                    pause = 0.0
                    self.cond.wait()
                    continue
                if pause:
                    self.cond.wait(pause)       # (a new message wakes it)
                messages = list(self.inflight)
            if self.stopped or MPI.Is_finalized():
                return
            moved = False
            for m in messages:
                if m._done.is_set() or not m._lock.acquire(False):
                    continue                    # (a caller is waiting on it: its own thread completes it)
                try:
                    if m._done.is_set():
                        continue
                    if m._test():
                        m._end(None)
                        moved = True
                    elif m.deadline is not None and time.monotonic() > m.deadline:
                        m._end(expire(m._expired(), m.lib.own), cancel=True)
                except Exception as exc:  # noqa: BLE001 - the message's error; the thread goes on
                    if not m._done.is_set():
                        m._end(as_collective_error(exc, m.fn, m.lib.rank))
                finally:
                    m._unlock()
            pause = 0.0 if moved else min(max(2 * pause, 2e-5), MAX_PAUSE)


_PROGRESS = _Progress()


def post(fn: str, tensor: Any, peer: Any, group_peer: Any, group: Any, tag: Any, peer_name: str) -> Message | None:
    """Post one message (after its argument checks, which raise on this rank); None: this rank is
    not in a list ``group``."""
    if CAPTURING:
        raise V.arg_error(fn, "graph.capture", "active", MPI.COMM_WORLD.Get_rank(),
                          "point-to-point messages are not captured (a graph records collectives, agreed by the "
                          "group at the end of the block): send or receive outside the capture block")
    fields = group_fields(group, fn)
    if fields is None:
        return None
    lib = resolve(fn, fields.get("comm"), fields.get("comm_domain", ""), None, "group")
    r, n = lib.rank, lib.size
    sends = fn.endswith("send")
    if not isinstance(tensor, np.ndarray):
        raise V.arg_error(fn, "tensor", type(tensor).__name__, r, "must be a numpy array")
    if not tensor.flags.c_contiguous or (not sends and not tensor.flags.writeable):
        raise V.arg_error(fn, "tensor", "non-contiguous" if sends else "non-contiguous or read-only", r,
                          "must be a C-contiguous" + ("" if sends else " writable") + " numpy array")
    if peer is not None and group_peer is not None:
        raise V.arg_error(fn, f"group_{peer_name}", group_peer, r, f"give {peer_name} (a world rank) or "
                          f"group_{peer_name} (a group rank), not both")
    if peer is None and group_peer is None:
        if sends:
            raise V.arg_error(fn, peer_name, None, r, f"give {peer_name} (a world rank) or group_{peer_name}")
        at = MPI.ANY_SOURCE
    elif group_peer is None:
        if isinstance(peer, bool) or not isinstance(peer, (int, np.integer)) or int(peer) not in lib.world_ranks:
            raise V.arg_error(fn, peer_name, peer, r, f"must be a world rank in the group ({list(lib.world_ranks)})")
        at = lib.world_ranks.index(int(peer))
    else:
        if isinstance(group_peer, bool) or not isinstance(group_peer, (int, np.integer)) or \
                not 0 <= group_peer < n:
            raise V.arg_error(fn, f"group_{peer_name}", group_peer, r, f"must be in [0, {n})")
        at = int(group_peer)
    top = tag_ub()
    if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)) or not 0 <= tag <= top:
        raise V.arg_error(fn, "tag", tag, r, f"must be an int in [0, {top}] (MPI's TAG_UB)")
    return Message(fn, lib, at, int(tag), tensor.reshape(-1).view(np.uint8))


@functools.cache
def tag_ub() -> int:
    """MPI's largest tag (every message's tag is at most this); asked once MPI runs, never at import."""
    return MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
