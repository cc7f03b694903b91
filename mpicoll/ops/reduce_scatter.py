"""ReduceScatter and ReduceScatterV: reduce over all ranks, each rank keeps one block."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import _shm
from .. import _validate as V
from .._numeric import average, reduce_rows
from .._params import ReduceTypeParam
from .._call import Call
from .._plan import Plan
from ._base import ReduceTypeOperation
from ._modes import PREPARE, RUN
from ._reduce import reduce_scatter


__all__ = ["ReduceScatterOperation", "ReduceScatterParam", "ReduceScatterVOperation", "ReduceScatterVParam"]


@dataclass
class ReduceScatterParam(ReduceTypeParam):
    """ReduceScatter parameters: the common fields plus ``reduce_type`` (JSON ``reduceType``)."""


@dataclass
class ReduceScatterVParam(ReduceTypeParam):
    """ReduceScatterV parameters: the common fields plus ``reduce_type`` (counts are execute inputs)."""


class ReduceScatterOperation(ReduceTypeOperation):
    """Reduce ``x`` over all ranks, then rank r keeps block r of dim 0.

    float16/bfloat16 accumulate in float32 and round once; integers wrap, as in MPI.

    Example (4 ranks, every rank ``x = np.array([[0], [1], [2], [3]], np.float32)``)::

        ReduceScatterOperation(ReduceScatterParam()).execute(x)   # rank 0: [[0.]], rank 1: [[4.]], ...
    """

    NAME = "ReduceScatter"
    RESIDES = True
    PARAM = ReduceScatterParam

    def execute(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Reduce ``x`` over all ranks and keep this rank's block.

        Args:
            x: this rank's input; ``x.shape[0]`` divisible by rank_size; the same shape everywhere.
            out: a preallocated output of shape ``[x.shape[0] // rank_size, *x.shape[1:]]``, or
                x's block ``rank`` of dim 0 (in place, as nccl-tests: x is read from a copy first).

        Returns:
            ``out``, or a new array of that shape: the reduction of block ``rank`` of dim 0.
        """
        return self._call((x, out), RUN)

    def prepare(self, x: np.ndarray, out: np.ndarray | None = None) -> Plan:
        """A :class:`~mpicoll.Plan` of ``execute(x, out)``."""
        return self._call((x, out), PREPARE)

    def describe(self, x, out=None) -> Call:
        x, dt, src = self._data(x)
        V.check_dim0(self.NAME, x, self.size, self.rank)
        k = x.shape[0] // self.size
        if src is None and V.same_elements(out, x[self.rank * k:(self.rank + 1) * k]):
            out = V.check_out(self.NAME, out, out.shape, x.dtype, self.rank)   # in place: out is x's block rank
            x, src = np.empty_like(x), x
        else:
            out = self._out(out, (k, *x.shape[1:]), x.dtype, x if src is None else src)
        call = Call(dt, x, out, x.shape)
        call.src, call.reduce = src, self._reduction(dt)
        if call.reduce.average:
            call.after = ((average, out, self.size),)
        if src is None:
            call.info = _shm.ref(self._lib, x)
        return call

    def issue(self, call, table, go) -> None:
        x = call.x.reshape(-1)
        reduce_scatter(go, self._lib, x, [x.size // self.size] * self.size, call.dt, call.reduce, call.out,
                       inputs=_shm.resident(self._lib, table, x))

    def ride(self, call):
        return call.x

    def land(self, call, rows, table, go) -> None:
        k, me = call.out.size, self.rank
        go.local(reduce_rows, [r[me * k:(me + 1) * k] for r in rows], call.dt, call.reduce, call.out)


class ReduceScatterVOperation(ReduceTypeOperation):
    """Reduce-scatter with a different block size per rank.

    Block j of this rank is ``x.flat[sdispls[j] : sdispls[j] + send_counts[j]]``; rank j receives
    the reduction over all ranks of their block j, a 1-D array of ``recv_count`` elements.
    ``send_counts[j]`` must equal rank j's ``recv_count`` on every rank (so all ranks'
    ``send_counts`` agree); displacements are each rank's own and may leave gaps or permute the
    blocks. The MPI calls are ReduceScatter's (``_base.reduce_scatter``): equal counts run MPI's
    ``Reduce_scatter_block`` where MPI's order cannot change the bits.

    Example (2 ranks, ``x = [1, 2, 3]`` on both, ``send_counts=[1, 2]``, ``sdispls=[0, 1]``)::

        rank 0: execute(x, [1, 2], [0, 1], 1) -> [2]     rank 1: execute(x, [1, 2], [0, 1], 2) -> [4, 6]
    """

    NAME = "ReduceScatterV"
    RESIDES = True
    PARAM = ReduceScatterVParam
    VALUES = ("send_counts", "sdispls", "recv_count")
    PAIR_NAMES = ("send_counts[{j}]", "recv_count")

    def execute(self, x: np.ndarray, send_counts, sdispls, recv_count: int,
                out: np.ndarray | None = None) -> np.ndarray:
        """Reduce each rank's block j over all ranks into rank j.

        Args:
            x: this rank's input (its blocks, in any order, with gaps allowed).
            send_counts, sdispls: ``rank_size`` integers each (lists, tuples, integer arrays or any
                iterable, read once): block j's size and offset in ``x.flat``.
            recv_count: this rank's block size (= every rank's ``send_counts[rank]``).
            out: a preallocated 1-D output of ``recv_count`` elements.

        Returns:
            ``out``, or a new 1-D array of ``recv_count`` elements.
        """
        return self._call((x, send_counts, sdispls, recv_count, out), RUN)

    def prepare(self, x: np.ndarray, send_counts, sdispls, recv_count: int,
                out: np.ndarray | None = None) -> Plan:
        """A :class:`~mpicoll.Plan` of ``execute(x, send_counts, sdispls, recv_count, out)``."""
        return self._call((x, send_counts, sdispls, recv_count, out), PREPARE)

    def describe(self, x, send_counts, sdispls, recv_count, out=None) -> Call:
        x, dt, src = self._data(x)
        op, r, n = self.NAME, self.rank, self.size
        sc = V.counts(op, "send_counts", send_counts, n, r)
        sd = V.counts(op, "sdispls", sdispls, n, r)
        packed = V.check_layout(op, "send_counts", sc, "sdispls", sd, x.size, "x.size", r)
        rc = V.scalar_count(op, "recv_count", recv_count, r)
        out = self._out(out, (rc,), x.dtype, x if src is None else src)
        call = Call(dt, x, out)
        call.src, call.reduce, call.send, call.recv, call.args = src, self._reduction(dt), sc, [rc] * n, (sc, sd)
        if call.reduce.average:
            call.after = ((average, out, n),)
        if packed and src is None:            # (where its packed blocks lie: in a node buffer?)
            call.info = V.BIT_PACKED | _shm.ref(self._lib, x.reshape(-1)[:sum(sc)])
        else:
            call.info = int(packed)
        return call

    def issue(self, call, table, go) -> None:
        x, out, dt, (sc, sd), comm = call.x, call.out, call.dt, call.args, self._lib
        flat = x.reshape(-1)
        # send_counts are the same list on every rank (each is a rank's recv_count): every rank
        # decides alike from them; the layout is each rank's own
        inputs = None
        if call.info & V.BIT_PACKED:
            blocks = flat[:sum(sc)]
            inputs = _shm.resident(comm, table, blocks)     # (every rank's blocks packed in a node buffer)
        else:                   # (packed into rank order first: every rank then has packed blocks)
            blocks = np.empty(sum(sc), dtype=x.dtype)
            go.local(_pack, flat, sc, sd, blocks)
        reduce_scatter(go, comm, blocks, sc, dt, call.reduce, out, inputs=inputs)

    def ride(self, call):
        sc = call.args[0]
        return call.x.reshape(-1)[:sum(sc)] if call.info & V.BIT_PACKED else None   # (gapped blocks: issue packs)

    def land(self, call, rows, table, go) -> None:
        sc, me = call.args[0], self.rank                       # (send_counts: the same list on every rank)
        at = sum(sc[:me])
        go.local(reduce_rows, [r[at:at + sc[me]] for r in rows], call.dt, call.reduce, call.out)


def _pack(flat: np.ndarray, counts: list[int], displs: list[int], blocks: np.ndarray) -> None:
    """Copy the blocks of a gapped or permuted layout into rank order."""
    pos = 0
    for c, d in zip(counts, displs):
        blocks[pos:pos + c] = flat[d:d + c]
        pos += c
