"""mpicoll as a torch.distributed backend (docs/torch.md).

    import torch.distributed as dist
    import mpicoll.torch                                      # registers "mpicoll" and mpi://
    dist.init_process_group("mpicoll", init_method="mpi://")  # rank and world size from MPI

Importing this module registers the backend ``"mpicoll"`` for CPU tensors and the init method
``mpi://`` (rank and world size are MPI's; the store is a TCPStore on world rank 0 whose address
MPI hands to the others, so that store-based groups, gloo's, can join the job). Each process-group
call maps onto :mod:`mpicoll.functional` on numpy views of the tensors (no copies; bfloat16 through
a 16-bit view), so it takes mpicoll's one call path: described, agreed across
the ranks (a mismatch raises the same ``CollectiveError`` on every rank, through torch), issued.
A group of ``dist.new_group(ranks)`` is an mpicoll comm domain of those world ranks. Collectives
run to completion before they return: the ``Work`` torch hands back is complete, its future set
(``async_op=True`` is accepted and changes nothing); point-to-point messages are started and
completed by ``wait()``. A tensor or a reduce op the backend cannot take raises
``CollectiveArgumentError`` through the call's agreement, on every rank of the group.

The backend is a subclass of torch's c10d ``Backend`` (torch wraps it in a ``ProcessGroup``,
names it, routes every CPU call of it to the backend, and wraps it for
``TORCH_DISTRIBUTED_DEBUG=DETAIL``). torch before 2.14 binds no constructor for a Python
``Backend``: there the same class derives from ``ProcessGroup`` (:data:`_BASE`) and also answers
what torch's own ProcessGroup would: its name (``group_name``, how torch's C++ callers find a
group) and its device (``_device_types``); and it unwraps a functional collective's result, which
torch's dispatcher unwraps from 2.14 (:func:`_unwrapped`).
"""
from __future__ import annotations

import os
import time
import urllib.parse
from datetime import timedelta
from typing import Any, Callable

import ml_dtypes
import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI
from torch._C._distributed_c10d import Backend as _C10dBackend
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.constants import default_pg_timeout
from torch.distributed.rendezvous import register_rendezvous_handler
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from . import functional as F
from ._domains import user_comm, world as lib_world
from ._rendezvous import create, rendezvous
from ._errors import CollectiveError, CollectiveTimeout, arg_error
from ._torch_store import LocalStore, agree_problem, exchange, shared_store

__all__ = ["BACKEND", "ProcessGroupMpicoll"]

#: the name to give ``init_process_group`` / ``new_group``
BACKEND = "mpicoll"

#: opts of an all_reduce called without them (torch's C++ callers pass theirs)
_DEFAULT_ALLREDUCE = dist.AllreduceOptions()
#: the tag of monitored_barrier's messages (MPI's largest): a user's tags stay below it
_MONITOR_TAG = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)


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


def _array(t: torch.Tensor, call: str, rank: int, strided: bool = False) -> np.ndarray:
    """A numpy view of the CPU tensor ``t`` (shares its memory; bfloat16 via int16).
    ``strided``: a strided tensor is fine (an element of a list, which mpicoll copies to or from).
    Every tensor it cannot view is a ``CollectiveArgumentError`` (agreed by the call, as any)."""
    if type(t) is not torch.Tensor and is_traceable_wrapper_subclass(t):
        t = _unwrapped(t, call, rank)
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


def _unwrapped(t: torch.Tensor, call: str, rank: int) -> torch.Tensor:
    """The plain tensor behind a wrapper subclass, which torch 2.13 hands a ProcessGroup subclass as
    it is (gloo's C++ route, and this backend's from torch 2.14, get it unwrapped by torch's
    dispatcher): an ``AsyncCollectiveTensor`` (what functional collectives and a redistributed
    DTensor's ``to_local()`` give) waits and is its result; another (a DTensor) has no memory of its own."""
    if isinstance(t, AsyncCollectiveTensor):
        return t.trigger_wait()
    raise arg_error(call, "tensor", type(t).__name__, rank, "is a tensor subclass without memory of its own: "
                    "pass a plain tensor (a DTensor's to_local())")


def _arrays(ts, call: str, rank: int) -> list[np.ndarray]:
    """Views of a list's tensors (strided ones too)."""
    return [_array(t, call, rank, strided=True) for t in ts]


def _one(tensors, call: str, rank: int) -> torch.Tensor:
    if len(tensors) != 1:
        raise arg_error(call, "tensors", f"{len(tensors)} tensors", rank,
                        "the mpicoll backend takes one tensor per call (one device per process)")
    return tensors[0]


class _Done(dist.Work):
    """A finished call's ``Work``: complete, its future holding ``result`` (made when asked for: a
    Python Work costs a third of a future-wrapping one, and most are only waited on)."""

    def __init__(self, result: Any) -> None:
        super().__init__()
        self._result = result

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def result(self) -> Any:
        return self._result

    def get_future(self) -> torch.futures.Future:
        return _future(self._result)


def _future(result: Any) -> torch.futures.Future:
    """A completed future holding ``result``."""
    fut = torch.futures.Future()
    fut.set_result(result)
    return fut


class _MessageWork(dist.Work):
    """A point-to-point message in flight (mpicoll.functional's Work): ``wait()`` completes it."""

    def __init__(self, work: F.Work, tensors: list, call: str) -> None:
        super().__init__()
        self._work, self._tensors, self._call = work, tensors, call

    def wait(self, timeout: Any = None) -> bool:
        """Complete the message; with a ``timeout`` (a timedelta or seconds; 0: none, torch's
        default) a RuntimeError after that long, the message still posted (a later ``wait()``
        completes it)."""
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout or 0)
        if seconds > 0:
            _wait_until(self._work, time.monotonic() + seconds, cancel=False, why=lambda: (
                f"{self._call}: the message did not complete within wait(timeout={seconds:g} s)"))
        return self._work.wait()

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def is_success(self) -> bool:
        return self._work.is_completed()

    def _source_rank(self) -> int:                     # (torch's recv with src=None reads it)
        return F.source(self._work)

    def source_rank(self) -> int:
        return F.source(self._work)

    def result(self) -> list:
        return self._tensors

    def get_future(self) -> torch.futures.Future:
        self._work.wait()
        return _future(self._tensors)


def _base() -> type:
    """torch's c10d ``Backend`` where Python can subclass it (torch >= 2.14 binds its
    constructor), else its ``ProcessGroup``."""
    class Probe(_C10dBackend):
        pass
    try:
        Probe(0, 1)
    except TypeError:                       # ("No constructor defined!")
        return dist.ProcessGroup
    return _C10dBackend


#: the group's base class (see the module docstring)
_BASE = _base()


def _eager_under_compile(cls: type) -> type:
    """Wrap the group's methods torch calls (``torch.compiler.disable``, ~0.2 us a call): torch's C++
    side (DDP's reducer, a compiled graph's collectives) calls them while torch.compile runs, and
    dynamo must run them as they are, not trace into a group it sees as an opaque object (a hard
    ``InternalTorchDynamoError`` for a compiled DDP model otherwise)."""
    for name, fn in list(vars(cls).items()):
        if callable(fn) and (not name.startswith("_") or name in ("_allgather_base", "_reduce_scatter_base")):
            setattr(cls, name, torch.compiler.disable(fn))
    return cls


@_eager_under_compile
class ProcessGroupMpicoll(_BASE):
    """A torch.distributed process group on mpicoll (one per torch group; world ranks ``ranks``)."""

    # what the group supports beyond the calls below: nothing (torch 2.14 reads these of a Python
    # Backend as attributes: left to the base class, reading one recurses without end)
    supports_splitting = supports_coalescing = supports_time_estimate = supports_shrinking = False
    supports_reconfigure = supports_window = False

    def supports_tensor_alloc(self, device: Any) -> bool:    # (FSDP2 asks the group's backend for a buffer)
        return False

    def __init__(self, rank: int, size: int, ranks: list[int], comm: MPI.Comm,
                 timeout: timedelta | None = None) -> None:
        super().__init__(rank, size)
        self._rank, self._size, self._ranks = rank, size, list(ranks)
        self._group = comm                  # the mpicoll group: the group's own communicator (_create)
        self._timeout = timeout or default_pg_timeout
        self._name, self._desc = "", ""
        self._barriers = 0                  # monitored_barrier calls so far (their tokens carry it)

    # --------------------------------------------------------------- what torch asks of a group
    def getBackendName(self) -> str:  # noqa: N802 - torch's names
        return BACKEND

    def getRank(self) -> int:  # noqa: N802
        return self._rank

    def getSize(self) -> int:  # noqa: N802
        return self._size

    def setGroupName(self, name: str) -> None:  # noqa: N802 - torch's C++ callers find a group by it
        self._name = name

    def getGroupName(self) -> str:  # noqa: N802
        return self._name

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._desc = desc

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._desc

    # torch 2.13's ProcessGroup answers these two from the backends registered with it, and a Python
    # ProcessGroup has none: FSDP's state dicts, DCP's async_save and broadcast_from_rank0 ask a group
    # for its device. (From torch 2.14 the ProcessGroup wrapping this Backend answers them.)
    @property
    def _device_types(self) -> list[torch.device]:
        return [torch.device("cpu")]

    def _get_backend(self, device: Any) -> Any:
        kind = torch.device(device).type
        if kind != "cpu":
            raise RuntimeError(f"No backend type associated with device type {kind}")
        return self

    def _set_sequence_number_for_group(self) -> None:
        """(torch's start of a group's count of collectives: mpicoll keeps its own)"""

    def _get_sequence_number_for_group(self) -> int:
        """0: ``TORCH_DISTRIBUTED_DEBUG=DETAIL``'s wrapper compares it across ranks with each call's
        op and shapes; mpicoll's agreement already checks that the ranks make the same call in
        the same place of their sequence (validation on)."""
        return 0

    def __repr__(self) -> str:
        return (f"ProcessGroupMpicoll(rank={self._rank}, size={self._size}, world ranks={self._ranks}, "
                f"name={self._name!r})")

    # --------------------------------------------------------------- collectives
    def _args(self, call: str, n: int, build: Callable[[], tuple]) -> tuple:
        """``build()``: the call's arguments mapped to numpy (views) and mpicoll's names. A mapping
        that fails on this rank (a tensor or a reduce op the backend cannot take) gives the error
        in place of the first argument and None for the other ``n - 1``: the call then raises it
        through its agreement, on every rank of the group, so that no peer waits."""
        try:
            return build()
        except CollectiveError as exc:
            return (exc,) + (None,) * (n - 1)

    def allreduce(self, tensors, opts=None):
        red = (opts or _DEFAULT_ALLREDUCE).reduceOp.op
        call, r = "all_reduce", self._rank
        if len(tensors) == 1 and tensors[0].is_sparse:
            return self._sparse_allreduce(tensors[0], red)
        x, = self._args(call, 1, lambda: (_array(_one(tensors, call, r), call, r),))
        F.all_reduce(x, red, self._group)
        return _Done(tensors)

    def _sparse_allreduce(self, t: torch.Tensor, op: Any) -> Any:
        """A sparse COO tensor's SUM, as gloo makes it: every rank's indices and values gathered
        (two uneven AllGathers after one of the counts), summed by ``coalesce``; the result
        replaces ``t``'s contents."""
        call, r = "all_reduce", self._rank
        c = t.coalesce()
        indices = c.indices().t().contiguous()                    # (nnz, sparse dims)
        values = c.values().contiguous()                          # (nnz, *dense dims)
        counts = torch.empty(self._size, dtype=torch.int64)

        def check():                        # (a bad op on one rank: raised by the first gather, everywhere)
            if op != dist.ReduceOp.RedOpType.SUM:
                raise arg_error(call, "op", str(op), r, "a sparse tensor is reduced with SUM only")
            return (_array(counts, call, r),)
        out, = self._args(call, 1, check)
        F.all_gather_into_tensor(out, np.array([indices.shape[0]], np.int64), self._group)
        n = counts.tolist()
        all_indices = torch.empty((sum(n), indices.shape[1]), dtype=indices.dtype)
        all_values = torch.empty((sum(n), *values.shape[1:]), dtype=values.dtype)
        F.all_gather_into_tensor_uneven(_array(all_indices, call, r), _array(indices, call, r), n, self._group)
        F.all_gather_into_tensor_uneven(_array(all_values, call, r), _array(values, call, r), n, self._group)
        total = torch.sparse_coo_tensor(all_indices.t(), all_values, t.shape).coalesce()
        with torch.no_grad():
            t.copy_(total)
        return _Done([t])

    def broadcast(self, tensors, opts=None):
        opts = opts or dist.BroadcastOptions()
        call, r = "broadcast", self._rank
        x, = self._args(call, 1, lambda: (_array(_one(tensors, call, r), call, r),))
        F.broadcast(x, group=self._group, group_src=opts.rootRank)
        return _Done(tensors)

    def reduce(self, tensors, opts=None):
        opts = opts or dist.ReduceOptions()
        call, r, red = "reduce", self._rank, opts.reduceOp.op
        x, = self._args(call, 1, lambda: (_array(_one(tensors, call, r), call, r),))
        F.reduce(x, op=red, group=self._group, group_dst=opts.rootRank)
        return _Done(tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        call, r = "all_gather", self._rank
        x, outs = self._args(call, 2, lambda: (_array(_one(input_tensors, call, r), call, r),
                                               _arrays(_one(output_tensors, call, r), call, r)))
        F.all_gather(outs, x, group=self._group)
        return _Done(output_tensors)

    def _allgather_base(self, output, input, opts=None):  # noqa: A002 - torch's names
        call, r = "all_gather_into_tensor", self._rank
        x, out = self._args(call, 2, lambda: (_array(input, call, r), _array(output, call, r)))
        F.all_gather_into_tensor(out, x, group=self._group)
        return _Done([output])

    all_gather_single = _allgather_base

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        # torch's all_gather_coalesced (output_lists[rank][k] gets that rank's input_list[k]): one
        # all_gather per input, in order
        for k, x in enumerate(input_list):
            self.allgather([[outs[k] for outs in output_lists]], [x], opts)
        return _Done(output_lists)

    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.GatherOptions()
        call, r = "gather", self._rank
        root = r == opts.rootRank
        x, outs = self._args(call, 2, lambda: (_array(_one(input_tensors, call, r), call, r),
                                               _arrays(_one(output_tensors, call, r), call, r) if root else None))
        F.gather(x, outs, group=self._group, group_dst=opts.rootRank)
        return _Done(output_tensors)

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.ScatterOptions()
        call, r = "scatter", self._rank
        root = r == opts.rootRank
        x, ins = self._args(call, 2, lambda: (_array(_one(output_tensors, call, r), call, r),
                                              _arrays(_one(input_tensors, call, r), call, r) if root else None))
        F.scatter(x, ins, group=self._group, group_src=opts.rootRank)
        return _Done(output_tensors)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        call, r, red = "reduce_scatter", self._rank, opts.reduceOp.op
        out, ins = self._args(call, 2, lambda: (_array(_one(output_tensors, call, r), call, r),
                                                _arrays(_one(input_tensors, call, r), call, r)))
        F.reduce_scatter(out, ins, red, self._group)
        return _Done(output_tensors)

    def _reduce_scatter_base(self, output, input, opts=None):  # noqa: A002
        opts = opts or dist.ReduceScatterOptions()
        call, r, red = "reduce_scatter_tensor", self._rank, opts.reduceOp.op
        out, x = self._args(call, 2, lambda: (_array(output, call, r), _array(input, call, r)))
        F.reduce_scatter_tensor(out, x, red, self._group)
        return _Done([output])

    reduce_scatter_single = _reduce_scatter_base

    def alltoall(self, output_tensors, input_tensors, opts=None):
        call, r = "all_to_all", self._rank
        outs, ins = self._args(call, 2, lambda: (_arrays(output_tensors, call, r), _arrays(input_tensors, call, r)))
        F.all_to_all(outs, ins, group=self._group)
        return _Done(output_tensors)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):  # noqa: A002
        call, r = "all_to_all_single", self._rank
        out, x = self._args(call, 2, lambda: (_array(output, call, r), _array(input, call, r)))
        F.all_to_all_single(out, x, list(output_split_sizes) or None, list(input_split_sizes) or None,
                            group=self._group)
        return _Done([output])

    all_to_all_single = alltoall_base

    def barrier(self, opts=None):
        F.barrier(group=self._group)
        return _Done([])

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        """gloo's ``monitored_barrier``: ``dist.monitored_barrier()`` from torch 2.14 (before, torch
        refuses every backend but gloo by name: call it on the group, ``dist.group.WORLD.monitored_barrier()``).
        Group rank 0 waits up to ``timeout`` (default: the group's; torch passes its
        ``BarrierOptions``) for a message from every other rank, then answers each; a rank that did
        not come is named in the ``RuntimeError`` rank 0 raises (all of them with
        ``wait_all_ranks``); the ranks that came then time out too."""
        if isinstance(timeout, dist.BarrierOptions):
            timeout = timeout.timeout
        timeout = self._timeout if timeout is None else timeout
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
        deadline = time.monotonic() + seconds
        self._barriers += 1
        serial, call = self._barriers, "monitored_barrier"
        other: dict[int, int] = {}              # group rank -> the call number of the last token it dropped

        def receive(p: int, why: Callable[[], str]) -> None:
            """A token of this barrier from group rank ``p`` (one of an earlier, failed barrier that
            came late is dropped)."""
            token = torch.zeros(1, dtype=torch.int64)
            while int(token) != serial:
                if int(token):
                    other[p] = int(token)
                _wait_until(F.irecv(_array(token, call, self._rank), group=self._group, tag=_MONITOR_TAG,
                                    group_src=p), deadline, why)

        def step(ps: list[int]) -> str:
            """Why ranks ``ps`` seem absent when they came to another call: the ranks are out of step."""
            seen = [p for p in ps if p in other]
            return "" if not seen else (
                f" (rank {seen[0]} is behind: it sent the token of its monitored_barrier call {other[seen[0]]}, "
                f"this is call {serial} on rank 0; if a rank skipped a call, the ranks are out of step: use a new "
                "group)")

        token = torch.full((1,), serial, dtype=torch.int64)
        if self._rank != 0:
            F.send(_array(token, call, self._rank), group=self._group, tag=_MONITOR_TAG, group_dst=0)
            receive(0, lambda: f"monitored_barrier: rank {self._rank} waited {seconds:g} s for rank 0 to answer: "
                               "some rank did not reach monitored_barrier")
            return
        missing = []
        for p in range(1, self._size):
            try:
                receive(p, lambda p=p: f"monitored_barrier: rank {p} (world rank {self._ranks[p]}) did not reach it "
                                       f"within {seconds:g} s{step([p])}")
            except RuntimeError as exc:
                if not wait_all_ranks:
                    raise
                missing.append((p, exc))
        if missing:
            raise RuntimeError(f"monitored_barrier: ranks {[p for p, _ in missing]} (world ranks "
                               f"{[self._ranks[p] for p, _ in missing]}) did not reach it within {seconds:g} s"
                               f"{step([p for p, _ in missing])}")
        for p in range(1, self._size):
            F.send(_array(token, call, 0), group=self._group, tag=_MONITOR_TAG, group_dst=p)

    # torch's coalescing manager hands over the calls it gathered: they run one after the other
    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts or dist.AllreduceCoalescedOptions()
        for t in tensors:
            self.allreduce([t], opts)
        return _Done(tensors)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        for out, x in zip(outputs, inputs):
            self._allgather_base(out, x, opts)
        return _Done(outputs)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        for out, x in zip(outputs, inputs):
            self._reduce_scatter_base(out, x, opts)
        return _Done(outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # --------------------------------------------------------------- point-to-point
    def _message(self, fn: Callable, call: str, tensors, peer: int | None, tag: int) -> _MessageWork:
        r = self._rank
        t = _one(tensors, call, r)
        if not 0 <= tag < _MONITOR_TAG:
            raise arg_error(call, "tag", tag, r, f"must be in [0, {_MONITOR_TAG}) (MPI's TAG_UB is "
                            "monitored_barrier's)")
        peer_arg = {} if peer is None else {"group_" + ("dst" if call == "send" else "src"): peer}
        return _MessageWork(fn(_array(t, call, r), group=self._group, tag=tag, **peer_arg), tensors, call)

    def send(self, tensors, dstRank, tag):  # noqa: N803 - torch's names
        return self._message(F.isend, "send", tensors, dstRank, tag)

    def recv(self, tensors, srcRank, tag):  # noqa: N803
        return self._message(F.irecv, "recv", tensors, srcRank, tag)

    def recv_anysource(self, tensors, tag):
        return self._message(F.irecv, "recv", tensors, None, tag)


def _wait_until(work: F.Work, deadline: float, why: Callable[[], str], cancel: bool = True) -> None:
    """Poll the message ``work`` until it completes or ``deadline`` passes (then RuntimeError:
    ``why()``; a receive of monitored_barrier's is ``cancel``led: a late token must not land in a
    later barrier's buffer)."""
    pause = 1e-5
    while not work.is_completed():
        if time.monotonic() > deadline:
            if cancel:
                request = work._handle.req
                request.Cancel()
                request.Wait()
            raise RuntimeError(why())
        time.sleep(pause)
        pause = min(2 * pause, 1e-3)


# ----------------------------------------------------------------------------- start-up

def _launcher_size() -> tuple[str, int] | None:
    """``(variable, value)`` of a launcher's world size in the environment (torchrun's and
    torch's ``env://`` ``WORLD_SIZE``), or None."""
    value = os.environ.get("WORLD_SIZE")
    return None if value in (None, "") else ("WORLD_SIZE", int(value))


def _refuse_other_world(torch_size: int, where: str) -> None:
    """Raise at once, on every process, when torch's world is not MPI's: a job launched by
    torchrun (or any launcher but mpirun) runs each process as an MPI world of its own, and would
    otherwise train N separate worlds of 1."""
    mpi_size = MPI.COMM_WORLD.Get_size()
    launcher = _launcher_size()
    if torch_size != mpi_size or (launcher is not None and launcher[1] != mpi_size):
        given = f"{launcher[0]}={launcher[1]}" if launcher is not None and launcher[1] != mpi_size else \
            f"a world of {torch_size}"
        raise RuntimeError(f"the mpicoll backend ({where}): torch was given {given}, but this process's MPI world "
                           f"has {mpi_size} process(es): the processes were not started by one MPI launcher (torchrun "
                           f"starts MPI singletons, which MPI cannot join). Launch with "
                           f"`mpirun -np {max(torch_size, launcher[1] if launcher else 0)} python ...` instead")


def _world(limit: float):
    """mpicoll's world, made (if this is its first use) within ``init_process_group``'s timeout."""
    try:
        return lib_world(set_up=limit)
    except CollectiveTimeout as exc:
        raise CollectiveTimeout(f"init_process_group(timeout={limit:g} s): {exc}", param="timeout") from None


#: how many times init_process_group made the default group in this process (every rank alike)
_INITS = [0]
#: every group made: torch holds a Python backend by its C++ half only, and would otherwise lose the
#: Python half (its methods) when Python's last reference goes
_GROUPS: list[ProcessGroupMpicoll] = []


def _create(backend_opts, options) -> ProcessGroupMpicoll:
    """The creator torch calls for ``init_process_group("mpicoll")`` and ``new_group`` (extended API:
    ``backend_opts`` carries the group's rank, size, world ranks and timeout), on the group's
    members only.

    Each group gets a communicator of its own, made here by its members (``Comm.Create_group``,
    which involves nobody else), whose mpicoll duplicate carries the group's ``timeout`` as its
    watchdog timeout (raising the named ``CollectiveTimeout``; torch's default, 30 min, leaves the
    watchdog as ``MPICOLL_TIMEOUT`` says, unset: none, so that calls keep their direct path to
    MPI). So two groups never mix their messages, and a group's timeout is its own: it reaches
    neither other groups nor mpicoll calls made outside torch. torch gives a backend no hook at
    ``destroy_process_group`` (it shuts down NCCL's only), so a group's communicator stays until
    the process ends."""
    default = not backend_opts.global_ranks_in_group
    ranks = list(backend_opts.global_ranks_in_group) or list(range(backend_opts.group_size))
    mine = ranks[backend_opts.group_rank]
    timeout = backend_opts.timeout
    limit = timeout.total_seconds()         # (every start-up step waits for the members this long at most)
    call = "init_process_group(" if default else f"new_group(ranks={ranks}, "
    if default:
        _refuse_other_world(backend_opts.group_size, "init_process_group")
        # (torch's ranks against MPI's, on mpicoll's world: no communicator of the group exists yet)
        seen = np.empty(MPI.COMM_WORLD.Get_size(), dtype=np.int64)
        world = _world(limit)
        exchange(world.mpi, "Allgather", ([np.array([mine], np.int64), MPI.INT64_T], [seen, MPI.INT64_T]), limit,
                 "init_process_group: its ranks' check")
        wrong = [(w, t) for w, t in enumerate(seen.tolist()) if w != t]
        if wrong:
            raise ValueError(f"the mpicoll backend: torch's ranks must be MPI's, but world ranks "
                             f"{[w for w, _ in wrong]} have torch ranks {[t for _, t in wrong]} (init_method='mpi://' "
                             "takes them from MPI)")
    if ranks != sorted(ranks):
        raise ValueError(f"the mpicoll backend: new_group(ranks={ranks}, sort_ranks=False): a group's ranks follow "
                         "the world's order here (a comm domain); leave sort_ranks at True")
    # (the members meet on the group's name within the limit, then Create_group over them, as a comm
    # domain's members do: a member that never comes is a named timeout, not a wait for ever)
    if default:
        _INITS[0] += 1
    # (torch numbers its groups from 0 again after destroy_process_group: the count of inits makes
    # the name the members meet on a new one, the same on every member)
    name = f"torch group {backend_opts.group_id}" + (f" (init {_INITS[0]})" if _INITS[0] > 1 else "")
    members = rendezvous(name, len(ranks), tuple(ranks), (limit, f"{call}timeout={limit:g} s)"))
    comm = create(name, members)
    comm.Set_name(name)
    seconds = None if timeout == default_pg_timeout else limit
    seen = np.empty(len(ranks), dtype=np.float64)
    exchange(comm, "Allgather", ([np.array([np.nan if seconds is None else seconds]), MPI.DOUBLE],
                                 [seen, MPI.DOUBLE]), limit, f"{call}timeout=...): its check")
    if len(set(seen.tolist())) > 1 and not np.isnan(seen).all():
        comm.Free()                         # (every member raises here: every member frees it)
        raise ValueError(f"the mpicoll backend: {call}timeout=...) differs across its ranks: "
                         f"{['default' if np.isnan(s) else s for s in seen.tolist()]} s on "
                         f"world ranks {ranks}: give it alike everywhere")
    try:
        user_comm(comm, seconds, set_up=limit)  # mpicoll's duplicate, with the group's timeout (and the
    except CollectiveError:                 # settings checked: a refused one is every member's error)
        comm.Free()                         # (every member raises here: every member frees it)
        raise
    pg = ProcessGroupMpicoll(backend_opts.group_rank, backend_opts.group_size, ranks, comm, timeout)
    _GROUPS.append(pg)
    return pg


def _mpi_rendezvous(url: str, timeout: timedelta = default_pg_timeout, **kwargs):
    """``init_method="mpi://"``: MPI's rank and world size, and a TCPStore served by world rank 0
    whose address MPI gives the others (so that a store-based group, gloo's, can be made). torch
    passes a ``rank=``/``world_size=`` given to ``init_process_group`` in the URL's query (-1: not
    given); one that is not MPI's is refused, as is a launcher's WORLD_SIZE that is not MPI's."""
    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlparse(url).query))
    problem = None
    try:
        _refuse_other_world(size, "init_method='mpi://'")
        for key, mine in (("rank", rank), ("world_size", size)):
            given = query.get(key, kwargs.get(key, -1))
            if given not in (-1, "-1", None) and int(given) != mine:
                raise ValueError(f"init_process_group(init_method='mpi://', {key}={given}): MPI says {mine} on "
                                 f"world rank {rank}; leave {key} out (mpi:// takes it from MPI)")
    except (RuntimeError, ValueError) as exc:
        problem = exc
    # mpicoll's world, made within the timeout; every rank raises the first rank's problem, so that
    # none waits in the store's set-up
    limit = timeout.total_seconds()
    world = _world(limit)
    agree_problem(world, problem, limit, "init_process_group")
    store, why = shared_store(world, timeout)
    yield (store if store is not None else LocalStore(why)), rank, size


def _register() -> None:
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
    register_rendezvous_handler("mpi", _mpi_rendezvous)


_register()
