"""Trace a region of a program, and read what a trace or a flight recorder says (docs/trace.md).

    with mpicoll.trace("trace-out"):        # collective over the world: every rank enters and leaves
        ...                                 # every call: one event in trace-out/trace.<rank>.json
    print(mpicoll.trace_report("trace-out"))

``MPICOLL_TRACE=DIR`` traces the whole run instead (from mpicoll's first library communicator).
"""
from __future__ import annotations

import contextlib
from typing import Iterator

from mpi4py import MPI

from . import _env, _trace
from ._domains import world
from .functional import barrier
from ._trace_read import report

__all__ = ["trace", "trace_report"]


@contextlib.contextmanager
def trace(where: str | None = None) -> Iterator[str]:
    """Trace every call made inside the block: each rank writes its events to
    ``where/trace.<world rank>.json`` (Chrome's trace event format). Collective over the world:
    every rank enters the block (its clock's offset to world rank 0's is measured then, where the
    ranks span several hosts) and leaves it (after a barrier: every rank's file is complete when the
    block ends; not when the block raised). Inside a trace already running (``MPICOLL_TRACE``, an
    outer block) it adds nothing: the calls go to that trace.

    Args:
        where: the directory (made if need be); default ``MPICOLL_TRACE``'s, else ``mpicoll-trace``.

    Yields:
        This rank's trace file.
    """
    world()                                   # (mpicoll's world, its settings agreed: before the trace)
    if _trace.ON:                             # (MPICOLL_TRACE's run, or an outer region: it goes on)
        yield _trace.current()
        return
    where = where or _env.value("MPICOLL_TRACE") or "mpicoll-trace"
    own = MPI.COMM_WORLD.Dup()                # (the offset's messages on a communicator of their own)
    try:
        offset = _trace.clock_offset(own)
    finally:
        own.Free()
    path = _trace.start(where, MPI.COMM_WORLD.Get_rank(), offset)
    try:
        yield path
    finally:
        _trace.stop()
    barrier()                                 # (every rank's file written before any rank reads them)


def trace_report(where: str, merge: str | None = None, plot: str | None = None) -> str:
    """What ``python -m mpicoll.run trace DIR`` prints: per operator the calls, bytes, time and time
    waiting; the ranks that made the others wait; for flight-recorder dumps, the first call some
    rank never entered. ``merge``: also write every rank's events into one file; ``plot``: a picture
    of the timeline (matplotlib)."""
    return report(where, merge, plot)
