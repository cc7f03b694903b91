"""ReduceScatter and ReduceScatterV: reduce over all ranks, each rank keeps one block."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import _shm
from .. import _validate as V
from .._dtypes import DTYPES, reduce_op
from .._golden import (TORCH_OPS, BenchRun, BenchSpec, Case, CheckSpec, bench_data, counts_matrix, displs,
                       golden_reduce, rank_data, raw_reduce_type, reduce_case_names, register_bench, register_check,
                       torch_view)
from .._numeric import average, reduce_rows
from .._params import ReduceTypeParam
from .._plan import Call, Plan
from ._base import PREPARE, RUN, ReduceTypeOperation
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


# ----------------------------------------------------------------------------- golden checks

_RS_SHAPES = {"even": lambda n: (4 * n, 3), "zero": lambda n: (0, 3), "large": lambda n: (20_480 * n,)}


def _rs_case(case, dtype, comm_domain, rank, n, seed, validate=True) -> Case:
    family, rname = case.split(":")
    dt, rop = DTYPES[dtype], reduce_op(rname)
    inputs = [rank_data(seed, f"ReduceScatter/{case}/{dtype}", r, _RS_SHAPES[family](n), dt) for r in range(n)]
    full = golden_reduce(inputs, dt, rop)
    block = full.shape[0] // n
    op = ReduceScatterOperation(ReduceScatterParam(comm_domain=comm_domain, rank_size=n, reduce_type=rname),
                                validate=validate)
    return Case(op, (inputs[rank],), {}, full[rank * block:(rank + 1) * block])


def _rsv_case(case, dtype, comm_domain, rank, n, seed, validate=True) -> Case:
    family, rname = case.split(":")
    dt, rop = DTYPES[dtype], reduce_op(rname)
    sc = counts_matrix(family, n)[0]             # the same block sizes on every rank
    blocks, inputs, layouts = [], [], []
    for r in range(n):
        sd, length = displs(sc, gapped=(family == "gapped" and r % 2 == 0))
        x = rank_data(seed, f"ReduceScatterV/{case}/{dtype}", r, length, dt)
        inputs.append(x)
        layouts.append(sd)
        blocks.append(x[sd[rank]:sd[rank] + sc[rank]])
    op = ReduceScatterVOperation(ReduceScatterVParam(comm_domain=comm_domain, rank_size=n, reduce_type=rname),
                                 validate=validate)
    return Case(op, (inputs[rank], sc, layouts[rank], int(sc[rank])), {}, golden_reduce(blocks, dt, rop))


register_check(CheckSpec("ReduceScatter", lambda n: reduce_case_names(["even", "large"]) + ["zero:sum"], _rs_case))
register_check(CheckSpec("ReduceScatterV", lambda n: reduce_case_names(["uneven", "gapped"])
                         + ["uniform:sum", "zero:sum", "spike:max", "skew:sum", "large:sum"], _rsv_case))


def _rs_bench(c, v=False) -> BenchRun:
    per = c.count // c.n
    x = bench_data(c.rank, c.count, c.dtype)
    out = np.empty(per, dtype=x.dtype)
    full = golden_reduce([bench_data(r, c.count, c.dtype) for r in range(c.n)], c.dtype, c.reduce)
    raw_t = raw_reduce_type(c.dtype)
    param = dict(comm_domain=c.comm_domain, rank_size=c.n, reduce_type=c.reduce.name)
    comm, mop = c.comm, c.reduce.mpi      # locals in the raw calls, as a user's loop has them
    if v:
        sc, sd = np.full(c.n, per), np.arange(c.n) * per
        op = ReduceScatterVOperation(ReduceScatterVParam(**param), validate=c.validate)
        args = (x, sc, sd, per)
        raw = None if raw_t is None else (lambda: comm.Reduce_scatter([x, raw_t], [out, raw_t], sc, mop))
        inplace = reset = None
    else:
        op = ReduceScatterOperation(ReduceScatterParam(**param), validate=c.validate)
        args = (x,)
        raw = None if raw_t is None else (lambda: comm.Reduce_scatter_block([x, raw_t], [out, raw_t], mop))
        work = x.copy()                                                      # nccl-tests: recv = send + rank*count
        inplace = ((work,), {"out": work[c.rank * per:(c.rank + 1) * per]})
        reset = lambda: np.copyto(work, x)  # noqa: E731

    def torch_call(dist, torch, group):
        t, o, rop = torch_view(torch, x), torch_view(torch, out), getattr(dist.ReduceOp, TORCH_OPS[c.reduce.name])
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor   # (renamed in torch 2.13)
        return lambda: scatter(o, t, rop, group=group)
    return BenchRun(op, args, full[c.rank * per:(c.rank + 1) * per], kwargs={"out": out}, raw=raw,
                    inplace=inplace, reset=reset, torch_call=torch_call)


register_bench(BenchSpec("ReduceScatter", _rs_bench, lambda n: (n - 1) / n if n else 0, count_multiple=lambda n: n,
                         uses_reduce=True))
register_bench(BenchSpec("ReduceScatterV", lambda c: _rs_bench(c, v=True), lambda n: (n - 1) / n if n else 0,
                         count_multiple=lambda n: n, uses_reduce=True))
