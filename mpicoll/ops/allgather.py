"""AllGather and AllGatherV: every rank gets every rank's data, in rank order."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import _validate as V
from .._dtypes import DTYPES, MPI_BY_NUM
from .._golden import (BenchRun, BenchSpec, CheckSpec, bench_data, counts_matrix, displs, rank_data, register_bench,
                       register_check, torch_view)
from .._params import CommParam
from ._base import Operation, check_out, mpi_of_c, packed_layout_c, x_out


@dataclass
class AllGatherParam(CommParam):
    """AllGather parameters: the common fields."""


@dataclass
class AllGatherVParam(CommParam):
    """AllGatherV parameters: the common fields (counts are execute inputs)."""


class AllGatherOperation(Operation):
    """Gather every rank's ``x`` to every rank, stacked on a new leading axis (as ATB).

    ``execute(x, out=None)`` -> ``[rank_size, *x.shape]``; row i is rank i's x. Shapes and dtypes
    must agree across ranks.

    Example (4 ranks, ``x = np.array([[rank]], np.float32)``)::

        AllGatherOperation(AllGatherParam()).execute(x)   # shape (4, 1, 1): [[[0.]], [[1.]], [[2.]], [[3.]]]
    """

    NAME = "AllGather"
    PARAM = AllGatherParam

    def _check(self, args, kwargs, h):
        x, out = x_out(*args, **kwargs)
        x = self._check_x(x, h)
        check_out(self.NAME, out, (self.size, *x.shape), x.dtype, self.rank, x)
        return (x,), {"out": out}

    def _checked(self):
        n = self.size
        return self._checked_x_out(lambda x: (n, *x.shape))

    def _fast(self):
        call, slow, n, empty = self.comm.Allgather, self._run, self.size, np.empty
        mpi_of, table = mpi_of_c(), MPI_BY_NUM

        def execute(x, out=None):
            m = mpi_of(x, table)
            if m is not None:
                if out is None:
                    out = empty((n, *x.shape), dtype=x.dtype)
                call([x, m], [out, m])
                return out
            return slow(x, out)
        return execute

    def _run(self, x, out=None):
        x, dt = self._data(x)
        if out is None:
            out = np.empty((self.size, *x.shape), dtype=x.dtype)
        self.comm.Allgather([x, dt.mpi], [out, dt.mpi])
        return out


class AllGatherVOperation(Operation):
    """Gather a different number of elements from every rank.

    ``execute(x, send_count, recv_counts, rdispls, shape=None)``: this rank sends
    ``x.flat[:send_count]``; rank i's elements land at ``out[rdispls[i] : rdispls[i] + recv_counts[i]]``.
    Returns a 1-D array of ``sum(recv_counts)`` elements, or that array reshaped to ``shape`` (a
    tuple, or an array whose shape is used). ``recv_counts[i]`` must equal rank i's ``send_count``.

    Example (2 ranks; rank 0 sends [0, 1], rank 1 sends [7])::

        AllGatherVOperation(AllGatherVParam()).execute(x, len(x), [2, 1], [0, 2])   # [0, 1, 7]
    """

    NAME = "AllGatherV"
    PARAM = AllGatherVParam
    SAME_SHAPE = False

    def _check(self, args, kwargs, h):
        x, send_count, rc, rd, shape, out = _agv_args(*args, **kwargs)
        x = self._check_x(x, h)
        op, r, n = self.NAME, self.rank, self.size
        sc = V.scalar_count(op, "send_count", send_count, r)
        if sc > x.size:
            raise V.arg_error(op, "send_count", sc, r, f"must be <= x.size={x.size}")
        rc = V.counts(op, "recv_counts", rc, n, r)
        rd = V.counts(op, "rdispls", rd, n, r)
        total = sum(rc)
        V.check_regions(op, "recv_counts", rc, "rdispls", rd, total, "sum(recv_counts)", r)
        V.check_no_overlap(op, "recv_counts", rc, "rdispls", rd, r)
        dims = _dims(shape, total)
        if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in dims) \
                or int(np.prod(dims)) != total:
            raise V.arg_error(op, "shape", dims, r, f"must be dims >= 0 holding sum(recv_counts)={total} elements")
        check_out(op, out, dims, x.dtype, r, x)
        h[V.H_SCALAR] = sc
        V.vec_a(h, n)[:] = rc
        return (x, sc, rc, rd, shape), {"out": out}

    def _cross(self, args, kwargs, table):
        V.check_pairs(self.NAME, table, (V.H_SCALAR, 0), "send_count", (V.H_LEN, 1), "recv_counts[{i}]")
        return kwargs

    def _fast(self):
        ag, agv, slow, ndarray, empty = self.comm.Allgather, self.comm.Allgatherv, self._run, np.ndarray, np.empty
        mpi_of, table = mpi_of_c(), MPI_BY_NUM
        packed_c, packed_py = packed_layout_c(), V.layout_read_once

        def execute(x, send_count, recv_counts, rdispls, shape=None, out=None):
            # the common case, recv_counts packed in rank order: one Allgather or Allgatherv (see _run)
            m = mpi_of(x, table)
            if m is not None:
                total, c = packed_c(recv_counts, rdispls)
                if total == -2:           # (lists, tuples, generators, ...)
                    recv_counts, rdispls, total, c = packed_py(recv_counts, rdispls)
                if total >= 0:
                    if out is None:
                        out = empty(_dims(shape, total), dtype=x.dtype)
                    size = int(send_count)
                    send = [x, size if size < x.size else x.size, m]
                    if c >= 0:        # equal counts: Allgather, as _run
                        ag(send, [out, m])
                    else:
                        agv(send, [out, (recv_counts.tolist() if type(recv_counts) is ndarray else recv_counts,
                                         rdispls.tolist() if type(rdispls) is ndarray else rdispls), m])
                    return out
            return slow(x, send_count, recv_counts, rdispls, shape, out)
        return execute

    def _run(self, x, send_count, recv_counts, rdispls, shape=None, out=None):
        x, dt = self._data(x)
        rc = recv_counts.tolist() if type(recv_counts) is np.ndarray else list(recv_counts)
        rd = rdispls.tolist() if type(rdispls) is np.ndarray else list(rdispls)   # (read once: any iterable)
        if out is None:
            out = np.empty(_dims(shape, sum(rc)), dtype=x.dtype)
        # the first send_count elements of x, never past its end (even unvalidated)
        send = [x, min(int(send_count), x.size), dt.mpi]
        c = rc[0]
        if rc.count(c) != len(rc):
            self.comm.Allgatherv(send, [out, (rc, rd), dt.mpi])
            return out
        # Every rank sends c elements: MPICH's Allgather is faster than its Allgatherv (1.3x at 8 B,
        # 2-2.5x at 8 MiB on 4 ranks; 6x into a freshly allocated output at 64 KiB on 4 ranks, where
        # Allgatherv's pipelined ring page-faults). recv_counts are the ranks' send counts, the same
        # list on every rank, so every rank takes this path; rdispls are each rank's own: a permuted
        # layout is gathered packed, then moved into place.
        if not c or rd == [*range(0, len(rc) * c, c)]:
            self.comm.Allgather(send, [out, dt.mpi])
            return out
        packed = np.empty(len(rc) * c, dtype=x.dtype)
        self.comm.Allgather(send, [packed, dt.mpi])
        flat = out.reshape(-1)
        for i, d in enumerate(rd):
            flat[d:d + c] = packed[i * c:(i + 1) * c]
        return out


def _agv_args(x, send_count, recv_counts, rdispls, shape=None, out=None):
    return x, send_count, recv_counts, rdispls, shape, out


def _dims(shape, total):
    """The output shape: 1-D of ``total``, or that of a shape reference (tuple or array)."""
    if shape is None:
        return (total,)
    if isinstance(shape, (int, np.integer)):
        return (shape,)
    return shape.shape if isinstance(shape, np.ndarray) else tuple(shape)


# ----------------------------------------------------------------------------- golden checks

_SHAPES = {"even": (3, 2), "zero": (0,), "scalar": (), "large": (50_001,)}


def _ag_run(case, dtype, comm_domain, rank, n, seed, validate=True):
    dt = DTYPES[dtype]
    inputs = [rank_data(seed, f"AllGather/{case}/{dtype}", r, _SHAPES[case], dt) for r in range(n)]
    op = AllGatherOperation(AllGatherParam(comm_domain=comm_domain, rank_size=n), validate=validate)
    return op.execute(inputs[rank]), np.stack(inputs), True


def _agv_plan(case, n):
    """Per-rank send counts, and the receive displacements (in reverse rank order for "gapped" and
    "permuted", the latter with equal counts: the Allgather path with blocks moved into place)."""
    sc = counts_matrix("uniform" if case == "permuted" else case, n)[:, 0]
    if case in ("gapped", "permuted"):
        order = np.arange(n)[::-1]
        rd = np.empty(n, dtype=np.int64)
        rd[order] = np.concatenate(([0], np.cumsum(sc[order])[:-1]))
    else:
        rd = displs(sc, False)[0]
    return sc, rd


def _agv_run(case, dtype, comm_domain, rank, n, seed, validate=True):
    dt = DTYPES[dtype]
    sc, rd = _agv_plan(case, n)
    inputs = [rank_data(seed, f"AllGatherV/{case}/{dtype}", r, int(sc[r]) + 2, dt) for r in range(n)]
    expected = np.empty(int(sc.sum()), dtype=dt.np)
    for i in range(n):
        expected[rd[i]:rd[i] + sc[i]] = inputs[i][:sc[i]]
    op = AllGatherVOperation(AllGatherVParam(comm_domain=comm_domain, rank_size=n), validate=validate)
    return op.execute(inputs[rank], int(sc[rank]), sc, rd), expected, True


register_check(CheckSpec("AllGather", lambda n: list(_SHAPES), _ag_run))
register_check(CheckSpec("AllGatherV", lambda n: ["uniform", "permuted", "uneven", "zero", "spike", "skew", "gapped",
                                                   "large"],
                         _agv_run))


def _ag_bench(c, v=False) -> BenchRun:
    per = c.count // c.n
    x = bench_data(c.rank, per, c.dtype)
    out = np.empty((c.n, per), dtype=x.dtype)
    expected = np.stack([bench_data(r, per, c.dtype) for r in range(c.n)])
    comm, t = c.comm, c.dtype.mpi         # locals in the raw calls, as a user's loop has them
    if v:
        rc, rd = np.full(c.n, per), np.arange(c.n) * per
        op = AllGatherVOperation(AllGatherVParam(comm_domain=c.comm_domain, rank_size=c.n), validate=c.validate)
        flat = out.reshape(-1)
        run = lambda: op.execute(x, per, rc, rd, out=flat)  # noqa: E731
        raw = lambda: comm.Allgatherv([x, t], [flat, (rc, rd), t])  # noqa: E731
    else:
        op = AllGatherOperation(AllGatherParam(comm_domain=c.comm_domain, rank_size=c.n), validate=c.validate)
        run = lambda: op.execute(x, out=out)  # noqa: E731
        raw = lambda: comm.Allgather([x, t], [out, t])  # noqa: E731

    def torch_call(dist, torch, group):
        t, o = torch_view(torch, x), torch_view(torch, out.reshape(-1))
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor   # (renamed in torch 2.13)
        return lambda: gather(o, t, group=group)
    return BenchRun(run=run, result=lambda: out, expected=expected, raw=raw, torch_call=torch_call)


register_bench(BenchSpec("AllGather", _ag_bench, lambda n: (n - 1) / n if n else 0, count_multiple=lambda n: n))
register_bench(BenchSpec("AllGatherV", lambda c: _ag_bench(c, v=True), lambda n: (n - 1) / n if n else 0,
                         count_multiple=lambda n: n))
