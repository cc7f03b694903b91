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
    """``op._here(lib, args, mode, failed)``, and its event (``seq``: the call's number on ``lib``
    as its flight recorder counts, -1: none)."""
    note = _trace.NOTE
    note.path = note.table = None
    t0, outcome = time.time_ns(), "ok"
    try:
        return op._here(lib, args, mode, failed)
    except BaseException as exc:
        outcome = type(exc).__name__
        raise
    finally:
        a = args[0] if args else None
        fields = {"comm": lib.label, "seq": seq, "dtype": str(a.dtype) if type(a) is np.ndarray else None,
                  "bytes": int(a.nbytes) if type(a) is np.ndarray else 0, "path": note.path or "mpi",
                  "agreed": note.table is not None, "outcome": outcome}
        fields.update(arrivals(lib, note.table))
        _trace.event(op.NAME, "collective", t0, time.time_ns(), fields)


def arrivals(lib: LibComm, table: np.ndarray | None) -> dict:
    """Who came last to an agreed call, from its gathered ``table`` (``H_TIME``: every rank's
    arrival): ``last_rank`` (a world rank), ``wait_us`` (how long this rank waited for it),
    ``late_us`` (how long after the first it came); nothing where some rank wrote no time."""
    if table is None:
        return {}
    times = table[:, V.H_TIME].tolist()
    if not all(times):
        return {}
    last = max(range(len(times)), key=times.__getitem__)
    return {"last_rank": lib.world_ranks[last], "wait_us": (times[last] - times[lib.rank]) / 1e3,
            "late_us": (times[last] - min(times)) / 1e3}


def stamp(send: np.ndarray) -> None:
    """Write this rank's arrival into its agreement row (where a trace runs)."""
    send[V.H_TIME] = time.time_ns() - _trace.OFFSET
