"""torch.distributed-style functional collectives on numpy arrays (docs/functional.md).

    from mpicoll import functional as dist
    dist.all_reduce(t)                                    # in place, on every rank
    work = dist.all_gather_into_tensor(out, t, async_op=True)
    ...                                                   # overlap
    work.wait()

The names, arguments and in-place semantics are torch.distributed's (``src``/``dst`` are world
ranks, ``group_src``/``group_dst`` group ranks; splits are along dim 0, None = even). ``group`` is
None (the world), a comm-domain name, a list of world ranks (declared as a domain once, as torch's
``new_group``; a rank outside it makes no call and gets None, as in torch) or an mpi4py communicator.

Every function is a call of an internal operation (one per function, named after it), on the one
call path: described with torch's rules and argument names, agreed across the ranks (errors are
``CollectiveError``s raised on every rank), issued by the primitive operator it adapts. Operations
are cached per (function, group, reduce op or root), at most ``MAX_CACHED``, least recently used
out first; and an operation runs a call as a recorded plan when the very same call comes back
(with validation on, once every rank has agreed the header it sent last time: docs/plans.md).
Inside :func:`mpicoll.graph.capture` every function is captured instead of run.
"""
from __future__ import annotations

from collections import OrderedDict
from datetime import timedelta
from typing import Any

import numpy as np
from mpi4py import MPI

from . import _validate as V
from ._domains import group_fields
from ._dtypes import REDUCE_RULE, reduce_op
from ._errors import CollectiveArgumentError, CollectiveError, CollectiveTimeout
from ._numeric import prefix
from ._plan import Call
from ._messages import post
from .ops._base import ASYNC, RUN, Operation
from .ops.allgather import AllGatherOperation, AllGatherVOperation
from .ops.allreduce import AllReduceOperation
from .ops.alltoall import AllToAllVV2Operation
from .ops.broadcast import BroadcastOperation
from .ops.gather import GatherOperation
from .ops.reduce import ReduceOperation
from .ops.reduce_scatter import ReduceScatterOperation, ReduceScatterVOperation
from .ops.scatter import ScatterOperation

__all__ = ["MAX_CACHED", "Work", "all_gather", "all_gather_into_tensor", "all_gather_into_tensor_uneven",
           "all_reduce", "all_to_all", "all_to_all_single", "barrier", "broadcast", "gather", "irecv", "isend",
           "recv", "reduce", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_tensor_uneven", "scatter",
           "send", "source"]

#: operations kept per (function, group, reduce op or root); the least recently used goes first
MAX_CACHED = 256


class Work:
    """A call made with ``async_op=True`` (torch's ``Work``): it runs on its communicator's worker
    thread while the caller goes on (:mod:`mpicoll._async`), or, captured into a graph, with the
    graph's replay.

    ``wait()`` blocks until the call has finished and raises its error (the same
    ``CollectiveError`` on every rank); ``is_completed()`` says whether it has finished, without
    blocking; ``exception()`` is its error, once finished; ``result()`` the list of output arrays.
    """

    __slots__ = ("_handle", "_outputs", "_name")

    def __init__(self, handle: Any, outputs: list, name: str) -> None:
        self._handle, self._outputs, self._name = handle, outputs, name

    def wait(self, timeout: Any = None) -> bool:
        """Block until the call has finished; True. ``timeout`` (seconds or a timedelta; None or 0:
        no limit): a :class:`CollectiveTimeout` once that long has passed with the call still
        running (it goes on: ``wait()`` again to complete it).

        Raises:
            CollectiveError: the call's own error (on every rank of the call, as a synchronous call).
        """
        seconds = wait_seconds(timeout)
        if not self._handle.wait(seconds):
            raise CollectiveTimeout(f"{self._name}: wait(timeout={seconds:g} s) timed out with the call still in "
                                    "flight (it goes on: wait() again to complete it)", op=self._name, param="timeout")
        return True

    def is_completed(self) -> bool:
        """Whether the call has finished (well, or with the error ``wait()`` raises)."""
        return self._handle.is_completed()

    def exception(self) -> BaseException | None:
        """The call's error once it has finished (None: it went well, or it is still running)."""
        return self._handle.exception()

    def result(self) -> list:
        """The call's output arrays."""
        return self._outputs

    def __repr__(self) -> str:
        return f"<Work {self._name} {'completed' if self.is_completed() else 'in flight'}>"


def wait_seconds(timeout: Any) -> float | None:
    """A ``wait(timeout)`` in seconds: a timedelta or a number; None, 0 or less: no limit."""
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
    return float(seconds) if seconds is not None and seconds > 0 else None


# ----------------------------------------------------------------------------- groups and the cache

_OPS: "OrderedDict[tuple, Operation]" = OrderedDict()
def _group(group: Any, fn: str) -> tuple[Any, dict] | None:
    """``(cache key, Param fields)`` of a group (:func:`~mpicoll._domains.group_fields`), or None
    when this rank is not in its list."""
    fields = group_fields(group, fn)
    if fields is None:
        return None
    # (a communicator: the cached operation keeps it alive, so its id stays its own)
    return ("comm", id(group)) if "comm" in fields else fields.get("comm_domain", ""), fields


def _op(cls: type, group: Any, fn: str, root: tuple | None = None, reduce: str | None = None) -> Operation | None:
    """The cached operation of ``cls`` on ``group`` (None: this rank is not in a list ``group``).
    ``root``: ``(name, world rank, group rank)`` of a rooted function's src/dst (one of the two
    ranks given, or neither: group rank 0); ``reduce``: its reduce op's name."""
    kind = type(group)
    if group is None or kind is str or kind is MPI.Intracomm:      # (the common cases: one dict lookup)
        key = (cls, ("comm", id(group)) if kind is MPI.Intracomm else group or "", root, reduce)
        op = _OPS.get(key)
        if op is not None:
            _OPS.move_to_end(key)
            return op
    g = _group(group, fn)
    if g is None:
        return None
    key = (cls, g[0], root, reduce)
    op = _OPS.get(key)
    if op is None:
        fields = {} if reduce is None else {"reduce_type": reduce}
        op = cls(cls.PARAM(**g[1], **fields))
        if root is not None:
            op._root_given = root
        _OPS[key] = op
        if len(_OPS) > MAX_CACHED:
            _OPS.popitem(last=False)
    else:
        _OPS.move_to_end(key)
    return op


class _Rooted:
    """A rooted function's root: the group rank of a world rank (torch's ``src``/``dst``) or a group
    rank (``group_src``/``group_dst``), set when the operation binds: a root outside the group is
    a Param error, raised on every rank by the first call."""

    _root_given: tuple = ("src", None, None)

    def _bind_param(self) -> None:
        name, world_root, group_root = self._root_given
        if group_root is None and world_root is not None:
            if world_root not in self._lib.world_ranks:
                raise V.arg_error(self.NAME, name, world_root, self.rank, f"must be a world rank in the group "
                                  f"({list(self._lib.world_ranks)})")
            group_root = self._lib.world_ranks.index(world_root)
        if group_root is not None:
            if isinstance(group_root, bool) or not isinstance(group_root, (int, np.integer)) or \
                    not 0 <= group_root < self.size:
                raise V.arg_error(self.NAME, f"group_{name}", group_root, self.rank, f"must be in [0, {self.size})")
            self.param.rank_root = int(group_root)
        super()._bind_param()


def _reduce_name(op: Any) -> str | None:
    """mpicoll's name of a reduce op as given (the reduce-op table's names, or an enum member
    with such a ``name``, as torch's ``ReduceOp.SUM``); None: not one."""
    try:
        return reduce_op(op if type(op) is str else getattr(op, "name", op)).name
    except CollectiveArgumentError:
        return None


#: ``_run``'s ``reduce`` for a function without a reduce op (None is a reduce op given, and refused)
_NO_OP = object()


def _run(cls: type, group: Any, args: tuple, async_op: bool, outputs: Any, root: tuple | None = None,
         reduce: Any = _NO_OP, failed: CollectiveError | None = None) -> Work | None:
    """Run (or start, or, inside a capture, capture) one call of the function ``cls`` adapts;
    torch's return value. ``root``: a rooted function's ``(name, src/dst, group_src/group_dst)``;
    ``reduce``: a reducing function's op, as given; ``outputs``: what the Work's result() gives (a
    list, or the one output array); ``failed``: an argument the caller could not map on this rank
    (the torch backend's tensors).

    An argument this rank cannot use before it has an operation (a reduce op or a group it cannot
    read, a root that cannot be a cache key) must not be raised here alone, while the peers wait in
    the call: the call goes to the operation it would most likely have had (the reduce op "sum",
    the default root, the world: every group is inside it) with the error, naming this rank there,
    and is raised through the call's agreement on every rank that makes it (``Operation._call``'s
    ``failed``)."""
    fn, refused = cls.NAME, None
    if reduce is _NO_OP:
        reduce = None
    else:
        name = _reduce_name(reduce)
        if name is None:
            refused = ("op", getattr(reduce, "name", reduce), REDUCE_RULE)
        reduce = name or "sum"
    if root is not None:
        try:
            hash(root)
        except TypeError:                   # (a list or an array as src: no cache key)
            name, world_root, group_root = root
            if type(world_root).__hash__ is None:
                refused = refused or (name, world_root, "must be a world rank in the group")
            else:
                refused = refused or (f"group_{name}", group_root, "must be a rank in the group")
            root = (name, None, None)
    try:
        op = _op(cls, group, fn, root, reduce)
    except CollectiveArgumentError as exc:
        refused = refused or exc
        op = _op(cls, None, fn, root, reduce)
    if op is None:
        return None
    refused = refused or failed
    if refused is not None:
        op._live()                          # (bound: the error names this rank in the call's communicator)
        if isinstance(refused, tuple):
            refused = V.arg_error(fn, refused[0], refused[1], op.rank, refused[2])
    if async_op:
        return Work(op._call(args, ASYNC, refused), outputs if isinstance(outputs, list) else [outputs], fn)
    op._call(args, RUN, refused)
    return None


# ----------------------------------------------------------------------------- the adapting operations

def _tensor(fn: str, name: str, t: Any, rank: int, writes: bool = True) -> np.ndarray:
    """A numpy array the call may use as it is: C-contiguous (and writable, where it is written)."""
    if not isinstance(t, np.ndarray):
        raise V.arg_error(fn, name, type(t).__name__, rank, "must be a numpy array")
    if not t.flags.c_contiguous or (writes and not t.flags.writeable):
        raise V.arg_error(fn, name, "non-contiguous or read-only" if writes else "non-contiguous", rank,
                          "must be a C-contiguous" + (" writable" if writes else "") + " numpy array")
    return t


def _splits(fn: str, name: str, splits: Any, n: int, dim0: int, rank: int, dim_name: str) -> list[int]:
    """Split sizes along dim 0: None = even (dim 0 divisible by the group size), else ``n`` sizes
    that sum to dim 0."""
    if splits is None:
        if dim0 % n:
            raise V.arg_error(fn, dim_name, dim0, rank, f"must be divisible by the group size {n} (no {name} given)")
        return [dim0 // n] * n
    s = V.counts(fn, name, splits, n, rank)
    if sum(s) != dim0:
        raise V.arg_error(fn, name, s, rank, f"must sum to {dim_name}={dim0}")
    return s


def _split_pair(fn: str, rank: int, output: Any, input: Any, both_dim0: bool = False):  # noqa: A002
    """``(output, input)`` of a call split along dim 0 (:func:`_tensor`'s arrays): one dtype and the
    same rows (the dims after 0); ``both_dim0``: each must have a dim 0."""
    output = _tensor(fn, "output", output, rank)
    input = _tensor(fn, "input", input, rank, writes=False)  # noqa: A001
    if both_dim0 and (input.ndim < 1 or output.ndim < 1):
        raise V.arg_error(fn, "input.shape" if input.ndim < 1 else "output.shape", (), rank, "needs a dim 0 to split")
    if input.ndim < 1 or output.shape[1:] != input.shape[1:] or output.dtype != input.dtype:
        raise V.arg_error(fn, "output", f"{output.dtype}{list(output.shape)}", rank, f"must be {input.dtype}"
                          f"[*, {', '.join(map(str, input.shape[1:]))}] (input's dtype and rows)")
    return output, input


def _rows(t: np.ndarray) -> int:
    """Elements per row of dim 0."""
    return int(np.prod(t.shape[1:], dtype=np.int64)) if t.ndim else 1


class _AllReduce(AllReduceOperation):
    NAME, PUBLIC = "all_reduce", False

    def execute(self, tensor):
        return self._call((tensor,), RUN)

    def describe(self, tensor) -> Call:
        return super().describe(_tensor(self.NAME, "tensor", tensor, self.rank), tensor)


class _Broadcast(_Rooted, BroadcastOperation):
    NAME, PUBLIC = "broadcast", False

    def execute(self, tensor):
        return self._call((tensor,), RUN)

    def describe(self, tensor) -> Call:
        return super().describe(_tensor(self.NAME, "tensor", tensor, self.rank))


class _Reduce(_Rooted, ReduceOperation):
    NAME, PUBLIC = "reduce", False

    def execute(self, tensor):
        return self._call((tensor,), RUN)

    def describe(self, tensor) -> Call:
        return super().describe(_tensor(self.NAME, "tensor", tensor, self.rank), tensor)


class _AllGatherIntoTensor(AllGatherOperation):
    NAME, PUBLIC = "all_gather_into_tensor", False

    def execute(self, output, input):  # noqa: A002 - torch's names
        return self._call((output, input), RUN)

    def describe(self, output, input) -> Call:  # noqa: A002
        fn, r, n = self.NAME, self.rank, self.size
        output = _tensor(fn, "output", output, r)
        input = _tensor(fn, "input", input, r, writes=False)  # noqa: A001
        stacked = (n, *input.shape)
        concat = (n * input.shape[0], *input.shape[1:]) if input.ndim else None
        if output.dtype != input.dtype:
            raise V.arg_error(fn, "output.dtype", str(output.dtype), r, f"must be input's ({input.dtype})")
        if output.shape not in (stacked, concat):
            raise V.arg_error(fn, "output.shape", output.shape, r, "must be (world_size * input.shape[0], ...) = "
                              f"{concat} or (world_size, *input.shape) = {stacked}")
        return super().describe(input, output.reshape(stacked))


class _ReduceScatterTensor(ReduceScatterOperation):
    NAME, PUBLIC = "reduce_scatter_tensor", False

    def execute(self, output, input):  # noqa: A002
        return self._call((output, input), RUN)

    def describe(self, output, input) -> Call:  # noqa: A002
        fn, r, n = self.NAME, self.rank, self.size
        output = _tensor(fn, "output", output, r)
        input = _tensor(fn, "input", input, r, writes=False)  # noqa: A001
        stacked = (n, *output.shape)
        concat = (n * output.shape[0], *output.shape[1:]) if output.ndim else None
        if output.dtype != input.dtype:
            raise V.arg_error(fn, "output.dtype", str(output.dtype), r, f"must be input's ({input.dtype})")
        if input.shape not in (stacked, concat):
            raise V.arg_error(fn, "input.shape", input.shape, r, "must be (world_size * output.shape[0], ...) = "
                              f"{concat} or (world_size, *output.shape) = {stacked}")
        return super().describe(input.reshape(stacked), output.reshape((1, *output.shape)))


class _AllToAllSingle(AllToAllVV2Operation):
    NAME, PUBLIC = "all_to_all_single", False
    VALUES = ("output_split_sizes", "input_split_sizes")
    PAIR_NAMES = ("input_split_sizes[{j}]", "output_split_sizes[{i}]")

    def execute(self, output, input, output_split_sizes=None, input_split_sizes=None):  # noqa: A002
        return self._call((output, input, output_split_sizes, input_split_sizes), RUN)

    def describe(self, output, input, output_split_sizes=None, input_split_sizes=None) -> Call:  # noqa: A002
        fn, r, n = self.NAME, self.rank, self.size
        output, input = _split_pair(fn, r, output, input, both_dim0=True)  # noqa: A001
        si = _splits(fn, "input_split_sizes", input_split_sizes, n, input.shape[0], r, "input.shape[0]")
        so = _splits(fn, "output_split_sizes", output_split_sizes, n, output.shape[0], r, "output.shape[0]")
        row = _rows(input)
        sc, rc = [s * row for s in si], [s * row for s in so]
        call = super().describe(input, sc, prefix(sc), rc, prefix(rc), None, output.reshape(1, -1))
        call.send, call.recv, call.shape, call.result = si, so, input.shape[1:], output     # splits, in rows
        call.unit = row
        return call


class _AllGatherIntoTensorUneven(AllGatherVOperation):
    NAME, PUBLIC = "all_gather_into_tensor_uneven", False
    VALUES = ("output_split_sizes",)
    PAIR_NAMES = ("input.shape[0]", "output_split_sizes[{i}]")

    def execute(self, output, input, output_split_sizes=None):  # noqa: A002
        return self._call((output, input, output_split_sizes), RUN)

    def describe(self, output, input, output_split_sizes=None) -> Call:  # noqa: A002
        fn, r, n = self.NAME, self.rank, self.size
        output, input = _split_pair(fn, r, output, input)  # noqa: A001
        so = _splits(fn, "output_split_sizes", output_split_sizes, n, output.shape[0], r, "output.shape[0]")
        row = _rows(input)
        rc = [s * row for s in so]
        call = super().describe(input, input.size, rc, prefix(rc), output.shape, output)
        call.send, call.recv, call.shape = [input.shape[0]] * n, so, input.shape[1:]
        return call


class _ReduceScatterTensorUneven(ReduceScatterVOperation):
    NAME, PUBLIC = "reduce_scatter_tensor_uneven", False
    VALUES = ("input_split_sizes",)
    PAIR_NAMES = ("input_split_sizes[{j}]", "output.shape[0]")

    def execute(self, output, input, input_split_sizes=None):  # noqa: A002
        return self._call((output, input, input_split_sizes), RUN)

    def describe(self, output, input, input_split_sizes=None) -> Call:  # noqa: A002
        fn, r, n = self.NAME, self.rank, self.size
        output, input = _split_pair(fn, r, output, input)  # noqa: A001
        si = _splits(fn, "input_split_sizes", input_split_sizes, n, input.shape[0], r, "input.shape[0]")
        row = _rows(input)
        sc = [s * row for s in si]
        call = super().describe(input, sc, prefix(sc), output.size, output.reshape(-1))
        call.send, call.recv, call.shape, call.result = si, [output.shape[0]] * n, input.shape[1:], output
        return call


class _Barrier(Operation):
    NAME, PUBLIC = "barrier", False

    def execute(self):
        return self._call((), RUN)

    def describe(self) -> Call:
        return Call(None, None, None)

    def issue(self, call, table, go) -> None:
        go.mpi(self._lib, "Barrier")

    def ride(self, call):
        return _NOTHING                 # (the agreement is the barrier: every rank's row reaches every rank)

    def land(self, call, rows, table, go) -> None:
        pass


_NOTHING = np.empty(0, dtype=np.uint8)


def _lists_check(fn: str, name: str, lst: Any, n: int, like: np.ndarray, rank: int) -> list[np.ndarray]:
    if not isinstance(lst, (list, tuple)) or len(lst) != n:
        raise V.arg_error(fn, name, f"{type(lst).__name__} of {len(lst) if hasattr(lst, '__len__') else '?'}", rank,
                          f"must be a list of world_size={n} arrays")
    for i, t in enumerate(lst):
        if not isinstance(t, np.ndarray) or t.shape != like.shape or t.dtype != like.dtype or not t.flags.writeable:
            raise V.arg_error(fn, f"{name}[{i}]", f"{getattr(t, 'dtype', type(t).__name__)}"
                              f"{list(getattr(t, 'shape', ()))}", rank,
                              f"must be a writable {like.dtype}{list(like.shape)} array (the tensor's)")
    return list(lst)


def _unstack(staging: np.ndarray, targets: list[np.ndarray]) -> None:
    for k, t in enumerate(targets):
        np.copyto(t, staging[k])


def _stack(sources: list[np.ndarray], staging: np.ndarray) -> None:
    for k, t in enumerate(sources):
        np.copyto(staging[k], t)


class _AllGatherList(AllGatherOperation):
    NAME, PUBLIC = "all_gather", False

    def execute(self, tensor_list, tensor):
        return self._call((tensor_list, tensor), RUN)

    def describe(self, tensor_list, tensor) -> Call:
        fn, r, n = self.NAME, self.rank, self.size
        tensor = _tensor(fn, "tensor", tensor, r, writes=False)
        targets = _lists_check(fn, "tensor_list", tensor_list, n, tensor, r)
        call = super().describe(tensor, np.empty((n, *tensor.shape), tensor.dtype))
        call.result, call.after = targets, ((_unstack, call.out, targets),)
        return call


class _Gather(_Rooted, GatherOperation):
    NAME, PUBLIC = "gather", False

    def execute(self, tensor, gather_list=None):
        return self._call((tensor, gather_list), RUN)

    def describe(self, tensor, gather_list=None) -> Call:
        fn, r, n = self.NAME, self.rank, self.size
        tensor = _tensor(fn, "tensor", tensor, r, writes=False)
        targets = _lists_check(fn, "gather_list", gather_list, n, tensor, r) if r == self._root else None
        call = super().describe(tensor, None if targets is None else np.empty((n, *tensor.shape), tensor.dtype))
        call.result = targets
        if targets is not None:
            call.after = ((_unstack, call.out, targets),)
        return call


class _Scatter(_Rooted, ScatterOperation):
    NAME, PUBLIC = "scatter", False

    def execute(self, tensor, scatter_list=None):
        return self._call((tensor, scatter_list), RUN)

    def describe(self, tensor, scatter_list=None) -> Call:
        fn, r, n = self.NAME, self.rank, self.size
        tensor = _tensor(fn, "tensor", tensor, r)
        block = tensor.reshape((1, *tensor.shape))
        if r != self._root:
            call = super().describe(None, block)
            call.result = tensor
            return call
        sources = _lists_check(fn, "scatter_list", scatter_list, n, tensor, r)
        staging = np.empty((n, *tensor.shape), tensor.dtype)
        call = super().describe(staging, block)
        call.result, call.before = tensor, ((_stack, sources, staging),)
        return call


class _AllToAllList(AllToAllVV2Operation):
    NAME, PUBLIC = "all_to_all", False
    PAIR_NAMES = ("input_tensor_list[{j}].size", "output_tensor_list[{i}].size")

    def execute(self, output_tensor_list, input_tensor_list):
        return self._call((output_tensor_list, input_tensor_list), RUN)

    def describe(self, output_tensor_list, input_tensor_list) -> Call:
        fn, r, n = self.NAME, self.rank, self.size
        outs, ins = output_tensor_list, input_tensor_list
        for name, lst in (("output_tensor_list", outs), ("input_tensor_list", ins)):
            if not isinstance(lst, (list, tuple)) or len(lst) != n:
                raise V.arg_error(fn, name, type(lst).__name__, r, f"must be a list of world_size={n} arrays")
            for i, t in enumerate(lst):
                if not isinstance(t, np.ndarray):
                    raise V.arg_error(fn, f"{name}[{i}]", type(t).__name__, r, "must be a numpy array")
        dtype = ins[0].dtype if n else np.dtype(np.float32)
        for name, lst in (("output_tensor_list", outs), ("input_tensor_list", ins)):
            for i, t in enumerate(lst):
                if t.dtype != dtype:
                    raise V.arg_error(fn, f"{name}[{i}].dtype", str(t.dtype), r, f"must be input_tensor_list[0]'s "
                                      f"({dtype})")
                if name[0] == "o" and not t.flags.writeable:
                    raise V.arg_error(fn, f"{name}[{i}]", "read-only", r, "must be writable")
        sc, rc = [t.size for t in ins], [t.size for t in outs]
        send = np.empty(sum(sc), dtype)
        recv = np.empty((1, sum(rc)), dtype)
        call = super().describe(send, sc, prefix(sc), rc, prefix(rc), None, recv)
        call.result = list(outs)
        call.before, call.after = ((_pack, list(ins), send),), ((_unpack, recv.reshape(-1), list(outs)),)
        return call


def _pack(sources: list[np.ndarray], flat: np.ndarray) -> None:
    pos = 0
    for t in sources:
        flat[pos:pos + t.size] = t.reshape(-1)
        pos += t.size


def _unpack(flat: np.ndarray, targets: list[np.ndarray]) -> None:
    pos = 0
    for t in targets:                       # (copyto: a target may be strided, where reshape(-1) would copy)
        np.copyto(t, flat[pos:pos + t.size].reshape(t.shape))
        pos += t.size


class _ReduceScatterList(ReduceScatterOperation):
    NAME, PUBLIC = "reduce_scatter", False

    def execute(self, output, input_list):
        return self._call((output, input_list), RUN)

    def describe(self, output, input_list) -> Call:
        fn, r, n = self.NAME, self.rank, self.size
        output = _tensor(fn, "output", output, r)
        if not isinstance(input_list, (list, tuple)) or len(input_list) != n:
            raise V.arg_error(fn, "input_list", type(input_list).__name__, r, f"must be a list of world_size={n} "
                              "arrays")
        for i, t in enumerate(input_list):
            if not isinstance(t, np.ndarray) or t.shape != output.shape or t.dtype != output.dtype:
                raise V.arg_error(fn, f"input_list[{i}]", f"{getattr(t, 'dtype', type(t).__name__)}"
                                  f"{list(getattr(t, 'shape', ()))}", r, f"must be a {output.dtype}"
                                  f"{list(output.shape)} array (output's)")
        staging = np.empty((n, *output.shape), output.dtype)
        call = super().describe(staging, output.reshape((1, *output.shape)))
        call.result, call.before = output, ((_stack, list(input_list), staging),)
        return call


for _fn, _shape in (("all_reduce", "tensor.shape"), ("broadcast", "tensor.shape"), ("reduce", "tensor.shape"),
                    ("all_gather_into_tensor", "input.shape"), ("all_gather", "tensor.shape"),
                    ("gather", "tensor.shape"), ("scatter", "tensor.shape"),
                    ("reduce_scatter_tensor", "output.shape (the block)"), ("reduce_scatter", "output.shape"),
                    ("all_to_all_single", "input.shape[1:] (a row)"),
                    ("all_gather_into_tensor_uneven", "input.shape[1:] (a row)"),
                    ("reduce_scatter_tensor_uneven", "input.shape[1:] (a row)")):
    V.SHAPE_NAMES[_fn] = _shape


# ----------------------------------------------------------------------------- the functions

def all_reduce(tensor: np.ndarray, op: Any = "sum", group: Any = None, async_op: bool = False) -> Work | None:
    """Reduce ``tensor`` over the group, in place on every rank.

    Example (2 ranks, ``t = np.array([rank + 1.0])``): ``all_reduce(t)`` -> t is ``[3.]`` on both.

    Args:
        tensor: a C-contiguous writable array; the same shape and dtype on every rank.
        op: "sum", "prod" (or "product"), "max", "min" (any case; ``HcclReduceOp`` too).
        group: None (world), a domain name, a list of world ranks, or an mpi4py communicator.
        async_op: return a :class:`Work` instead of blocking.

    Returns:
        None, or a :class:`Work` (``async_op``); None on a rank outside a list ``group``.

    Raises:
        CollectiveError: on every rank of the group, for a bad argument on any of them.
    """
    return _run(_AllReduce, group, (tensor,), async_op, tensor, reduce=op)


def broadcast(tensor: np.ndarray, src: int | None = None, group: Any = None, async_op: bool = False,
              group_src: int | None = None) -> Work | None:
    """Fill ``tensor`` on every rank with the source rank's, in place.

    Args:
        tensor: a C-contiguous writable array; the same shape and dtype on every rank.
        src: the source as a world rank (torch's ``src``); or ``group_src``, a rank in the group.
        group, async_op: as in :func:`all_reduce`.
    """
    return _run(_Broadcast, group, (tensor,), async_op, tensor, ("src", src, group_src))


def reduce(tensor: np.ndarray, dst: int | None = None, op: Any = "sum", group: Any = None, async_op: bool = False,
           group_dst: int | None = None) -> Work | None:
    """Reduce ``tensor`` over the group into the destination rank's ``tensor`` (in place there;
    the other ranks' tensors are left as they are).

    Args:
        dst: the destination as a world rank; or ``group_dst``, a rank in the group.
        tensor, op, group, async_op: as in :func:`all_reduce`.
    """
    return _run(_Reduce, group, (tensor,), async_op, tensor, ("dst", dst, group_dst), op)


def all_gather_into_tensor(output: np.ndarray, input: np.ndarray, group: Any = None,  # noqa: A002
                           async_op: bool = False) -> Work | None:
    """Gather every rank's ``input`` into ``output``, concatenated along dim 0 (shape
    ``(world_size * N, ...)``) or stacked (``(world_size, N, ...)``), in rank order.

    ``input`` may be ``output``'s own block ``rank`` (in place).
    """
    return _run(_AllGatherIntoTensor, group, (output, input), async_op, output)


def all_gather(tensor_list: list[np.ndarray], tensor: np.ndarray, group: Any = None,
               async_op: bool = False) -> Work | None:
    """Gather every rank's ``tensor`` into ``tensor_list[i]`` (rank i's), on every rank."""
    return _run(_AllGatherList, group, (tensor_list, tensor), async_op, tensor_list)


def gather(tensor: np.ndarray, gather_list: list[np.ndarray] | None = None, dst: int | None = None,
           group: Any = None, async_op: bool = False, group_dst: int | None = None) -> Work | None:
    """Gather every rank's ``tensor`` into the destination's ``gather_list`` (None elsewhere)."""
    return _run(_Gather, group, (tensor, gather_list), async_op, [] if gather_list is None else gather_list,
                ("dst", dst, group_dst))


def scatter(tensor: np.ndarray, scatter_list: list[np.ndarray] | None = None, src: int | None = None,
            group: Any = None, async_op: bool = False, group_src: int | None = None) -> Work | None:
    """Fill rank i's ``tensor`` with the source's ``scatter_list[i]`` (``scatter_list`` on the
    source only)."""
    return _run(_Scatter, group, (tensor, scatter_list), async_op, tensor, ("src", src, group_src))


def reduce_scatter_tensor(output: np.ndarray, input: np.ndarray, op: Any = "sum", group: Any = None,  # noqa: A002
                          async_op: bool = False) -> Work | None:
    """Reduce ``input`` over the group; rank r keeps block r of dim 0 in ``output``. ``input`` is
    ``(world_size * N, ...)`` (blocks along dim 0) or ``(world_size, *output.shape)``."""
    return _run(_ReduceScatterTensor, group, (output, input), async_op, output, reduce=op)


def reduce_scatter(output: np.ndarray, input_list: list[np.ndarray], op: Any = "sum", group: Any = None,
                   async_op: bool = False) -> Work | None:
    """Reduce ``input_list[r]`` over the group into rank r's ``output``."""
    return _run(_ReduceScatterList, group, (output, input_list), async_op, output, reduce=op)


def all_to_all_single(output: np.ndarray, input: np.ndarray, output_split_sizes: Any = None,  # noqa: A002
                      input_split_sizes: Any = None, group: Any = None, async_op: bool = False) -> Work | None:
    """Split ``input`` along dim 0 (``input_split_sizes``, None = even) and send block j to rank j;
    ``output`` receives rank i's block at split i of its dim 0 (``output_split_sizes``).

    Example (2 ranks, even): rank r's ``input = [2r, 2r + 1]`` -> ``output = [r, 2 + r]``.
    """
    return _run(_AllToAllSingle, group, (output, input, output_split_sizes, input_split_sizes), async_op, output)


def all_to_all(output_tensor_list: list[np.ndarray], input_tensor_list: list[np.ndarray], group: Any = None,
               async_op: bool = False) -> Work | None:
    """Send ``input_tensor_list[j]`` to rank j; ``output_tensor_list[i]`` receives rank i's (sizes may
    differ per rank, dtypes may not)."""
    return _run(_AllToAllList, group, (output_tensor_list, input_tensor_list), async_op, output_tensor_list)


def all_gather_into_tensor_uneven(output: np.ndarray, input: np.ndarray, output_split_sizes: Any = None,  # noqa: A002
                                  group: Any = None, async_op: bool = False) -> Work | None:
    """AllGather along dim 0 with a different number of rows per rank: rank i's ``input`` lands at
    split i of ``output``'s dim 0 (``output_split_sizes``, None = even)."""
    return _run(_AllGatherIntoTensorUneven, group, (output, input, output_split_sizes), async_op, output)


def reduce_scatter_tensor_uneven(output: np.ndarray, input: np.ndarray, input_split_sizes: Any = None,  # noqa: A002
                                 op: Any = "sum", group: Any = None, async_op: bool = False) -> Work | None:
    """ReduceScatter along dim 0 with a different number of rows per rank: rank r gets the
    reduction of split r of every rank's ``input`` (``input_split_sizes``, None = even)."""
    return _run(_ReduceScatterTensorUneven, group, (output, input, input_split_sizes), async_op, output, reduce=op)


def barrier(group: Any = None, async_op: bool = False) -> Work | None:
    """Wait until every rank of the group has reached it."""
    return _run(_Barrier, group, (), async_op, [])


# ----------------------------------------------------------------------------- point-to-point (mpicoll._messages)

def isend(tensor: np.ndarray, dst: int | None = None, group: Any = None, tag: int = 0,
          group_dst: int | None = None) -> Work | None:
    """Start sending ``tensor`` to one rank; the :class:`Work` completes when the buffer may be
    reused. Messages from one rank to another with one tag arrive in the order they were sent.

    Example (2 ranks): rank 0 ``isend(np.arange(3.0), dst=1).wait()``; rank 1 ``recv(t, src=0)``.

    Args:
        tensor: a C-contiguous array (read, not written).
        dst: the destination as a world rank; or ``group_dst``, a rank in the group.
        group: None (world), a domain name, a list of world ranks, or an mpi4py communicator.
        tag: an int in [0, MPI's TAG_UB]; the receiver's must be the same.

    Returns:
        A :class:`Work`; None on a rank outside a list ``group``.

    Raises:
        CollectiveArgumentError: a bad argument, on this rank only (there is no collective to
            agree in); CollectiveTimeout: ``wait()`` under ``MPICOLL_TIMEOUT``, the receiver absent.
    """
    message = post("isend", tensor, dst, group_dst, group, tag, "dst")
    return None if message is None else Work(message, [tensor], "isend")


def irecv(tensor: np.ndarray, src: int | None = None, group: Any = None, tag: int = 0,
          group_src: int | None = None) -> Work | None:
    """Start receiving into ``tensor`` from one rank (``src`` and ``group_src`` None: from any
    rank of the group); :func:`source` of the Work, once complete, is the sender's group rank.

    Args:
        tensor: a C-contiguous writable array of the sender's size in bytes (else ``wait()`` raises).
        src: the source as a world rank; or ``group_src``, a rank in the group; neither: any.
        group, tag: as in :func:`isend`.

    Returns:
        A :class:`Work`; None on a rank outside a list ``group``.
    """
    message = post("irecv", tensor, src, group_src, group, tag, "src")
    return None if message is None else Work(message, [tensor], "irecv")


def send(tensor: np.ndarray, dst: int | None = None, group: Any = None, tag: int = 0,
         group_dst: int | None = None) -> None:
    """Send ``tensor`` to one rank (:func:`isend`, then ``wait()``)."""
    work = isend(tensor, dst, group, tag, group_dst)
    if work is not None:
        work.wait()


def recv(tensor: np.ndarray, src: int | None = None, group: Any = None, tag: int = 0,
         group_src: int | None = None) -> int:
    """Receive into ``tensor`` from one rank, or from any (``src`` None); the sender's world rank
    (-1 on a rank outside a list ``group``), as torch's ``recv``."""
    work = irecv(tensor, src, group, tag, group_src)
    if work is None:
        return -1
    work.wait()
    message = work._handle
    return message.lib.world_ranks[message.source]


def source(work: Work) -> int:
    """The sender's group rank of a completed :func:`irecv`'s ``work``."""
    work.wait()
    return work._handle.source
