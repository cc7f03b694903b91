"""A call's layout and its slots (docs/design.md, "Compiled calls"): the key a compiled call is kept
under (:func:`layout`: each data array's look, which arguments are the same array or overlap, the
describing values by content), the markers that stand for the caller's arrays in recorded steps
(:func:`slotted`: a slot, or a view into one), and the steps with their slots filled per call
(:class:`Steps`). :mod:`._compiled` keeps and runs them."""
from __future__ import annotations

import operator
import types
from functools import partial
from typing import Any

import numpy as np
from mpi4py import MPI

from .._comm import LibComm
from .._shm import _Shared
from .._dtypes import DType, ReduceOp
from .._go import LOCAL, MPI_CALL, Step, bind_steps
from ._agree import Slots

_SCALARS = (int, float, bool, str, type(None))
#: how an array looks: what describe checks of it, and what may change in place (part of a layout;
#: what a repeat compares of the arrays it holds)
LOOK = operator.attrgetter("dtype", "shape", "strides", "flags.num")


# ----------------------------------------------------------------------------- the layout

def layout(args: tuple, values: frozenset, slots: frozenset) -> tuple[tuple | None, list, list]:
    """``(key, arrays, looks)``: the layout of a call's arguments, its data arrays (each once, in
    the order found: the slots they fill) and how each looks (``LOOK``: dtype, shape, strides,
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
                    look = LOOK(a)
                    looks.append(look)
                    key.append(look)
            elif i in slots:
                key.append(a is None)
            elif i in values:
                key.append(contents(a))
            else:
                key.append(_data(a, arrays, looks))
    except TypeError:
        return None, arrays, looks
    if len(arrays) > 1:
        for a in arrays:
            if a.base is not None:
                key += overlaps(arrays)
                break
    return tuple(key), arrays, looks


def overlaps(arrays: list) -> list:
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
        looks.append(LOOK(a))
        return looks[-1]
    if t in _SCALARS:
        return (t, a)                          # (2, 2.0 and True are equal, not the same argument)
    if (t is list or t is tuple) and a and all(type(v) is np.ndarray or v is None for v in a):
        return (t, tuple([_data(v, arrays, looks) for v in a]))
    raise TypeError(t)                         # (a list of numbers is data: its contents are read)


def contents(a: Any) -> Any:
    """A value's contents, hashable and copied (a list or an array may change later)."""
    t = type(a)
    if t is np.ndarray:
        return (a.dtype, a.shape, a.tobytes())
    if t in _SCALARS:
        return (t, a)
    if (t is list or t is tuple) and all(type(v) is int for v in a):
        return tuple(a)
    if t is list or t is tuple:
        return tuple([contents(v) for v in a])
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


class Unfillable(Exception):
    """A recorded step holds a slot's memory where the slots cannot reach it (a closure, an
    object): the compiled call runs its repeats, and a call with other arrays compiles anew."""


#: objects a step may hold that hold no array of a call
_PLAIN = (int, float, bool, str, bytes, type(None), slice, type(Ellipsis), np.dtype, np.generic, MPI.Datatype,
          MPI.Op, type(MPI.IN_PLACE), LibComm, DType, ReduceOp, type, types.BuiltinFunctionType, np.ufunc,
          type(np.copyto), Slots, _Shared)


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def slotted(v: Any, slots: list) -> Any:
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
                    raise Unfillable(v)
                return _View(k, offset, v)
        return v
    if t is list:
        return [slotted(w, slots) for w in v]
    if t is tuple:
        return tuple([slotted(w, slots) for w in v])
    if t is partial:
        if _touches(v.args, slots) or _touches(tuple(v.keywords.values()), slots):
            raise Unfillable(v)
        return v
    if isinstance(v, _PLAIN):
        return v
    if t is types.FunctionType:
        if v.__closure__ and _touches(tuple(c.cell_contents for c in v.__closure__), slots):
            raise Unfillable(v)
        return v
    if t is types.MethodType and isinstance(v.__self__, _PLAIN):
        return v
    if t is memoryview and not any(np.may_share_memory(np.asarray(v), s) for s in slots):
        return v
    raise Unfillable(v)                      # (an object whose arrays the slots cannot see)


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


def touched(steps: list[Step], result: Any, mine: list) -> bool:
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


def filled(v: Any, arrays: list) -> Any:
    t = type(v)
    if t is _Slot:
        return arrays[v.k]
    if t is _View:
        return v.of(arrays)
    if t is list:
        return [filled(w, arrays) for w in v]
    if t is tuple:
        return tuple([filled(w, arrays) for w in v])
    return v


class Steps:
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
            fn = s.fn if s.fn is None else slotted(s.fn, slots)
            marked = slotted(s.args, slots)
            if any(type(a) is not list and _marked(a) for a in marked):
                if s.kind not in (LOCAL, MPI_CALL):         # (a started collective's token is shared)
                    raise Unfillable(s)
                self.loose.append((i, Step(s.kind, s.comm, s.name, fn, marked, s.token, s.part)))
            args = tuple([self._held(a, arrays) if type(a) is list else filled(a, arrays) for a in marked])
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
            held.append(filled(w, arrays))
        return held

    def fill(self, arrays: list) -> None:
        for held, i, k in self.cells:
            held[i] = arrays[k]
        for held, i, w in self.views:
            held[i] = filled(w, arrays)
        if self.loose:
            go = self.go
            for i, s in self.loose:
                args = filled(s.args, arrays)
                go[i] = partial(s.fn, *args) if s.kind == LOCAL else s.comm.bind(s.name, args, self.timeout,
                                                                                  self.where[s.part])


def flat_shape(args: tuple, op: Any) -> list | None:
    """What :func:`of_layout` checks of each argument of a call whose arguments are arrays, None
    and scalars only (None: another call): None, a new array; an int, the same array as that
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


def of_layout(args: tuple, shape: list | None, looks_of: list, overlapping: list | None
              ) -> tuple[list, list] | None:
    """``(arrays, looks)`` of a call of a compiled call's layout (None: not of it), for a call whose
    arguments :func:`flat_shape` could tell apart (``shape``; ``looks_of``, its arrays' looks;
    ``overlapping``, where they overlap, or None): what :func:`layout` finds of them, checked in
    place, without building a key."""
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
    looks = list(map(LOOK, arrays))
    if looks != looks_of or (overlapping is not None and overlaps(arrays) != overlapping):
        return None
    return arrays, looks


def allocated(result: Any, mine: list) -> list[np.ndarray]:
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
