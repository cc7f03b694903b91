"""The reduction building blocks every reducing operator shares: the reproducibility rule
(:func:`ordered`, :func:`invariant`), a reduce op's row for a dtype (:func:`reduction`), and THE
choice of a reduce-scatter's MPI calls (:func:`reduce_scatter`, :func:`alltoall_reduce`)."""
from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from .. import _shm
from .._comm import LibComm
from .._dtypes import DTYPES, DType, ReduceOp
from .._errors import arg_error
from .._making import tiers
from .._numeric import from_f32, pack, prefix, reduce_chunks, reduce_rows

#: A tree-order reduction (:func:`ordered`) that the node window does not take, of at most
#: this many bytes over all ranks' inputs (n x its size): an Allgather (a Reduce: Gather) of every
#: input, then a reduction in the tree order on every rank (the root; a ReduceScatter: of its own
#: block); above it, AllToAll + that reduction + AllGather (bandwidth-optimal: the Allgather moves
#: (n - 1) / 2 times its bytes).
#: Measured without the window (MPICOLL_SHM=0, one node, float32 and bfloat16, 3 and 4 ranks), per
#: rank's input: the Allgather took 0.55-0.77x the AllToAll path's time up to 4 KiB, 0.95-1.2x at
#: 8-16 KiB, 0.6-0.8x at 32-64 KiB (MPICH's AllToAll crosses its eager limit); 16 KiB a rank at 4
#: ranks, less at more ranks and on networks, where the bytes weigh more.
GATHERED_BYTES = 64 * 1024


#: A float reduction in the tree order over nodes aligned with it (:func:`aligned`) goes in tiers from
#: this many bytes of a rank's input (AllReduce: ``ops/allreduce._tiered``; ReduceScatter(V):
#: :func:`_tiered_reduce_scatter`). Measured on the test bed, 2 hosts x 2 ranks at 1 Gbit/s, float32
#: AllReduce, tiers / the flat path: 1.62 at 1 KiB, 1.33 at 4 KiB (the flat path's one Allgather), 0.41
#: at 16 KiB, 0.50 at 64 KiB, 0.56 at 1 MiB; bfloat16: 1.83, 1.10, 0.39, 0.73, and 0.87-1.02 at 1-8 MiB.
ALIGNED_TIERED_BYTES = 8 * 1024
_F32 = DTYPES["float32"]


def reduction(rop: ReduceOp, dt: DType, op: str, param: str, rank: int) -> ReduceOp:
    """``rop``'s row that reduces ``dt`` (:meth:`ReduceOp.on`: a bool's SUM is a logical or), what
    a call's ``reduce`` holds; an op that cannot reduce ``dt`` (AVG of integers) is an argument error."""
    why = rop.refuses(dt)
    if why is not None:
        raise arg_error(op, param, rop.name, rank, why)
    return rop.on(dt)


def ordered(comm: LibComm, dt: DType, rop: ReduceOp) -> bool:
    """THE reproducibility rule (docs/reproducibility.md): whether a reduction on ``comm`` must
    run on mpicoll's paths in the tree order (the shared window, :func:`alltoall_reduce`, a gather
    and :func:`~mpicoll._numeric.reduce_rows`; tiers on :func:`aligned` nodes), never in MPI's own
    reduction, whose order changes with the message size, the MPI library, even the rank: every
    float reduction over more than 1 member, with ``MPICOLL_EXACT`` on (``comm.exact``, agreed),
    but a SUM or PROD over 2 (one commutative operation per element: the same bits on any path).
    Integers are exact anyway; a float MAX or MIN is not (MPI's ``a > b ? a : b`` drops a NaN or
    picks a signed zero by its operands' order, which MPI varies; numpy's maximum in the tree order
    propagates NaN)."""
    return comm.exact and dt.floating and (comm.size > 2 or (comm.size == 2 and not rop.rounds))


def aligned(comm: LibComm) -> bool:
    """Whether ``comm``'s nodes are aligned with the tree order: several nodes (``per_node``), each
    holding consecutive ranks (``blocks``), the same power of two of them. Then every node's ranks
    form a subtree of the order (``[k 2^a, (k + 1) 2^a)``) and the tree over the nodes' partials is
    the rest of it: a tiered reduction computes the order's bits (both facts agreed at set-up)."""
    p = comm.per_node
    return comm.blocks and p > 1 and p & (p - 1) == 0


def invariant(comm: LibComm, dt: DType, rop: ReduceOp) -> bool:
    """Whether a reduction's bits cannot depend on its path (the message size, fusion into a larger
    message): integers, one member (a copy), the :func:`ordered` reductions, a float SUM or PROD
    over 2 members."""
    return not dt.floating or comm.size == 1 or ordered(comm, dt, rop) or (comm.size == 2 and rop.rounds)


def alltoall_reduce(go: Any, comm: LibComm, flat: np.ndarray, dt: DType, rop: ReduceOp, counts: np.ndarray,
                    displs: np.ndarray | None, out: np.ndarray, recv: np.ndarray | None = None,
                    block_type: MPI.Datatype | None = None) -> None:
    """Reduce-scatter as an AllToAll of the blocks plus a local reduction of this rank's block from
    every rank (``reduce_chunks``, the tree order): 16-bit floats travel as 16 bits and accumulate in
    float32; 8-bit integers reduce in numpy, faster than MPICH's own byte loop for large blocks.

    Block j (``counts[j]`` elements at ``displs[j]`` of ``flat``) goes to rank j; ``out`` receives
    this rank's reduced block (``counts[rank]`` elements). ``displs=None`` means packed and uniform
    counts (``Alltoall``, about 2x faster than ``Alltoallv`` in MPICH): callers pass it only when
    that holds on every rank. ``block_type``: one block per rank in this datatype (a block resized
    to a stride: the Hccl client's layouts). ``recv``: scratch of ``n * counts[rank]`` elements, or
    None (fresh).
    """
    n, c = comm.size, out.size
    recv = np.empty((n, c), dtype=dt.np) if recv is None else recv[:n * c].reshape(n, c)
    if block_type is not None:
        go.mpi(comm, "Alltoall", [flat, 1, block_type], [recv, c, dt.mpi])
    elif displs is None:
        go.mpi(comm, "Alltoall", [flat, dt.mpi], [recv, dt.mpi])
    else:
        go.mpi(comm, "Alltoallv", [flat, (counts, displs), dt.mpi], [recv, (np.full(n, c), np.arange(n) * c), dt.mpi])
    go.local(reduce_chunks, recv, dt, rop, out)


def reduce_scatter(go: Any, comm: LibComm, blocks: np.ndarray, counts: list[int], dt: DType, rop: ReduceOp,
                   out: np.ndarray, packed_everywhere: bool = True, block_type: MPI.Datatype | None = None,
                   recv: np.ndarray | None = None, inputs=None) -> None:
    """THE choice of a reduce-scatter's MPI calls (ReduceScatter, ReduceScatterV, the Hccl client).

    ``blocks``: this rank's blocks in rank order, packed (block j: ``counts[j]`` elements), or,
    with ``block_type``, one block per rank in that datatype. ``counts``: the blocks' sizes, the
    same list on every rank. ``packed_everywhere``: every rank's blocks are packed (agreed: a
    rank's layout is its own). On one node, packed blocks from ``_shm.REDUCE_SCATTER_BYTES`` on
    go through the node's shared window (:mod:`mpicoll._shm`). On nodes :func:`aligned` with the tree
    order, a reduction in it of at least ``ALIGNED_TIERED_BYTES`` of a rank's packed blocks goes node
    first (:func:`_tiered_reduce_scatter`). Otherwise MPI's own reduction runs
    for the dtypes it reduces natively when every rank's blocks are packed and the order cannot
    change the bits (not :func:`ordered`): ``Reduce_scatter_block`` for equal counts, else
    ``Reduce_scatter``; a tree-order reduction of every input at most ``GATHERED_BYTES`` an
    Allgather of every rank's blocks and a reduction of this rank's; otherwise an AllToAll of the
    blocks and a reduction in the tree order (:func:`alltoall_reduce`: float16/bfloat16 accumulated in
    float32). ``inputs``: every rank's
    ``blocks`` in a node buffer (:func:`_shm.resident`), read there by the window path.
    """
    equal = counts.count(counts[0]) == len(counts)
    if packed_everywhere and block_type is None and _shm.serves(comm, sum(counts) * dt.itemsize,
                                                                _shm.REDUCE_SCATTER_BYTES, inputs is None):
        _shm.reduce_scatter(go, comm, blocks, counts, dt, rop, out, inputs)     # one node: the shared window
        return
    order = ordered(comm, dt, rop)
    if order and packed_everywhere and block_type is None and sum(counts) * dt.itemsize >= ALIGNED_TIERED_BYTES \
            and aligned(comm):
        _tiered_reduce_scatter(go, comm, blocks, counts, dt, rop, out)      # nodes aligned with the tree
        return
    if dt.reduce != "float32" and packed_everywhere and not order:
        if equal:
            go.mpi(comm, "Reduce_scatter_block", [blocks, dt.mpi], [out, dt.mpi], rop.mpi)
        else:
            go.mpi(comm, "Reduce_scatter", [blocks, dt.mpi], [out, dt.mpi], counts, rop.mpi)
        return
    total, n = sum(counts), comm.size
    if order and packed_everywhere and block_type is None and n * total * dt.itemsize <= GATHERED_BYTES:
        rows = np.empty((n, total), dtype=dt.np)       # (every rank's blocks, then this rank's reduced in the tree order)
        a = sum(counts[:comm.rank])
        go.mpi(comm, "Allgather", [blocks, dt.mpi], [rows, dt.mpi])
        go.local(reduce_rows, [r[a:a + counts[comm.rank]] for r in rows], dt, rop, out)
        return
    c = np.array(counts, dtype=np.int64)
    alltoall_reduce(go, comm, blocks, dt, rop, c, None if equal or block_type is not None else prefix(counts), out,
                    recv, block_type)


def _tiered_reduce_scatter(go: Any, comm: LibComm, blocks: np.ndarray, counts: list[int], dt: DType,
                           rop: ReduceOp, out: np.ndarray) -> None:
    """A ReduceScatter(V) in the tree order over nodes aligned with it (:func:`aligned`), node first:
    the blocks bound for the k-th members of every node are put side by side (node order), a
    ReduceScatter on each node gives them to its k-th member reduced over the node (a subtree of the
    order), and a ReduceScatter among the k-th members of every node reduces each over the nodes (the
    rest of the tree). Each node's link carries ``(N - 1) / N`` of a rank's input per member, MPI's
    bytes, where the flat AllToAll sends ``p`` times that for ``p`` members a node. 16-bit floats go in
    float32 and are rounded once at the end (2x the bytes across nodes)."""
    node, across = tiers(comm)
    p, h, k = node.size, across.size, node.rank
    starts = prefix(counts)
    order = [a * p + j for j in range(p) for a in range(h)]         # member j of node a is rank a * p + j
    wide = _F32 if dt.reduce == "float32" else dt
    per_member = [sum(counts[a * p + j] for a in range(h)) for j in range(p)]
    mine_counts = [counts[a * p + k] for a in range(h)]
    total, c, q = sum(counts), per_member[k], mine_counts[across.rank]
    buf = go.scratch(np.empty, total + c + (q if wide is not dt else 0), wide.np)
    packed, mine, piece = buf[:total], buf[total:total + c], buf[total + c:]
    go.local(pack, [blocks[starts[r]:starts[r] + counts[r]] for r in order], packed)   # (16-bit: widened, exactly)
    reduce_scatter(go, node, packed, per_member, wide, rop, mine)
    if wide is dt:
        reduce_scatter(go, across, mine, mine_counts, dt, rop, out.reshape(-1))
    else:
        reduce_scatter(go, across, mine, mine_counts, wide, rop, piece)
        go.local(from_f32, piece, out.reshape(-1))
