"""What a described call is: the record ``describe`` returns and ``issue`` reads (:class:`Call`),
with its local work around the data's movement (refreshing a copy of a strided input, packing a
list, dividing an average: ``src``, ``before``, ``after``), which every mode runs around the call,
whether ``issue`` made the MPI calls or the agreement carried the data (:func:`prologue`,
:func:`epilogue`).
"""
from __future__ import annotations

import numpy as np

#: graphs being captured, innermost last (``mpicoll.graph.capture``): while it is not empty, an
#: operation's execute (and one-shot start) is described into the graph instead of run
CAPTURING: list = []


class Call:
    """One rank's description of one call: what ``describe`` returns and ``issue`` reads.

    Attributes:
        dt: the dtype row of the data (None for an operator without one).
        x: the array MPI reads (C-contiguous); ``src``: the caller's array when x is a copy of it
            (the copy is refreshed from it before every run).
        out: the array MPI writes (or None: a non-root rank of a rooted operator).
        result: what ``execute`` returns (default ``out``).
        shape, root, reduce, params: what must agree across ranks (shape None: not compared).
        info: per-rank facts the issuer may read from the agreed table (layout bits).
        send, recv: per-peer counts for the count-pair rule (V operators), else None.
        args: the operator's own normalised arguments (counts, displacements, ...).
        rounds, round: a plan records ``rounds`` parts of the call (the Hccl client's ``repeat``),
            ``issue`` reading which one from ``round``.
        before, after: local steps ``(fn, *args)`` around the call's data movement (after ``src``'s
            copy, before the result is returned).
        unit: the elements of one entry of ``send`` (an adapter counting rows: their elements).

    The constructor takes the fields every call has; ``describe`` sets the others it needs, the
    class defaults standing otherwise (a plain class and positional arguments: the cheapest record
    to build on every ``execute``).
    """

    src = reduce = send = recv = None
    root = params = info = round = 0
    rounds = unit = 1
    args: tuple = ()
    before: tuple = ()
    after: tuple = ()

    def __init__(self, dt, x, out, shape: tuple | None = None) -> None:
        self.dt, self.x, self.out, self.result, self.shape = dt, x, out, out, shape


def prologue(call: Call) -> None:
    """The call's local work before its data moves: ``src``'s copy, then its ``before`` steps."""
    if call.src is not None:
        np.copyto(call.x, call.src)
    for step in call.before:
        step[0](*step[1:])


def epilogue(call: Call) -> None:
    """The call's local work once its data has moved: its ``after`` steps."""
    for step in call.after:
        step[0](*step[1:])
