"""AllReduce: every rank gets the element-wise reduction of all ranks' inputs."""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from .._dtypes import DTYPES, NATIVE_MPI_BY_NUM, reduce_op
from .._golden import (TORCH_OPS, BenchRun, BenchSpec, CheckSpec, bench_data, golden_reduce, rank_data,
                       raw_reduce_type, reduce_case_names, register_bench, register_check, torch_view)
from .._params import ReduceParam
from .. import _validate as V
from ._base import ReduceOperation, check_out, from_f32, mpi_of_c, reduce_scatter_alltoall, split_even, to_f32, x_out

#: float16/bfloat16 AllReduce of at most this many bytes: cast to float32, one native float32
#: Allreduce, cast back (one collective beats two at small sizes); above: the AllToAll path.
SMALL_F32_BYTES = int(os.environ.get("MPICOLL_SMALL_F32_BYTES", 64 * 1024))
#: 8-bit integer AllReduce (or piece of one) of at least this many bytes: AllToAll + a numpy
#: reduction + AllGather. MPICH's own 8-bit reduction loop is the slow part: at 2 ranks 1.8x
#: faster at 1-2 MiB, 1.6x at 4 MiB; no gain below 1 MiB.
BYTE_ALLTOALL_BYTES = int(os.environ.get("MPICOLL_BYTE_ALLTOALL_BYTES", 1024 * 1024))
#: An AllReduce of at least PIECED_BYTES runs as AllReduces of PIECE_BYTES pieces, one after the
#: other: MPICH maps and unmaps a temporary buffer as large as the message on every call (glibc
#: serves >= 32 MiB requests with mmap), and small pieces keep the reduction in cache. float32 at
#: 64 MiB: 44 -> 22 ms at 2 ranks, 116 -> 64 ms at 4 (one MPI call vs 2 MiB pieces).
PIECE_BYTES = max(int(os.environ.get("MPICOLL_PIECE_BYTES", 2 * 1024 * 1024)), 1)
PIECED_BYTES = 4 * PIECE_BYTES


@dataclass
class AllReduceParam(ReduceParam):
    """AllReduce parameters: the common fields plus ``reduce_type`` (JSON ``allReduceType``)."""


class AllReduceOperation(ReduceOperation):
    """Element-wise reduction over all ranks; every rank gets the result.

    ``execute(x, out=None)`` -> array of x's shape and dtype. ``out`` may be a preallocated output,
    or ``x`` itself for an in-place reduction. float16/bfloat16 accumulate in float32 and round once.

    Example (4 ranks, ``x = np.array([[rank]], np.float32)``)::

        AllReduceOperation(AllReduceParam(reduce_type="sum")).execute(x)   # [[6.]] on every rank
    """

    NAME = "AllReduce"
    PARAM = AllReduceParam

    def _check(self, args, kwargs, h):
        x, out = x_out(*args, **kwargs)
        x = self._check_x(x, h)
        check_out(self.NAME, out, x.shape, x.dtype, self.rank, x, in_place_ok=True)
        return (x,), {"out": out}

    def _checked(self):
        return self._checked_x_out(lambda x: x.shape)

    def _fast(self):
        call, mop, slow, empty_like = self.comm.Allreduce, self._mpi_op, self._run, np.empty_like
        mpi_of, table = mpi_of_c(), NATIVE_MPI_BY_NUM
        in_place = MPI.IN_PLACE
        limit = min(PIECED_BYTES, BYTE_ALLTOALL_BYTES)   # one MPI call for every native dtype below it

        def execute(x, out=None):
            m = mpi_of(x, table)
            if m is not None and x.nbytes < limit:
                if out is None:
                    out = empty_like(x)
                elif out is x:
                    call(in_place, [out, m], mop)
                    return out
                call([x, m], [out, m], mop)
                return out
            return slow(x, out)
        return execute

    def _run(self, x, out=None, _acc=None):
        x, dt = self._data(x)
        if out is None:
            out = np.empty_like(x)
        whole = x.nbytes < PIECED_BYTES or self.size == 1
        if whole and _acc is None and dt.reduce == "native" and (
                dt.itemsize > 1 or x.size < BYTE_ALLTOALL_BYTES or self.size == 1):   # MPI's own reduction
            if out is x:
                self.comm.Allreduce(MPI.IN_PLACE, [out, dt.mpi], self._mpi_op)
            else:
                self.comm.Allreduce([x, dt.mpi], [out, dt.mpi], self._mpi_op)
            return out
        if _acc is not None:
            return self._checked_sum(x, out, dt, _acc)
        flat, oflat, inplace = x.reshape(-1), out.reshape(-1), out is x
        for piece in pieces(flat.size, dt.itemsize, self.size):
            self._piece(flat[piece], oflat[piece], dt, inplace)
        return out

    def _checked_sum(self, x, out, dt, acc):
        """An integer SUM checked for overflow (validation on): exact in the wider dtype ``acc``;
        ``out`` is written only when no element leaves ``dt``'s range (else every rank raises)."""
        wide = x.astype(acc.np).reshape(-1)
        for piece in pieces(wide.size, acc.itemsize, self.size):
            self.comm.Allreduce(MPI.IN_PLACE, [wide[piece], acc.mpi], MPI.SUM)
        err = V.overflow_error(self.NAME, dt, acc, wide, None)
        if err is not None:       # the same sum on every rank: every rank raises the same error
            raise err
        np.copyto(out, wide.reshape(out.shape), casting="unsafe")
        return out

    def _piece(self, x, out, dt, inplace: bool):
        """AllReduce of the flat ``x`` into ``out`` (the same memory when ``inplace``)."""
        comm, rop, n = self.comm, self._rop, self.size
        if dt.reduce == "native" and (dt.itemsize > 1 or x.size < BYTE_ALLTOALL_BYTES or n == 1):
            comm.Allreduce(MPI.IN_PLACE if inplace else [x, dt.mpi], [out, dt.mpi], rop.mpi)
            return out
        total = x.size
        if dt.reduce != "native" and (total * dt.itemsize <= SMALL_F32_BYTES or n == 1):
            acc32 = to_f32(x)
            comm.Allreduce(MPI.IN_PLACE, [acc32, MPI.FLOAT], rop.mpi)
            return from_f32(acc32, out)
        # reduce-scatter as AllToAll + a local reduction, then AllGather (16-bit floats, large 8-bit)
        counts = split_even(total, n)
        if total % n == 0:
            chunk = reduce_scatter_alltoall(comm, x, dt, rop, counts, None, int(counts[self.rank]))
            comm.Allgather([chunk, dt.mpi], [out, dt.mpi])
        else:
            displs = np.concatenate(([0], np.cumsum(counts[:-1])))
            chunk = reduce_scatter_alltoall(comm, x, dt, rop, counts, displs, int(counts[self.rank]))
            comm.Allgatherv([chunk, dt.mpi], [out, (counts, displs), dt.mpi])
        return out


def pieces(size: int, itemsize: int, n: int):
    """Slices of ``size`` elements: one, or PIECE_BYTES each from PIECED_BYTES up (not on one rank)."""
    if size * itemsize < PIECED_BYTES or n == 1:
        yield slice(0, size)
        return
    step = max(PIECE_BYTES // itemsize, 1)
    for s in range(0, size, step):
        yield slice(s, s + step)


# ----------------------------------------------------------------------------- golden check

_SHAPES = {"even": lambda n: (8 * n, 3), "uneven": lambda n: (37,), "zero": lambda n: (0, 4),
           "scalar": lambda n: (), "large": lambda n: (40_003,), "large-even": lambda n: (n * 20_480,)}


def _cases(n: int) -> list[str]:
    return reduce_case_names(["even", "uneven", "large", "large-even"]) + ["zero:sum", "scalar:max", "random:sum",
                                                                             "inplace:sum"]


def _run_case(case, dtype, comm_domain, rank, n, seed, validate=True):
    family, rname = case.split(":")
    dt, rop = DTYPES[dtype], reduce_op(rname)
    kind = "random" if family == "random" and dt.np.kind == "f" else "int"
    shape = _SHAPES.get(family, lambda n: (1000,))(n)
    inputs = [rank_data(seed, f"AllReduce/{case}/{dtype}", r, shape, dt, kind) for r in range(n)]
    op = AllReduceOperation(AllReduceParam(comm_domain=comm_domain, rank_size=n, reduce_type=rname),
                            validate=validate)
    x = inputs[rank].copy()
    got = op.execute(x, out=x) if family == "inplace" else op.execute(x)
    return got, golden_reduce(inputs, dt, rop), kind == "int"


register_check(CheckSpec("AllReduce", _cases, _run_case))


def _bench(c) -> BenchRun:
    x = bench_data(c.rank, c.count, c.dtype)
    out, work = np.empty_like(x), x.copy()
    op = AllReduceOperation(AllReduceParam(comm_domain=c.comm_domain, rank_size=c.n, reduce_type=c.reduce.name),
                            validate=c.validate)
    raw_t = raw_reduce_type(c.dtype)
    comm, mop = c.comm, c.reduce.mpi      # locals in the raw call, as a user's loop has them
    raw = None if raw_t is None else (lambda: comm.Allreduce([x, raw_t], [out, raw_t], mop))

    def torch_call(dist, torch, group):
        t, rop = torch_view(torch, work), getattr(dist.ReduceOp, TORCH_OPS[c.reduce.name])
        return lambda: dist.all_reduce(t, rop, group=group)
    return BenchRun(run=lambda: op.execute(x, out=out), result=lambda: out, raw=raw,
                    expected=golden_reduce([bench_data(r, c.count, c.dtype) for r in range(c.n)], c.dtype, c.reduce),
                    inplace=lambda: op.execute(work, out=work), reset=lambda: np.copyto(work, x),
                    torch_call=torch_call)


register_bench(BenchSpec("AllReduce", _bench, lambda n: 2 * (n - 1) / n if n else 0, uses_reduce=True))
