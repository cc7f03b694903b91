"""A call, traced (docs/trace.md): one event with what it moved, the path its data took, how long it
took, its outcome, and, where it agreed, which rank arrived last and how long this one waited.

The stages of the call leave notes on the way (:data:`mpicoll._trace.NOTE`, the calling thread's):
the path (a compiled call's, or what ``issue`` told its Runner: ``go.took``) and the agreed table,
whose ``H_TIME`` column holds every rank's arrival (written before the exchange where a trace runs).
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from .. import _trace
from .. import _validate as V
from .._comm import LibComm


def traced(op: Any, lib: LibComm, args: tuple, mode: Any, failed: Any, seq: int) -> Any:
    """``op._here(lib, args, mode, failed)``, and its event (``seq``: the call's number on ``lib``,
    1 for the first). The event keeps the facts as they are (:func:`fields` reads them when the
    trace is written): the call pays for a tuple."""
    note = _trace.NOTE
    note.path = note.table = None
    t0, outcome = time.time_ns(), "ok"
    try:
        return op._here(lib, args, mode, failed)
    except BaseException as exc:
        outcome = type(exc).__name__
        raise
    finally:
        t1, a, table = time.time_ns(), args[0] if args else None, note.table
        mine = type(a) is np.ndarray
        _trace.event(op.NAME, "collective", t0, t1, (fields, lib, seq, a.dtype if mine else None,
                                                     a.nbytes if mine else 0, note.path, outcome,
                                                     None if table is None else table[:, V.H_TIME].tolist(), t1))


#: a dtype's name as written (``null``: none), kept (a numpy dtype's name takes microseconds)
_NAMES: dict = {None: "null"}


def _named(dtype: Any) -> str:
    return _NAMES.setdefault(dtype, _trace.quoted(str(dtype)))


def fields(lib: LibComm, seq: int, dtype: Any, nbytes: int, path: str | None, outcome: str,
           times: list[int] | None, t1: int) -> str:
    """A traced call's event fields, as the JSON object written (made when the trace is written,
    cheaply: a loop of calls makes one each): its communicator, its number there, dtype, bytes,
    path, whether it agreed, its outcome, and who came last (``times``: every rank's arrival, where
    it agreed): ``last_rank`` (a world rank), ``wait_us`` (how long this rank waited for it),
    ``late_us`` (how long after the first it came), ``move_us`` (from its arrival to the call's end
    ``t1``: the data moving, and the local work around it); no arrivals where some rank wrote no time."""
    q = _trace.quoted
    text = (f'{{"comm": {q(lib.label)}, "seq": {seq}, "dtype": {_NAMES.get(dtype) or _named(dtype)}, '
            f'"bytes": {nbytes}, "path": {q(path or "mpi")}, "agreed": {"false" if times is None else "true"}, '
            f'"outcome": {q(outcome)}')
    if times and all(times):
        last = max(range(len(times)), key=times.__getitem__)
        text += (f', "last_rank": {lib.world_ranks[last]}, "wait_us": {(times[last] - times[lib.rank]) / 1e3}, '
                 f'"late_us": {(times[last] - min(times)) / 1e3}, "move_us": {(t1 - _trace.OFFSET - times[last]) / 1e3}')
    return text + "}"


def stamp(send: np.ndarray) -> None:
    """Write this rank's arrival into its agreement row (where a trace runs)."""
    send[V.H_TIME] = time.time_ns() - _trace.OFFSET
