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
future set (``async_op=True`` is accepted and changes nothing). Point-to-point calls and reduce ops
MPI has no counterpart for here raise ``NotImplementedError`` naming the call.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import ml_dtypes
import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI
from torch._C._distributed_c10d import _create_work_from_future
from torch.distributed.rendezvous import register_rendezvous_handler

from . import functional as F
from ._errors import CollectiveArgumentError

__all__ = ["BACKEND", "ProcessGroupMpicoll"]

#: the name to give ``init_process_group`` / ``new_group``
BACKEND = "mpicoll"

_R = dist.ReduceOp.RedOpType
#: torch's reduce ops -> mpicoll's (AVG: a sum, then a division; bool: logical or/and as max/min)
_REDUCE = {_R.SUM: "sum", _R.PRODUCT: "prod", _R.MIN: "min", _R.MAX: "max", _R.AVG: "sum"}
_BOOL_REDUCE = {"sum": "max", "prod": "min", "min": "min", "max": "max"}


def _array(t: torch.Tensor, call: str) -> np.ndarray:
    """A numpy view of the CPU tensor ``t`` (shares its memory; bfloat16 via int16, bool via uint8)."""
    if t.device.type != "cpu":
        raise CollectiveArgumentError(f"{call}: a tensor on {t.device}: the mpicoll backend takes CPU tensors",
                                      op=call, param="tensor")
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if t.dtype == torch.bool:
        return t.view(torch.uint8).numpy()
    return t.numpy()


def _arrays(ts, call: str) -> list[np.ndarray]:
    return [_array(t, call) for t in ts]


def _one(tensors, call: str) -> torch.Tensor:
    if len(tensors) != 1:
        raise CollectiveArgumentError(f"{call}: {len(tensors)} tensors: the mpicoll backend takes one tensor per "
                                      "call (one device per process)", op=call, param="tensors")
    return tensors[0]


def _reduce(op: Any, t: torch.Tensor, call: str) -> str:
    """mpicoll's name of torch's reduce op ``op`` (a ``ReduceOp`` of the options) for tensors like ``t``."""
    op = op.op
    name = _REDUCE.get(op)
    if name is None:
        raise NotImplementedError(f"{call}: reduce op {op}: the mpicoll backend has SUM, PRODUCT, MIN, MAX and "
                                  "AVG (floating point)")
    if op == _R.AVG and not t.is_floating_point():
        raise NotImplementedError(f"{call}: ReduceOp.AVG on {t.dtype}: only floating-point tensors are averaged")
    return _BOOL_REDUCE[name] if t.dtype == torch.bool else name


def _done(result: Any) -> Any:
    """A complete ``Work`` whose future holds ``result`` (torch's form for a finished call)."""
    fut = torch.futures.Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


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
    def allreduce(self, tensors, opts):
        t = _one(tensors, "all_reduce")
        F.all_reduce(_array(t, "all_reduce"), _reduce(opts.reduceOp, t, "all_reduce"), self._group)
        if opts.reduceOp.op == _R.AVG:
            t.div_(self._size)
        return _done(tensors)

    def broadcast(self, tensors, opts):
        t = _one(tensors, "broadcast")
        F.broadcast(_array(t, "broadcast"), group=self._group, group_src=opts.rootRank)
        return _done(tensors)

    def reduce(self, tensors, opts):
        t = _one(tensors, "reduce")
        F.reduce(_array(t, "reduce"), op=_reduce(opts.reduceOp, t, "reduce"), group=self._group,
                 group_dst=opts.rootRank)
        if opts.reduceOp.op == _R.AVG and self._rank == opts.rootRank:
            t.div_(self._size)
        return _done(tensors)

    def allgather(self, output_tensors, input_tensors, opts):
        outs, t = _one(output_tensors, "all_gather"), _one(input_tensors, "all_gather")
        F.all_gather(_arrays(outs, "all_gather"), _array(t, "all_gather"), group=self._group)
        return _done(output_tensors)

    def _allgather_base(self, output, input, opts):  # noqa: A002 - torch's names
        F.all_gather_into_tensor(_array(output, "all_gather_into_tensor"), _array(input, "all_gather_into_tensor"),
                                 group=self._group)
        return _done([output])

    all_gather_single = _allgather_base

    def gather(self, output_tensors, input_tensors, opts):
        t = _one(input_tensors, "gather")
        outs = _arrays(_one(output_tensors, "gather"), "gather") if self._rank == opts.rootRank else None
        F.gather(_array(t, "gather"), outs, group=self._group, group_dst=opts.rootRank)
        return _done(output_tensors)

    def scatter(self, output_tensors, input_tensors, opts):
        t = _one(output_tensors, "scatter")
        ins = _arrays(_one(input_tensors, "scatter"), "scatter") if self._rank == opts.rootRank else None
        F.scatter(_array(t, "scatter"), ins, group=self._group, group_src=opts.rootRank)
        return _done(output_tensors)

    def reduce_scatter(self, output_tensors, input_tensors, opts):
        t, ins = _one(output_tensors, "reduce_scatter"), _one(input_tensors, "reduce_scatter")
        F.reduce_scatter(_array(t, "reduce_scatter"), _arrays(ins, "reduce_scatter"),
                         _reduce(opts.reduceOp, t, "reduce_scatter"), self._group)
        if opts.reduceOp.op == _R.AVG:
            t.div_(self._size)
        return _done(output_tensors)

    def _reduce_scatter_base(self, output, input, opts):  # noqa: A002
        call = "reduce_scatter_tensor"
        F.reduce_scatter_tensor(_array(output, call), _array(input, call), _reduce(opts.reduceOp, output, call),
                                self._group)
        if opts.reduceOp.op == _R.AVG:
            output.div_(self._size)
        return _done([output])

    reduce_scatter_single = _reduce_scatter_base

    def alltoall(self, output_tensors, input_tensors, opts):
        F.all_to_all(_arrays(output_tensors, "all_to_all"), _arrays(input_tensors, "all_to_all"), group=self._group)
        return _done(output_tensors)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts):  # noqa: A002
        call = "all_to_all_single"
        F.all_to_all_single(_array(output, call), _array(input, call), list(output_split_sizes) or None,
                            list(input_split_sizes) or None, group=self._group)
        return _done([output])

    all_to_all_single = alltoall_base

    def barrier(self, opts):
        F.barrier(group=self._group)
        return _done([])

    # --------------------------------------------------------------- what mpicoll does not do
    def _unsupported(self, call: str) -> None:
        raise NotImplementedError(f"{call}: not supported by the mpicoll backend (collectives only: no "
                                  "point-to-point send/recv, no coalesced calls); use gloo for it")

    def send(self, tensors, dst, tag):
        self._unsupported("send")

    def recv(self, tensors, src, tag):
        self._unsupported("recv")

    def recv_anysource(self, tensors, tag):
        self._unsupported("recv_anysource")

    def allreduce_coalesced(self, tensors, opts):
        self._unsupported("all_reduce_coalesced")

    def allgather_coalesced(self, output_lists, input_list, opts):
        self._unsupported("all_gather_coalesced")

    def monitored_barrier(self, *args, **kwargs):
        self._unsupported("monitored_barrier")


def _create(backend_opts, options) -> ProcessGroupMpicoll:
    """The creator torch calls for ``init_process_group("mpicoll")`` and ``new_group`` (extended API:
    ``backend_opts`` carries the group's rank, size and world ranks)."""
    ranks = list(backend_opts.global_ranks_in_group) or list(range(backend_opts.group_size))
    mine, mpi = ranks[backend_opts.group_rank], MPI.COMM_WORLD.Get_rank()
    if mine != mpi or len(ranks) > MPI.COMM_WORLD.Get_size():
        raise ValueError(f"the mpicoll backend: torch's rank {mine} of {len(ranks)} is MPI's world rank {mpi} of "
                         f"{MPI.COMM_WORLD.Get_size()}: torch's ranks must be MPI's (init_method='mpi://' takes them "
                         "from MPI)")
    return ProcessGroupMpicoll(backend_opts.group_rank, backend_opts.group_size, ranks, backend_opts.timeout)


def _mpi_rendezvous(url: str, timeout: timedelta = timedelta(minutes=30), **kwargs):
    """``init_method="mpi://"``: MPI's rank and world size, and a store of this process alone."""
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    for key, given in (("rank", kwargs.get("rank", -1)), ("world_size", kwargs.get("world_size", -1))):
        mine = rank if key == "rank" else size
        if given not in (-1, None) and int(given) != mine:
            raise ValueError(f"init_process_group(init_method='mpi://', {key}={given}): MPI says {mine} on world "
                             f"rank {rank}; leave {key} out (mpi:// takes it from MPI)")
    yield dist.HashStore(), rank, size


def _register() -> None:
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
    register_rendezvous_handler("mpi", _mpi_rendezvous)


_register()
