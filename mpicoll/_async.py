"""Calls that run while the caller goes on (``async_op=True``): each communicator's worker thread.

A call made with ``async_op=True`` (:mod:`mpicoll.functional`, the torch backend) returns at once: its
whole pipeline (describe, agree, move the data, land) runs on a thread of its communicator, the
communicator's *worker*, made at its first such call, as gloo runs a group's calls on its own
threads. MPI is initialised with ``MPI_THREAD_MULTIPLE`` (mpi4py's default), mpi4py lets go of the
GIL in every MPI call and numpy in its copies and reductions, so the caller's own work (torch's
kernels, numpy) goes on while the call does.

Order is the program's. A worker runs its communicator's calls one at a time in the order they were
queued; a queued call waits in the communicator's ``pending`` queue (``LibComm.pending``, where a
started plan waits too) until it has finished and its callbacks have run, and any later call on that
communicator from another thread first waits for the calls queued ahead of it (:meth:`Job.issue_all`,
through ``LibComm.drain``); a call a worker's job makes (a graph replay's, a callback's) waits only
for what was queued ahead of that job. A program whose threads make calls on one communicator in
the same order on every rank therefore makes its collectives in that order, whichever thread runs
them.

A :class:`Job` tells the truth: ``is_completed()`` is True once the call has finished (well or
not), ``wait()`` raises the call's error (the same ``CollectiveError`` on every rank, as a
synchronous call would), ``wait(timeout)`` gives up waiting after that long and leaves the call
running. Its callbacks (:meth:`Job.then`: a torch future's) run on the worker as the call
completes; a call a callback makes on the same communicator runs there at once, before the calls
queued after. Its place in the order is then the same on every rank if the callback was attached
before any later call on that communicator was made (``then`` on a finished call runs the callback
at once, in the caller: after the calls queued meanwhile): attach callbacks that make calls right
after the call they follow, as DDP's hooks do.
"""
from __future__ import annotations

import atexit
import collections
import threading
import traceback
from typing import Any, Callable

from mpi4py import MPI

from . import _comm, _exit
from ._errors import CollectiveError

#: the worker thread a thread is, if it is one (its communicator's)
_HERE = threading.local()
#: the workers alive
WORKERS: "set[Worker]" = set()


class Job:
    """One call queued on a communicator's worker (or run at once: a worker's own call)."""

    __slots__ = ("fn", "worker", "comms", "value", "error", "_done", "_released", "_then", "__weakref__")

    def __init__(self, fn: Callable[[], Any], worker: "Worker | None", comms: tuple = ()) -> None:
        self.fn, self.worker, self.comms = fn, worker, comms
        self.value: Any = None                    # what the call returned (its outputs)
        self.error: BaseException | None = None
        self._done = threading.Event()            # the call has finished
        self._released = threading.Event()        # ... and its callbacks have run: it left the queues
        self._then: list[Callable[["Job"], None]] = []

    def is_completed(self) -> bool:
        """Whether the call has finished (well, or with its error)."""
        return self._done.is_set()

    @property
    def rank(self) -> int | None:
        """This rank in the call's (first) communicator, or None."""
        return self.comms[0].rank if self.comms else None

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the call has finished; raise its error. ``timeout`` (seconds; None: no limit):
        False once that long has passed with the call still running (it goes on).

        Raises:
            CollectiveError: the call's own error; or this is the worker, waiting on a call queued
                behind the one it runs (it would wait for ever).
        """
        if not self._done.is_set():
            if self.worker is not None and getattr(_HERE, "worker", None) is self.worker:
                raise CollectiveError(f"a call waits, on {self.worker.lib.label}'s worker thread, for a call queued "
                                      "after it there (a callback of an async call waiting on a later one): it would "
                                      "wait for ever", op="wait", param="thread", rank=self.worker.lib.rank)
            if not self._done.wait(timeout):
                return False
        if self.error is not None:
            raise self.error
        return True

    def exception(self) -> BaseException | None:
        """The call's error, once finished (None: it went well, or it is still running)."""
        return self.error

    def then(self, fn: Callable[["Job"], None]) -> None:
        """Run ``fn(job)`` once the call has finished: on the worker as it finishes, or here at
        once if it has."""
        worker = self.worker
        if worker is not None:
            with worker.cond:
                if not self._done.is_set():
                    self._then.append(fn)
                    return
        fn(self)

    def issue_all(self) -> None:
        """What ``LibComm.drain`` asks of the work queued ahead of a new call: this call finished
        and its callbacks run (their calls keep their place, ahead of the new one). Its own worker
        asks nothing (what is queued ahead of a worker's job there has finished; a worker's drain
        stops at the job it runs)."""
        if getattr(_HERE, "worker", None) is not self.worker:
            self._released.wait()

    def _run(self) -> None:
        try:
            self.value = self.fn()
        except BaseException as exc:  # noqa: BLE001 - the caller gets it from wait()
            self.error = exc
        self.fn = None

    def __repr__(self) -> str:
        state = "in flight" if not self.is_completed() else "failed" if self.error is not None else "completed"
        return f"<Job {state}>"


class Worker(threading.Thread):
    """A communicator's worker: runs its queued calls one at a time, in order."""

    def __init__(self, lib: Any) -> None:
        super().__init__(name=f"mpicoll worker ({lib.label})", daemon=True)
        self.lib = lib
        self.queue: collections.deque[Job] = collections.deque()
        self.cond = threading.Condition(threading.Lock())

    def stop(self, timeout: float | None = None) -> bool:
        """End once the calls queued here have finished (its communicator is freed, or the job
        ends), waiting at most ``timeout`` seconds (None: no limit); whether it ended."""
        if self.is_alive() and self is not getattr(_HERE, "worker", None):
            with self.cond:
                self.queue.append(_STOP)
                self.cond.notify()
            self.join(timeout)
            if self.is_alive():
                return False
        WORKERS.discard(self)
        return True

    def run(self) -> None:
        _HERE.worker = self
        while True:
            with self.cond:
                while not self.queue:
                    self.cond.wait()
                job = self.queue[0]
            if job is _STOP:
                return
            _comm.RUNNING.job = job
            job._run()
            with self.cond:
                self.queue.popleft()
                then, job._then = job._then, []
                job._done.set()
            for fn in then:                 # (in the queues still: a callback's call keeps its place)
                _callback(fn, job)
            with _comm.LOCK:
                for c in job.comms:
                    c.pending.remove(job)
                _comm.QUEUED -= 1
            _comm.RUNNING.job = None
            job._released.set()


def _callback(fn: Callable[[Job], None], job: Job) -> None:
    """Run a job's callback on the worker; one that raises is reported, and the worker goes on."""
    try:
        fn(job)
    except Exception:  # noqa: BLE001 - a callback's failure must not end the communicator's worker
        traceback.print_exc()


_STOP = Job(lambda: None, None)


def submit(comms: tuple, fn: Callable[[], Any]) -> Job:
    """Queue ``fn()`` (a call's pipeline, or a plan's run) on the worker of ``comms[0]``, in the
    queue of each of ``comms`` (the communicators it makes calls on); its :class:`Job`. On that
    worker itself (a callback's call) it runs at once."""
    lib = comms[0]
    worker = lib.worker
    if worker is not None and getattr(_HERE, "worker", None) is worker:
        job = Job(fn, None)
        job._run()
        job._done.set()
        job._released.set()
        return job
    for c in comms:                     # (plans started before it start their collectives here, first)
        for work in list(c.pending):
            if type(work) is not Job:
                work.issue_all()
    if worker is None or not worker.is_alive():
        if not WORKERS and not _EXIT:
            _EXIT.append(atexit.register(_at_exit))    # (after _exit's: it runs first, atexit is LIFO)
        worker = lib.worker = Worker(lib)
        WORKERS.add(worker)
        worker.start()
    job = Job(fn, worker, comms)
    with _comm.LOCK:
        for c in comms:
            c.pending.append(job)
        _comm.QUEUED += 1
    with worker.cond:
        worker.queue.append(job)
        worker.cond.notify()
    return job


_EXIT: list = []


def _at_exit() -> None:
    """A clean exit: the calls still queued on workers finish before mpicoll frees its windows and
    MPI finalizes. (After a failure, ``python -m mpi4py`` aborts the job: nothing to wait for.)"""
    if not MPI.Is_finalized() and not _exit.failing_exit():
        stop_all()


def stop_all() -> None:
    """End every worker once its queued calls have finished (a clean exit, before MPI finalizes)."""
    for worker in list(WORKERS):
        worker.stop()
