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

Every function is a call of an internal operation (one per function, named after it:
:mod:`mpicoll._adapters`), on the one call path: described with torch's rules and argument names, agreed across the ranks (errors are
``CollectiveError``s raised on every rank), issued by the primitive operator it adapts. Operations
are cached per (function, group, reduce op or root), at most ``MAX_CACHED``, least recently used
out first; and an operation runs a call as a recorded plan when the very same call comes back
(with validation on, once every rank has agreed the header it sent last time: docs/plans.md).
Inside :func:`mpicoll.graph.capture` every function is captured instead of run.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
from mpi4py import MPI

from . import _adapters as A
from . import _validate as V
from ._domains import group_fields
from ._dtypes import REDUCE_RULE, reduce_op
from ._errors import CollectiveArgumentError, CollectiveError, CollectiveTimeout
from ._messages import post
from ._watchdog import wait_seconds
from .ops._base import Operation
from .ops._modes import ASYNC, RUN

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
        """Block until the call has finished; True. ``timeout`` (what an Operation's ``timeout=``
        takes: seconds or a timedelta, 0 or less: none; None: no limit): a :class:`CollectiveTimeout`
        once that long has passed with the call still running (it goes on: ``wait()`` again to
        complete it).

        Raises:
            CollectiveArgumentError: a ``timeout`` that is none of these (a string, inf, nan), on
                this rank, in flight or not.
            CollectiveError: the call's own error (on every rank of the call, as a synchronous call).
        """
        seconds = wait_seconds(timeout, self._name, _rank(self._handle))
        if not self._handle.wait(seconds):
            raise CollectiveTimeout(f"{self._name}: wait(timeout={seconds:g} s) timed out with the call still in "
                                    "flight (it goes on: wait() again to complete it)", op=self._name, param="timeout",
                                    seconds=seconds)
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


def _rank(handle: Any) -> int:
    """The rank a Work's messages name: its call's, on its communicator (a captured call's: the world's)."""
    rank = getattr(handle, "rank", None)
    return MPI.COMM_WORLD.Get_rank() if rank is None else rank


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


def _op(cls: type, group: Any, fn: str, root: tuple | None = None, reduce: str | None = None,
        ops: dict | None = None) -> Operation | None:
    """The operation of ``cls`` on ``group`` (None: this rank is not in a list ``group``), kept in
    ``ops`` (a torch group's own: one group, its operations for as long as it lives) or else in the
    module's cache of the latest ``MAX_CACHED``. ``root``: ``(name, world rank, group rank)`` of a
    rooted function's src/dst (one of the two ranks given, or neither: group rank 0); ``reduce``: its
    reduce op's name."""
    kind = type(group)
    cache = _OPS if ops is None else ops
    if group is None or kind is str or kind is MPI.Intracomm:      # (the common cases: one dict lookup)
        key = (cls, ("comm", id(group)) if kind is MPI.Intracomm else group or "", root, reduce)
        op = cache.get(key)
        if op is not None:
            if ops is None:
                _OPS.move_to_end(key)
            return op
    g = _group(group, fn)
    if g is None:
        return None
    key = (cls, g[0], root, reduce)
    op = cache.get(key)
    if op is None:
        fields = {} if reduce is None else {"reduce_type": reduce}
        op = cls(cls.PARAM(**g[1], **fields))
        if root is not None:
            op._root_given = root
        cache[key] = op
        if ops is None and len(_OPS) > MAX_CACHED:
            _OPS.popitem(last=False)
    elif ops is None:
        _OPS.move_to_end(key)
    return op


def _reduce_name(op: Any) -> str | None:
    """mpicoll's name of a reduce op as given, not seen yet (:func:`run` reads the ones seen from
    :data:`_REDUCE_NAMES`): the reduce-op table's names, or an enum member with such a ``name``, as
    torch's ``ReduceOp.SUM``; None: not one. Kept per op given (a torch enum's ``name`` costs a
    microsecond and a half a call)."""
    try:
        name = reduce_op(op if type(op) is str else getattr(op, "name", op)).name
    except CollectiveArgumentError:
        name = None
    try:
        if len(_REDUCE_NAMES) < 64:
            _REDUCE_NAMES[op] = name
    except TypeError:
        pass
    return name


#: reduce ops as given -> their names (:func:`_reduce_name`)
_REDUCE_NAMES: dict[Any, str | None] = {}


#: ``_run``'s ``reduce`` for a function without a reduce op (None is a reduce op given, and refused)
NO_OP = object()


def run(cls: type, group: Any, args: tuple, async_op: bool, outputs: Any, root: tuple | None = None,
        reduce: Any = NO_OP, failed: CollectiveError | None = None, ops: dict | None = None) -> Work | None:
    """Run (or queue on its worker, or, inside a capture, capture) one call of the function ``cls`` adapts;
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
    if reduce is NO_OP:
        reduce = None
    else:
        try:
            name = _REDUCE_NAMES[reduce]           # (an op seen before: the common case)
        except (KeyError, TypeError):             # (not seen yet, or not hashable)
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
        op = _op(cls, group, fn, root, reduce, ops)
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
    return run(A.AllReduce, group, (tensor,), async_op, tensor, reduce=op)


def broadcast(tensor: np.ndarray, src: int | None = None, group: Any = None, async_op: bool = False,
              group_src: int | None = None) -> Work | None:
    """Fill ``tensor`` on every rank with the source rank's, in place.

    Args:
        tensor: a C-contiguous writable array; the same shape and dtype on every rank.
        src: the source as a world rank (torch's ``src``); or ``group_src``, a rank in the group.
        group, async_op: as in :func:`all_reduce`.
    """
    return run(A.Broadcast, group, (tensor,), async_op, tensor, ("src", src, group_src))


def reduce(tensor: np.ndarray, dst: int | None = None, op: Any = "sum", group: Any = None, async_op: bool = False,
           group_dst: int | None = None) -> Work | None:
    """Reduce ``tensor`` over the group into the destination rank's ``tensor`` (in place there;
    the other ranks' tensors are left as they are).

    Args:
        dst: the destination as a world rank; or ``group_dst``, a rank in the group.
        tensor, op, group, async_op: as in :func:`all_reduce`.
    """
    return run(A.Reduce, group, (tensor,), async_op, tensor, ("dst", dst, group_dst), op)


def all_gather_into_tensor(output: np.ndarray, input: np.ndarray, group: Any = None,  # noqa: A002
                           async_op: bool = False) -> Work | None:
    """Gather every rank's ``input`` into ``output``, concatenated along dim 0 (shape
    ``(world_size * N, ...)``) or stacked (``(world_size, N, ...)``), in rank order.

    ``input`` may be ``output``'s own block ``rank`` (in place).
    """
    return run(A.AllGatherIntoTensor, group, (output, input), async_op, output)


def all_gather(tensor_list: list[np.ndarray], tensor: np.ndarray, group: Any = None,
               async_op: bool = False) -> Work | None:
    """Gather every rank's ``tensor`` into ``tensor_list[i]`` (rank i's), on every rank."""
    return run(A.AllGatherList, group, (tensor_list, tensor), async_op, tensor_list)


def gather(tensor: np.ndarray, gather_list: list[np.ndarray] | None = None, dst: int | None = None,
           group: Any = None, async_op: bool = False, group_dst: int | None = None) -> Work | None:
    """Gather every rank's ``tensor`` into the destination's ``gather_list`` (None elsewhere)."""
    return run(A.Gather, group, (tensor, gather_list), async_op, [] if gather_list is None else gather_list,
                ("dst", dst, group_dst))


def scatter(tensor: np.ndarray, scatter_list: list[np.ndarray] | None = None, src: int | None = None,
            group: Any = None, async_op: bool = False, group_src: int | None = None) -> Work | None:
    """Fill rank i's ``tensor`` with the source's ``scatter_list[i]`` (``scatter_list`` on the
    source only)."""
    return run(A.Scatter, group, (tensor, scatter_list), async_op, tensor, ("src", src, group_src))


def reduce_scatter_tensor(output: np.ndarray, input: np.ndarray, op: Any = "sum", group: Any = None,  # noqa: A002
                          async_op: bool = False) -> Work | None:
    """Reduce ``input`` over the group; rank r keeps block r of dim 0 in ``output``. ``input`` is
    ``(world_size * N, ...)`` (blocks along dim 0) or ``(world_size, *output.shape)``."""
    return run(A.ReduceScatterTensor, group, (output, input), async_op, output, reduce=op)


def reduce_scatter(output: np.ndarray, input_list: list[np.ndarray], op: Any = "sum", group: Any = None,
                   async_op: bool = False) -> Work | None:
    """Reduce ``input_list[r]`` over the group into rank r's ``output``."""
    return run(A.ReduceScatterList, group, (output, input_list), async_op, output, reduce=op)


def all_to_all_single(output: np.ndarray, input: np.ndarray, output_split_sizes: Any = None,  # noqa: A002
                      input_split_sizes: Any = None, group: Any = None, async_op: bool = False) -> Work | None:
    """Split ``input`` along dim 0 (``input_split_sizes``, None = even) and send block j to rank j;
    ``output`` receives rank i's block at split i of its dim 0 (``output_split_sizes``).

    Example (2 ranks, even): rank r's ``input = [2r, 2r + 1]`` -> ``output = [r, 2 + r]``.
    """
    return run(A.AllToAllSingle, group, (output, input, output_split_sizes, input_split_sizes), async_op, output)


def all_to_all(output_tensor_list: list[np.ndarray], input_tensor_list: list[np.ndarray], group: Any = None,
               async_op: bool = False) -> Work | None:
    """Send ``input_tensor_list[j]`` to rank j; ``output_tensor_list[i]`` receives rank i's (sizes may
    differ per rank, dtypes may not)."""
    return run(A.AllToAllList, group, (output_tensor_list, input_tensor_list), async_op, output_tensor_list)


def all_gather_into_tensor_uneven(output: np.ndarray, input: np.ndarray, output_split_sizes: Any = None,  # noqa: A002
                                  group: Any = None, async_op: bool = False) -> Work | None:
    """AllGather along dim 0 with a different number of rows per rank: rank i's ``input`` lands at
    split i of ``output``'s dim 0 (``output_split_sizes``, None = even)."""
    return run(A.AllGatherIntoTensorUneven, group, (output, input, output_split_sizes), async_op, output)


def reduce_scatter_tensor_uneven(output: np.ndarray, input: np.ndarray, input_split_sizes: Any = None,  # noqa: A002
                                 op: Any = "sum", group: Any = None, async_op: bool = False) -> Work | None:
    """ReduceScatter along dim 0 with a different number of rows per rank: rank r gets the
    reduction of split r of every rank's ``input`` (``input_split_sizes``, None = even)."""
    return run(A.ReduceScatterTensorUneven, group, (output, input, input_split_sizes), async_op, output, reduce=op)


def barrier(group: Any = None, async_op: bool = False) -> Work | None:
    """Wait until every rank of the group has reached it."""
    return run(A.Barrier, group, (), async_op, [])


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
