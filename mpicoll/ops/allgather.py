"""AllGather and AllGatherV: every rank gets every rank's data, in rank order."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import _shm
from .. import _validate as V
from .._numeric import copy_pairs
from .._params import CommParam
from .._call import Call
from .._plan import Plan
from .._thresholds import value
from .._numeric import pack
from ._base import Operation
from ._modes import PREPARE, RUN


__all__ = ["AllGatherOperation", "AllGatherParam", "AllGatherVOperation", "AllGatherVParam"]


@dataclass
class AllGatherParam(CommParam):
    """AllGather parameters: the common fields."""


@dataclass
class AllGatherVParam(CommParam):
    """AllGatherV parameters: the common fields (counts are execute inputs)."""


class AllGatherOperation(Operation):
    """Gather every rank's ``x`` to every rank, stacked on a new leading axis (as ATB).

    Example (4 ranks, ``x = np.array([[rank]], np.float32)``)::

        AllGatherOperation(AllGatherParam()).execute(x)   # shape (4, 1, 1): [[[0.]], [[1.]], [[2.]], [[3.]]]
    """

    NAME = "AllGather"
    PARAM = AllGatherParam
    RESIDES = True

    def execute(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Gather ``x`` from every rank.

        Args:
            x: this rank's input; the same shape and dtype on every rank; or ``out[rank]`` (in
                place, as nccl-tests: the gather reads a copy of it).
            out: a preallocated output of shape ``[rank_size, *x.shape]``.

        Returns:
            ``out``, or a new array of that shape; row i is rank i's x.
        """
        return self._call((x, out), RUN)

    def prepare(self, x: np.ndarray, out: np.ndarray | None = None) -> Plan:
        """A :class:`~mpicoll.Plan` of ``execute(x, out)``."""
        return self._call((x, out), PREPARE)

    def describe(self, x, out=None) -> Call:
        x, dt, src = self._data(x)
        shape = (self.size, *x.shape)
        if src is None and isinstance(out, np.ndarray) and out.shape == shape and V.same_elements(x, out[self.rank]):
            out = V.check_out(self.NAME, out, shape, x.dtype, self.rank)        # in place: x is out[rank]
            x, src = np.empty_like(x), x
        else:
            out = self._out(out, shape, x.dtype, x if src is None else src)
        call = Call(dt, x, out, x.shape)
        call.src = src
        if src is None:
            call.info = _shm.ref(self._lib, x)
        return call

    def issue(self, call, table, go) -> None:
        inputs = _shm.resident(self._lib, table, call.x)
        if _shm.copies(self._lib, call.out.nbytes, inputs, value("nodebuf.gather")):   # node buffers: copied once
            _shm.gather(go, self._lib, inputs, list(call.out.reshape(self.size, -1)))
            return
        m = call.dt.mpi
        go.mpi(self._lib, "Allgather", [call.x, m], [call.out, m])

    def ride(self, call):
        return call.x

    def land(self, call, rows, table, go) -> None:
        go.local(copy_pairs, list(zip(call.out.reshape(self.size, -1), rows)))

    def coalesce_key(self, call, exact=True) -> tuple | None:
        if not self._one_issue(AllGatherOperation):
            return None
        return ("AllGather", self._lib.ident, call.dt.code)

    def issue_many(self, calls, go) -> None:
        dt, n = calls[0].dt, self.size
        total = sum(c.x.size for c in calls)
        sin, sout = np.empty(total, dtype=dt.np), np.empty((n, total), dtype=dt.np)
        for c in calls:
            if c.src is not None:
                go.local(np.copyto, c.x, c.src)
        go.local(pack, [c.x.reshape(-1) for c in calls], sin)
        go.mpi(self._lib, "Allgather", [sin, dt.mpi], [sout, dt.mpi])
        pairs, pos = [], 0
        for c in calls:                   # call k's block of every rank's row of the merged gather
            pairs.append((c.out.reshape(n, c.x.size), sout[:, pos:pos + c.x.size]))
            pos += c.x.size
        go.local(copy_pairs, pairs)


class AllGatherVOperation(Operation):
    """Gather a different number of elements from every rank.

    This rank sends ``x.flat[:send_count]``; rank i's elements land at ``out[rdispls[i] :
    rdispls[i] + recv_counts[i]]``. ``recv_counts[i]`` must equal rank i's ``send_count``. Equal
    counts run MPI's ``Allgather`` (faster than its ``Allgatherv`` in MPICH), whatever the
    displacements.

    Example (2 ranks; rank 0 sends [0, 1], rank 1 sends [7])::

        AllGatherVOperation(AllGatherVParam()).execute(x, len(x), [2, 1], [0, 2])   # [0, 1, 7]
    """

    NAME = "AllGatherV"
    PARAM = AllGatherVParam
    RESIDES = True
    VALUES = ("send_count", "recv_counts", "rdispls")
    PAIR_NAMES = ("send_count", "recv_counts[{i}]")

    def execute(self, x: np.ndarray, send_count: int, recv_counts, rdispls, shape=None,
                out: np.ndarray | None = None) -> np.ndarray:
        """Gather ``send_count`` elements from every rank.

        Args:
            x: this rank's input; its first ``send_count`` elements (flattened) are sent.
            send_count: how many elements this rank sends (<= x.size).
            recv_counts, rdispls: ``rank_size`` integers each (lists, tuples, integer arrays or any
                iterable, read once): where rank i's elements land in the output.
            shape: the output's shape (a tuple, or an array whose shape is used), holding
                ``sum(recv_counts)`` elements; default 1-D.
            out: a preallocated output of that shape.

        Returns:
            ``out``, or a new array of ``sum(recv_counts)`` elements.
        """
        return self._call((x, send_count, recv_counts, rdispls, shape, out), RUN)

    def prepare(self, x: np.ndarray, send_count: int, recv_counts, rdispls, shape=None,
                out: np.ndarray | None = None) -> Plan:
        """A :class:`~mpicoll.Plan` of ``execute(x, send_count, recv_counts, rdispls, shape, out)``."""
        return self._call((x, send_count, recv_counts, rdispls, shape, out), PREPARE)

    def describe(self, x, send_count, recv_counts, rdispls, shape=None, out=None) -> Call:
        x, dt, src = self._data(x)
        op, r, n = self.NAME, self.rank, self.size
        sc = V.scalar_count(op, "send_count", send_count, r)
        if sc > x.size:
            raise V.arg_error(op, "send_count", sc, r, f"must be <= x.size={x.size}")
        rc = V.counts(op, "recv_counts", recv_counts, n, r)
        rd = V.counts(op, "rdispls", rdispls, n, r)
        total = sum(rc)
        packed = V.check_layout(op, "recv_counts", rc, "rdispls", rd, total, "sum(recv_counts)", r, receive=True)
        dims = _dims(shape, total)
        if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in dims) \
                or math.prod(dims) != total:
            raise V.arg_error(op, "shape", dims, r, f"must be dims >= 0 holding sum(recv_counts)={total} elements")
        out = self._out(out, dims, x.dtype, x if src is None else src)
        call = Call(dt, x, out)
        call.src, call.send, call.recv, call.args = src, [sc] * n, rc, (sc, rc, rd, packed)
        if src is None:
            call.info = _shm.ref(self._lib, x.reshape(-1)[:sc])
        return call

    def issue(self, call, table, go) -> None:
        x, out, m, (sc, rc, rd, packed), comm = call.x, call.out, call.dt.mpi, call.args, self._lib
        inputs = _shm.resident(comm, table, x, rc)        # (recv_counts: every rank's send count, agreed)
        if _shm.copies(comm, out.nbytes, inputs, value("nodebuf.gather")):
            flat = out.reshape(-1)
            _shm.gather(go, comm, inputs, [flat[d:d + c] for c, d in zip(rc, rd)])
            return
        send = [x, sc, m]
        if rc.count(rc[0]) != len(rc):
            go.mpi(comm, "Allgatherv", send, [out, (rc, rd), m])
            return
        # Every rank sends c elements: MPICH's Allgather is faster than its Allgatherv (1.3x at 8 B,
        # 2-2.5x at 8 MiB on 4 ranks). recv_counts are the ranks' send counts, the same list on every
        # rank, so every rank makes this choice; rdispls are each rank's own: a permuted layout is
        # gathered packed, then moved into place.
        c = rc[0]
        if not c or packed:
            go.mpi(comm, "Allgather", send, [out, m])
            return
        packed = np.empty(len(rc) * c, dtype=x.dtype)
        go.mpi(comm, "Allgather", send, [packed, m])
        go.local(_place, packed, out.reshape(-1), c, rd)

    def ride(self, call):
        return call.x.reshape(-1)[:call.args[0]]

    def land(self, call, rows, table, go) -> None:
        flat, (_, rc, rd, _) = call.out.reshape(-1), call.args          # (rows[i]: rank i's recv_counts[i])
        go.local(copy_pairs, [(flat[d:d + c], row) for c, d, row in zip(rc, rd, rows)])


def _place(packed: np.ndarray, flat: np.ndarray, c: int, rd: list[int]) -> None:
    for i, d in enumerate(rd):
        flat[d:d + c] = packed[i * c:(i + 1) * c]


def _dims(shape, total):
    """The output shape: 1-D of ``total``, or that of a shape reference (tuple or array)."""
    if shape is None:
        return (total,)
    if isinstance(shape, (int, np.integer)):
        return (shape,)
    return shape.shape if isinstance(shape, np.ndarray) else tuple(shape)
