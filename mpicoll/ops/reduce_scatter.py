"""ReduceScatter and ReduceScatterV: reduce over all ranks, each rank keeps one block."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from .. import _validate as V
from .._dtypes import DTYPES, NATIVE_MPI_BY_NUM, reduce_op
from .._errors import agree
from .._golden import (TORCH_OPS, BenchRun, BenchSpec, CheckSpec, bench_data, counts_matrix, displs, golden_reduce,
                       rank_data, raw_reduce_type, reduce_case_names, register_bench, register_check, torch_view)
from .._params import ReduceParam
from ._base import ReduceOperation, check_out, mpi_of_c, packed_layout_c, reduce_scatter_alltoall, x_out


@dataclass
class ReduceScatterParam(ReduceParam):
    """ReduceScatter parameters: the common fields plus ``reduce_type`` (JSON ``reduceType``)."""


@dataclass
class ReduceScatterVParam(ReduceParam):
    """ReduceScatterV parameters: the common fields plus ``reduce_type`` (counts are execute inputs)."""


class ReduceScatterOperation(ReduceOperation):
    """Reduce ``x`` over all ranks, then rank r keeps block r of dim 0.

    ``execute(x, out=None)``: ``x.shape[0]`` must be divisible by rank_size; returns
    ``[x.shape[0] // rank_size, *x.shape[1:]]``. float16/bfloat16 accumulate in float32.

    Example (4 ranks, every rank ``x = np.array([[0], [1], [2], [3]], np.float32)``)::

        ReduceScatterOperation(ReduceScatterParam()).execute(x)   # rank 0: [[0.]], rank 1: [[4.]], ...
    """

    NAME = "ReduceScatter"
    PARAM = ReduceScatterParam

    def _check(self, args, kwargs, h):
        x, out = x_out(*args, **kwargs)
        x = self._check_x(x, h)
        V.check_dim0(self.NAME, x, self.size, self.rank)
        check_out(self.NAME, out, (x.shape[0] // self.size, *x.shape[1:]), x.dtype, self.rank, x)
        return (x,), {"out": out}

    def _checked(self):
        n = self.size
        return self._checked_x_out(lambda x: (x.shape[0] // n, *x.shape[1:]) if x.ndim and not x.shape[0] % n else None)

    def _fast(self):
        call, mop, slow, n = self.comm.Reduce_scatter_block, self._mpi_op, self._run, self.size
        mpi_of, table, empty = mpi_of_c(), NATIVE_MPI_BY_NUM, np.empty

        def execute(x, out=None):
            m = mpi_of(x, table)
            if m is not None:
                if out is None:
                    out = empty((x.shape[0] // n, *x.shape[1:]), dtype=x.dtype)
                call([x, m], [out, m], mop)
                return out
            return slow(x, out)
        return execute

    def _run(self, x, out=None, _acc=None):
        x, dt = self._data(x)
        n = self.size
        if out is None:
            out = np.empty((x.shape[0] // n, *x.shape[1:]), dtype=x.dtype)
        if _acc is not None:      # a checked integer sum (validation on): exact in a wider dtype
            wide = np.empty(out.shape, dtype=_acc.np)
            self.comm.Reduce_scatter_block([x.astype(_acc.np), _acc.mpi], [wide, _acc.mpi], MPI.SUM)
            return _narrow(self, dt, _acc, wide, out, 0)
        if dt.reduce == "native":
            self.comm.Reduce_scatter_block([x, dt.mpi], [out, dt.mpi], self._mpi_op)
        else:
            reduce_scatter_alltoall(self.comm, x.reshape(-1), dt, self._rop, None, None, x.size // n, out.reshape(-1))
        return out


class ReduceScatterVOperation(ReduceOperation):
    """Reduce-scatter with a different block size per rank.

    ``execute(x, send_counts, sdispls, recv_count)``: block j of this rank is
    ``x.flat[sdispls[j] : sdispls[j] + send_counts[j]]``; rank j receives the reduction over all
    ranks of their block j, a 1-D array of ``recv_count`` elements. ``send_counts[j]`` must equal
    rank j's ``recv_count`` on every rank (so all ranks' ``send_counts`` agree); displacements are
    each rank's own and may leave gaps or permute the blocks.

    Example (2 ranks, ``x = [1, 2, 3]`` on both, ``send_counts=[1, 2]``, ``sdispls=[0, 1]``)::

        rank 0: execute(x, [1, 2], [0, 1], 1) -> [2]     rank 1: execute(x, [1, 2], [0, 1], 2) -> [4, 6]
    """

    NAME = "ReduceScatterV"
    PARAM = ReduceScatterVParam
    SAME_SHAPE = False

    def _check(self, args, kwargs, h):
        x, sc, sd, recv_count, out = _rsv_args(*args, **kwargs)
        x = self._check_x(x, h)
        op, r, n = self.NAME, self.rank, self.size
        sc = V.counts(op, "send_counts", sc, n, r)
        sd = V.counts(op, "sdispls", sd, n, r)
        V.check_regions(op, "send_counts", sc, "sdispls", sd, x.size, "x.size", r)
        h[V.H_SCALAR] = recv_count = V.scalar_count(op, "recv_count", recv_count, r)
        check_out(op, out, (recv_count,), x.dtype, r, x)
        V.vec_a(h, n)[:] = sc
        return (x, sc, sd, recv_count), {"out": out}

    def _cross(self, args, kwargs, table):
        V.check_pairs(self.NAME, table, (V.H_LEN, 1), "send_counts[{j}]", (V.H_SCALAR, 0), "recv_count")
        return super()._cross(args, kwargs, table)

    def _checked(self):
        general, finish, tmpl, codes, plain, out_ok = self._plain_kit()
        n, packed_c, dtype_at, max_dims = self.size, packed_layout_c(), V.H_DTYPE, V.MAX_DIMS
        count_at, vec_at = V.H_SCALAR, V.H_LEN

        def execute(*args, **kwargs):
            # plain: (x, send_counts, sdispls, recv_count[, out]) with integer-array counts packed
            # in rank order inside x and a Python int recv_count
            h = None
            try:          # (nothing here may raise on one rank alone: anything odd goes to the general path)
                if len(args) == 4 and (not kwargs or len(kwargs) == 1 and "out" in kwargs) or \
                        len(args) == 5 and not kwargs:
                    x, sc, sd, rc = args[:4]
                    out = args[4] if len(args) == 5 else kwargs.get("out")
                    h = plain(x, tmpl, codes, dtype_at, -1, max_dims)
                    if h is not None and type(rc) is int and 0 <= rc < INT64_END and (
                            out is None or out_ok(out, x, (rc,))) and len(sc) == n:
                        total, _ = packed_c(sc, sd)
                        if 0 <= total <= x.size:
                            h[count_at] = rc
                            h[vec_at:vec_at + n] = sc
                        else:
                            h = None
                    else:
                        h = None
            except Exception:  # noqa: BLE001
                h = None
            if h is not None:
                return finish((x, sc, sd, rc), {"out": out}, h)
            return general(*args, **kwargs)
        return execute

    def _fast(self):
        rs, rsb, mop, slow = self.comm.Reduce_scatter, self.comm.Reduce_scatter_block, self._mpi_op, self._run
        mpi_of, table, ndarray, empty, n = mpi_of_c(), NATIVE_MPI_BY_NUM, np.ndarray, np.empty, self.size
        packed_c, packed_py = packed_layout_c(), V.layout_read_once

        def execute(x, send_counts, sdispls, recv_count, out=None):
            m = mpi_of(x, table)
            if m is not None:
                total, block = packed_c(send_counts, sdispls)
                if total == -2:           # (lists, tuples, generators, ...)
                    send_counts, sdispls, total, block = packed_py(send_counts, sdispls)
                if total >= 0:        # packed in rank order: x itself is the send buffer
                    if out is None:
                        out = empty(int(recv_count), dtype=x.dtype)
                    size = x.size
                    if block >= 0 and block * n <= size:      # equal counts: the block call (as _run)
                        rsb([x, block, m], [out, m], mop)
                    else:             # a list: mpi4py reads it faster than an integer array
                        rs([x, total if total < size else size, m], [out, m],
                           send_counts.tolist() if type(send_counts) is ndarray else send_counts, mop)
                    return out
            return slow(x, send_counts, sdispls, recv_count, out)
        return execute

    def _run(self, x, send_counts, sdispls, recv_count, out=None, _acc=None):
        x, dt = self._data(x)
        send_counts, sdispls = V.read_once(send_counts), V.read_once(sdispls)
        if _acc is None and dt.reduce == "native":      # MPI's own reduction
            if out is None:
                out = np.empty(int(recv_count), dtype=x.dtype)
            blocks, count, block = _blocks(x, send_counts, sdispls)
            if block >= 0 and block * self.size <= count:       # equal counts (count: per block)
                self.comm.Reduce_scatter_block([blocks, block, dt.mpi], [out, dt.mpi], self._mpi_op)
            else:
                self.comm.Reduce_scatter([blocks, count, dt.mpi], [out, dt.mpi], send_counts, self._mpi_op)
            return out
        flat = x.reshape(-1)
        recv_count = int(recv_count)
        if _acc is not None:      # a checked integer sum (validation on): exact in a wider dtype
            wide = np.empty(recv_count, dtype=_acc.np)
            blocks, count, _ = _blocks(x, send_counts, sdispls)
            self.comm.Reduce_scatter([blocks.reshape(-1)[:count].astype(_acc.np), _acc.mpi], [wide, _acc.mpi],
                                     send_counts, MPI.SUM)
            return _narrow(self, dt, _acc, wide, np.empty(recv_count, x.dtype) if out is None else out, 0)
        return reduce_scatter_alltoall(self.comm, flat, dt, self._rop, send_counts, sdispls, recv_count, out)


INT64_END = 1 << 63      # (a recv_count at or past it does not fit the int64 header: the general path says so)


def _blocks(x: np.ndarray, send_counts, sdispls) -> tuple[np.ndarray, int, int]:
    """The blocks in rank order, contiguous, as MPI's reduce-scatter wants them; their element
    count; and the count every block has, -1 when they differ (equal counts take
    ``Reduce_scatter_block``, which MPICH runs faster than ``Reduce_scatter``: the choice depends on
    the counts alone, which agree on every rank, so every rank makes the same MPI call).
    x itself when this rank's layout is packed (MPI reads its first ``sum(send_counts)`` elements),
    a packed copy when it has gaps or permutes the blocks."""
    total, block = V.packed_layout(send_counts, sdispls)
    if total >= 0:
        return x, min(total, x.size), block      # (never past the end of x, even unvalidated)
    flat = x.reshape(-1)
    pairs = zip(np.asarray(send_counts).tolist(), np.asarray(sdispls).tolist())
    packed = np.concatenate([flat[d:d + c] for c, d in pairs] or [flat[:0]])
    return packed, packed.size, block


def _narrow(op, dt, acc, wide: np.ndarray, out: np.ndarray, first: int) -> np.ndarray:
    """Check this rank's block of a wide integer sum, agree on overflow across ranks, narrow it."""
    err = V.overflow_error(op.NAME, dt, acc, wide.reshape(-1), op.rank, first)
    agree(op.comm, np.zeros(1, dtype=np.int64), err)
    np.copyto(out, wide.reshape(out.shape), casting="unsafe")
    return out


def _rsv_args(x, send_counts, sdispls, recv_count, out=None):
    return x, send_counts, sdispls, recv_count, out


# ----------------------------------------------------------------------------- golden checks

_RS_SHAPES = {"even": lambda n: (4 * n, 3), "zero": lambda n: (0, 3), "large": lambda n: (20_480 * n,)}


def _rs_run(case, dtype, comm_domain, rank, n, seed, validate=True):
    family, rname = case.split(":")
    dt, rop = DTYPES[dtype], reduce_op(rname)
    inputs = [rank_data(seed, f"ReduceScatter/{case}/{dtype}", r, _RS_SHAPES[family](n), dt) for r in range(n)]
    full = golden_reduce(inputs, dt, rop)
    block = full.shape[0] // n
    op = ReduceScatterOperation(ReduceScatterParam(comm_domain=comm_domain, rank_size=n, reduce_type=rname),
                                validate=validate)
    return op.execute(inputs[rank]), full[rank * block:(rank + 1) * block], True


def _rsv_run(case, dtype, comm_domain, rank, n, seed, validate=True):
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
    got = op.execute(inputs[rank], sc, layouts[rank], int(sc[rank]))
    return got, golden_reduce(blocks, dt, rop), True


register_check(CheckSpec("ReduceScatter", lambda n: reduce_case_names(["even", "large"]) + ["zero:sum"], _rs_run))
register_check(CheckSpec("ReduceScatterV", lambda n: reduce_case_names(["uneven", "gapped"])
                         + ["uniform:sum", "zero:sum", "spike:max", "skew:sum", "large:sum"], _rsv_run))


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
        run = lambda: op.execute(x, sc, sd, per, out=out)  # noqa: E731
        raw = None if raw_t is None else (lambda: comm.Reduce_scatter([x, raw_t], [out, raw_t], sc, mop))
    else:
        op = ReduceScatterOperation(ReduceScatterParam(**param), validate=c.validate)
        run = lambda: op.execute(x, out=out)  # noqa: E731
        raw = None if raw_t is None else (lambda: comm.Reduce_scatter_block([x, raw_t], [out, raw_t], mop))

    def torch_call(dist, torch, group):
        t, o, rop = torch_view(torch, x), torch_view(torch, out), getattr(dist.ReduceOp, TORCH_OPS[c.reduce.name])
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor   # (renamed in torch 2.13)
        return lambda: scatter(o, t, rop, group=group)
    return BenchRun(run=run, result=lambda: out, expected=full[c.rank * per:(c.rank + 1) * per], raw=raw,
                    torch_call=torch_call)


register_bench(BenchSpec("ReduceScatter", _rs_bench, lambda n: (n - 1) / n if n else 0, count_multiple=lambda n: n,
                         uses_reduce=True))
register_bench(BenchSpec("ReduceScatterV", lambda c: _rs_bench(c, v=True), lambda n: (n - 1) / n if n else 0,
                         count_multiple=lambda n: n, uses_reduce=True))
