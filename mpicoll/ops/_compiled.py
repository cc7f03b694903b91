"""Compiled calls: what the first call of a layout decides, kept; every later call of that layout
fills the slots and runs (docs/design.md, "Compiled calls").

A call's *layout* (:func:`._slots.layout`) is what does not change from one call to the next: each data
array's dtype, shape, strides and flags (not its identity, not its contents), which arguments are
the same array, and the values that describe the call (counts, split sizes: ``Operation.VALUES``) by
their contents; the operation (its params, communicator, validation) is the one that keeps it. An
operator whose values change with every call (``Operation.SLOTS``: AllToAllVV2's counts, a MoE
layer's routing) has one compiled call, whatever its arrays (:class:`Slotted`): its values are the
slots, each call described (the operator's local rules on its values; its output sized by them)
and its varying fields written into the header row it keeps.

The first call of a layout is described, agreed (validation on, or the operation's first call) and
its steps recorded (``issue``, or ``land`` where its data rode the agreement): its compilation
(:class:`Compiled`). The steps are kept with every array of the call replaced by a *slot*: the
caller's arrays (in the order :func:`layout` finds them) and the outputs the call allocated (new for
every call), each referred to itself or by a view into it. A later call of that layout fills the
slots with its own arrays and runs the steps (:meth:`Compiled.fill`); the very arrays of the last
call (a repeat: :meth:`Compiled.repeat`) run the steps bound last time.

Validation is a step of the compiled call: its header row is built at compilation; per call the
payload (where it rides) is copied into the row's slot and, where a sequence is kept, the sequence
number written; one ``Allgather``; one comparison of the gathered headers with those of the
compilation. Any difference (a peer's error flag, another call, another shape) goes to the
named-error path (:meth:`Compiled.differs`): the same error on every rank, or, where the peers'
calls still agree, this call run from the new table and compiled again.
"""
from __future__ import annotations

import operator
from typing import Any

import numpy as np
from mpi4py import MPI

from .. import _comm, _trace
from .. import _validate as V
from .._comm import LibComm
from .._errors import as_collective_error
from .._agreement import AGREEMENT, flagged
from .._call import Call, epilogue, prologue
from .._go import Recorder, Step
from ._agree import Slots
from ._observe import stamp
from ._slots import (LOOK, Steps, Unfillable, allocated, contents, filled, flat_shape, layout, of_layout, overlaps,
                     slotted, touched)

#: layouts an operation keeps compiled (the least recently compiled goes first)
COMPILED = 8
#: what ``repeat`` returns when the call is not the last one
MISS = object()
# ----------------------------------------------------------------------------- the compiled call

class Compiled:
    """One layout of one operation's calls, compiled (see the module docstring).

    Attributes:
        op, lib: the operation and the communicator it agrees and counts on.
        args: the arguments of the last call (held: their identities stay theirs).
        result: what the last call returned.
    """

    __slots__ = ("op", "lib", "key", "args", "mine", "shapes", "allocs", "agree", "data", "result_t", "result",
                 "slots", "heads", "expected", "rode", "counting", "fillable", "repeats", "plain", "plain_run",
                 "agree_go", "data_go", "shape", "shapes_of", "overlaps", "path", "values", "others", "resides")
    #: what a MISS leaves the pipeline (:class:`Slotted`'s described call): nothing
    described = None

    def __init__(self, op: Any, lib: LibComm, key: tuple | None, args: tuple, mine: list, looks: list, call: Call,
                 table: np.ndarray | None, rode: bool, slots: Slots | None, payload: np.ndarray | None) -> None:
        self.op, self.lib, self.key, self.slots, self.rode = op, lib, key, slots, rode
        self.plain = lib.plain
        self.counting = op._counted(lib)
        self.plain_run = slots is None and not self.counting
        allocs = allocated(call.result, mine)
        self.allocs = [(a.shape, a.dtype) for a in allocs]
        every = mine + allocs
        agree_steps, data_steps, tokens, self.path = _record(op, call, table, slots, payload, rode)
        self.heads = self.expected = None
        if slots is not None:
            self.heads = slots.table[:, :slots.header]
            self.expected = self._seen(self.heads)
            slots.send[V.H_TIME] = 0
        timeout = op.timeout
        where = [(op.NAME, None, AGREEMENT)], [(op.NAME, None, "")]
        try:
            self.agree = Steps(agree_steps, every, every, timeout, where[0], 0)
            self.data = Steps(data_steps, every, every, timeout, where[1], tokens)
            self.result_t = slotted(call.result, every)
            self.fillable = True
        except Unfillable:
            self.agree = Steps(agree_steps, None, every, timeout, where[0], 0)
            self.data = Steps(data_steps, None, every, timeout, where[1], tokens)
            self.result_t, self.fillable = call.result, False
        self.agree_go, self.data_go = self.agree.go, self.data.go     # (lists a fill changes in place)
        self.shape, self.shapes_of, self.overlaps = flat_shape(args, op), looks, None
        if any(a.base is not None for a in mine):
            self.overlaps = overlaps(mine)
        # (an array of a list no step touches was read into a copy when the call was described, as
        # x given as a list of arrays is: such a call is described every time; a call that
        # allocates its output and cannot fill a new one neither)
        listed = [a for v in args if type(v) is list or type(v) is tuple for a in v if type(a) is np.ndarray]
        self.repeats = touched(agree_steps + data_steps, call.result, listed) and (self.fillable or not allocs)
        # (values given in a container that may change in place between calls, an array or a list of
        # counts: a repeat compares their contents, kept here)
        self.values = [(i, contents(args[i])) for i in op._VALUES_AT if not _fixed(args[i])]
        # (the other communicators its steps call on: work queued there runs first, as for a plan)
        self.others = tuple(dict.fromkeys(s.comm for s in agree_steps + data_steps
                                          if s.comm is not None and s.comm is not lib))
        self.resides = op.RESIDES and slots is None    # (not agreed: a node buffer made later changes it)
        self.result = call.result
        self.args, self.mine, self.shapes = args, mine, looks

    # -- filling ---------------------------------------------------------------------------------
    def _bind(self, arrays: list) -> None:
        """Point the steps at ``arrays`` (the caller's, then new outputs)."""
        self.agree.fill(arrays)
        self.data.fill(arrays)
        self.result = filled(self.result_t, arrays)

    def fill(self, args: tuple, mine: list, looks: list) -> bool:
        """Fill the slots with another call's arrays (of this layout: they overlap as its did);
        False: it cannot (its steps hold memory the slots cannot reach: the call is described afresh)."""
        if not self.fillable or (self.op.RESIDES and self.lib.buffers):   # (where x lies is in its header)
            return False
        self._bind(mine + [np.empty(s, d) for s, d in self.allocs] if self.allocs else mine)
        self.args, self.mine, self.shapes = args, mine, looks
        return True

    def repeat(self, args: tuple) -> Any:
        """Run again with the very arguments of the last call (MISS: not them)."""
        held = self.args
        if len(args) != len(held) or not all(map(operator.is_, args, held)) or \
                list(map(LOOK, self.mine)) != self.shapes:        # (reshaped, restrided, retyped, made read-only)
            return MISS
        if self.values and any(contents(args[i]) != v for i, v in self.values):   # (counts changed in place)
            return MISS
        if self.resides and self.lib.buffers:         # (where each input lies is agreed now: described)
            return MISS
        if self.allocs:                                # (a new output, every call)
            self._bind(self.mine + [np.empty(s, d) for s, d in self.allocs])
        if self.plain_run and not _trace.ON:           # (no agreement, nothing counted: its steps alone)
            if self.others and _comm.QUEUED:
                self._drain()
            for step in self.data_go:
                step()
            return self.result
        return self.run()

    def similar(self, args: tuple) -> Any:
        """Run with other arrays of its layout (MISS: not of it)."""
        found = of_layout(args, self.shape, self.shapes_of, self.overlaps)
        if found is None or not self.fill(args, *found):
            return MISS
        return self.run()

    # -- running ---------------------------------------------------------------------------------
    def _drain(self) -> None:
        """Run first what is queued on the other communicators its steps call on (as a plan's run)."""
        for c in self.others:
            if c.pending:
                c.drain(None)

    def run(self) -> Any:
        """One call: its agreement (validated), its data, its result. The caller holds the
        communicator (``LibComm.busy``)."""
        if self.others and _comm.QUEUED:
            self._drain()
        if self.counting:
            calls = self.lib.calls
            calls[self.op.NAME] = calls.get(self.op.NAME, 0) + 1
        if self.slots is not None:
            if self.plain and not _trace.ON:
                for step in self.agree_go:
                    step()
                if self.heads.tobytes() != self.expected:
                    return self.differs()
            else:                                      # (a sequence number to write, or a trace's time)
                send = self.slots.send
                send[V.H_SEQ] = 0 if self.plain else self.lib.seq    # (as a described call's header)
                if _trace.ON:
                    stamp(send)
                for step in self.agree_go:
                    step()
                send[V.H_TIME] = 0
                if _trace.ON:
                    _trace.NOTE.table = self.slots.table
                if self._seen(self.heads) != self.expected:
                    return self.differs()
        for step in self.data_go:
            step()
        if _trace.ON:
            _trace.NOTE.path = self.path
        return self.result

    def run_data(self) -> Any:
        """The data part of the call its compilation has just agreed."""
        if self.others and _comm.QUEUED:
            self._drain()
        for step in self.data_go:
            step()
        if _trace.ON:
            _trace.NOTE.path = self.path
        return self.result

    def _seen(self, heads: np.ndarray) -> bytes:
        return seen(heads, self.plain)

    def differs(self) -> Any:
        """The gathered headers are not those of the compilation: a peer's local error (raised on
        every rank), a mismatch (named, on every rank), or peers whose calls changed but still
        agree: this call then runs from the new table, and is compiled again with it."""
        op, lib, table = self.op, self.lib, self.slots.table
        _raise_flagged(op, lib, table)
        V.check_agreed(lib, op.NAME, table, op.PAIR_NAMES)
        key, mine, looks = layout(self.args, op._VALUES_AT, op._SLOTS_AT)
        call = op.describe(*self.args)          # (it described the same layout before: no local error)
        payload = op._payload(call)
        rode = payload is not None and min(self.slots.rides.tolist()) >= 0
        c = Compiled(op, lib, key, self.args, mine, looks, call, table, rode, self.slots, payload)
        op._keep(c)
        return c.run_data()


def seen(heads: np.ndarray, plain: bool) -> bytes:
    """Gathered headers as a compiled call compares them: without the arrival times (a trace's), and
    without the sequence numbers, where they are kept (those are compared among themselves)."""
    if plain and heads.shape[1] <= V.H_TIME:     # (neither in them: as they are)
        return heads.tobytes()
    h = heads.copy()
    if h.shape[1] > V.H_TIME:
        h[:, V.H_TIME] = 0
    if not plain:
        seqs = h[:, V.H_SEQ].tolist()
        h[:, V.H_SEQ] = 0 if seqs.count(seqs[0]) == len(seqs) else -1
    return h.tobytes()


class Slotted:
    """The compiled call of an operator whose values change with every call (``Operation.SLOTS``:
    AllToAllVV2's counts, ``all_to_all_single``'s split sizes): one per operation, whatever its
    arrays. Each call is described (the operator's local rules on its values, its output sized by
    them); validated, the fields of the header row it keeps that change (sequence, layout bit,
    counts, payload) are written, one ``Allgather``, the gathered headers compared with those of
    its compilation but for the counts, which must pair (:func:`~mpicoll._validate.pairs_hold`); any
    difference goes to the named-error path. Its data then moves at once from the described call
    (:func:`run_now`: its landing where every rank's payload rode, else its ``issue``: the agreed
    table picks ``Alltoall`` for uniform counts). A call whose dtype or shape is not its
    compilation's is compiled again (the fields its header holds).

    Attributes:
        op, lib: as :class:`Compiled`'s; args: the arguments of the call it runs.
    """

    __slots__ = ("op", "lib", "args", "slots", "plain", "counting", "dt", "shape", "expected", "exchange",
                 "described")

    def __init__(self, op: Any, lib: LibComm, call: Call, slots: Slots | None) -> None:
        self.op, self.lib, self.slots, self.args = op, lib, slots, ()
        self.plain, self.counting = lib.plain, op._counted(lib)
        self.dt, self.shape = call.dt, call.shape
        self.expected = self.exchange = self.described = None
        if slots is not None:
            self.expected = seen(slots.table[:, :V.H_INFO], self.plain)
            self.exchange = lib.bind("Allgather", ([slots.send, MPI.INT64_T], [slots.table, MPI.INT64_T]),
                                     op.timeout, (op.NAME, None, AGREEMENT))

    def repeat(self, args: tuple) -> Any:
        self.args = args
        return self.run()

    def similar(self, args: tuple) -> Any:
        return MISS                      # (``repeat`` ran it, or found it is not its call)

    def run(self) -> Any:
        """One call (the caller holds the communicator); MISS: its describe failed here, or it is
        of another dtype or shape: ``described`` then holds ``(call, error)`` for the pipeline,
        which agrees it (a call is described once: its values may be iterators, read once)."""
        op, lib = self.op, self.lib
        self.described = None
        try:
            call = op.describe(*self.args)
        except Exception as exc:  # noqa: BLE001 - raised through the pipeline's agreement
            self.described = (None, as_collective_error(exc, op.NAME, op.rank))
            return MISS
        slots = self.slots
        if slots is not None and (call.dt is not self.dt or call.shape != self.shape):
            self.described = (call, None)
            return MISS
        if self.counting:
            calls = lib.calls
            calls[op.NAME] = calls.get(op.NAME, 0) + 1
        if slots is None:
            return run_now(op, call, None, False, None)
        send = slots.send
        if not self.plain:
            send[V.H_SEQ] = lib.seq                    # (as a described call's header)
        send[V.H_INFO] = call.info
        send[V.H_LEN:slots.header] = call.send + call.recv
        payload = op._payload(call)
        if payload is None:
            send[V.H_RIDE] = -1
        else:
            if call.src is not None or call.before:
                prologue(call)                         # (its payload is read now, into the agreement)
            slots.offer(payload)
        if _trace.ON:
            stamp(send)
        self.exchange()
        send[V.H_TIME] = 0
        table = slots.table
        if _trace.ON:
            _trace.NOTE.table = table
        if seen(table[:, :V.H_INFO], self.plain) != self.expected or not V.pairs_hold(table):
            _raise_flagged(op, lib, table)
            V.check_agreed(lib, op, table)             # (raises on every rank: the same table)
        return run_now(op, call, table, payload is not None and min(slots.rides.tolist()) >= 0, payload)


def _raise_flagged(op: Any, lib: LibComm, table: np.ndarray) -> None:
    """A peer's local error flagged in a compiled call's gathered headers: raised on every rank."""
    failure = flagged(lib, table, None, op.timeout, (op.NAME, None, AGREEMENT))
    if failure is not None:
        raise failure


def run_now(op: Any, call: Call, table: np.ndarray | None, rode: bool, payload: np.ndarray | None) -> Any:
    """A described (and, ``table``, agreed) call's data, moved at once by the operation's Runner:
    its landing where it ``rode`` its agreement, else its ``issue`` (its local work before it, unless
    its ``payload`` was read already), then its local work after."""
    runner = op._runner
    runner.taken = None
    if rode:
        op.land(call, Slots.rows_of(op._lib, table, call), table, runner)
    else:
        if payload is None and (call.src is not None or call.before):
            prologue(call)
        op.issue(call, table, runner)
    if call.after:
        epilogue(call)
    if _trace.ON:
        _trace.NOTE.path = "riding" if rode else runner.taken or "mpi"
    return call.result


def _fixed(v: Any) -> bool:
    """Whether a value argument cannot change in place (None, a number, a tuple of numbers)."""
    return v is None or isinstance(v, (int, float, np.number)) or \
        (type(v) is tuple and all(isinstance(x, (int, np.integer)) for x in v))


def _record(op: Any, call: Call, table: np.ndarray | None, slots: Slots | None, payload: np.ndarray | None,
            rode: bool) -> tuple[list[Step], list[Step], int, str]:
    """The steps of a compiled call: its agreement (``slots`` given: the row's payload copy and its
    ``Allgather``) and its data (its landing where it ``rode``, else its ``issue``, with its local
    work around); and the path its data takes (what ``issue`` said: ``go.took``; else ``mpi``)."""
    agree = Recorder(counts=False)
    agree.begin(op.NAME, op._comms)
    if slots is not None:
        if payload is not None:
            for step in ([(np.copyto, call.x, call.src)] if call.src is not None else []) + list(call.before):
                agree.local(*step)
            size = payload.nbytes
            agree.local(operator.setitem, slots.payload[:size], Ellipsis, payload.reshape(-1).view(np.uint8))
        agree.mpi(op._lib, "Allgather", [slots.send, MPI.INT64_T], [slots.table, MPI.INT64_T])
    data = Recorder(counts=False)
    data.begin(op.NAME, op._comms)
    if rode:
        op.land(call, Slots.rows_of(op._lib, table, call), table, data)
    else:
        if payload is None:                   # (else it ran before the payload was read)
            if call.src is not None:
                data.local(np.copyto, call.x, call.src)
            for step in call.before:
                data.local(*step)
        op.issue(call, table, data)
    for step in call.after:
        data.local(*step)
    data.end(call.result)
    return agree.steps, data.steps, data.tokens, "riding" if rode else data.taken or "mpi"
