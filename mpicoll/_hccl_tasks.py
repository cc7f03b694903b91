"""The task kinds of the ``Hccl`` client (:mod:`mpicoll.hccl`): each an internal operation on the
client's domain (``Hccl.AllReduce``, ...), whose ``describe`` checks the kernel-style arguments
(counts, strides, ``repeat``) and whose ``issue`` makes the MPI calls of round ``call.round`` of
``call.rounds`` (the task's ``repeat``): a prepared task's plan has one part per round. A strided
layout is an MPI derived datatype (a contiguous block resized to the stride), so one MPI call moves
every block of a round.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from . import _validate as V
from ._call import Call
from ._dtypes import lookup as dtype_row, reduce_op
from ._errors import arg_error
from ._numeric import average
from ._params import CommParam
from .ops._base import Operation
from .ops._reduce import reduce_scatter, reduction
from .ops.allreduce import reduce_pieces


class Task(Operation):
    """A task kind of the client: an internal operation on the client's domain, whose prepare records
    one plan part per round (the client's own rules for a prepare come as the call's ``failed``)."""

    PUBLIC = False

    def __init__(self, param: CommParam, timeout: float | None) -> None:
        super().__init__(param, timeout=timeout)          # (its prepares always agree)
        self.types: list[MPI.Datatype] = []        # derived datatypes of its tasks (freed by finalize)

    def issue(self, call: Call, table: np.ndarray | None, go: Any) -> None:
        """The MPI calls of round ``call.round`` (of ``call.rounds``: the task's ``repeat``)."""
        raise NotImplementedError


class BlockTask(Task):
    """AllReduce, AllGather, ReduceScatter, AllToAll: ``count`` elements per block, per round."""

    def _strided(self, call: Call, c: int, s: int) -> MPI.Datatype | None:
        """The datatype of one block of ``c`` elements every ``s`` (None: blocks are packed)."""
        if s == c or c == 0:
            return None
        if call.type is None:
            call.type = call.dt.mpi.Create_contiguous(c).Create_resized(0, s * call.dt.itemsize).Commit()
            self.types.append(call.type)
        return call.type

    def describe(self, send, recv, count, dtype, rop, stride_count, repeat) -> Call:
        op, rank, n, kind = self.NAME, self.rank, self.size, self.NAME[5:]
        dt, x, y = _buffers(op, rank, send, recv, dtype, in_place_ok=kind == "AllReduce")
        c = V.scalar_count(op, "count", count, rank)
        s = V.scalar_count(op, "stride_count", stride_count, rank) or c
        r = _repeat(op, rank, repeat)
        if s < c:
            raise arg_error(op, "stride_count", s, rank, f"must be 0 or >= the count ({c}): blocks may not overlap")
        span, how = (r - 1) * c + (n - 1) * s + c, "(repeat-1)*count + (rank_size-1)*stride + count"
        need = {"AllReduce": ((r * c, "repeat*count"),) * 2, "AllGather": ((r * c, "repeat*count"), (span, how)),
                "ReduceScatter": ((span, how), (r * c, "repeat*count")), "AllToAll": ((span, how), (span, how))}[kind]
        for name, buf, (k, why) in zip(("send", "recv"), (x, y), need):
            _need(op, rank, name, buf, k if c else 0, why)
        if kind in ("AllGather", "AllToAll") and r > 1 and n > 1 and c and s < r * c:
            raise arg_error(op, "stride_count", stride_count, rank, f"with repeat={r}, must be >= repeat*count = "
                            f"{r * c}: else a later round's blocks overwrite an earlier round's in recv")
        call = Call(dt, x, y, (c, r))
        call.info = V.BIT_PACKED if s == c or c == 0 else 0       # (each rank's own layout; issue reads all)
        call.reduce = None if rop is None else reduction(reduce_op(rop, op=op, param="op", rank=rank), dt, op, "op", rank)
        call.args, call.rounds, call.type, call.in_place = (c, s), r, None, send is recv
        call.result = recv
        return call


class AllReduce(BlockTask):
    NAME = "Hccl.AllReduce"

    def issue(self, call, table, go) -> None:
        k = call.round
        c = call.args[0]
        x = call.x[k * c:(k + 1) * c]
        out = x if call.in_place else call.out[k * c:(k + 1) * c]
        reduce_pieces(go, self._lib, x, out, call.dt, call.reduce)
        if call.reduce.average:
            go.local(average, out, self.size)


class AllGather(BlockTask):
    NAME = "Hccl.AllGather"

    def issue(self, call, table, go) -> None:
        k = call.round
        (c, s), m, n = call.args, call.dt.mpi, self.size
        t = self._strided(call, c, s)
        recv = [call.out[k * c:k * c + n * c], m] if t is None else [call.out[k * c:], 1, t]
        go.mpi(self._lib, "Allgather", [call.x[k * c:(k + 1) * c], m], recv)


class ReduceScatter(BlockTask):
    NAME = "Hccl.ReduceScatter"

    def issue(self, call, table, go) -> None:
        k = call.round
        (c, s), n = call.args, self.size
        t = self._strided(call, c, s)
        if not hasattr(call, "scratch"):             # (rounds run one after the other: one scratch)
            call.scratch = np.empty(n * c, dtype=call.dt.np)
        blocks = call.x[k * c:k * c + n * c] if t is None else call.x[k * c:]
        # the strides are each rank's own layout: MPI's own reduce-scatter only when every rank's
        # blocks are packed (agreed), so that every rank makes the same collective
        packed_everywhere = all(b & V.BIT_PACKED for b in table[:, V.H_INFO].tolist())
        out = call.out[k * c:(k + 1) * c]
        reduce_scatter(go, self._lib, blocks, [c] * n, call.dt, call.reduce, out, packed_everywhere, t, call.scratch)
        if call.reduce.average:
            go.local(average, out, self.size)


class AllToAll(BlockTask):
    NAME = "Hccl.AllToAll"

    def issue(self, call, table, go) -> None:
        k = call.round
        (c, s), m, n = call.args, call.dt.mpi, self.size
        t = self._strided(call, c, s)
        if t is None:
            go.mpi(self._lib, "Alltoall", [call.x[k * c:k * c + n * c], m], [call.out[k * c:k * c + n * c], m])
        else:
            go.mpi(self._lib, "Alltoall", [call.x[k * c:], 1, t], [call.out[k * c:], 1, t])


class AllToAllV(Task):
    NAME = "Hccl.AllToAllV"
    PAIR_NAMES = ("send_counts[{j}]", "recv_counts[{i}]")

    def describe(self, send, send_layout, recv, recv_layout, dtype, repeat) -> Call:
        op, rank, n = self.NAME, self.rank, self.size
        dt, x, y = _buffers(op, rank, send, recv, dtype)
        r = _repeat(op, rank, repeat)
        sc, sd = (V.counts(op, name, v, n, rank) for name, v in zip(("send_counts", "sdispls"), send_layout))
        rc, rd = (V.counts(op, name, v, n, rank) for name, v in zip(("recv_counts", "rdispls"), recv_layout))
        # every round's blocks: peer j's r blocks of c[j] elements, from d[j] on, one after the other
        V.check_layout(op, "send_counts", [r * c for c in sc], "sdispls", sd, x.size, "send.size", rank)
        V.check_layout(op, "recv_counts", [r * c for c in rc], "rdispls", rd, y.size, "recv.size", rank, receive=True)
        call = Call(dt, x, y, (r,))
        call.send, call.recv, call.args, call.rounds = sc, rc, (sc, sd, rc, rd), r
        call.result = recv
        return call

    def issue(self, call, table, go) -> None:
        k = call.round
        sc, sd, rc, rd = call.args
        m = call.dt.mpi
        go.mpi(self._lib, "Alltoallv", [call.x, (sc, [d + k * c for c, d in zip(sc, sd)]), m],
               [call.out, (rc, [d + k * c for c, d in zip(rc, rd)]), m])


#: the client's task kinds, in its order
KINDS = (AllReduce, AllGather, ReduceScatter, AllToAll, AllToAllV)


# ----------------------------------------------------------------------------- describe: local rules

def _buffers(op: str, rank: int, send: Any, recv: Any, dtype: Any, in_place_ok: bool = False):
    """The dtype row and the flat send / recv arrays, checked."""
    dt = dtype_row(dtype, op=op, param="dtype", rank=rank)
    for name, b in (("send", send), ("recv", recv)):
        if not isinstance(b, np.ndarray):
            raise arg_error(op, name, type(b).__name__, rank, "must be a numpy array")
        if b.dtype != dt.np:
            raise arg_error(op, f"{name}.dtype", str(b.dtype), rank, f"must be the dtype argument ({dt.name})")
        if not b.flags.c_contiguous:
            raise arg_error(op, name, "non-contiguous", rank, "must be C-contiguous (read flat, offsets in elements)")
    if not recv.flags.writeable:
        raise arg_error(op, "recv", "read-only", rank, "must be writable")
    if not (in_place_ok and send is recv) and np.shares_memory(send, recv):
        raise arg_error(op, "recv", "overlaps send", rank,
                        "must not overlap send" + (" (pass recv=send itself for in place)" if in_place_ok else ""))
    return dt, send.reshape(-1), recv.reshape(-1)


def _repeat(op: str, rank: int, repeat: Any) -> int:
    if isinstance(repeat, bool) or not isinstance(repeat, (int, np.integer)) or repeat < 1:
        raise arg_error(op, "repeat", repeat, rank, "must be an integer >= 1")
    return int(repeat)


def _need(op: str, rank: int, name: str, buf: np.ndarray, need: int, how: str) -> None:
    if buf.size < need:
        raise arg_error(op, f"{name}.size", buf.size, rank, f"must be >= {need} = {how}")
