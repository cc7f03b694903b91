"""The CollectiveError family, and how errors read.

Every error mpicoll raises is a :class:`CollectiveError`. A check that only one rank can see is
agreed across the ranks before any data moves (:mod:`mpicoll._agreement`), so that all of them raise
the same error (:func:`from_reports`, :func:`agreed`) instead of some ranks entering a collective
that their peers never join.
"""
from __future__ import annotations

import re


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


def from_reports(reports: list) -> CollectiveError:
    """The error every failing rank's report ``[class, message, op, param, rank]`` (lowest rank
    first) makes: the first one's class and fields, the messages :func:`grouped`."""
    cls_name, _, op, param, rank = reports[0]
    return _CLASSES.get(cls_name, CollectiveArgumentError)(grouped(reports), op=op, param=param, rank=rank)


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
