"""int8 quantized all-reduce: int8 AllToAll -> float32 dequantize-and-sum -> float16 AllGather.

Every rank holds int8 data ``x_r`` with its dequantisation scale ``scale_r`` (one scalar, or one
float32 per block of ``block_size`` elements). Every rank gets ``float16(sum_r float32(x_r) * scale_r)``.
The reduce phase moves int8 (half the bytes of a float16 AllReduce's reduce phase); the gather phase
moves float16, or int8 plus per-block scales with ``allgather_dtype="int8"``.

Chunks are contiguous and follow block boundaries (with per-block scales, chunk j is a run of whole
blocks), so every scale travels with exactly one chunk.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from .._dtypes import DTYPES
from .._errors import CollectiveArgumentError, arg_error
from .._numeric import dequant_sum, dequant_sum_quantize, quantize_into
from .._params import CommParam
from .._call import Call
from .._plan import Plan
from .._numeric import prefix, split_even
from ._base import Operation
from ._modes import PREPARE, RUN

__all__ = ["QuantAllReduceOperation", "QuantAllReduceParam", "dequantize", "quantize"]

_INT8 = DTYPES["int8"]
_F16 = DTYPES["float16"]
_I8, _F32, _F16 = _INT8.mpi, DTYPES["float32"].mpi, _F16.mpi         # (MPI datatypes, from the dtype table)
_GATHER_DTYPES = ("float16", "int8")
#: element counts whose chunk layout an operation keeps (the latest)
CHUNK_PLANS = 64


def _bad(op: str, param: str, value: object, rank: int | None, rule: str) -> CollectiveArgumentError:
    """The standard message. The helpers run without a communicator (rank None): they name the
    calling process's world rank."""
    if rank is None:
        rank = MPI.COMM_WORLD.Get_rank() if MPI.Is_initialized() and not MPI.Is_finalized() else -1
    return arg_error(op, param, value, rank, rule)


def _check_block_size(block_size: object, name: str = "block_size", op: str = "quantize", rank: int | None = None,
                      allow_zero: bool = False) -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) or not (
            0 if allow_zero else 1) <= block_size < 1 << 62:
        raise _bad(op, name, block_size, rank, "must be an int >= " + ("0 (0 = one scale)" if allow_zero else "1")
                   + " and < 2**62")
    return int(block_size)


def quantize(x: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric absmax quantization per block of ``block_size`` consecutive (flattened) elements.

    Args:
        x: a float array (float16, bfloat16, float32 or float64), any shape.
        block_size: elements per block (>= 1); the last block may be shorter.

    Returns:
        ``(q, scales)``: int8 of x's shape with ``q = rint(x * (1 / scale))`` in [-127, 127], and
        float32 ``scales`` of ``ceil(x.size / block_size)`` entries, ``scale = absmax / 127`` (0 for
        an all-zero block, whose q is 0). ``dequantize(q, scales, block_size)`` inverts it to within
        half a scale step per element.

    Raises:
        CollectiveArgumentError: non-float input, NaN/inf values, block_size < 1.
    """
    block_size = _check_block_size(block_size)
    x = np.asarray(x)
    if x.dtype.kind != "f" and x.dtype != DTYPES["bfloat16"].np:
        raise _bad("quantize", "x.dtype", str(x.dtype), None, "must be a float dtype")
    flat = x.reshape(-1)
    if flat.dtype not in (np.float16, np.float32):
        with np.errstate(over="ignore"):                 # beyond float32's range: inf, refused below
            flat = flat.astype(np.float32)
    q, scales = quantize_into(np.ascontiguousarray(flat), block_size)
    if not np.isfinite(scales).all():     # a block's scale is finite exactly when its values are
        raise _bad("quantize", "x", "NaN or inf", None, "values must be finite")
    return q.reshape(x.shape), scales


def dequantize(q: np.ndarray, scales: np.ndarray | float, block_size: int = 0,
               dtype: np.dtype | type = np.float16) -> np.ndarray:
    """``dtype(float32(q) * scale)`` per block (``block_size=0``: one scalar scale).

    Raises:
        CollectiveArgumentError: non-int8 q, or scales that do not fit q and block_size.
    """
    q = np.asarray(q)
    if q.dtype != np.int8:
        raise _bad("dequantize", "q.dtype", str(q.dtype), None, "must be int8")
    block_size = _check_block_size(block_size, op="dequantize", allow_zero=True)
    s = _scales("dequantize", scales, q.size, block_size, None, "q")
    direct = np.dtype(dtype) in (np.float16, np.float32)
    out = np.empty(q.size, dtype=dtype if direct else np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        dequant_sum(np.ascontiguousarray(q).reshape(1, -1), s.reshape(1, -1), block_size, out)
    return (out if direct else out.astype(dtype)).reshape(q.shape)


def _scales(op: str, scale: object, size: int, block_size: int, rank: int | None, data: str = "x") -> np.ndarray:
    """Validated float32 scales: one value (block_size 0) or ``ceil(size / block_size)`` values."""
    s = _scale_array(op, scale, size, block_size, rank, data)
    if s.size == 1:                       # one scale: Python arithmetic beats numpy's reductions
        v = float(s[0])
        finite, negative = math.isfinite(v), v < 0
    else:
        finite, negative = not s.size or bool(np.isfinite(s).all()), bool(s.size and (s < 0).any())
    if not finite:
        raise _bad(op, "scale", "NaN or inf", rank, "scales must be finite")
    if negative:
        raise _bad(op, "scale", float(s[np.argmax(s < 0)]), rank, "scales must be >= 0")
    return s


def _scale_array(op: str, scale: object, size: int, block_size: int, rank: int | None, data: str = "x") -> np.ndarray:
    """The scales as a contiguous 1-D float32 array of the right length (values not checked)."""
    if isinstance(scale, np.ndarray):
        s = np.ascontiguousarray(scale.reshape(-1), dtype=np.float32)
    else:
        s = np.asarray(scale, dtype=np.float32).reshape(-1)
    want = 1 if block_size == 0 else -(-size // block_size)
    if s.size != want:
        raise _bad(op, "scale", f"{s.size} value(s)", rank,
                   f"must hold {want} value(s): " + ("one scalar (block_size=0)" if block_size == 0 else
                                                     f"ceil({data}.size={size} / block_size={block_size})"))
    return s


def plan_chunks(size: int, n: int, block_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Element counts/displacements of the n chunks, and their block counts/displacements.

    With ``block_size > 0`` chunks are runs of whole blocks (the blocks split as evenly as possible);
    with 0, the elements split as evenly as possible. Uneven chunks are allowed either way.
    """
    if block_size == 0:
        counts = split_even(size, n)
        bcounts = np.zeros(n, dtype=np.int64)
    else:
        nb = -(-size // block_size)
        bcounts = split_even(nb, n)
        bstarts = np.concatenate(([0], np.cumsum(bcounts)))
        ends = np.minimum(bstarts[1:] * block_size, size)
        counts = ends - np.minimum(bstarts[:-1] * block_size, size)
    displs, bdispls = np.array(prefix(counts), dtype=np.int64), np.array(prefix(bcounts), dtype=np.int64)
    return counts.astype(np.int64), displs, bcounts, bdispls


@dataclass
class QuantAllReduceParam(CommParam):
    """Parameters of the int8 quantized all-reduce.

    Args:
        block_size: elements per scale block; 0 = one scalar scale per rank (JSON ``blockSize``).
        allgather_dtype: "float16" (the seed's data path) or "int8" (re-quantize the reduced chunk
            per block, scales travelling with it; fewer bytes, more error).
    """

    block_size: int = 0
    allgather_dtype: str = "float16"


@dataclass(frozen=True)
class _Chunks:
    """Everything about the exchange that depends only on the element count (cached per size)."""

    counts: np.ndarray             # elements of chunk j
    displs: np.ndarray
    bcounts: np.ndarray            # scale blocks of chunk j (block_size > 0)
    bdispls: np.ndarray
    c: int                         # this rank's chunk: elements, blocks, first element
    nb: int
    start: int
    even: bool                     # equal chunks: Alltoall / Allgather instead of the v forms
    beven: bool                    # equal block counts: the scales go by Alltoall
    recv_counts: tuple             # (counts, displs) of the received chunks / blocks
    recv_bcounts: tuple


class QuantAllReduceOperation(Operation):
    """int8 AllToAll -> float32 dequantize-and-sum -> float16 AllGather.

    Every rank gets ``float16(sum_r float32(x_r) * scale_r)``, summed in the tree order
    (docs/reproducibility.md).

    Example (2 ranks, rank r: ``x = np.full(4, r + 1, np.int8)``, ``scale = 0.5``)::

        QuantAllReduceOperation(QuantAllReduceParam()).execute(x, 0.5)   # [1.5, 1.5, 1.5, 1.5]
    """

    NAME = "QuantAllReduce"
    PARAM = QuantAllReduceParam

    RULES_ON_DATA = True                    # (scales must be finite and >= 0)

    @staticmethod
    def show_params(value: int) -> str:
        return f"block_size={value // 2}, allgather_dtype={'int8' if value & 1 else 'float16'}"

    def execute(self, x: np.ndarray, scale, out: np.ndarray | None = None) -> np.ndarray:
        """Sum the dequantized ``x`` of every rank.

        Args:
            x: int8, any shape, the same on every rank.
            scale: a scalar (``block_size`` 0) or ``ceil(x.size / block_size)`` float32 per-block
                scales (a plan re-reads a float32 array of scales on every run).
            out: a preallocated float16 output of x's shape.

        Returns:
            ``out``, or a new float16 array of x's shape.
        """
        return self._call((x, scale, out), RUN)

    def prepare(self, x: np.ndarray, scale, out: np.ndarray | None = None) -> Plan:
        """A :class:`~mpicoll.Plan` of ``execute(x, scale, out)``."""
        return self._call((x, scale, out), PREPARE)

    def _bind_param(self) -> None:
        p = self.param
        self._block = _check_block_size(p.block_size, op=self.NAME, rank=self.rank, allow_zero=True)
        if p.allgather_dtype not in _GATHER_DTYPES:
            raise arg_error(self.NAME, "allgather_dtype", p.allgather_dtype, self.rank, f"must be one of {_GATHER_DTYPES}")
        self._int8_gather = p.allgather_dtype == "int8"
        self._chunks: dict[int, _Chunks] = {}

    def describe(self, x, scale, out=None) -> Call:
        if np.asarray(x).dtype != np.int8:
            raise arg_error(self.NAME, "x.dtype", str(np.asarray(x).dtype), self.rank, "must be int8")
        x, dt, src = self._data(x)
        s = _scales(self.NAME, scale, x.size, self._block, self.rank)
        out = self._out(out, x.shape, np.dtype(np.float16), x if src is None else src)
        call = Call(dt, x, out, x.shape)
        # (scales are data: a plan, or a remembered call, re-reads the caller's array on every run,
        # converted into s when it is not float32 itself)
        fresh = scale if isinstance(scale, np.ndarray) and not np.may_share_memory(s, scale) else None
        call.src, call.params, call.args = src, self._block * 2 + self._int8_gather, (s, fresh)
        return call

    def _plan_of(self, size: int) -> _Chunks:
        plan = self._chunks.get(size)
        if plan is None:
            if len(self._chunks) >= CHUNK_PLANS:       # (bounded: a long run of sizes keeps the latest)
                del self._chunks[next(iter(self._chunks))]
            n, me = self.size, self.rank
            counts, displs, bcounts, bdispls = plan_chunks(size, n, self._block)
            c, nb = int(counts[me]), int(bcounts[me])
            plan = self._chunks[size] = _Chunks(
                counts, displs, bcounts, bdispls, c, nb, int(displs[me]), bool((counts == counts[0]).all()),
                bool((bcounts == bcounts[0]).all()), (np.full(n, c), np.arange(n) * c),
                (np.full(n, nb), np.arange(n) * nb))
        return plan

    def _work(self, size: int) -> tuple:
        """Scratch buffers for ``size`` elements: the received int8 rows and their scales; for the
        int8 gather also the gathered int8 data and scales."""
        p = self._plan_of(size)
        n, block = self.size, self._block
        w = (size, np.empty((n, p.c), dtype=np.int8), np.empty((n, p.nb if block else 1), dtype=np.float32),
             None, None)
        if self._int8_gather:
            w = w[:3] + (np.empty(size, dtype=np.int8), np.zeros(-(-size // block) if block else n, dtype=np.float32))
        return w

    def issue(self, call, table, go) -> None:
        x, out, (s, fresh), comm, n = call.x, call.out, call.args, self._lib, self.size
        block, p = self._block, self._plan_of(x.size)
        if fresh is not None:
            go.local(_refresh, s, fresh)
        c, start = p.c, p.start
        _, recv, rscales, allq, alls = go.scratch(self._work, x.size)
        flat, oflat = x.reshape(-1), out.reshape(-1)
        # 1. int8 on the wire: chunk j of every rank goes to rank j ...
        if p.even:
            go.mpi(comm, "Alltoall", [flat, _I8], [recv, _I8])
        else:
            go.mpi(comm, "Alltoallv", [flat, (p.counts, p.displs), _I8], [recv, p.recv_counts, _I8])
        # ... with the scales of exactly those elements
        if block == 0:
            go.mpi(comm, "Allgather", [s, _F32], [rscales, _F32])
        elif p.beven:
            go.mpi(comm, "Alltoall", [s, _F32], [rscales, _F32])
        else:
            go.mpi(comm, "Alltoallv", [s, (p.bcounts, p.bdispls), _F32], [rscales, p.recv_bcounts, _F32])
        if allq is None:
            # 2. dequantize and sum in float32, the tree order, rounded once to float16 straight into
            # this rank's slot of out; 3. gather the float16 chunks in place
            go.local(dequant_sum, recv, rscales, block, oflat[start:start + c])
            o16 = oflat.view(np.uint16)
            if p.even:
                go.mpi(comm, "Allgather", MPI.IN_PLACE, [o16, _F16])
            else:
                go.mpi(comm, "Allgatherv", MPI.IN_PLACE, [o16, (p.counts, p.displs), _F16])
            return
        # 2'. the float32 sum, re-quantized (per block; block 0: one scale for the chunk) straight
        # into this rank's slots of the gathered arrays; 3'. gather int8 + scales in place
        if block:
            b0 = int(p.bdispls[self.rank])
            go.local(dequant_sum_quantize, recv, rscales, block, block, allq[start:start + c], alls[b0:b0 + p.nb])
            if p.even and p.beven:
                go.mpi(comm, "Allgather", MPI.IN_PLACE, [allq, _I8])
                go.mpi(comm, "Allgather", MPI.IN_PLACE, [alls, _F32])
            else:
                go.mpi(comm, "Allgatherv", MPI.IN_PLACE, [allq, (p.counts, p.displs), _I8])
                go.mpi(comm, "Allgatherv", MPI.IN_PLACE, [alls, (p.bcounts, p.bdispls), _F32])
            go.local(dequant_sum, allq.reshape(1, -1), alls.reshape(1, -1), block, oflat)
            return
        go.local(dequant_sum_quantize, recv, rscales, 0, max(c, 1), allq[start:start + c],
                 alls[self.rank:self.rank + 1])
        if p.even:
            go.mpi(comm, "Allgather", MPI.IN_PLACE, [allq, _I8])
        else:
            go.mpi(comm, "Allgatherv", MPI.IN_PLACE, [allq, (p.counts, p.displs), _I8])
        go.mpi(comm, "Allgather", MPI.IN_PLACE, [alls, _F32])
        go.local(_gathered_chunks, allq, alls, x.size, n, oflat)


def _refresh(s: np.ndarray, scale: np.ndarray) -> None:
    """Convert the caller's scales into the call's float32 ones (before every run)."""
    np.copyto(s, scale.reshape(-1), casting="unsafe")


def _gathered_chunks(allq: np.ndarray, alls: np.ndarray, size: int, n: int, oflat: np.ndarray) -> None:
    """Dequantize the gathered int8 chunks of :func:`split_even` (one scale each: the first
    ``size % n`` chunks hold one element more)."""
    small, rem = divmod(size, n)
    head = rem * (small + 1)
    dequant_sum(allq[:head].reshape(1, -1), alls[:rem].reshape(1, -1), small + 1, oflat[:head])
    if small:
        dequant_sum(allq[head:].reshape(1, -1), alls[rem:].reshape(1, -1), small, oflat[head:])


def bytes_per_rank(size: int, n: int, block_size: int, allgather_dtype: str = "float16") -> int:
    """Bytes this pipeline sends per rank for ``size`` elements (sent to other ranks only)."""
    share = (n - 1) / n if n else 0
    sent = size * share                                   # int8 AllToAll
    sent += (-(-size // block_size) * 4 * share) if block_size else 0
    sent += size * (2 if allgather_dtype == "float16" else 1) * share
    if allgather_dtype == "int8" and block_size:
        sent += -(-size // block_size) * 4 * share
    return int(sent)
