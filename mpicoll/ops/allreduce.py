"""AllReduce: every rank gets the element-wise reduction of all ranks' inputs."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from .. import _shm
from .._dtypes import DTYPES
from .._making import tiers
from .._params import ReduceTypeParam
from .._call import Call
from .._plan import Plan
from .._numeric import average, copy_pairs, from_f32, pack, prefix, reduce_chunks, reduce_rows, scatter_pairs, split_even, to_f32
from ._base import ReduceTypeOperation
from ._modes import PREPARE, RUN
from . import _paths, _window
from .._thresholds import value
from ._paths import invariant, ordered
from ._reduce import alltoall_reduce, reduce_scatter



__all__ = ["AllReduceOperation", "AllReduceParam"]

_F32DT = DTYPES["float32"]
_F32 = _F32DT.mpi


@dataclass
class AllReduceParam(ReduceTypeParam):
    """AllReduce parameters: the common fields plus ``reduce_type`` (JSON ``allReduceType``)."""


class AllReduceOperation(ReduceTypeOperation):
    """Element-wise reduction over all ranks; every rank gets the result.

    Integers reduce in their own dtype and wrap on overflow, as MPI does; floats reduce in the
    tree order, the same bits on every path (docs/reproducibility.md); float16/bfloat16 accumulate
    in float32 and round once.

    Example (4 ranks, ``x = np.array([[rank]], np.float32)``)::

        AllReduceOperation(AllReduceParam(reduce_type="sum")).execute(x)   # [[6.]] on every rank
    """

    NAME = "AllReduce"
    PARAM = AllReduceParam
    RESIDES = True

    def execute(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Reduce ``x`` over all ranks.

        Args:
            x: this rank's input, any shape; the same shape and dtype on every rank.
            out: a preallocated output of x's shape and dtype, or ``x`` itself (in place).

        Returns:
            ``out``, or a new array of x's shape and dtype.
        """
        return self._call((x, out), RUN)

    def prepare(self, x: np.ndarray, out: np.ndarray | None = None) -> Plan:
        """A :class:`~mpicoll.Plan` of ``execute(x, out)``."""
        return self._call((x, out), PREPARE)

    def describe(self, x, out=None) -> Call:
        x, dt, src = self._data(x)
        out = self._out(out, x.shape, x.dtype, x if src is None else src, in_place_ok=src is None)
        call = Call(dt, x, out, x.shape)
        call.src, call.reduce = src, self._reduction(dt)
        if call.reduce.average:
            call.after = ((average, out, self.size),)
        if src is None:
            call.info = _shm.ref(self._lib, x)
        return call

    def issue(self, call, table, go) -> None:
        inputs = _shm.resident(self._lib, table, call.x)
        reduce_pieces(go, self._lib, call.x, call.out, call.dt, call.reduce, inputs=inputs)

    def ride(self, call):
        return call.x

    def land(self, call, rows, table, go) -> None:
        go.local(reduce_rows, rows, call.dt, call.reduce, call.out)    # (the tree order: the rule of every path)

    def coalesce_key(self, call, exact=True) -> tuple | None:
        """``exact``: only where the result cannot depend on the size of the message
        (:func:`~._paths.invariant`: always with ``MPICOLL_EXACT`` on)."""
        if (exact and not invariant(self._lib, call.dt, call.reduce)) or not self._one_issue(AllReduceOperation):
            return None
        return ("AllReduce", self._lib.ident, call.dt.code, self._rop.code)

    def issue_many(self, calls, go) -> None:
        dt, rop = calls[0].dt, calls[0].reduce
        staging = np.empty(sum(c.x.size for c in calls), dtype=dt.np)
        for c in calls:
            if c.src is not None:
                go.local(np.copyto, c.x, c.src)
        go.local(pack, [c.x.reshape(-1) for c in calls], staging)
        reduce_pieces(go, self._lib, staging, staging, dt, rop)
        go.local(copy_pairs, scatter_pairs(staging, [c.out for c in calls]))


def reduce_pieces(go, comm, x: np.ndarray, out: np.ndarray | None, dt, rop, root: int | None = None,
                  inputs=None) -> None:
    """The MPI calls of AllReduce (``root`` None: every rank gets ``out``) or Reduce (only rank
    ``root`` gets it; ``out`` None elsewhere), on the path :func:`~._paths.allreduce` picks from the
    dtype and the size alone (the same on every rank): the node's shared window (:mod:`mpicoll._shm`),
    tiers (:func:`_tiered`), MPI's own reduction in one call, or pieces (from ``allreduce.pieces``
    bytes, of its second value; below, one piece of the whole), each on the path
    :func:`~._paths.piece` picks. ``out`` may be ``x`` (in place). ``inputs``: every rank's ``x`` in
    a node buffer (:func:`_shm.resident`)."""
    n, in_place = comm.size, out is x
    path = _paths.allreduce(comm, x.nbytes, dt, rop, root is not None)
    if path == "window":
        _window.allreduce(go, comm, x, out, dt, rop, in_place, inputs)
    elif path == "tiers":
        _tiered(go, comm, x, out, dt, rop)
    elif path == "mpi":
        _native(go, comm, x, out, dt, rop, root, in_place)
    else:
        at, size = value("allreduce.pieces")
        pieced = x.nbytes >= at and n > 1
        flat, oflat = x.reshape(-1), None if out is None else out.reshape(-1)
        step = max(size // dt.itemsize, 1) if pieced else max(flat.size, 1)
        scratch: dict = {}                # the buffers the pieces share (they run one after the other)
        for s in range(0, flat.size, step):
            path = _piece(go, comm, flat[s:s + step], None if oflat is None else oflat[s:s + step], dt, rop, root,
                          in_place, scratch)
        path = f"pieces:{path}" if pieced else path
    go.took(path)


def _tiered(go, comm, x: np.ndarray, out: np.ndarray, dt, rop) -> None:
    """AllReduce over several nodes in tiers (:func:`~mpicoll._making.tiers`): a ReduceScatter among the
    members on each node (through its shared window: block k, in node rank order, to the node's
    k-th member), an AllReduce of block k among the k-th members of every node (each node's link
    carries ``2 (N - 1) / N`` of the message for N nodes, spread over its members), then an
    AllGather among the members on each node. In the tree order (nodes :func:`~._paths.aligned`)
    each tier reduces in it: a node's partial is the subtree of its ranks, and the tree over nodes
    is the rest; 16-bit floats then reduce in float32 until the end (:func:`_tiered_wide`).
    Otherwise (integers, ``MPICOLL_EXACT=0``) 16-bit floats round to their dtype between the tiers."""
    if dt.reduce == "float32" and ordered(comm, dt, rop):
        _tiered_wide(go, comm, x, out, dt, rop)
        return
    node, across = tiers(comm)
    flat, oflat = x.reshape(-1), out.reshape(-1)
    counts = split_even(flat.size, node.size)
    mine = np.empty(int(counts[node.rank]), dtype=dt.np)
    reduce_scatter(go, node, flat, [int(c) for c in counts], dt, rop, mine)
    reduce_pieces(go, across, mine, mine, dt, rop)
    go.mpi(node, "Allgatherv", [mine, dt.mpi], [oflat, (counts, prefix(counts)), dt.mpi])


def _tiered_wide(go, comm, x: np.ndarray, out: np.ndarray, dt, rop) -> None:
    """:func:`_tiered` of 16-bit floats in the tree order, rounded once: the message widened to
    float32, its ReduceScatter on each node in float32 (a node's partial), the ReduceScatter of
    block k among the k-th members of every node in float32 (the tree over the nodes), each piece
    rounded to the dtype once, then gathered in 16 bits: among those members, then on each node.
    Each node's link carries 1.5 times MPI's bytes (float32 one way, 16 bits back): the floor of
    "rounded once" (docs/scaling.md)."""
    node, across = tiers(comm)
    flat, oflat = x.reshape(-1), out.reshape(-1)
    counts, hosts = split_even(flat.size, node.size), across.size
    displs = prefix(counts)
    c, lo = int(counts[node.rank]), displs[node.rank]
    pieces = split_even(c, hosts)
    k, at = int(pieces[across.rank]), prefix(pieces)[across.rank]
    buf = go.scratch(np.empty, flat.size + c + k, np.float32)
    wide, mine, piece = buf[:flat.size], buf[flat.size:flat.size + c], buf[flat.size + c:]
    go.local(to_f32, flat, wide)
    reduce_scatter(go, node, wide, [int(v) for v in counts], _F32DT, rop, mine)
    reduce_scatter(go, across, mine, [int(v) for v in pieces], _F32DT, rop, piece)
    block = oflat[lo:lo + c]
    go.local(from_f32, piece, block[at:at + k])
    go.mpi(across, "Allgatherv", MPI.IN_PLACE, [block, (pieces, prefix(pieces)), dt.mpi])
    go.mpi(node, "Allgatherv", MPI.IN_PLACE, [oflat, (counts, displs), dt.mpi])


def _native(go, comm, x, out, dt, rop, root, in_place) -> None:
    m = dt.mpi
    if root is None:
        go.mpi(comm, "Allreduce", MPI.IN_PLACE if in_place else [x, m], [out, m], rop.mpi)
    else:
        mine = out is not None
        go.mpi(comm, "Reduce", MPI.IN_PLACE if mine and in_place else [x, m], [out, m] if mine else None, rop.mpi, root)


def _piece(go, comm, x, out, dt, rop, root, in_place, scratch) -> str:
    """One flat piece of :func:`reduce_pieces`, on the path :func:`~._paths.piece` picks; that path."""
    n, mine, m = comm.size, out is not None, dt.mpi
    path = _paths.piece(comm, x.nbytes, dt, rop)
    if path == "mpi":
        _native(go, comm, x, out, dt, rop, root, in_place)
        return path
    if path == "gather":                              # every input to every rank (the root), the tree order there
        rows = go.scratch(_rows, n, x.size, dt.np)
        if root is None:
            go.mpi(comm, "Allgather", [x, m], [rows, m])
        else:
            go.mpi(comm, "Gather", [x, m], [rows, m] if mine else None, root)
        if mine:
            go.local(reduce_chunks, rows, dt, rop, out)
        return path
    if path == "f32":
        if "f32" not in scratch:                      # (the first piece is the largest)
            scratch["f32"] = np.empty(x.size, dtype=np.float32)
        acc = scratch["f32"][:x.size]
        go.local(to_f32, x, acc)
        if root is None:
            go.mpi(comm, "Allreduce", MPI.IN_PLACE, [acc, _F32], rop.mpi)
        else:
            go.mpi(comm, "Reduce", MPI.IN_PLACE if mine else [acc, _F32], [acc, _F32] if mine else None, rop.mpi, root)
        if mine:
            go.local(from_f32, acc, out)
        return path
    # reduce-scatter as AllToAll + a local reduction (16-bit floats, large 8-bit ints), then AllGather / Gather
    counts = split_even(x.size, n)
    if "recv" not in scratch:                         # (the first piece is the largest)
        scratch["recv"], scratch["chunk"] = np.empty(n * int(counts[0]), dtype=dt.np), np.empty(int(counts[0]), dt.np)
    recv, chunk = scratch["recv"], scratch["chunk"][:int(counts[comm.rank])]
    even = x.size % n == 0
    displs = None if even else prefix(counts)
    alltoall_reduce(go, comm, x, dt, rop, counts, displs, chunk, recv)
    if root is None:
        go.mpi(comm, "Allgather" if even else "Allgatherv", [chunk, m], [out, m] if even else [out, (counts, displs), m])
    else:
        recv_spec = ([out, m] if even else [out, (counts, prefix(counts)), m]) if mine else None
        go.mpi(comm, "Gather" if even else "Gatherv", [chunk, m], recv_spec, root)
    return path


def _rows(n: int, size: int, dtype) -> np.ndarray:
    return np.empty((n, size), dtype=dtype)
