"""The torch backend's views: a numpy array on a CPU tensor's own memory (no copy), as mpicoll's
calls take them (mpicoll.torch). bfloat16 through a 16-bit view; a complex tensor through its real
view (``torch.view_as_real``: its real and imaginary parts side by side, the last dimension 2), so
every call that only moves data takes it, and SUM and AVG reduce it part by part, as gloo does; a
tensor without a view (another device, sparse, strided where a call needs it contiguous, a conj or
neg view, a complex tensor given a PRODUCT, MIN or MAX) is a ``CollectiveArgumentError`` naming the
call, the tensor and the rank.
"""
from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import torch
import torch.distributed as dist
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ._errors import arg_error

__all__ = ["array", "arrays", "one"]

#: the reduce ops a complex tensor takes (its parts apart: a complex SUM is the SUMs of its parts)
COMPLEX_OPS = (dist.ReduceOp.RedOpType.SUM, dist.ReduceOp.RedOpType.AVG)


#: numpy views of small tensors by (address, dtype, shape, strides): a call that comes back with the same tensor
#: passes mpicoll the same array, which it can replay as a recorded plan (docs/plans.md) instead of
#: describing a fresh view. An entry keeps its tensor, so its memory cannot be reused while cached,
#: and is used only while that tensor still has that address (a resize_ gives it other memory).
_VIEWS: dict[tuple, tuple] = {}
_VIEWS_MAX, _VIEW_BYTES = 64, 1 << 16
#: the dtypes a view takes as another: torch dtype -> (the torch dtype numpy takes its memory as, the
#: numpy dtype the view is then retyped to, or None)
_RETYPED = {torch.bfloat16: (torch.int16, ml_dtypes.bfloat16)}
#: torch dtype -> (the numpy type string of its memory, as numpy() gives it; _RETYPED's retype or None)
_TYPESTRS: dict[torch.dtype, tuple[str, Any]] = {}


class _Memory:
    """A tensor's memory as numpy takes it (``__array_interface__``); it holds the tensor, so the
    view keeps it alive. ``Tensor.numpy()`` would mark the storage not resizable for good, where
    gloo's C++ access leaves it be: FSDP frees a gathered parameter by resizing its storage to 0."""
    __slots__ = ("__array_interface__", "tensor")

    def __init__(self, t: torch.Tensor, typestr: str) -> None:
        self.tensor = t
        self.__array_interface__ = {"data": (t.data_ptr(), False), "shape": tuple(t.shape), "typestr": typestr,
                                    "strides": tuple(k * t.element_size() for k in t.stride()), "version": 3}


def _typestr(dtype: torch.dtype) -> tuple[str, Any]:
    """The numpy type string of a view of ``dtype`` tensors, and the dtype it is retyped to (None:
    none); TypeError/RuntimeError: no view."""
    found = _TYPESTRS.get(dtype)
    if found is None:
        wire, retype = _RETYPED.get(dtype, (dtype, None))
        found = _TYPESTRS[dtype] = (torch.empty(0, dtype=wire).numpy().dtype.str, retype)
    return found


def array(t: torch.Tensor | list, call: str, rank: int, strided: bool = False, op: Any = None) -> np.ndarray:
    """A numpy view of the CPU tensor ``t``, or of the one tensor of torch's list ``t`` (:func:`one`)
    (shares its memory; bfloat16 via int16, complex via its real view). ``strided``: a strided tensor
    is fine (an element of a list, which mpicoll copies to or from); ``op``: the call's reduce op
    (torch's ``RedOpType``), if it reduces. Every tensor it cannot view is a
    ``CollectiveArgumentError`` (agreed by the call, as any)."""
    if type(t) is list or type(t) is tuple:
        t = t[0] if len(t) == 1 else one(t, call, rank)
    if type(t) is not torch.Tensor and is_traceable_wrapper_subclass(t):
        t = unwrapped(t, call, rank)
    if not t.is_cpu:
        raise arg_error(call, "tensor", str(t.device), rank, "the mpicoll backend takes CPU tensors")
    if t.layout != torch.strided:
        raise arg_error(call, "tensor", str(t.layout), rank, "must be dense (torch.strided): the mpicoll backend "
                        "takes sparse tensors in all_reduce only")
    if not strided and not t.is_contiguous():
        raise arg_error(call, "tensor", f"strided {tuple(t.shape)} (strides {t.stride()})", rank,
                        "must be contiguous: pass t.contiguous() (and copy the result back if the call writes it)")
    if t.is_conj() or t.is_neg():                    # (before the cache: such a view shares its key)
        what = "conj" if t.is_conj() else "neg"
        raise arg_error(call, "tensor", f"a {what}-bit view", rank, f"pass t.resolve_{what}()")
    if t.is_complex():
        if op is not None and op not in COMPLEX_OPS:
            raise arg_error(call, "op", op.name, rank, f"a complex tensor ({t.dtype}) is reduced with SUM or AVG "
                            "only (part by part, as gloo does)")
        t = torch.view_as_real(t)
    key = (t.data_ptr(), t.dtype, t.shape, t.stride())
    seen = _VIEWS.get(key)
    if seen is not None and seen[0].data_ptr() == key[0]:   # (its tensor still owns that memory)
        return seen[1]
    held, span = t.untyped_storage().nbytes(), 0
    if t.numel():                                     # (the bytes the view reaches, from the storage's start)
        span = (t.storage_offset() + 1 + sum((n - 1) * k for n, k in zip(t.shape, t.stride()))) * t.element_size()
    if held < span:
        raise arg_error(call, "tensor", f"a storage of {held} bytes", rank, f"must hold the tensor's {span} bytes "
                        "(was it freed or resized to less?)")
    try:
        typestr, retype = _typestr(t.dtype)
        view = np.asarray(_Memory(t, typestr)) if t.numel() else np.empty(tuple(t.shape), typestr)
    except (TypeError, RuntimeError, ValueError) as exc:     # (a dtype numpy lacks, ...)
        raise arg_error(call, "tensor", str(t.dtype), rank, f"has no numpy view ({exc})") from None
    if retype is not None:
        view = view.view(retype)
    if held <= _VIEW_BYTES and view.flags.c_contiguous:     # (its whole memory small: an entry keeps it alive)
        _VIEWS[key] = (t, view)
        if len(_VIEWS) > _VIEWS_MAX:
            _VIEWS.pop(next(iter(_VIEWS)))
    return view


def unwrapped(t: torch.Tensor, call: str, rank: int) -> torch.Tensor:
    """The plain tensor behind a wrapper subclass, which torch hands a Python ProcessGroup as it is
    (gloo's C++ route gets it unwrapped by torch's dispatcher): an ``AsyncCollectiveTensor`` (what
    functional collectives and a redistributed DTensor's ``to_local()`` give) waits and is its
    result; another (a DTensor) has no memory of its own."""
    if isinstance(t, AsyncCollectiveTensor):
        return t.trigger_wait()
    raise arg_error(call, "tensor", type(t).__name__, rank, "is a tensor subclass without memory of its own: "
                    "pass a plain tensor (a DTensor's to_local())")


def arrays(ts, call: str, rank: int) -> list[np.ndarray]:
    """Views of a list's tensors (strided ones too)."""
    return [array(t, call, rank, strided=True) for t in ts]


def one(tensors, call: str, rank: int) -> torch.Tensor:
    """The one tensor of torch's list (one device per process)."""
    if len(tensors) != 1:
        raise arg_error(call, "tensors", f"{len(tensors)} tensors", rank,
                        "the mpicoll backend takes one tensor per call (one device per process)")
    return tensors[0]
