"""The CollectiveError family and the cross-rank agreement helper.

Every error mpicoll raises is a :class:`CollectiveError`. A check that only one rank can see is
folded into :func:`agree`, a single small ``Allgather`` that every rank of the communicator makes
before any data moves, so that all of them raise the same error instead of some ranks entering a
collective that their peers never join.
"""
from __future__ import annotations

import json
import re

import numpy as np
from mpi4py import MPI


class CollectiveError(RuntimeError):
    """Base class of every error mpicoll raises.

    Attributes:
        op: operator name ("AllReduce", ...), or None.
        param: the offending parameter name, or None.
        rank: the rank (in the operator's communicator) whose input broke the rule, or None.
    """

    def __init__(self, message: str, *, op: str | None = None, param: str | None = None,
                 rank: int | None = None) -> None:
        super().__init__(message)
        self.op = op
        self.param = param
        self.rank = rank


class CollectiveArgumentError(CollectiveError, ValueError):
    """A bad argument or parameter (also a ``ValueError``)."""


class CollectiveMismatchError(CollectiveArgumentError):
    """Arguments that are fine on each rank alone but disagree across ranks."""


class CollectiveTimeout(CollectiveError, TimeoutError):
    """A collective, or a comm-domain rendezvous, did not complete in time.

    Attributes:
        seconds: the limit that passed, or None. Given, the message ends with gloo's words for it
            (:func:`gloo_timeout`), which programs and log scrapers written for torch's gloo look for.
    """

    def __init__(self, message: str, *, op: str | None = None, param: str | None = None, rank: int | None = None,
                 seconds: float | None = None) -> None:
        if seconds is not None:
            message = f"{message}; in gloo's words: {gloo_timeout(seconds, op)}"
        super().__init__(message, op=op, param=param, rank=rank)
        self.seconds = seconds


def milliseconds(seconds: float) -> str:
    """A duration in milliseconds as gloo prints it, but as given (0.1 s: ``100``, 0.0005 s: ``0.5``)."""
    return f"{seconds * 1000:g}"


def gloo_timeout(seconds: float, op: str | None) -> str:
    """gloo's words for a timeout (``Timed out waiting 2000ms for ...``: torch's tests look for
    ``Timed out``)."""
    return f"Timed out waiting {milliseconds(seconds)}ms for {op or 'the call'} to complete"


_CLASSES = {c.__name__: c for c in (CollectiveError, CollectiveArgumentError,
                                    CollectiveMismatchError, CollectiveTimeout)}
for _cls in _CLASSES.values():
    _cls.__module__ = "mpicoll"          # shown as mpicoll.CollectiveError in tracebacks, as it is imported


def agreed(exc: CollectiveError, world_ranks) -> CollectiveError:
    """Mark ``exc`` as raised alike on every member of a communicator (``exc.members``: their
    world ranks), so that an uncaught one prints its traceback once per job (``mpicoll._comm``'s
    exception hook)."""
    exc.members = tuple(world_ranks)
    return exc


def arg_error(op: str, param: str, value: object, rank: int, rule: str) -> CollectiveArgumentError:
    """Build the standard message: ``"AllToAllV: send_counts[2]=-1 on rank 1: counts must be >= 0"``."""
    return CollectiveArgumentError(f"{op}: {param}={value!r} on rank {rank}: {rule}",
                                   op=op, param=param, rank=rank)


def mismatch_error(op: str, param: str, detail: str, rank: int) -> CollectiveMismatchError:
    """A cross-rank disagreement; ``detail`` names the values on both sides."""
    return CollectiveMismatchError(f"{op}: {param} differs across ranks: {detail}",
                                   op=op, param=param, rank=rank)


def as_collective_error(exc: BaseException, op: str, rank: int) -> CollectiveError:
    """Wrap anything raised while checking local input (a TypeError on a list, ...)."""
    if isinstance(exc, CollectiveError):
        return exc
    return CollectiveArgumentError(f"{op}: bad input on rank {rank}: {type(exc).__name__}: {exc}",
                                   op=op, rank=rank)


def agree(comm, header: np.ndarray, error: BaseException | None, timeout: float | None, op: str,
          number: int | None, step: str = "its header agreement (an internal MPI Allgather)",
          out: np.ndarray | None = None) -> np.ndarray:
    """Allgather every rank's fixed-length int64 ``header`` over ``comm`` (a LibComm) into ``out`` (or
    a new array); raise the same error on all ranks.

    ``header[0]`` is 1 on a rank that has a local ``error`` (set here if it is not already). If any rank has one, the
    messages are exchanged (on the error path only) and every rank raises the error of the lowest
    failing rank, with the other failing ranks' messages appended. ``op`` and ``number`` (its call
    number on ``comm``, None: the latest counted) and ``step`` name the call for the watchdog.

    Returns:
        The gathered ``(comm.size, len(header))`` int64 matrix, identical on every rank.
    """
    header[0] = error is not None
    table = np.empty((comm.size, header.size), dtype=np.int64) if out is None else out
    comm.call("Allgather", ([header, MPI.INT64_T], [table, MPI.INT64_T]), timeout, (op, number, step))
    if any(table[:, 0].tolist()):
        settle(comm, error, timeout, (op, number, "the exchange of an error (internal MPI Allgather/Allgatherv)"))
    return table


def settle(comm, error: BaseException | None, timeout: float | None, where: tuple) -> None:
    """Every rank raises the same error: the lowest failing rank's, the others' messages appended
    (collective over ``comm``; called when a gathered error flag is set)."""
    mine = b"" if error is None else json.dumps(
        [type(error).__name__, str(error), getattr(error, "op", None), getattr(error, "param", None),
         getattr(error, "rank", None)]).encode()
    sizes = np.empty(comm.size, dtype=np.int64)
    comm.call("Allgather", ([np.array([len(mine)], dtype=np.int64), MPI.INT64_T], [sizes, MPI.INT64_T]), timeout,
              where)
    data = np.empty(int(sizes.sum()), dtype=np.uint8)
    displs = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    comm.call("Allgatherv", ([np.frombuffer(mine, dtype=np.uint8), MPI.BYTE], [data, (sizes, displs), MPI.BYTE]),
              timeout, where)
    reports = [json.loads(data[d:d + c].tobytes()) for c, d in zip(sizes.tolist(), displs.tolist()) if c]
    cls_name, _, op, param, rank = reports[0]
    raise agreed(_CLASSES.get(cls_name, CollectiveArgumentError)(grouped(reports), op=op, param=param, rank=rank),
                 comm.world_ranks)


def grouped(reports: list) -> str:
    """One message from the failing ranks' reports ``[class, message, op, param, rank]``, lowest
    rank first: messages that differ only in their rank (``on rank 2``, ``world rank 2``) become one,
    ``on ranks [0, 1, 3]``; the others follow as ``(also: ...)``."""
    groups: dict[str, list[int]] = {}
    for _, text, _, _, rank in reports:
        key = text
        if isinstance(rank, int):
            key, found = re.subn(rf"\brank {rank}\b", "\0", text, count=1)
            if found:
                groups.setdefault(key, []).append(rank)
                continue
        groups.setdefault(key, [])

    def render(key: str, ranks: list[int]) -> str:
        return key.replace("\0", f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}")
    first, *others = [render(k, r) for k, r in groups.items()]
    return first + (" (also: " + "; ".join(others) + ")" if others else "")
