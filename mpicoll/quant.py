"""int8 quantized all-reduce: int8 AllToAll -> float32 dequantize-and-sum -> float16 AllGather.

Every rank holds int8 data ``x_r`` with its dequantisation scale ``scale_r`` (one scalar, or one
float32 per block of ``block_size`` elements). Every rank gets ``float16(sum_r float32(x_r) * scale_r)``.
The reduce phase moves int8 (half the bytes of a float16 AllReduce's reduce phase); the gather phase
moves float16, or int8 plus per-block scales with ``allgather_dtype="int8"``.

Chunks are contiguous and follow block boundaries (with per-block scales, chunk j is a run of whole
blocks), so every scale travels with exactly one chunk.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from . import _validate as V
from ._dtypes import DTYPES
from ._errors import CollectiveArgumentError, arg_error
from ._golden import BenchRun, BenchSpec, CheckSpec, bench_data, rank_data, register_bench, register_check, rng_for
from ._params import CommParam
from .ops._base import Operation, check_out, split_even

_INT8 = DTYPES["int8"]
_F16 = DTYPES["float16"]
_GATHER_DTYPES = ("float16", "int8")


def _bad(op: str, param: str, value: object, rank: int | None, rule: str) -> CollectiveArgumentError:
    """The standard message; the helpers (no communicator, rank None) leave the rank out."""
    if rank is None:
        return CollectiveArgumentError(f"{op}: {param}={value!r}: {rule}", op=op, param=param)
    return arg_error(op, param, value, rank, rule)


def _check_block_size(block_size: object, name: str = "block_size", op: str = "quantize", rank: int | None = None,
                      allow_zero: bool = False) -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) or block_size < (
            0 if allow_zero else 1):
        raise _bad(op, name, block_size, rank, "must be an int >= " + ("0 (0 = one scale)" if allow_zero else "1"))
    return int(block_size)


def quantize(x: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric absmax quantization per block of ``block_size`` consecutive (flattened) elements.

    Args:
        x: a float array (float16, bfloat16, float32 or float64), any shape.
        block_size: elements per block (>= 1); the last block may be shorter.

    Returns:
        ``(q, scales)``: int8 of x's shape with ``q = rint(x / scale)`` in [-127, 127], and float32
        ``scales`` of ``ceil(x.size / block_size)`` entries, ``scale = absmax / 127`` (0 for an
        all-zero block, whose q is 0). ``dequantize(q, scales, block_size)`` inverts it to within
        half a scale step per element.

    Raises:
        CollectiveArgumentError: non-float input, NaN/inf values, block_size < 1.
    """
    block_size = _check_block_size(block_size)
    x = np.asarray(x)
    if x.dtype.kind != "f" and x.dtype != DTYPES["bfloat16"].np:
        raise _bad("quantize", "x.dtype", str(x.dtype), None, "must be a float dtype")
    flat = x.reshape(-1).astype(np.float32)
    if not np.isfinite(flat).all():
        raise _bad("quantize", "x", "NaN or inf", None, "values must be finite")
    q, scales = _quantize(flat, block_size)
    return q.reshape(x.shape), scales


def _quantize(flat: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`quantize` of a flat float32 array, unchecked: a block holding inf or NaN gets a
    non-finite scale (and dequantizes to NaN) instead of an error, so that inside the pipeline one
    rank's overflow can never leave the others waiting."""
    nb = -(-flat.size // block_size)
    padded = np.zeros(nb * block_size, dtype=np.float32)
    padded[:flat.size] = flat
    blocks = padded.reshape(nb, block_size)
    scales = (np.abs(blocks).max(axis=1) / np.float32(127)).astype(np.float32) if nb else np.zeros(0, np.float32)
    inv = np.divide(np.float32(1), scales, out=np.zeros_like(scales), where=(scales > 0) & np.isfinite(scales))
    with np.errstate(invalid="ignore"):
        q = np.clip(np.nan_to_num(np.rint(blocks * inv[:, None])), -127, 127).astype(np.int8)
    return q.reshape(-1)[:flat.size], scales


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
    s = _scales("dequantize", scales, q.size, block_size, None)
    return _expand(q.reshape(-1).astype(np.float32), s, block_size).astype(dtype).reshape(q.shape)


def _scales(op: str, scale: object, size: int, block_size: int, rank: int | None) -> np.ndarray:
    """Validated float32 scales: one value (block_size 0) or ``ceil(size / block_size)`` values."""
    s = np.asarray(scale, dtype=np.float32).reshape(-1) if not isinstance(scale, np.ndarray) else \
        scale.reshape(-1).astype(np.float32, copy=False)
    want = 1 if block_size == 0 else -(-size // block_size)
    if s.size != want:
        raise _bad(op, "scale", f"{s.size} value(s)", rank,
                        f"must hold {want} value(s): " + ("one scalar (block_size=0)" if block_size == 0 else
                                                          f"ceil(x.size={size} / block_size={block_size})"))
    if s.size and not np.isfinite(s).all():
        raise _bad(op, "scale", "NaN or inf", rank, "scales must be finite")
    if s.size and (s < 0).any():
        raise _bad(op, "scale", float(s[np.argmax(s < 0)]), rank, "scales must be >= 0")
    return s


def _expand(values: np.ndarray, scales: np.ndarray, block_size: int) -> np.ndarray:
    """``values * scale`` elementwise, a scalar or one scale per block (vectorised, in place)."""
    if block_size == 0 or values.size == 0:
        values *= scales[0] if scales.size else np.float32(1)
        return values
    full = values.size // block_size * block_size
    values[:full].reshape(-1, block_size)[...] *= scales[:full // block_size, None]
    if full < values.size:
        values[full:] *= scales[-1]
    return values


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
    displs = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
    bdispls = np.concatenate(([0], np.cumsum(bcounts)[:-1])).astype(np.int64)
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


class QuantAllReduceOperation(Operation):
    """int8 AllToAll -> float32 dequantize-and-sum -> float16 AllGather.

    ``execute(x, scale, out=None)``: ``x`` int8 (any shape, same on every rank), ``scale`` a scalar
    (block_size 0) or ``ceil(x.size / block_size)`` float32 per-block scales. Returns float16 of
    x's shape: ``float16(sum_r float32(x_r) * scale_r)``, summed in rank order.

    Example (2 ranks, rank r: ``x = np.full(4, r + 1, np.int8)``, ``scale = 0.5``)::

        QuantAllReduceOperation(QuantAllReduceParam()).execute(x, 0.5)   # [1.5, 1.5, 1.5, 1.5]
    """

    NAME = "QuantAllReduce"
    PARAM = QuantAllReduceParam

    def _bind_param(self) -> None:
        p = self.param
        self._block = _check_block_size(p.block_size, op=self.NAME, rank=self.rank, allow_zero=True)
        if p.allgather_dtype not in _GATHER_DTYPES:
            raise arg_error(self.NAME, "allgather_dtype", p.allgather_dtype, self.rank, f"must be one of {_GATHER_DTYPES}")
        self._plans: dict[int, tuple] = {}

    def _check(self, args, kwargs, h):
        x, scale, out = _args(*args, **kwargs)
        x = np.asarray(x)
        if x.dtype != np.int8:
            raise arg_error(self.NAME, "x.dtype", str(x.dtype), self.rank, "must be int8")
        x = self._check_x(x, h)
        s = _scales(self.NAME, scale, x.size, self._block, self.rank)
        check_out(self.NAME, out, x.shape, np.dtype(np.float16), self.rank)
        h[V.H_EXTRA] = self._block * 2 + (self.param.allgather_dtype == "int8")   # must agree across ranks
        return (x, s), {"out": out}

    def _plan(self, size: int) -> tuple:
        plan = self._plans.get(size)
        if plan is None:
            plan = self._plans[size] = plan_chunks(size, self.size, self._block)
        return plan

    def _run(self, x, scale, out=None):
        with np.errstate(over="ignore", invalid="ignore"):    # an overflowing sum gives inf/NaN, as IEEE
            return self._pipeline(x, scale, out)

    def _pipeline(self, x, scale, out):
        x, _ = self._data(x)
        if x.dtype != np.int8:
            raise arg_error(self.NAME, "x.dtype", str(x.dtype), self.rank, "must be int8")
        s = scale if isinstance(scale, np.ndarray) and scale.dtype == np.float32 and scale.ndim == 1 else \
            _scales(self.NAME, scale, x.size, self._block, self.rank)
        comm, n, me, block = self.comm, self.size, self.rank, self._block
        counts, displs, bcounts, bdispls = self._plan(x.size)
        c, nb = int(counts[me]), int(bcounts[me])
        flat = x.reshape(-1)
        # 1. int8 on the wire: chunk j of every rank goes to rank j
        recv = np.empty((n, c), dtype=np.int8)
        if n * int(counts[0]) == x.size:                 # even chunks (identical on every rank)
            comm.Alltoall([flat, MPI.INT8_T], [recv, MPI.INT8_T])
        else:
            comm.Alltoallv([flat, (counts, displs), MPI.INT8_T],
                           [recv, (np.full(n, c), np.arange(n) * c), MPI.INT8_T])
        # ... with the scales of exactly those elements
        if block == 0:
            rscales = np.empty((n, 1), dtype=np.float32)
            comm.Allgather([s, MPI.FLOAT], [rscales, MPI.FLOAT])
        else:
            rscales = np.empty((n, nb), dtype=np.float32)
            comm.Alltoallv([s, (bcounts, bdispls), MPI.FLOAT], [rscales, (np.full(n, nb), np.arange(n) * nb), MPI.FLOAT])
        # 2. dequantize and sum in float32, rank order, one vectorised pass
        acc = np.add.reduce(_expand_rows(recv, rscales, block), axis=0) if n else np.zeros(c, np.float32)
        if out is None:
            out = np.empty(x.shape, dtype=np.float16)
        oflat = out.reshape(-1)
        even = n * int(counts[0]) == x.size
        # 3. gather the reduced chunks
        if self.param.allgather_dtype == "float16":
            chunk = acc.astype(np.float16)
            if even:
                comm.Allgather([chunk.view(np.uint16), MPI.UINT16_T], [oflat.view(np.uint16), MPI.UINT16_T])
            else:
                comm.Allgatherv([chunk.view(np.uint16), MPI.UINT16_T],
                                [oflat.view(np.uint16), (counts, displs), MPI.UINT16_T])
            return out
        qblock = block if block else max(c, 1)
        q, qs = _quantize(acc, qblock)
        allq = np.empty(x.size, dtype=np.int8)
        comm.Allgatherv([q, MPI.INT8_T], [allq, (counts, displs), MPI.INT8_T])
        if block:
            alls = np.empty(-(-x.size // block), dtype=np.float32)
            comm.Allgatherv([qs, MPI.FLOAT], [alls, (bcounts, bdispls), MPI.FLOAT])
            oflat[...] = _expand(allq.astype(np.float32), alls, block)
        else:   # one scale per chunk
            alls = np.empty(n, dtype=np.float32)
            comm.Allgather([qs[:1] if qs.size else np.zeros(1, np.float32), MPI.FLOAT], [alls, MPI.FLOAT])
            oflat[...] = allq.astype(np.float32) * np.repeat(alls, counts)
        return out


def _args(x, scale, out=None):
    return x, scale, out


def _expand_rows(recv: np.ndarray, rscales: np.ndarray, block: int) -> np.ndarray:
    """float32(recv[r]) * scales of row r, for every row at once."""
    vals = recv.astype(np.float32)
    if block == 0 or vals.shape[1] == 0:
        vals *= rscales[:, :1]
        return vals
    c = vals.shape[1]
    full = c // block * block
    vals[:, :full].reshape(vals.shape[0], -1, block)[...] *= rscales[:, :full // block, None]
    if full < c:
        vals[:, full:] *= rscales[:, -1:]
    return vals


def bytes_per_rank(size: int, n: int, block_size: int, allgather_dtype: str = "float16") -> int:
    """Bytes this pipeline sends per rank for ``size`` elements (sent to other ranks only)."""
    share = (n - 1) / n if n else 0
    sent = size * share                                   # int8 AllToAll
    sent += (-(-size // block_size) * 4 * share) if block_size else 0
    sent += size * (2 if allgather_dtype == "float16" else 1) * share
    if allgather_dtype == "int8" and block_size:
        sent += -(-size // block_size) * 4 * share
    return int(sent)


# ----------------------------------------------------------------------------- golden check

_CASES = {"scalar-even": (0, lambda n: 64 * n), "scalar-uneven": (0, lambda n: 37), "block32": (32, lambda n: 32 * 8 * n),
          "block128-uneven": (128, lambda n: 1000 + n), "block1": (1, lambda n: 5), "zero": (16, lambda n: 0),
          "tiny": (4, lambda n: 3), "int8-gather": (64, lambda n: 640 * n + 17)}


def golden_f32(xs: list[np.ndarray], scales: list[np.ndarray], block: int) -> np.ndarray:
    """``sum_r float32(x_r) * scale_r`` in float32, rank order (independent of the chunking), flat."""
    acc = None
    for x, s in zip(xs, scales):
        v = x.reshape(-1).astype(np.float32)
        per = np.repeat(s, block)[:v.size] if block else np.full(v.size, s[0], np.float32)
        acc = v * per if acc is None else acc + v * per
    return acc


def golden(xs: list[np.ndarray], scales: list[np.ndarray], block: int) -> np.ndarray:
    """``float16(sum_r float32(x_r) * scale_r)``."""
    return golden_f32(xs, scales, block).astype(np.float16).reshape(xs[0].shape)


def _run_case(case, dtype, comm_domain, rank, n, seed, validate=True):
    block, size_of = _CASES[case]
    size = size_of(n)
    xs = [rank_data(seed, f"Quant/{case}", r, size, _INT8) * 30 for r in range(n)]
    xs = [x.astype(np.int8) for x in xs]
    nscales = 1 if block == 0 else -(-size // block)
    scales = [rng_for(seed, "Quant/scale", case, r).uniform(0.001, 0.01, nscales).astype(np.float32) for r in range(n)]
    if case == "block32" and n:
        scales[0][0] = 0.0                                   # an all-zero-scale block is fine
    gather = "int8" if case == "int8-gather" else "float16"
    op = QuantAllReduceOperation(QuantAllReduceParam(comm_domain=comm_domain, rank_size=n, block_size=block,
                                                     allgather_dtype=gather), validate=validate)
    got = op.execute(xs[rank], scales[rank] if block else float(scales[rank][0]))
    if gather == "int8":   # the float32 golden re-quantized per block (chunks follow block boundaries)
        q, qs = quantize(golden_f32(xs, scales, block), block)
        return got, dequantize(q, qs, block).reshape(xs[0].shape), False
    return got, golden(xs, scales, block), False


register_check(CheckSpec("QuantAllReduce", lambda n: list(_CASES), _run_case, dtypes=("int8",)))
V.EXTRA_DESCRIBERS["QuantAllReduce"] = lambda v: f"block_size={v // 2}, allgather_dtype={'int8' if v & 1 else 'float16'}"


def _bench(c) -> BenchRun:
    """int8 input of ``count`` elements, one scalar scale per rank, float16 out."""
    xs = [bench_data(r, c.count, DTYPES["int8"]) for r in range(c.n)]
    scales = [np.full(1, 0.01 * (r + 1), np.float32) for r in range(c.n)]
    out = np.empty(c.count, dtype=np.float16)
    op = QuantAllReduceOperation(QuantAllReduceParam(comm_domain=c.comm_domain, rank_size=c.n), validate=c.validate)
    return BenchRun(run=lambda: op.execute(xs[c.rank], scales[c.rank], out=out), result=lambda: out,
                    expected=golden(xs, scales, 0), exact=False)


register_bench(BenchSpec("QuantAllReduce", _bench, lambda n: 2 * (n - 1) / n if n else 0, dtypes=("int8",)))
