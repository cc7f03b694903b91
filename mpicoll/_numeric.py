"""The numeric kernels: float16/bfloat16 conversion and reduction in the tree order, int8 quantization.

Each runs in C (``mpicoll/_kernels.c``, built at install when a compiler is there) or, when the
extension is not built or ``MPICOLL_KERNELS=0``, in numpy: the two give the same bits (tests check
it), the numpy twin more slowly. Nothing here decides anything about communication.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from . import _env
from ._dtypes import DTYPES

if TYPE_CHECKING:
    from ._dtypes import DType, ReduceOp


def load_kernels():
    """The ``_kernels`` extension, or None when it is not built or ``MPICOLL_KERNELS=0``."""
    if not _env.value("MPICOLL_KERNELS"):
        return None
    try:
        from . import _kernels
    except ImportError:
        return None
    return _kernels


#: the C kernels, or None = numpy (the same bits). Read at every use, so tests can switch it.
KERNELS = load_kernels()


def kernels_in_use() -> str:
    """Which kernels run, for the CLI's headers: "C", or "numpy (...)" with the reason."""
    if KERNELS is not None:
        return "C (mpicoll._kernels)"
    if not _env.value("MPICOLL_KERNELS"):
        return "numpy (MPICOLL_KERNELS=0)"
    return ("numpy (mpicoll._kernels is not built: `pip install .` builds it where a C compiler is found, and "
            "puts it beside the sources too)")


#: float16's numpy dtype and bfloat16's row, from the dtype table, to compare with (``dtype.name`` takes
#: 0.6 us); bfloat16's dtype is read from its row where it is met (ml_dtypes is imported by then)
F16, BF16 = DTYPES["float16"].np, DTYPES["bfloat16"]

#: elements per cache tile of the numpy float32 reduction (two float32 tiles stay in L2)
TILE = 1 << 16


def to_f32(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Contiguous 16-bit floats -> float32 ``out`` (the C kernels when built)."""
    if KERNELS is not None and x.dtype == F16:
        KERNELS.f16_to_f32(x, out)
    elif KERNELS is not None and x.dtype == BF16.np:
        KERNELS.bf16_to_f32(x, out)
    else:
        np.copyto(out, x.reshape(out.shape))
    return out


def from_f32(acc: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Round a contiguous float32 array into ``out`` (float16 or bfloat16), to nearest even."""
    if KERNELS is not None and out.dtype == F16:
        KERNELS.f32_to_f16(acc, out)
    elif KERNELS is not None and out.dtype == BF16.np:
        KERNELS.f32_to_bf16(acc, out)
    else:
        with np.errstate(over="ignore", invalid="ignore"):   # overflow to inf is the IEEE answer
            np.copyto(out, acc.reshape(out.shape), casting="unsafe")
    return out


def copy_pairs(pairs: list[tuple[np.ndarray, np.ndarray]], stream: bool = False) -> None:
    """``np.copyto(dst, src)`` for each ``(dst, src)`` pair (``stream``: :func:`stream_copy`): a
    staging buffer's parts back into their arrays (``ops._base.scatter_pairs``), blocks into and
    out of a shared window (mpicoll._shm)."""
    copy = stream_copy if stream else np.copyto
    for dst, src in pairs:
        copy(dst, src)


def stream_copy(dst: np.ndarray, src: np.ndarray) -> None:
    """Copy contiguous ``src`` into ``dst`` with stores that bypass the cache (the C kernel; numpy
    copies plainly): for data another process reads next from shared memory (mpicoll._shm)."""
    if KERNELS is not None:
        KERNELS.stream_copy(src.view(np.uint8), dst.view(np.uint8))
    else:
        np.copyto(dst, src)


def average(out: np.ndarray, n: int) -> None:
    """AVG (``ReduceOp.average``): the sum in ``out`` divided by ``n``, in ``out``'s dtype, as torch
    divides a tensor."""
    np.divide(out, n, out=out)


def reduce_chunks(parts: np.ndarray, dt: DType, rop: ReduceOp, out: np.ndarray) -> np.ndarray:
    """Reduce ``parts[i]`` (one row per source rank) into ``out``: :func:`reduce_rows` of the rows
    of a 2-D array."""
    return reduce_rows(list(parts), dt, rop, out)


def tree_order(n: int, push, fold, combine) -> None:
    """THE order of every float reduction (docs/reproducibility.md, "The order"), over rows 0 .. n-1:
    the tree ``T(lo, hi) = T(lo, mid) op T(mid, hi)``, ``mid = lo +`` the largest power of two below
    ``hi - lo`` (n = 4: ``(x0 op x1) op (x2 op x3)``). In one pass over the rows, as a binary counter
    (the C kernels' ``TREE``): row r goes onto a stack of partials, whose top two then combine
    ``ctz(r + 1)`` times, the lower ranks the left operand; at the end the stack folds from the right.
    ``push(j, r)``: partial j = row r; ``fold(j, r)``: partial j = partial j op row r (an odd row meets
    its left neighbour straight from the row); ``combine(j, k)``: partial j = partial j op partial k.
    Partial 0 ends as the result; at most ``n.bit_length()`` are live."""
    sp = 0
    for r in range(n):
        k = ((r + 1) & -(r + 1)).bit_length() - 1             # ctz(r + 1)
        if k == 0:
            push(sp, r)
            sp += 1
            continue
        fold(sp - 1, r)
        for _ in range(k - 1):
            sp -= 1
            combine(sp - 1, sp)
    while sp > 1:
        sp -= 1
        combine(sp - 1, sp)


def _fold(rows: list[np.ndarray], ufunc: np.ufunc, out: np.ndarray) -> None:
    """``((r0 op r1) op r2) ...`` into ``out`` (:func:`reduce_rows`' integers and bools: exact in any
    order, and the fewest numpy calls)."""
    np.copyto(out, rows[0])
    for r in rows[1:]:
        ufunc(out, r, out=out)


def _tree_tiles(rows: list[np.ndarray], ufunc: np.ufunc, out: np.ndarray, n: int, c: int, acc_dtype) -> None:
    """:func:`tree_order` over ``rows`` into ``out``, tile by tile (the partials stay in cache while
    the rows stream by), the partials in ``acc_dtype`` (float32 for 16-bit floats: rounded once)."""
    m = min(c, TILE)
    direct = acc_dtype == out.dtype                  # (partial 0 is out's tile itself)
    scratch = np.empty((max(n.bit_length(), 1) + 1 - direct, m), dtype=acc_dtype)
    for s in range(0, c, TILE):
        e = min(s + TILE, c)
        slots = ([out[s:e]] if direct else []) + [t[:e - s] for t in scratch]
        tmp = slots[-1]                              # (a row widened before it is folded in)

        def push(j, r):
            np.copyto(slots[j], rows[r][s:e])

        def fold(j, r):
            if direct:
                ufunc(slots[j], rows[r][s:e], out=slots[j])
            else:
                np.copyto(tmp, rows[r][s:e])
                ufunc(slots[j], tmp, out=slots[j])
        tree_order(n, push, fold, lambda j, k: ufunc(slots[j], slots[k], out=slots[j]))
        if not direct:
            np.copyto(out[s:e], slots[0], casting="unsafe")


def reduce_rows(rows: list[np.ndarray], dt: DType, rop: ReduceOp, out: np.ndarray) -> np.ndarray:
    """Reduce the contiguous 1-D arrays ``rows`` (one per source rank, each as long as ``out``,
    wherever they live: a private array, a shared window) into ``out``, in one pass over the data:
    integers in their own dtype (wrapping, as MPI does: any order gives the same bits), floats in
    the tree order (:func:`tree_order`), 16-bit floats accumulated in float32 and rounded once.
    ``out`` may be one of the rows only if it is the first.

    With the C kernels, float32/float64 SUM and PROD and every 16-bit float op take one pass in C,
    bit-identical to numpy. Otherwise numpy works tile by tile, so that the partials stay in cache
    while the rows stream by.
    """
    if out.ndim != 1:
        out = out.reshape(-1)
    n, c = len(rows), out.size
    if not n or not c:
        return out
    if not dt.floating:                      # (integers and bool raise no floating-point error)
        _fold(rows, rop.ufunc, out)
        return out
    if KERNELS is not None and (dt.reduce == "float32" or rop.kernel < 2):   # (float32/float64 MAX, MIN: numpy)
        if dt.reduce == "float32":
            kernel = KERNELS.reduce_f16 if dt.name == "float16" else KERNELS.reduce_bf16
            kernel([r.view(np.uint16) for r in rows], out.view(np.uint16), rop.kernel)
        else:
            (KERNELS.reduce_f32 if dt.itemsize == 4 else KERNELS.reduce_f64)(rows, out, rop.kernel)
        return out
    if n == 1 and dt.reduce != "float32":     # (16-bit floats go through float32: a NaN comes out quiet)
        np.copyto(out, rows[0])
        return out
    with np.errstate(over="ignore", invalid="ignore"):   # overflow to inf / NaN are the IEEE answers, as MPI's
        _tree_tiles(rows, rop.ufunc, out, n, c, np.float32 if dt.reduce == "float32" else dt.np)
    return out


# ----------------------------------------------------------------------------- int8 quantization

def quantize_into(flat: np.ndarray, block_size: int, q: np.ndarray | None = None,
                  scales: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``quantize`` of a flat, contiguous float32 or float16 array into ``q`` and ``scales``
    (new arrays by default), unchecked: a block holding inf or NaN gets a non-finite scale and
    q = 0 (it dequantizes to NaN) instead of an error, so that inside the pipeline one rank's
    overflow can never leave the others waiting."""
    nb = -(-flat.size // block_size)
    q = np.empty(flat.size, dtype=np.int8) if q is None else q
    scales = np.empty(nb, dtype=np.float32) if scales is None else scales
    kernel = getattr(KERNELS, "quantize_i8", None)
    if kernel is not None:
        if flat.size:
            kernel(flat, q, scales, block_size, flat.itemsize)
        return q, scales
    full = flat.size // block_size                       # whole blocks, then the short last one
    per = max(1, TILE // block_size)                      # blocks per cache tile
    work = np.empty(2 * min(per, max(full, 1)) * block_size, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for b0 in range(0, full, per):                    # a loop over cache tiles, each vectorised
            b1 = min(b0 + per, full)
            _quantize_tile(flat[b0 * block_size:b1 * block_size].reshape(b1 - b0, block_size),
                           q[b0 * block_size:b1 * block_size].reshape(b1 - b0, block_size), scales[b0:b1], work)
        if full < nb:
            _quantize_tile(flat[full * block_size:].reshape(1, -1), q[full * block_size:].reshape(1, -1),
                           scales[full:], work)
    return q, scales


def _quantize_tile(x: np.ndarray, q: np.ndarray, scales: np.ndarray, work: np.ndarray) -> None:
    """One cache tile of whole blocks (one block per row) of :func:`quantize_into`, numpy."""
    a = work[:x.size].reshape(x.shape)
    t = work[x.size:2 * x.size].reshape(x.shape)
    np.copyto(a, x)
    np.max(np.abs(a, out=t), axis=1, out=scales)
    scales /= np.float32(127)
    inv = np.zeros_like(scales)
    np.divide(np.float32(1), scales, out=inv, where=(scales > 0) & np.isfinite(scales))
    np.multiply(a, inv[:, None], out=a)
    tiny = np.isinf(inv)             # 1 / (a subnormal scale) overflows: divide instead
    if tiny.any():
        a[tiny] = x[tiny].astype(np.float32) / scales[tiny, None]
    np.rint(a, out=a)
    np.nan_to_num(a, copy=False)
    np.clip(a, -127, 127, out=a)
    np.copyto(q, a, casting="unsafe")


def dequant_sum(q: np.ndarray, scales: np.ndarray, block: int, out: np.ndarray) -> np.ndarray:
    """``out[i] = sum over rows r, in the tree order (:func:`tree_order`), of float32(q[r, i]) *
    scale(r, i)``, accumulated in float32 and rounded once into ``out`` (float16 or float32, contiguous, ``q.shape[1]`` elements).

    ``q``: (rows, c) int8, C-contiguous. ``scales``: (rows, ceil(c / block)) float32, or (rows, 1)
    with ``block=0``; scale(r, i) is ``scales[r, i // block]`` (``scales[r, 0]`` for block 0).
    One C pass when the kernels are built; else numpy over cache tiles, the rows of a tile at once.
    """
    rows, c = q.shape
    if c == 0 or rows == 0:
        return out
    kernel = getattr(KERNELS, "dequant_sum", None)
    if kernel is not None:
        kernel(q, scales, out, rows, block, out.itemsize)
        return out
    with np.errstate(over="ignore", invalid="ignore"):   # an overflowing sum gives inf/NaN, as IEEE
        return _dequant_sum_numpy(q, scales, block, out)


def _dequant_sum_numpy(q: np.ndarray, scales: np.ndarray, block: int, out: np.ndarray) -> np.ndarray:
    rows, c = q.shape
    full = c // block * block if block else c            # whole blocks, then the short last one
    step = max(block, TILE // rows // block * block) if block else max(1, TILE // rows)
    m = min(step, c)
    tmp, acc = np.empty(rows * m, dtype=np.float32), np.empty(m, dtype=np.float32)
    for s in range(0, full, step):                       # a loop over cache tiles, each vectorised
        e = min(s + step, full)
        t = tmp[:rows * (e - s)].reshape(rows, e - s)
        if block:
            np.multiply(q[:, s:e].reshape(rows, -1, block), scales[:, s // block:e // block, None],
                        out=t.reshape(rows, -1, block))
        else:
            np.multiply(q[:, s:e], scales[:, :1], out=t)
        _sum_rows(t, out[s:e], acc)
    if full < c:
        t = tmp[:rows * (c - full)].reshape(rows, c - full)
        np.multiply(q[:, full:], scales[:, -1:], out=t)
        _sum_rows(t, out[full:], acc)
    return out


def dequant_sum_quantize(q: np.ndarray, scales: np.ndarray, block: int, qblock: int, qout: np.ndarray,
                         sout: np.ndarray) -> None:
    """:func:`quantize_into` (per ``qblock``) of :func:`dequant_sum`'s float32 result, into ``qout``
    (int8, ``q.shape[1]`` elements) and ``sout``. In C the float32 sums stay in cache, one tile of
    whole blocks at a time; numpy goes through a float32 array."""
    c = q.shape[1]
    if c == 0:
        return
    kernel = getattr(KERNELS, "dequant_sum_quantize", None)
    if kernel is not None:
        kernel(q, scales, qout, sout, q.shape[0], block, qblock)
        return
    quantize_into(dequant_sum(q, scales, block, np.empty(c, dtype=np.float32)), qblock, qout, sout)


def _sum_rows(t: np.ndarray, out: np.ndarray, acc: np.ndarray) -> None:
    """``out`` = the rows of ``t`` summed in the tree order (:func:`tree_order`), float32, rounded
    once. Never ``np.add.reduce(t, axis=0)``: numpy sums a one-column tile pairwise, in an order
    that would depend on where the tiles fall (the message size)."""
    total = out if out.dtype == np.float32 else acc[:t.shape[1]]
    slots = [total] + list(np.empty((max(len(t).bit_length() - 1, 0), t.shape[1]), dtype=np.float32))
    tree_order(len(t), lambda j, r: np.copyto(slots[j], t[r]), lambda j, r: np.add(slots[j], t[r], out=slots[j]),
               lambda j, k: np.add(slots[j], slots[k], out=slots[j]))
    if total is not out:
        from_f32(total, out)


# ----------------------------------------------------------------------------- counts and packing

def split_even(total: int, n: int) -> np.ndarray:
    """Chunk sizes for ``total`` elements over ``n`` ranks: the first ``total % n`` get one more."""
    c = np.full(n, total // n, dtype=np.int64)
    c[: total % n] += 1
    return c


def prefix(counts) -> list[int]:
    """The exclusive prefix sums of ``counts``: packed displacements (a list: what mpi4py and the
    callers' indexing take, and faster than numpy for the few entries a communicator has)."""
    out, pos = [], 0
    for c in counts:
        out.append(pos)
        pos += int(c)
    return out


def pack(arrays: list[np.ndarray], flat: np.ndarray) -> None:
    """Copy ``arrays`` (any layout) one after the other into ``flat`` (a staging buffer), in one call."""
    if arrays:
        np.concatenate([a.reshape(-1) for a in arrays], out=flat)


def unpack(flat: np.ndarray, arrays: list[np.ndarray]) -> None:
    """:func:`pack`'s inverse: ``flat``'s parts into ``arrays`` (any layout, strided too)."""
    pos = 0
    for a in arrays:
        np.copyto(a, flat[pos:pos + a.size].reshape(a.shape))
        pos += a.size


def scatter_pairs(flat: np.ndarray, arrays: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(array's flat view, its part of flat)`` pairs, :func:`pack`'s layout, of C-contiguous arrays
    (made once, at record: :func:`copy_pairs` then does :func:`unpack`'s work)."""
    pairs, pos = [], 0
    for a in arrays:
        pairs.append((a.reshape(-1), flat[pos:pos + a.size]))
        pos += a.size
    return pairs
