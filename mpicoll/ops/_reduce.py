"""The reduction building blocks every reducing operator shares: a reduce op's row for a dtype
(:func:`reduction`), a reduce-scatter's MPI calls on the path :mod:`._paths` picks
(:func:`reduce_scatter`, :func:`alltoall_reduce`)."""
from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from . import _paths, _window
from .._comm import LibComm
from .._dtypes import DTYPES, DType, ReduceOp
from .._errors import arg_error
from .._making import tiers
from .._numeric import from_f32, pack, prefix, reduce_chunks, reduce_rows

_F32 = DTYPES["float32"]


def reduction(rop: ReduceOp, dt: DType, op: str, param: str, rank: int) -> ReduceOp:
    """``rop``'s row that reduces ``dt`` (:meth:`ReduceOp.on`: a bool's SUM is a logical or), what
    a call's ``reduce`` holds; an op that cannot reduce ``dt`` (AVG of integers) is an argument error."""
    why = rop.refuses(dt)
    if why is not None:
        raise arg_error(op, param, rop.name, rank, why)
    return rop.on(dt)


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
    """A reduce-scatter's MPI calls (ReduceScatter, ReduceScatterV, the Hccl client), on the path
    :func:`~._paths.reduce_scatter` picks.

    ``blocks``: this rank's blocks in rank order, packed (block j: ``counts[j]`` elements), or,
    with ``block_type``, one block per rank in that datatype. ``counts``: the blocks' sizes, the
    same list on every rank. ``packed_everywhere``: every rank's blocks are packed (agreed: a
    rank's layout is its own). ``window``: the node's shared window (:mod:`mpicoll._shm`);
    ``tiers``: node first (:func:`_tiered_reduce_scatter`); ``mpi``: ``Reduce_scatter_block`` for
    equal counts, else ``Reduce_scatter``; ``gather``: an Allgather of every rank's blocks and a
    reduction of this rank's in the tree order; ``alltoall``: an AllToAll of the blocks and a
    reduction in the tree order (:func:`alltoall_reduce`: float16/bfloat16 accumulated in float32).
    ``inputs``: every rank's ``blocks`` in a node buffer (:func:`mpicoll._shm.resident`), read there by the
    window path.
    """
    equal, total, n = counts.count(counts[0]) == len(counts), sum(counts), comm.size
    path = _paths.reduce_scatter(comm, total * dt.itemsize, dt, rop, packed_everywhere and block_type is None,
                                 inputs is None)
    if path == "window":
        _window.reduce_scatter(go, comm, blocks, counts, dt, rop, out, inputs)
    elif path == "tiers":
        _tiered_reduce_scatter(go, comm, blocks, counts, dt, rop, out)
    elif path == "mpi":
        if equal:
            go.mpi(comm, "Reduce_scatter_block", [blocks, dt.mpi], [out, dt.mpi], rop.mpi)
        else:
            go.mpi(comm, "Reduce_scatter", [blocks, dt.mpi], [out, dt.mpi], counts, rop.mpi)
    elif path == "gather":
        rows = np.empty((n, total), dtype=dt.np)       # (every rank's blocks, then this rank's reduced in the tree order)
        a = sum(counts[:comm.rank])
        go.mpi(comm, "Allgather", [blocks, dt.mpi], [rows, dt.mpi])
        go.local(reduce_rows, [r[a:a + counts[comm.rank]] for r in rows], dt, rop, out)
    else:
        c = np.array(counts, dtype=np.int64)
        alltoall_reduce(go, comm, blocks, dt, rop, c, None if equal or block_type is not None else prefix(counts),
                        out, recv, block_type)
    go.took(path)                                     # (after the tiers' own reduce-scatters: this call's path)


def _tiered_reduce_scatter(go: Any, comm: LibComm, blocks: np.ndarray, counts: list[int], dt: DType,
                           rop: ReduceOp, out: np.ndarray) -> None:
    """A ReduceScatter(V) in the tree order over nodes aligned with it (:func:`~._paths.aligned`), node first:
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
