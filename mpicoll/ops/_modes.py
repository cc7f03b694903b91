"""The sinks of the call pipeline (:meth:`mpicoll.ops._base.Operation._call`): what each mode does with
an agreed call, the only stage that differs by mode. :data:`RUN` compiles the call (small calls of a
layout it can tell apart, :class:`~._compiled.Compiled`) and runs it, or runs it at once with the
operation's :class:`~mpicoll._go.Runner`; :data:`PREPARE` records a :class:`~mpicoll.Plan`;
:data:`ASYNC` queues the call on its communicator's worker, which runs it in :data:`WORKER`; a graph
being captured has its own sink (:mod:`mpicoll.graph`).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import _trace
from .._call import Call
from .._go import Recorder
from .._plan import Plan
from ._agree import Slots
from ._compiled import Compiled, Slotted, run_now


class Mode:
    """What a mode does with an agreed call (:meth:`take`), and which stages it takes: ``compiles``
    (look the call up among the compiled ones, compile it), ``rides`` (offer its payload to the
    agreement), ``agrees`` (always agree), ``defers`` (take it described, unagreed: a capture)."""

    compiles = rides = True
    agrees = defers = False

    def take(self, op: Any, call: Call, table: np.ndarray | None, rode: bool, slots: Slots | None,
             payload: np.ndarray | None, key: tuple | None, args: tuple, arrays: tuple | None) -> Any:
        raise NotImplementedError


class _Run(Mode):
    """``execute``: compile the call (``arrays``, its arrays and how they look: a call of a layout it
    can tell apart, small enough: ``compiled`` (:mod:`mpicoll._thresholds`)) and run it, or run it at once with the
    operation's Runner."""

    def take(self, op, call, table, rode, slots, payload, key, args, arrays):
        if arrays == ():                                # (its values are slots: one compiled call)
            op._last = Slotted(op, op._lib, call, slots if op._checks(op._lib) else None)
        elif arrays is not None:
            agrees = op._checks(op._lib)                # (its later calls: their agreement is a step of it)
            c = Compiled(op, op._lib, key, args, *arrays, call, table, rode and agrees, slots if agrees else None,
                         payload if agrees else None)
            if c.repeats:
                op._keep(c)
                if agrees or not rode:
                    return c.run_data()
            # (not kept: described every time; or its later calls make the MPI calls its issue
            # records, and this one rode its first agreement: landed here)
        return run_now(op, call, table, rode, payload)


class _Async(Mode):
    """``async_op=True``: the call queued on its communicator's worker, which runs its pipeline in
    :data:`WORKER` (:meth:`Operation._call`; a graph being captured takes it as an async call)."""


class _Prepare(Mode):
    """``prepare``: a Plan, each of whose runs counts as a call."""

    compiles = rides = False
    agrees = True

    def take(self, op, call, table, rode, slots, payload, key, args, arrays):
        rec = Recorder(counts=op._counted(op._lib))
        op._record(call, table, rec)
        return Plan(rec, op, rounds=call.rounds > 1)


#: ``execute`` here; a call queued with ``async_op=True``, on its worker (a capture never takes it:
#: the worker runs what the caller queued, whatever the caller captures meanwhile)
RUN, WORKER = _Run(), _Run()
ASYNC, PREPARE = _Async(), _Prepare()
