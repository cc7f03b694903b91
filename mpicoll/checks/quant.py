"""QuantAllReduce (mpicoll/ops/quant.py): golden cases and bench spec."""
from __future__ import annotations

import numpy as np

from .._dtypes import DTYPES
from ..ops.quant import QuantAllReduceOperation, QuantAllReduceParam
from ._golden import bench_data, golden_tree, rank_data, rng_for
from ._spec import BenchRun, BenchSpec, Case, CheckSpec

#: the dtype the operator takes (SPEC: int8 data, with its scales)
_INT8 = DTYPES["int8"]

_CASES = {"scalar-even": (0, lambda n: 64 * n), "scalar-uneven": (0, lambda n: 37), "block32": (32, lambda n: 32 * 8 * n),
          "block128-uneven": (128, lambda n: 1000 + n), "block1": (1, lambda n: 5), "zero": (16, lambda n: 0),
          "tiny": (4, lambda n: 3), "int8-gather": (64, lambda n: 640 * n + 17),
          # several cache tiles per chunk (C and numpy paths), a short last block, uneven chunks
          "large-block100": (100, lambda n: 150_001 * n - 7), "large-scalar": (0, lambda n: 70_001 * n + 5),
          "int8-gather-scalar": (0, lambda n: 1001 * n + 3)}


def golden_f32(xs: list[np.ndarray], scales: list[np.ndarray], block: int) -> np.ndarray:
    """``sum_r float32(x_r) * scale_r`` in float32, in the tree order (independent of the chunking), flat."""
    products = []
    for x, s in zip(xs, scales):
        v = x.reshape(-1).astype(np.float32)
        per = np.repeat(s, block)[:v.size] if block else np.full(v.size, s[0], np.float32)
        products.append(v * per)
    return golden_tree(products, np.add)


def golden(xs: list[np.ndarray], scales: list[np.ndarray], block: int) -> np.ndarray:
    """``float16(sum_r float32(x_r) * scale_r)``."""
    return golden_f32(xs, scales, block).astype(np.float16).reshape(xs[0].shape)


def requantized(v: np.ndarray, block: int) -> np.ndarray:
    """float32 ``v`` quantized per block of ``block`` elements as docs/quant.md defines it (symmetric
    absmax: ``scale = absmax / 127``, ``q = clip(rint(v * (1 / scale)), -127, 127)``, 0 for an
    all-zero block; ``v / scale`` where ``1 / scale`` overflows), then dequantized to float16
    (``float16(float32(q) * scale)``). In numpy, apart from the library's quantize/dequantize."""
    if v.size == 0:
        return np.zeros(0, np.float16)
    nb = -(-v.size // block)
    padded = np.zeros(nb * block, np.float32)
    padded[:v.size] = v
    rows = padded.reshape(nb, block)
    scale = np.max(np.abs(rows), axis=1) / np.float32(127)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        inv = np.where(scale > 0, np.float32(1) / scale, np.float32(0)).astype(np.float32)
        scaled = np.where(np.isinf(inv)[:, None], rows / scale[:, None], rows * inv[:, None])
    q = np.clip(np.rint(scaled), -127, 127).astype(np.int8)
    return (q.astype(np.float32) * scale[:, None]).astype(np.float16).reshape(-1)[:v.size]


def golden_int8_gather(xs: list[np.ndarray], scales: list[np.ndarray], block: int, n: int) -> np.ndarray:
    """The float32 golden re-quantized per block (chunks follow block boundaries), or with
    ``block=0`` per chunk (one scale each; SPEC's contiguous chunks, the first ``size % n`` one
    element longer), dequantized to float16."""
    exact = golden_f32(xs, scales, block)
    if block:
        return requantized(exact, block).reshape(xs[0].shape)
    sizes = [exact.size // n + (1 if j < exact.size % n else 0) for j in range(n)]
    pieces = [requantized(p, p.size) for p in np.split(exact, np.cumsum(sizes)[:-1])]
    return np.concatenate(pieces).reshape(xs[0].shape)


def _case(case, dtype, comm_domain, rank, n, seed, validate=True) -> Case:
    block, size_of = _CASES[case]
    size = size_of(n)
    xs = [rank_data(seed, f"Quant/{case}", r, size, _INT8) * 30 for r in range(n)]
    xs = [x.astype(np.int8) for x in xs]
    nscales = 1 if block == 0 else -(-size // block)
    scales = [rng_for(seed, "Quant/scale", case, r).uniform(0.001, 0.01, nscales).astype(np.float32) for r in range(n)]
    if case == "block32" and n:
        scales[0][0] = 0.0                                   # an all-zero-scale block is fine
    gather = "int8" if case.startswith("int8-gather") else "float16"
    op = QuantAllReduceOperation(QuantAllReduceParam(comm_domain=comm_domain, rank_size=n, block_size=block,
                                                     allgather_dtype=gather), validate=validate)
    expected = golden_int8_gather(xs, scales, block, n) if gather == "int8" else golden(xs, scales, block)
    return Case(op, (xs[rank], scales[rank] if block else float(scales[rank][0])), {}, expected)


CHECKS = (
    CheckSpec("QuantAllReduce", lambda n: list(_CASES), _case, dtypes=(_INT8.name,)),
)


def _bench(c) -> BenchRun:
    """int8 input of ``count`` elements, one scalar scale per rank, float16 out."""
    xs = [bench_data(r, c.count, _INT8) for r in range(c.n)]
    scales = [np.full(1, 0.01 * (r + 1), np.float32) for r in range(c.n)]
    out = np.empty(c.count, dtype=np.float16)
    op = QuantAllReduceOperation(QuantAllReduceParam(comm_domain=c.comm_domain, rank_size=c.n), validate=c.validate)
    return BenchRun(op, (xs[c.rank], scales[c.rank]), golden(xs, scales, 0), kwargs={"out": out})


BENCHES = (
    BenchSpec("QuantAllReduce", _bench, lambda n: 2 * (n - 1) / n if n else 0, dtypes=(_INT8.name,)),
)
