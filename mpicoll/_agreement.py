"""THE agreement: how the members of a communicator come to hold the same table, or all raise the
same error instead of some of them entering a collective their peers never join.

Every agreement mpicoll makes is one ``Allgather`` of a fixed-length int64 row per member
(:func:`gather`). Where the row's first entry is the member's local error flag (:func:`agree`), a
member that flagged one makes every member raise: they exchange their errors' reports, on that
error path only (:func:`settle`, :func:`values`), and each raises the lowest failing member's error,
the others' messages appended. What a row holds is its caller's: a call's header (:mod:`mpicoll.ops._agree`), a
plan's sequence row (:mod:`mpicoll._plan`), the settings of a communicator being made
(:mod:`mpicoll._making`), whether a shared window fits (:mod:`mpicoll._shm`), the torch backend's
start-up checks. A table whose rows differ is named with every member's own words for its call,
exchanged on that error path too (:func:`values`; :func:`mpicoll._validate.check_agreed`).

An agreement runs on a library communicator (``LibComm.call``: after the work queued there, counted,
under its watchdog), or on one being made (:class:`SetUp`: its calls are set-up calls, the
non-blocking form under the watched wait).
"""
from __future__ import annotations

import json
from typing import Callable

import numpy as np
from mpi4py import MPI

from ._comm import timed_call, world_ranks
from ._errors import CollectiveError, agreed, from_reports
from ._numeric import prefix

#: how an agreement's step names itself in a timeout ("waiting in ..."): a call's header agreement,
#: and the exchange of the error path
AGREEMENT = "its header agreement (an internal MPI Allgather)"
ERROR_STEP = "the exchange of an error (internal MPI Allgather/Allgatherv)"


class SetUp:
    """A communicator that is not a library communicator (yet), as an agreement talks to one: its
    collectives are set-up calls (:func:`~mpicoll._comm.timed_call`), a timeout names the step with
    ``says(step)`` and, ``own``, only raises (the limit is the communicator's own)."""

    def __init__(self, mpi: MPI.Comm, own: bool, says: Callable[[str], str]) -> None:
        self.mpi, self.own, self.says = mpi, own, says
        self.size, self.world_ranks = mpi.Get_size(), world_ranks(mpi)

    def call(self, name: str, args: tuple, timeout: float | None, where: tuple) -> None:
        timed_call(self.mpi, name, args, timeout, lambda: self.says(where[2]), self.own)


def gather(comm, row: np.ndarray, timeout: float | None, where: tuple, out: np.ndarray | None = None) -> np.ndarray:
    """Every member's int64 ``row`` over ``comm`` (a ``LibComm`` or a :class:`SetUp`), into ``out``
    (or a new array): the ``(comm.size, len(row))`` table, the same on every member. ``where``,
    ``(operator, its call number or None, step)``, names the call in a timeout."""
    table = np.empty((comm.size, row.size), dtype=np.int64) if out is None else out
    comm.call("Allgather", ([row, MPI.INT64_T], [table, MPI.INT64_T]), timeout, where)
    return table


def agree(comm, row: np.ndarray, error: BaseException | None, timeout: float | None, where: tuple,
          out: np.ndarray | None = None) -> np.ndarray:
    """:func:`gather` ``row``, whose first entry is set here to this member's error flag (``error``:
    its local error, or None); if any member flagged one, every member raises the same error
    (:func:`settle`).

    Returns:
        The gathered table, identical on every member.
    """
    row[0] = error is not None
    table = gather(comm, row, timeout, where, out)
    failure = flagged(comm, table, error, timeout, where)
    if failure is not None:
        raise failure
    return table


def flagged(comm, table: np.ndarray, error: BaseException | None, timeout: float | None,
            where: tuple) -> CollectiveError | None:
    """The second half of :func:`agree`, for a table gathered otherwise too (a plan's recorded
    ``Allgather``): if any member flagged an error (the first column), the error every member
    raises (:func:`settled`: collective), else None. (The caller raises it: a traceback ends where
    the call met its peers.)"""
    if any(table[:, 0].tolist()):
        return settled(comm, error, timeout, (where[0], where[1], ERROR_STEP))
    return None


def settle(comm, error: BaseException | None, timeout: float | None, where: tuple) -> None:
    """Raise :func:`settled`'s error (collective over ``comm``; called when a gathered error flag is
    set)."""
    raise settled(comm, error, timeout, where)


def settled(comm, error: BaseException | None, timeout: float | None, where: tuple) -> CollectiveError:
    """The error every member raises: the lowest failing member's, the others' messages appended
    (collective over ``comm``: the members exchange their reports)."""
    mine = None if error is None else [type(error).__name__, str(error), getattr(error, "op", None),
                                       getattr(error, "param", None), getattr(error, "rank", None)]
    reports = [r for r in values(comm, mine, timeout, where) if r is not None]
    return agreed(from_reports(reports), comm.world_ranks)


def values(comm, mine: object, timeout: float | None, where: tuple) -> list:
    """Every member's ``mine`` (a value JSON can carry), in rank order (collective over ``comm``;
    on error paths: an error's report, how a call reads)."""
    return [json.loads(t) for t in texts(comm, json.dumps(mine).encode(), timeout, where)]


def texts(comm, mine: bytes, timeout: float | None, where: tuple) -> list[bytes]:
    """Every member's bytes ``mine`` (any length, empty too), in rank order (collective over
    ``comm``: an ``Allgather`` of the lengths, an ``Allgatherv`` of the bytes; on error paths)."""
    sizes = gather(comm, np.array([len(mine)], dtype=np.int64), timeout, where).reshape(-1)
    data = np.empty(int(sizes.sum()), dtype=np.uint8)
    displs = prefix(sizes)
    comm.call("Allgatherv", ([np.frombuffer(mine, dtype=np.uint8), MPI.BYTE], [data, (sizes, displs), MPI.BYTE]),
              timeout, where)
    return [data[d:d + c].tobytes() for c, d in zip(sizes.tolist(), displs)]
