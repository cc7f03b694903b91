"""mpicoll as a torch.distributed backend (docs/torch.md).

    import torch.distributed as dist
    import mpicoll.torch                                      # registers "mpicoll" and mpi://
    dist.init_process_group("mpicoll", init_method="mpi://")  # rank and world size from MPI

Importing this module registers the backend ``"mpicoll"`` for CPU tensors and the init method
``mpi://`` (rank and world size are MPI's, the store is local: the backend never needs one).
Each process-group call maps onto :mod:`mpicoll.functional` on numpy views of the tensors (no
copies; bfloat16 through a 16-bit view, bool through uint8), so it takes mpicoll's one call path:
described, agreed across the ranks (a mismatch raises the same ``CollectiveError`` on every rank,
through torch), issued. A group of ``dist.new_group(ranks)`` is an mpicoll comm domain of those world
ranks. Calls run to completion before they return: the ``Work`` torch hands back is complete, its
future set (``async_op=True`` is accepted and changes nothing). A tensor or a reduce op the backend
cannot take raises ``CollectiveArgumentError`` through the call's agreement, on every rank of the
group; point-to-point calls raise ``NotImplementedError`` naming the call.
"""
from __future__ import annotations

import urllib.parse
from datetime import timedelta
from typing import Any, Callable

import ml_dtypes
import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI
from torch._C._distributed_c10d import _create_work_from_future
from torch.distributed.rendezvous import register_rendezvous_handler

from . import functional as F
from ._errors import CollectiveError, arg_error

__all__ = ["BACKEND", "ProcessGroupMpicoll"]

#: the name to give ``init_process_group`` / ``new_group``
BACKEND = "mpicoll"

_R = dist.ReduceOp.RedOpType
#: torch's reduce ops -> mpicoll's (AVG: a sum, then a division; bool: logical or/and as max/min)
_REDUCE = {_R.SUM: "sum", _R.PRODUCT: "prod", _R.MIN: "min", _R.MAX: "max", _R.AVG: "sum"}
_BOOL_REDUCE = {"sum": "max", "prod": "min", "min": "min", "max": "max"}


def _array(t: torch.Tensor, call: str, rank: int) -> np.ndarray:
    """A numpy view of the CPU tensor ``t`` (shares its memory; bfloat16 via int16, bool via uint8)."""
    if t.device.type != "cpu":
        raise arg_error(call, "tensor", str(t.device), rank, "the mpicoll backend takes CPU tensors")
    t = t.detach()
    try:
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        if t.dtype == torch.bool:
            return t.view(torch.uint8).numpy()
        return t.numpy()
    except (TypeError, RuntimeError) as exc:          # (a dtype numpy lacks, a sparse tensor, ...)
        raise arg_error(call, "tensor", str(t.dtype), rank, f"has no numpy view ({exc})") from None


def _arrays(ts, call: str, rank: int) -> list[np.ndarray]:
    return [_array(t, call, rank) for t in ts]


def _one(tensors, call: str, rank: int) -> torch.Tensor:
    if len(tensors) != 1:
        raise arg_error(call, "tensors", f"{len(tensors)} tensors", rank,
                        "the mpicoll backend takes one tensor per call (one device per process)")
    return tensors[0]


def _reduce(opts: Any, t: torch.Tensor, call: str, rank: int) -> str:
    """mpicoll's name of torch's reduce op (``opts.reduceOp``) for tensors like ``t``."""
    op = opts.reduceOp.op
    name = _REDUCE.get(op)
    if name is None:
        raise arg_error(call, "op", str(op), rank, "not supported by the mpicoll backend: SUM, PRODUCT, MIN, MAX "
                        "and AVG (floating point)")
    if op == _R.AVG and not t.is_floating_point():
        raise arg_error(call, "op", f"AVG on {t.dtype}", rank, "only floating-point tensors are averaged")
    return _BOOL_REDUCE[name] if t.dtype == torch.bool else name


def _done(result: Any) -> Any:
    """A complete ``Work`` whose future holds ``result`` (torch's form for a finished call)."""
    fut = torch.futures.Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


def _average(t: torch.Tensor, opts: Any, n: int) -> None:
    """AVG: the sum divided by the group size, in the tensor's dtype (outside autograd)."""
    if opts.reduceOp.op == _R.AVG:
        t.detach().div_(n)


class ProcessGroupMpicoll(dist.ProcessGroup):
    """A torch.distributed process group on mpicoll (one per torch group; world ranks ``ranks``)."""

    def __init__(self, rank: int, size: int, ranks: list[int], timeout: timedelta | None = None) -> None:
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        # the mpicoll group: the world, or the comm domain of these world ranks (as new_group's)
        self._group = None if list(ranks) == list(range(MPI.COMM_WORLD.Get_size())) else list(ranks)

    # --------------------------------------------------------------- what torch asks of a group
    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND

    def getRank(self) -> int:  # noqa: N802
        return self._rank

    def getSize(self) -> int:  # noqa: N802
        return self._size

    def __repr__(self) -> str:
        return f"ProcessGroupMpicoll(rank={self._rank}, size={self._size}, group={self._group or 'world'})"

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

    def allreduce(self, tensors, opts):
        call, r = "all_reduce", self._rank
        x, op = self._args(call, 2, lambda: (_array(_one(tensors, call, r), call, r),
                                             _reduce(opts, tensors[0], call, r)))
        F.all_reduce(x, op or "sum", self._group)
        _average(tensors[0], opts, self._size)
        return _done(tensors)

    def broadcast(self, tensors, opts):
        call, r = "broadcast", self._rank
        x, = self._args(call, 1, lambda: (_array(_one(tensors, call, r), call, r),))
        F.broadcast(x, group=self._group, group_src=opts.rootRank)
        return _done(tensors)

    def reduce(self, tensors, opts):
        call, r = "reduce", self._rank
        x, op = self._args(call, 2, lambda: (_array(_one(tensors, call, r), call, r),
                                             _reduce(opts, tensors[0], call, r)))
        F.reduce(x, op=op or "sum", group=self._group, group_dst=opts.rootRank)
        if r == opts.rootRank:
            _average(tensors[0], opts, self._size)
        return _done(tensors)

    def allgather(self, output_tensors, input_tensors, opts):
        call, r = "all_gather", self._rank
        x, outs = self._args(call, 2, lambda: (_array(_one(input_tensors, call, r), call, r),
                                               _arrays(_one(output_tensors, call, r), call, r)))
        F.all_gather(outs, x, group=self._group)
        return _done(output_tensors)

    def _allgather_base(self, output, input, opts):  # noqa: A002 - torch's names
        call, r = "all_gather_into_tensor", self._rank
        x, out = self._args(call, 2, lambda: (_array(input, call, r), _array(output, call, r)))
        F.all_gather_into_tensor(out, x, group=self._group)
        return _done([output])

    all_gather_single = _allgather_base

    def gather(self, output_tensors, input_tensors, opts):
        call, r = "gather", self._rank
        root = r == opts.rootRank
        x, outs = self._args(call, 2, lambda: (_array(_one(input_tensors, call, r), call, r),
                                               _arrays(_one(output_tensors, call, r), call, r) if root else None))
        F.gather(x, outs, group=self._group, group_dst=opts.rootRank)
        return _done(output_tensors)

    def scatter(self, output_tensors, input_tensors, opts):
        call, r = "scatter", self._rank
        root = r == opts.rootRank
        x, ins = self._args(call, 2, lambda: (_array(_one(output_tensors, call, r), call, r),
                                              _arrays(_one(input_tensors, call, r), call, r) if root else None))
        F.scatter(x, ins, group=self._group, group_src=opts.rootRank)
        return _done(output_tensors)

    def reduce_scatter(self, output_tensors, input_tensors, opts):
        call, r = "reduce_scatter", self._rank
        out, ins, op = self._args(call, 3, lambda: (_array(_one(output_tensors, call, r), call, r),
                                                    _arrays(_one(input_tensors, call, r), call, r),
                                                    _reduce(opts, output_tensors[0], call, r)))
        F.reduce_scatter(out, ins, op or "sum", self._group)
        _average(output_tensors[0], opts, self._size)
        return _done(output_tensors)

    def _reduce_scatter_base(self, output, input, opts):  # noqa: A002
        call, r = "reduce_scatter_tensor", self._rank
        out, x, op = self._args(call, 3, lambda: (_array(output, call, r), _array(input, call, r),
                                                  _reduce(opts, output, call, r)))
        F.reduce_scatter_tensor(out, x, op or "sum", self._group)
        _average(output, opts, self._size)
        return _done([output])

    reduce_scatter_single = _reduce_scatter_base

    def alltoall(self, output_tensors, input_tensors, opts):
        call, r = "all_to_all", self._rank
        outs, ins = self._args(call, 2, lambda: (_arrays(output_tensors, call, r), _arrays(input_tensors, call, r)))
        F.all_to_all(outs, ins, group=self._group)
        return _done(output_tensors)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts):  # noqa: A002
        call, r = "all_to_all_single", self._rank
        out, x = self._args(call, 2, lambda: (_array(output, call, r), _array(input, call, r)))
        F.all_to_all_single(out, x, list(output_split_sizes) or None, list(input_split_sizes) or None,
                            group=self._group)
        return _done([output])

    all_to_all_single = alltoall_base

    def barrier(self, opts):
        F.barrier(group=self._group)
        return _done([])

    # torch's coalescing manager hands over the calls it gathered: they run one after the other
    def allreduce_coalesced(self, tensors, opts):
        for t in tensors:
            self.allreduce([t], opts)
        return _done(tensors)

    def all_gather_single_coalesced(self, outputs, inputs, opts):
        for out, x in zip(outputs, inputs):
            self._allgather_base(out, x, opts)
        return _done(outputs)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts):
        for out, x in zip(outputs, inputs):
            self._reduce_scatter_base(out, x, opts)
        return _done(outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # --------------------------------------------------------------- what mpicoll does not do
    def _unsupported(self, call: str) -> None:
        raise NotImplementedError(f"{call}: not supported by the mpicoll backend (collectives only, no point-to-point "
                                  "send/recv); use a gloo group for it")

    def send(self, tensors, dst, tag):
        self._unsupported("send")

    def recv(self, tensors, src, tag):
        self._unsupported("recv")

    def recv_anysource(self, tensors, tag):
        self._unsupported("recv_anysource")

    def allgather_coalesced(self, output_lists, input_list, opts):
        self._unsupported("all_gather_coalesced")


def _create(backend_opts, options) -> ProcessGroupMpicoll:
    """The creator torch calls for ``init_process_group("mpicoll")`` and ``new_group`` (extended API:
    ``backend_opts`` carries the group's rank, size and world ranks)."""
    ranks = list(backend_opts.global_ranks_in_group) or list(range(backend_opts.group_size))
    world = MPI.COMM_WORLD
    mine = ranks[backend_opts.group_rank]
    if len(ranks) == world.Get_size():             # (the whole world, made on every rank: agree the ranks)
        # (on MPI_COMM_WORLD itself, not a LibComm: a set-up check of torch's ranks against MPI's,
        # made before mpicoll has made any communicator for this group)
        wrong = [(w, t) for w, t in enumerate(world.allgather(mine)) if w != t]
        if wrong:
            raise ValueError(f"the mpicoll backend: torch's ranks must be MPI's, but world ranks {[w for w, _ in wrong]} "
                             f"have torch ranks {[t for _, t in wrong]} (init_method='mpi://' takes them from MPI)")
    if ranks != sorted(ranks):
        raise ValueError(f"the mpicoll backend: new_group(ranks={ranks}, sort_ranks=False): a group's ranks follow "
                         "the world's order here (a comm domain); leave sort_ranks at True")
    return ProcessGroupMpicoll(backend_opts.group_rank, backend_opts.group_size, ranks, backend_opts.timeout)


class _LocalStore(dist.Store):
    """The store of ``mpi://``: this process's alone (the backend needs none). A key another rank
    would have set is an error at once, not a wait: a store-based group (gloo) or torch's
    ``TORCH_DIST_INIT_BARRIER`` needs a shared store (``env://``, ``tcp://``)."""

    def __init__(self) -> None:
        super().__init__()
        self._d: dict[str, bytes] = {}

    def _missing(self, key: str):
        raise RuntimeError(f"init_method='mpi://' has no store shared between the ranks (key {key!r} is not "
                           "here): the mpicoll backend needs none, but a store-based group (gloo) does: start with "
                           "init_method='env://' or 'tcp://...' for that")

    def set(self, key, value):
        self._d[key] = value if isinstance(value, bytes) else str(value).encode()

    def get(self, key):
        return self._d[key] if key in self._d else self._missing(key)

    def add(self, key, value):
        v = int(self._d.get(key, b"0")) + value
        self._d[key] = str(v).encode()
        return v

    def compare_set(self, key, expected, desired):
        as_bytes = lambda v: v if isinstance(v, bytes) else str(v).encode()  # noqa: E731
        if self._d.get(key, b"") == as_bytes(expected):
            self._d[key] = as_bytes(desired)
        return self._d.get(key, as_bytes(expected))

    def check(self, keys):
        return all(k in self._d for k in keys)

    def wait(self, keys, timeout=None):
        for k in keys:
            if k not in self._d:
                self._missing(k)

    def delete_key(self, key):
        return self._d.pop(key, None) is not None

    def num_keys(self):
        return len(self._d)


def _mpi_rendezvous(url: str, timeout: timedelta = timedelta(minutes=30), **kwargs):
    """``init_method="mpi://"``: MPI's rank and world size, and a store of this process alone. torch
    passes a ``rank=``/``world_size=`` given to ``init_process_group`` in the URL's query (-1: not
    given); one that is not MPI's is refused."""
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlparse(url).query))
    for key, mine in (("rank", rank), ("world_size", size)):
        given = query.get(key, kwargs.get(key, -1))
        if given not in (-1, "-1", None) and int(given) != mine:
            raise ValueError(f"init_process_group(init_method='mpi://', {key}={given}): MPI says {mine} on world "
                             f"rank {rank}; leave {key} out (mpi:// takes it from MPI)")
    yield _LocalStore(), rank, size


def _register() -> None:
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
    register_rendezvous_handler("mpi", _mpi_rendezvous)


_register()
