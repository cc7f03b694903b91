"""What mpicoll does when the process ends: at a clean exit it frees the windows its library
communicators hold (arrival marks, node windows, node buffers: MPI must not finalize with a window
exposed); after an unhandled error it leaves them (freeing is collective, and would wait for ranks
still inside some collective); an error that every member of a communicator raised alike prints its
traceback once per job; Ctrl-C aborts the job. Set up once per process, when mpicoll makes its first
library communicator (:func:`register`).
"""
from __future__ import annotations

import atexit
import sys
import threading
import time
from typing import Any, Callable

from mpi4py import MPI

from . import _env, _trace, _traceback
from ._errors import CollectiveError

#: communicators holding a window (arrival marks, a node window, node buffers), in creation order:
#: freed at a clean exit, newest first (:func:`hold`, :func:`release`)
_OPEN: list = []
_LOCK = threading.Lock()
#: the exit status ``python -m mpi4py`` decided on (it aborts the job at exit when non-zero)
_EXIT: list = []
_registered = False
_previous_hook: list = []
#: this process's world rank, kept for use after MPI_Finalize
_WORLD_RANK: list[int] = []


def register(finalizing: Callable[[], None]) -> None:
    """Set the exit up (once per process; the caller holds its lock): the clean exit's freeing, the
    exception hook, and ``finalizing()``, run first thing in ``MPI_Finalize`` (MPI deletes
    ``COMM_SELF``'s attributes then, MPI 4.1, 11.2.4)."""
    global _registered
    if not _registered:
        _registered = True
        MPI.COMM_SELF.Set_attr(MPI.Comm.Create_keyval(delete_fn=lambda _c, _k, _v: finalizing()), True)
        # Runs before mpi4py's own finalizer (atexit is LIFO): MPI must not finalize with a window exposed.
        atexit.register(_shutdown)
        _watch_mpi4py_exit()
        _WORLD_RANK.append(MPI.COMM_WORLD.Get_rank())
        _previous_hook.append(sys.excepthook)
        sys.excepthook = _excepthook
        _trace.on_signal()


def hold(comm: Any) -> None:
    """List ``comm`` (it has a ``close()`` that frees its windows, collective) among those a clean
    exit frees."""
    with _LOCK:
        if comm not in _OPEN:
            _OPEN.append(comm)


def release(comm: Any) -> None:
    """Take ``comm`` off that list (its windows are freed)."""
    with _LOCK:
        if comm in _OPEN:
            _OPEN.remove(comm)


def _excepthook(kind, exc, tb) -> None:
    """An uncaught error that every member of a communicator raised alike (``exc.members``, world
    ranks) prints its traceback on the lowest member only, one line on the others: a job prints
    one traceback, not one per rank. Anything else goes to the previous hook; an uncaught
    KeyboardInterrupt (Ctrl-C) then aborts the job, under plain ``python`` too."""
    members = getattr(exc, "members", None)
    me = _WORLD_RANK[0] if _WORLD_RANK else None
    if members and me in members and me != min(members):
        _traceback.write(f"world rank {me}: the same {kind.__module__}.{kind.__qualname__} as world rank "
                         f"{min(members)}, whose traceback is printed\n")
    elif isinstance(exc, CollectiveError) and _previous_hook[0] is sys.__excepthook__:
        # (mpicoll's frames out, MPICOLL_TRACEBACK_FILTERING; in one write: no other rank's line inside)
        _traceback.write(_traceback.render(kind, exc, tb, "MPICOLL_TRACEBACK_FILTERING",
                                           _env.value("MPICOLL_TRACEBACK_FILTERING")))
    else:
        _previous_hook[0](kind, exc, tb)
    if not issubclass(kind, (KeyboardInterrupt, SystemExit)):   # (the flight recorders, after the error is out)
        (_trace.dump if members else _trace.dump_all)(f"uncaught {kind.__name__}")    # (agreed: each rank its own)
    if members and me in members and me != min(members) and _EXIT:
        time.sleep(0.2)                      # (python -m mpi4py aborts next: let the lowest member print first)
    if issubclass(kind, KeyboardInterrupt) and not MPI.Is_finalized():
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(130)            # Ctrl-C stops the job: peers inside a collective never return


def _watch_mpi4py_exit() -> None:
    """Record the status mpi4py's ``-m`` runner passes to ``set_abort_status`` (if it is running)."""
    runner = sys.modules.get("mpi4py.run")
    original = getattr(runner, "set_abort_status", None)
    if original is None or getattr(original, "_mpicoll", False):
        return

    def set_abort_status(status):
        _EXIT.append(status)
        return original(status)
    set_abort_status._mpicoll = True
    runner.set_abort_status = set_abort_status


def failing_exit() -> bool:
    """Whether the process is exiting after an unhandled exception or with a non-zero status."""
    if getattr(sys, "last_value", None) is not None or getattr(sys, "last_exc", None) is not None:
        return True                          # an unhandled exception was printed
    for status in _EXIT:
        code = status.code if isinstance(status, SystemExit) else status
        if isinstance(status, BaseException) and not isinstance(status, SystemExit):
            return True
        if code not in (0, None):
            return True
    return False


def _shutdown() -> None:
    """Free the windows (arrival marks, node windows, node buffers) at a clean exit, newest first
    (every member made them in the same order, so every member frees them in the same order).
    After an unhandled exception or a non-zero exit (``python -m mpi4py`` then aborts the job) skip
    it: freeing is collective and would wait for ranks that are still inside some collective,
    turning a prompt abort into a hang."""
    try:
        if MPI.Is_finalized() or failing_exit():
            return
        for comm in reversed(list(_OPEN)):
            comm.close()
    finally:
        _trace.deaf()                        # (a peer's late SIGUSR1 must not end this rank in MPI_Finalize)
