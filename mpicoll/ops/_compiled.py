"""Compiled calls: what the first call of a layout decides, kept; every later call of that layout
fills the slots and runs (docs/design.md, "Compiled calls").

A call's *layout* (:func:`layout`) is what does not change from one call to the next: each data
array's dtype, shape, strides and flags (not its identity, not its contents), which arguments are
the same array, and the values that describe the call (counts, split sizes: ``Operation.VALUES``) by
their contents; the operation (its params, communicator, validation) is the one that keeps it. An
operator whose values change with every call (``Operation.SLOTS``: AllToAllVV2's counts) keeps them
out of the layout: they are slots of its compiled call, described on every call
(:class:`ValueSlots`).

The first call of a layout is described, agreed (validation on, or the operation's first call) and
its steps recorded (``issue``, or ``land`` where its data rode the agreement): its compilation
(:func:`compile_call`). The steps are kept with every array of the call replaced by a *slot*: the
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
import types
from functools import partial
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from .. import _validate as V
from .. import _trace
from .._comm import LibComm
from .._shm import _Shared
from .._dtypes import DType, ReduceOp
from .._agreement import settle
from .._call import Call
from .._go import LOCAL, MPI_CALL, Recorder, Step, bind_steps
from ._agree import Slots
from ._observe import stamp

#: layouts an operation keeps compiled (the least recently compiled goes first)
COMPILED = 8
_SCALARS = (int, float, bool, str, type(None))
#: what ``repeat`` returns when the call is not the last one
MISS = object()
_AGREEMENT = "its header agreement (an internal MPI Allgather)"
#: how an array looks: what describe checks of it, and what may change in place (part of a layout;
#: what a repeat compares of the arrays it holds)
_LOOK = operator.attrgetter("dtype", "shape", "strides", "flags.num")


# ----------------------------------------------------------------------------- the layout

def layout(args: tuple, values: frozenset, slots: frozenset) -> tuple[tuple | None, list, list]:
    """``(key, arrays, looks)``: the layout of a call's arguments, its data arrays (each once, in
    the order found: the slots they fill) and how each looks (``_LOOK``: dtype, shape, strides,
    flags; part of the key). ``values``: the positions read by contents, ``slots``: the value
    positions left out (slot values). Key None: an argument it cannot tell apart (a list of
    numbers as data, an object): such a call is never compiled."""
    key: list = []
    arrays: list = []
    looks: list = []
    try:
        for i, a in enumerate(args):
            if type(a) is np.ndarray and i not in values:      # (the common case, inline)
                for k, b in enumerate(arrays):
                    if b is a:
                        key.append(k)                  # (the same array as an earlier argument: in place)
                        break
                else:
                    arrays.append(a)
                    look = _LOOK(a)
                    looks.append(look)
                    key.append(look)
            elif i in slots:
                key.append(a is None)
            elif i in values:
                key.append(_value(a))
            else:
                key.append(_data(a, arrays, looks))
    except TypeError:
        return None, arrays, looks
    if len(arrays) > 1:
        for a in arrays:
            if a.base is not None:
                key += _overlaps(arrays)
                break
    return tuple(key), arrays, looks


def _overlaps(arrays: list) -> list:
    """Which of a call's arrays (views among them) overlap, and where: part of its layout (an
    in-place form, ``out`` a block of ``x``, is another call than two arrays apart)."""
    found = []
    n = len(arrays)
    for i in range(n):
        a = arrays[i]
        for j in range(i + 1, n):
            b = arrays[j]
            if (a.base is not None or b.base is not None) and np.may_share_memory(a, b):
                found.append((i, j, _address(b) - _address(a)))
    return found


def _data(a: Any, arrays: list, looks: list) -> Any:
    t = type(a)
    if t is np.ndarray:
        for k, b in enumerate(arrays):
            if b is a:
                return k                       # (the same array as an earlier argument: in place)
        arrays.append(a)
        looks.append(_LOOK(a))
        return looks[-1]
    if t in _SCALARS:
        return (t, a)                          # (2, 2.0 and True are equal, not the same argument)
    if (t is list or t is tuple) and a and all(type(v) is np.ndarray or v is None for v in a):
        return (t, tuple([_data(v, arrays, looks) for v in a]))
    raise TypeError(t)                         # (a list of numbers is data: its contents are read)


def _value(a: Any) -> Any:
    """A value's contents, hashable and copied (a list or an array may change later)."""
    t = type(a)
    if t is np.ndarray:
        return (a.dtype, a.shape, a.tobytes())
    if t in _SCALARS:
        return (t, a)
    if (t is list or t is tuple) and all(type(v) is int for v in a):
        return tuple(a)
    if t is list or t is tuple:
        return tuple([_value(v) for v in a])
    v = np.asarray(a)                          # (a numpy scalar, a memoryview, ...)
    if v.dtype.hasobject:
        raise TypeError(t)
    return (v.dtype, v.shape, v.tobytes())


# ----------------------------------------------------------------------------- slots

class _Slot:
    """Slot ``k`` itself, in a recorded step."""

    __slots__ = ("k",)

    def __init__(self, k: int) -> None:
        self.k = k


class _View:
    """A view into slot ``k`` (C-contiguous), ``offset`` bytes in."""

    __slots__ = ("k", "offset", "shape", "strides", "dtype")

    def __init__(self, k: int, offset: int, a: np.ndarray) -> None:
        self.k, self.offset, self.shape, self.strides, self.dtype = k, offset, a.shape, a.strides, a.dtype

    def of(self, arrays: list) -> np.ndarray:
        return np.ndarray(self.shape, self.dtype, arrays[self.k], self.offset, self.strides)


class _Unfillable(Exception):
    """A recorded step holds a slot's memory where the slots cannot reach it (a closure, an
    object): the compiled call runs its repeats, and a call with other arrays compiles anew."""


#: objects a step may hold that hold no array of a call
_PLAIN = (int, float, bool, str, bytes, type(None), slice, type(Ellipsis), np.dtype, np.generic, MPI.Datatype,
          MPI.Op, type(MPI.IN_PLACE), LibComm, DType, ReduceOp, type, types.BuiltinFunctionType, np.ufunc,
          type(np.copyto), Slots, _Shared)


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _slotted(v: Any, slots: list) -> Any:
    """``v`` with every array of ``slots`` in it, and every view into one, a slot marker."""
    t = type(v)
    if t is np.ndarray:
        for k, s in enumerate(slots):
            if v is s:
                return _Slot(k)
        for k, s in enumerate(slots):
            if np.may_share_memory(v, s):
                offset = _address(v) - _address(s)
                if not (s.flags.c_contiguous and 0 <= offset and offset + v.nbytes <= s.nbytes):
                    raise _Unfillable(v)
                return _View(k, offset, v)
        return v
    if t is list:
        return [_slotted(w, slots) for w in v]
    if t is tuple:
        return tuple([_slotted(w, slots) for w in v])
    if t is partial:
        if _touches(v.args, slots) or _touches(tuple(v.keywords.values()), slots):
            raise _Unfillable(v)
        return v
    if isinstance(v, _PLAIN):
        return v
    if t is types.FunctionType:
        if v.__closure__ and _touches(tuple(c.cell_contents for c in v.__closure__), slots):
            raise _Unfillable(v)
        return v
    if t is types.MethodType and isinstance(v.__self__, _PLAIN):
        return v
    if t is memoryview and not any(np.may_share_memory(np.asarray(v), s) for s in slots):
        return v
    raise _Unfillable(v)                      # (an object whose arrays the slots cannot see)


def _touches(values: tuple, slots: list) -> bool:
    """Whether ``values`` hold (in arrays, lists, tuples) memory of a slot."""
    for v in values:
        if isinstance(v, np.ndarray):
            if any(np.may_share_memory(v, s) for s in slots):
                return True
        elif isinstance(v, (list, tuple)):
            if _touches(tuple(v), slots):
                return True
        elif not isinstance(v, _PLAIN) and not callable(v):
            return True
    return False


def _marked(v: Any) -> bool:
    t = type(v)
    if t is _Slot or t is _View:
        return True
    if t is list or t is tuple:
        return any(_marked(w) for w in v)
    return False


def _touched(steps: list[Step], result: Any, mine: list) -> bool:
    """Whether every array of ``mine`` is read or written by a step (or is the result)."""
    left = list(mine)

    def walk(v: Any) -> None:
        if type(v) is np.ndarray:
            left[:] = [a for a in left if not (a is v or np.may_share_memory(a, v))]
        elif isinstance(v, (list, tuple)):
            for w in v:
                walk(w)
        elif type(v) is partial:
            walk(v.args)
    for s in steps:
        if left:
            walk(s.args)
            walk(s.fn)
    walk(result)
    return not left


def _filled(v: Any, arrays: list) -> Any:
    t = type(v)
    if t is _Slot:
        return arrays[v.k]
    if t is _View:
        return v.of(arrays)
    if t is list:
        return [_filled(w, arrays) for w in v]
    if t is tuple:
        return tuple([_filled(w, arrays) for w in v])
    return v


class _Steps:
    """Recorded steps, bound once, and how a fill points them at other arrays: the slots' places
    in the lists the bound steps hold (``cells``: each overwritten in place), and the steps that
    hold a slot's array in their own arguments (``loose``: each bound again)."""

    __slots__ = ("go", "cells", "views", "loose", "timeout", "where", "tokens")

    def __init__(self, steps: list[Step], slots: list | None, arrays: list, timeout: float | None, where: list,
                 tokens: int) -> None:
        self.cells: list[tuple[list, int, int]] = []          # (a list, a place in it, the slot there)
        self.views: list[tuple[list, int, Any]] = []          # (a list, a place in it, what goes there)
        self.loose: list[tuple[int, Step]] = []
        self.timeout, self.where, self.tokens = timeout, where, tokens
        own = []
        for i, s in enumerate(steps):
            if slots is None:                   # (not fillable: bound to its compilation's arrays)
                own.append(s)
                continue
            fn = s.fn if s.fn is None else _slotted(s.fn, slots)
            marked = _slotted(s.args, slots)
            if any(type(a) is not list and _marked(a) for a in marked):
                if s.kind not in (LOCAL, MPI_CALL):         # (a started collective's token is shared)
                    raise _Unfillable(s)
                self.loose.append((i, Step(s.kind, s.comm, s.name, fn, marked, s.token, s.part)))
            args = tuple([self._held(a, arrays) if type(a) is list else _filled(a, arrays) for a in marked])
            own.append(Step(s.kind, s.comm, s.name, fn, args, s.token, s.part))
        self.go = list(bind_steps(own, timeout, where, tokens))

    def _held(self, marked: list, arrays: list) -> list:
        """A list of the bound steps' own, filled with ``arrays``; its slots' places are cells."""
        held = []
        for i, w in enumerate(marked):
            if type(w) is list:
                held.append(self._held(w, arrays))
                continue
            if type(w) is _Slot:
                self.cells.append((held, i, w.k))
            elif _marked(w):
                self.views.append((held, i, w))
            held.append(_filled(w, arrays))
        return held

    def fill(self, arrays: list) -> None:
        for held, i, k in self.cells:
            held[i] = arrays[k]
        for held, i, w in self.views:
            held[i] = _filled(w, arrays)
        if self.loose:
            go = self.go
            for i, s in self.loose:
                args = _filled(s.args, arrays)
                go[i] = partial(s.fn, *args) if s.kind == LOCAL else s.comm.bind(s.name, args, self.timeout,
                                                                                  self.where[s.part])


def _flat_shape(args: tuple, op: Any) -> list | None:
    """What :meth:`Compiled.similar` checks of each argument of a call whose arguments are arrays,
    None and scalars only (None: another call): None, a new array; an int, the same array as that
    earlier one; ``(type, value)``, None or a scalar as it was."""
    if op._VALUES_AT:
        return None
    shape, arrays = [], []
    for a in args:
        t = type(a)
        if t is np.ndarray:
            k = next((k for k, b in enumerate(arrays) if b is a), None)
            if k is None:
                arrays.append(a)
            shape.append(k)
        elif t in _SCALARS:
            shape.append((t, a))
        else:
            return None
    return shape


def _allocated(result: Any, mine: list) -> list[np.ndarray]:
    """The arrays a call's result holds that its describe allocated (the memory of none of the
    caller's ``mine``): new for every call."""
    found: list[np.ndarray] = []

    def walk(v: Any) -> None:
        if isinstance(v, np.ndarray):
            if any(np.may_share_memory(v, s) for s in mine):
                return
            root = v if v.base is None else v.base
            if isinstance(root, np.ndarray) and root.flags.c_contiguous and not any(root is f for f in found):
                found.append(root)
        elif isinstance(v, (list, tuple)):
            for w in v:
                walk(w)
    walk(result)
    return found


# ----------------------------------------------------------------------------- the compiled call

class Compiled:
    """One layout of one operation's calls, compiled (see the module docstring).

    Attributes:
        op, lib: the operation and the communicator it agrees and counts on.
        args: the arguments of the last call (held: their identities stay theirs), or None once a
            large call's were let go.
        result: what the last call returned.
    """

    __slots__ = ("op", "lib", "key", "args", "mine", "shapes", "allocs", "agree", "data", "result_t", "result",
                 "slots", "heads", "expected", "rode", "counting", "fillable", "repeats", "plain", "plain_run",
                 "agree_go", "data_go", "shape", "shapes_of", "overlaps", "path")

    def __init__(self, op: Any, lib: LibComm, key: tuple | None, args: tuple, mine: list, looks: list, call: Call,
                 table: np.ndarray | None, rode: bool, slots: Slots | None, payload: np.ndarray | None) -> None:
        self.op, self.lib, self.key, self.slots, self.rode = op, lib, key, slots, rode
        self.plain = lib.plain
        self.counting = op._counted(lib)
        self.plain_run = slots is None and not self.counting
        allocs = _allocated(call.result, mine)
        self.allocs = [(a.shape, a.dtype) for a in allocs]
        every = mine + allocs
        agree_steps, data_steps, tokens, self.path = _record(op, call, table, slots, payload, rode)
        self.heads = self.expected = None
        if slots is not None:
            self.heads = slots.table[:, :slots.header]
            self.expected = self._seen(self.heads)
            slots.send[V.H_TIME] = 0
        timeout = op.timeout
        where = [(op.NAME, None, _AGREEMENT)], [(op.NAME, None, "")]
        try:
            self.agree = _Steps(agree_steps, every, every, timeout, where[0], 0)
            self.data = _Steps(data_steps, every, every, timeout, where[1], tokens)
            self.result_t = _slotted(call.result, every)
            self.fillable = True
        except _Unfillable:
            self.agree = _Steps(agree_steps, None, every, timeout, where[0], 0)
            self.data = _Steps(data_steps, None, every, timeout, where[1], tokens)
            self.result_t, self.fillable = call.result, False
        self.agree_go, self.data_go = self.agree.go, self.data.go     # (lists a fill changes in place)
        self.shape, self.shapes_of, self.overlaps = _flat_shape(args, op), looks, None
        if any(a.base is not None for a in mine):
            self.overlaps = _overlaps(mine)
        # (an array of a list no step touches was read into a copy when the call was described, as
        # x given as a list of arrays is: such a call is described every time; a call that
        # allocates its output and cannot fill a new one neither)
        listed = [a for v in args if type(v) is list or type(v) is tuple for a in v if type(a) is np.ndarray]
        self.repeats = _touched(agree_steps + data_steps, call.result, listed) and (self.fillable or not allocs)
        self.result = call.result
        self.args, self.mine, self.shapes = args, mine, looks

    # -- filling ---------------------------------------------------------------------------------
    def _bind(self, arrays: list) -> None:
        """Point the steps at ``arrays`` (the caller's, then new outputs)."""
        self.agree.fill(arrays)
        self.data.fill(arrays)
        self.result = _filled(self.result_t, arrays)

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
                list(map(_LOOK, self.mine)) != self.shapes:        # (reshaped, restrided, retyped, made read-only)
            return MISS
        if self.allocs:                                # (a new output, every call)
            self._bind(self.mine + [np.empty(s, d) for s, d in self.allocs])
        if self.plain_run and not _trace.ON:           # (no agreement, nothing counted: its steps alone)
            for step in self.data_go:
                step()
            return self.result
        return self.run()

    def similar(self, args: tuple) -> Any:
        """Run with other arrays of its layout (MISS: not of it)."""
        found = self.of_layout(args)
        if found is None or not self.fill(args, *found):
            return MISS
        return self.run()

    def of_layout(self, args: tuple) -> tuple[list, list] | None:
        """``(arrays, looks)`` of a call of its layout (None: not of it), for a call whose arguments
        are arrays, None and scalars only (``shape``, found when it compiled): what :func:`layout`
        finds of them, checked in place, without building a key."""
        shape = self.shape
        if shape is None or len(args) != len(shape):
            return None
        arrays: list = []
        for a, want in zip(args, shape):
            if want is None:                           # (a new array)
                if type(a) is not np.ndarray:
                    return None
                for b in arrays:
                    if a is b:
                        return None
                arrays.append(a)
            elif type(want) is int:                    # (the same array as an earlier argument)
                if a is not arrays[want]:
                    return None
            elif type(a) is not want[0] or a != want[1]:   # (None or a scalar, as it was)
                return None
        looks = list(map(_LOOK, arrays))
        if looks != self.shapes_of or (self.overlaps is not None and _overlaps(arrays) != self.overlaps):
            return None
        return arrays, looks

    # -- running ---------------------------------------------------------------------------------
    def run(self) -> Any:
        """One call: its agreement (validated), its data, its result. The caller holds the
        communicator (``LibComm.busy``)."""
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
        for step in self.data_go:
            step()
        if _trace.ON:
            _trace.NOTE.path = self.path
        return self.result

    def _seen(self, heads: np.ndarray) -> bytes:
        """The gathered headers as compared: without the arrival times (a trace's), and without the
        sequence numbers, where they are kept (those are compared among themselves)."""
        h = heads.copy()
        h[:, V.H_TIME] = 0
        if not self.plain:
            seqs = h[:, V.H_SEQ].tolist()
            h[:, V.H_SEQ] = 0 if seqs.count(seqs[0]) == len(seqs) else -1
        return h.tobytes()

    def differs(self) -> Any:
        """The gathered headers are not those of the compilation: a peer's local error (raised on
        every rank), a mismatch (named, on every rank), or peers whose calls changed but still
        agree: this call then runs from the new table, and is compiled again with it."""
        op, lib, table = self.op, self.lib, self.slots.table
        if any(table[:, V.H_FLAG].tolist()):
            settle(lib, None, op.timeout, (op.NAME, None, "the exchange of an error (internal MPI Allgather/Allgatherv)"))
        V.check_agreed(lib, op.NAME, table, op.PAIR_NAMES)
        key, mine, looks = layout(self.args, op._VALUES_AT, op._SLOTS_AT)
        call = op.describe(*self.args)          # (it described the same layout before: no local error)
        payload = op._payload(call)
        rode = payload is not None and min(self.slots.rides.tolist()) >= 0
        c = Compiled(op, lib, key, self.args, mine, looks, call, table, rode, self.slots, payload)
        op._keep(c)
        return c.run_data()


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
