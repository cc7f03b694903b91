"""mpicoll as a torch.distributed backend (docs/torch.md).

    import torch.distributed as dist
    import mpicoll.torch                                      # registers "mpicoll" and mpi://
    dist.init_process_group("mpicoll", init_method="mpi://")  # rank and world size from MPI

Importing this module registers the backend ``"mpicoll"`` for CPU tensors and the init method
``mpi://`` (rank and world size are MPI's; the store is a TCPStore on world rank 0 whose address
MPI hands to the others, so that store-based groups, gloo's, can join the job: start-up in
:mod:`mpicoll._torch_store`). A group of ``dist.new_group(ranks)`` is an mpicoll comm domain of those
world ranks, on a communicator of its own.

Each collective of the group is one call of :mod:`mpicoll.functional`'s operation for it, on numpy
views of the tensors (:mod:`mpicoll._torch_views`: no copies), so it takes mpicoll's one pipeline:
described, agreed across the ranks (a mismatch, or a tensor or reduce op one rank cannot take,
raises the same ``CollectiveError`` on every rank of the group), issued. torch says in each call's
options whether it waits for it at once (``opts.asyncOp``: False from torch's Python API without
``async_op=True``): then the call runs here and its ``Work`` is complete; else (``async_op=True``,
DDP's reducer, FSDP, functional collectives) it runs on the communicator's worker thread while the
caller goes on, and its Work (:mod:`mpicoll._torch_work`) says when it has finished. Point-to-point
messages are posted and progressed (:mod:`mpicoll._messages`).

The backend is a ``ProcessGroup`` subclass on every torch it supports (2.13 and 2.14: torch 2.14's
Python c10d ``Backend`` route hands back a Work whose completion torch misreports, and names the
backend "custom" in DDP's logs). It answers what torch's own ProcessGroup would: its name
(``group_name``, how torch's C++ callers find a group) and its device (``_device_types``); it
unwraps a functional collective's result (:func:`mpicoll._torch_views.unwrapped`); under
``torch.compile`` its methods run as they are (:mod:`mpicoll._torch_compile`).
"""
from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI
from torch._C._distributed_c10d import AllgatherOptions
from torch.distributed.constants import default_pg_timeout
from torch.distributed.rendezvous import register_rendezvous_handler
from torch.profiler import record_function

from . import _adapters as A
from . import functional as F
from ._domains import user_comm
from ._errors import CollectiveError, arg_error
from ._messages import post, tag_ub
from ._rendezvous import create, rendezvous
from ._torch_monitor import barrier, on_a_cpu_backend
from ._torch_compile import eager_under_compile
from ._torch_store import exchange, mpi_rendezvous, refuse_other_world
from ._torch_store import world as start_world
from ._torch_views import array, arrays, one
from ._torch_work import Work

__all__ = ["BACKEND", "ProcessGroupMpicoll"]

#: the name to give ``init_process_group`` / ``new_group``
BACKEND = "mpicoll"

#: the options of a call made without them (torch's C++ callers pass theirs), by their type
_DEFAULTS: dict[type, Any] = {}

#: whether torch.profiler records (a backend's call is then an event of its own: ``mpicoll:<call>``)
_profiling = torch._C._autograd._profiler_enabled
_NOTHING = contextlib.nullcontext()

def _opts(kind: type) -> Any:
    """torch's default ``kind`` options (for a call made without options: ``opts or _opts(kind)``)."""
    opts = _DEFAULTS.get(kind)
    if opts is None:
        opts = _DEFAULTS[kind] = kind()
    return opts


@eager_under_compile
class ProcessGroupMpicoll(dist.ProcessGroup):
    """A torch.distributed process group on mpicoll (one per torch group; world ranks ``ranks``)."""

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
        self._ops: dict = {}                # its operations (functional's, one per call kind), compiled calls and all

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

    # torch's ProcessGroup answers these two from the backends registered with it, and a Python
    # ProcessGroup has none: FSDP's state dicts, DCP's async_save and broadcast_from_rank0 ask a group
    # for its device.
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
    def _run(self, cls: type, opts: Any, result: Any, build: Callable[[str, int], tuple], root: str | None = None,
             op: Any = None, event: bool = True) -> Work:
        """One call of the functional operation ``cls`` on this group: ``build(call, rank)`` maps
        torch's tensors to its arguments (one it cannot map is the call's error, agreed: raised on
        every rank of the group); ``root``: the name of ``opts.rootRank`` (src or dst); ``op``: the
        reduce op (``opts.reduceOp.op``). On the worker unless torch waits for it at once. While
        ``torch.profiler`` records, inside an event named as gloo's (``mpicoll:all_reduce``)."""
        if event and _profiling():
            with record_function(f"mpicoll:{cls.NAME}"):
                return self._run(cls, opts, result, build, root, op, False)
        call, r = cls.NAME, self._rank
        try:
            args, failed = build(call, r), None
        except CollectiveError as exc:
            args, failed = (), exc
        work = F.run(cls, self._group, args, opts.asyncOp, None, None if root is None else (root, None, opts.rootRank),
                     F.NO_OP if op is None else op, failed, self._ops)
        return Work(() if work is None else (work._handle,), result, call)

    def allreduce(self, tensors, opts=None):
        opts = opts or _opts(dist.AllreduceOptions)
        op = opts.reduceOp.op
        if len(tensors) == 1 and tensors[0].is_sparse:
            return self._sparse_allreduce(tensors[0], op)
        return self._run(A.AllReduce, opts, tensors, lambda c, r: (array(tensors, c, r, op=op),), op=op)

    def _sparse_allreduce(self, t: torch.Tensor, op: Any) -> Any:
        """A sparse COO tensor's SUM, as gloo makes it: every rank's indices and values gathered
        (two uneven AllGathers after one of the counts), summed by ``coalesce``; the result
        replaces ``t``'s contents."""
        call, r = "all_reduce", self._rank
        c = t.coalesce()
        indices = c.indices().t().contiguous()                    # (nnz, sparse dims)
        values = c.values().contiguous()                          # (nnz, *dense dims)
        counts = torch.empty(self._size, dtype=torch.int64)
        failed = None                       # (a bad op on one rank: raised by the first gather, everywhere)
        if op != dist.ReduceOp.RedOpType.SUM:
            failed = arg_error(call, "op", str(op), r, "a sparse tensor is reduced with SUM only")
        F.run(A.AllGatherIntoTensor, self._group, (array(counts, call, r), np.array([indices.shape[0]], np.int64)),
              False, None, failed=failed, ops=self._ops)
        n = counts.tolist()
        all_indices = torch.empty((sum(n), indices.shape[1]), dtype=indices.dtype)
        all_values = torch.empty((sum(n), *values.shape[1:]), dtype=values.dtype)
        F.all_gather_into_tensor_uneven(array(all_indices, call, r), array(indices, call, r), n, self._group)
        F.all_gather_into_tensor_uneven(array(all_values, call, r), array(values, call, r), n, self._group)
        total = torch.sparse_coo_tensor(all_indices.t(), all_values, t.shape).coalesce()
        with torch.no_grad():
            t.copy_(total)
        return Work((), [t], call)

    def broadcast(self, tensors, opts=None):
        return self._run(A.Broadcast, opts or _opts(dist.BroadcastOptions), tensors,
                         lambda c, r: (array(tensors, c, r),), "src")

    def reduce(self, tensors, opts=None):
        opts = opts or _opts(dist.ReduceOptions)
        op = opts.reduceOp.op
        return self._run(A.Reduce, opts, tensors, lambda c, r: (array(tensors, c, r, op=op),), "dst", op)

    def allgather(self, output_tensors, input_tensors, opts=None):
        return self._run(A.AllGatherList, opts or _opts(AllgatherOptions), output_tensors, lambda c, r: (
            arrays(one(output_tensors, c, r), c, r), array(input_tensors, c, r)))

    def _allgather_base(self, output, input, opts=None):  # noqa: A002 - torch's names
        return self._run(A.AllGatherIntoTensor, opts or _opts(AllgatherOptions), [output],
                         lambda c, r: (array(output, c, r), array(input, c, r)))

    all_gather_single = _allgather_base

    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts or _opts(dist.GatherOptions)
        return self._run(A.Gather, opts, output_tensors, lambda c, r: (
            array(input_tensors, c, r),
            arrays(one(output_tensors, c, r), c, r) if r == opts.rootRank else None), "dst")

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or _opts(dist.ScatterOptions)
        return self._run(A.Scatter, opts, output_tensors, lambda c, r: (
            array(output_tensors, c, r),
            arrays(one(input_tensors, c, r), c, r) if r == opts.rootRank else None), "src")

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or _opts(dist.ReduceScatterOptions)
        op = opts.reduceOp.op
        return self._run(A.ReduceScatterList, opts, output_tensors, lambda c, r: (
            array(output_tensors, c, r, op=op), arrays(one(input_tensors, c, r), c, r)), op=op)

    def _reduce_scatter_base(self, output, input, opts=None):  # noqa: A002
        opts = opts or _opts(dist.ReduceScatterOptions)
        op = opts.reduceOp.op
        return self._run(A.ReduceScatterTensor, opts, [output],
                         lambda c, r: (array(output, c, r, op=op), array(input, c, r, op=op)), op=op)

    reduce_scatter_single = _reduce_scatter_base

    def alltoall(self, output_tensors, input_tensors, opts=None):
        return self._run(A.AllToAllList, opts or _opts(dist.AllToAllOptions), output_tensors,
                         lambda c, r: (arrays(output_tensors, c, r), arrays(input_tensors, c, r)))

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):  # noqa: A002
        return self._run(A.AllToAllSingle, opts or _opts(dist.AllToAllOptions), [output], lambda c, r: (
            array(output, c, r), array(input, c, r), list(output_split_sizes) or None,
            list(input_split_sizes) or None))

    all_to_all_single = alltoall_base

    def barrier(self, opts=None):
        return self._run(A.Barrier, opts or _opts(dist.BarrierOptions), [], lambda c, r: ())

    # torch's coalescing manager hands over the calls it gathered: they run one after the other (on
    # the worker, in order, when torch does not wait at once), one Work for all
    def _each(self, method: Callable, pairs: list, opts: Any, result: Any) -> Work:
        works = [method(*pair, opts) for pair in pairs]
        return Work(tuple(h for w in works for h in w._handles), result, "coalesced")

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts or _opts(dist.AllreduceCoalescedOptions)
        return self._each(self.allreduce, [([t],) for t in tensors], opts, tensors)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        # (output_lists[rank][k] gets that rank's input_list[k]: one all_gather per input)
        return self._each(self.allgather, [([[outs[k] for outs in output_lists]], [x])
                                           for k, x in enumerate(input_list)], opts, output_lists)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self._each(self._allgather_base, list(zip(outputs, inputs)), opts, outputs)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return self._each(self._reduce_scatter_base, list(zip(outputs, inputs)), opts, outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # --------------------------------------------------------------- monitored_barrier, point-to-point
    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        """gloo's ``monitored_barrier``, ``dist.monitored_barrier()`` (on torch 2.13 too, whose own
        refuses every backend but gloo by name): :func:`mpicoll._torch_monitor.barrier`, for
        ``timeout`` (default: the group's; torch passes its ``BarrierOptions``)."""
        if isinstance(timeout, dist.BarrierOptions):
            timeout = timeout.timeout
        timeout = self._timeout if timeout is None else timeout
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
        self._barriers += 1                     # (after a bad timeout raised: the ranks' calls stay in step)
        barrier(self._group, self._rank, self._ranks, self._barriers, seconds, wait_all_ranks)

    def _message(self, call: str, tensors, peer: int | None, tag: int) -> Work:
        """A message posted on the group's communicator (:mod:`mpicoll._messages`): its Work."""
        r = self._rank
        if not 0 <= tag < tag_ub():
            raise arg_error(call, "tag", tag, r, f"must be in [0, {tag_ub()}) (MPI's TAG_UB is "
                            "monitored_barrier's)")
        sends = call == "send"
        with record_function(f"mpicoll:{call}") if _profiling() else _NOTHING:
            message = post("isend" if sends else "irecv", array(tensors, call, r), None, peer,
                           self._group, tag, "dst" if sends else "src")
        return Work((message,), tensors, call)

    def send(self, tensors, dstRank, tag):  # noqa: N803 - torch's names
        return self._message("send", tensors, dstRank, tag)

    def recv(self, tensors, srcRank, tag):  # noqa: N803
        return self._message("recv", tensors, srcRank, tag)

    def recv_anysource(self, tensors, tag):
        return self._message("recv", tensors, None, tag)


# ----------------------------------------------------------------------------- start-up

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
        refuse_other_world(backend_opts.group_size, "init_process_group")
        # (torch's ranks against MPI's, on mpicoll's world: no communicator of the group exists yet)
        seen = np.empty(MPI.COMM_WORLD.Get_size(), dtype=np.int64)
        world = start_world(limit)
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


def _register() -> None:
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
    register_rendezvous_handler("mpi", mpi_rendezvous)
    on_a_cpu_backend(BACKEND)


_register()
