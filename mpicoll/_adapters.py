"""The operations behind :mod:`mpicoll.functional` (and the torch backend): one internal operation
per torch.distributed function, a subclass of the primitive operator it adapts (``PUBLIC = False``,
named after the function), whose ``describe`` checks torch's rules in torch's argument names and
puts a list's packing into the call's local work (``before``/``after``); rooted ones take torch's
``src``/``dst`` (world ranks) or ``group_src``/``group_dst`` (:class:`Rooted`).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from . import _validate as V
from ._numeric import pack, prefix, unpack
from ._call import Call
from .ops._base import Operation
from .ops._modes import RUN
from .ops.allgather import AllGatherOperation, AllGatherVOperation
from .ops.allreduce import AllReduceOperation
from .ops.alltoall import AllToAllVV2Operation
from .ops.broadcast import BroadcastOperation
from .ops.gather import GatherOperation
from .ops.reduce import ReduceOperation
from .ops.reduce_scatter import ReduceScatterOperation, ReduceScatterVOperation
from .ops.scatter import ScatterOperation


class Rooted:
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


class AllReduce(AllReduceOperation):
    NAME, PUBLIC = "all_reduce", False
    SHAPE_NAME = "tensor.shape"

    def execute(self, tensor):
        return self._call((tensor,), RUN)

    def describe(self, tensor) -> Call:
        return super().describe(_tensor(self.NAME, "tensor", tensor, self.rank), tensor)


class Broadcast(Rooted, BroadcastOperation):
    NAME, PUBLIC = "broadcast", False
    SHAPE_NAME = "tensor.shape"

    def execute(self, tensor):
        return self._call((tensor,), RUN)

    def describe(self, tensor) -> Call:
        return super().describe(_tensor(self.NAME, "tensor", tensor, self.rank))


class Reduce(Rooted, ReduceOperation):
    NAME, PUBLIC = "reduce", False
    SHAPE_NAME = "tensor.shape"

    def execute(self, tensor):
        return self._call((tensor,), RUN)

    def describe(self, tensor) -> Call:
        return super().describe(_tensor(self.NAME, "tensor", tensor, self.rank), tensor)


class AllGatherIntoTensor(AllGatherOperation):
    NAME, PUBLIC = "all_gather_into_tensor", False
    SHAPE_NAME = "input.shape"

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


class ReduceScatterTensor(ReduceScatterOperation):
    NAME, PUBLIC = "reduce_scatter_tensor", False
    SHAPE_NAME = "output.shape (the block)"

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


class AllToAllSingle(AllToAllVV2Operation):
    NAME, PUBLIC = "all_to_all_single", False
    SHAPE_NAME = "input.shape[1:] (a row)"
    VALUES = SLOTS = ("output_split_sizes", "input_split_sizes")
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


class AllGatherIntoTensorUneven(AllGatherVOperation):
    NAME, PUBLIC = "all_gather_into_tensor_uneven", False
    SHAPE_NAME = "input.shape[1:] (a row)"
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


class ReduceScatterTensorUneven(ReduceScatterVOperation):
    NAME, PUBLIC = "reduce_scatter_tensor_uneven", False
    SHAPE_NAME = "input.shape[1:] (a row)"
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


class Barrier(Operation):
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


class AllGatherList(AllGatherOperation):
    NAME, PUBLIC = "all_gather", False
    SHAPE_NAME = "tensor.shape"

    def execute(self, tensor_list, tensor):
        return self._call((tensor_list, tensor), RUN)

    def describe(self, tensor_list, tensor) -> Call:
        fn, r, n = self.NAME, self.rank, self.size
        tensor = _tensor(fn, "tensor", tensor, r, writes=False)
        targets = _lists_check(fn, "tensor_list", tensor_list, n, tensor, r)
        call = super().describe(tensor, np.empty((n, *tensor.shape), tensor.dtype))
        call.result, call.after = targets, ((unpack, call.out.reshape(-1), targets),)
        return call


class Gather(Rooted, GatherOperation):
    NAME, PUBLIC = "gather", False
    SHAPE_NAME = "tensor.shape"

    def execute(self, tensor, gather_list=None):
        return self._call((tensor, gather_list), RUN)

    def describe(self, tensor, gather_list=None) -> Call:
        fn, r, n = self.NAME, self.rank, self.size
        tensor = _tensor(fn, "tensor", tensor, r, writes=False)
        targets = _lists_check(fn, "gather_list", gather_list, n, tensor, r) if r == self._root else None
        call = super().describe(tensor, None if targets is None else np.empty((n, *tensor.shape), tensor.dtype))
        call.result = targets
        if targets is not None:
            call.after = ((unpack, call.out.reshape(-1), targets),)
        return call


class Scatter(Rooted, ScatterOperation):
    NAME, PUBLIC = "scatter", False
    SHAPE_NAME = "tensor.shape"

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
        call.result, call.before = tensor, ((pack, sources, staging.reshape(-1)),)
        return call


class AllToAllList(AllToAllVV2Operation):
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
        call.before, call.after = ((pack, list(ins), send),), ((unpack, recv.reshape(-1), list(outs)),)
        return call


class ReduceScatterList(ReduceScatterOperation):
    NAME, PUBLIC = "reduce_scatter", False
    SHAPE_NAME = "output.shape"

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
        call.result, call.before = output, ((pack, list(input_list), staging.reshape(-1)),)
        return call
