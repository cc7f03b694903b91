"""The goldens' shared builders: seeded per-rank data every rank can rebuild, numpy reference
reductions, wrong-element counting, count/displacement plans, and the bench's inputs and raw types.

Written from the definitions (SPEC.md, docs/reproducibility.md) in numpy, never with the library's
own code: a golden that called what it checks would prove consistency, not correctness.
"""
from __future__ import annotations

import zlib

import numpy as np
from mpi4py import MPI

from .._dtypes import REDUCE_OPS, DType, ReduceOp

SEED = 20261122


def rng_for(seed: int, *key: object) -> np.random.Generator:
    """A generator every rank can rebuild from (seed, key...)."""
    return np.random.default_rng([seed, zlib.crc32(repr(key).encode())])


def rank_data(seed: int, key: str, rank: int, shape: tuple | int, dt: DType, kind: str = "int") -> np.ndarray:
    """Rank ``rank``'s input for a case.

    ``kind="int"``: small integers ([-4, 4], unsigned [0, 8]); every sum/prod/max/min over <= 4 ranks
    is exact in every dtype, so any reduction order gives the golden bit for bit (integer products
    wrap identically in MPI and numpy). ``kind="random"``: standard normal values (float dtypes).
    """
    g = rng_for(seed, key, rank)
    if kind == "random":
        return g.standard_normal(shape).astype(dt.np)
    lo, hi = (0, 2) if dt.np.kind == "b" else (0, 9) if dt.np.kind == "u" else (-4, 5)
    return g.integers(lo, hi, size=shape).astype(dt.np)


def golden_tree(leaves: list, op):
    """The tree order of every float reduction (docs/reproducibility.md, "The order"), written
    independently of the library's one-pass kernels: ``T(lo, hi) = op(T(lo, mid), T(mid, hi))``,
    ``mid = lo +`` the largest power of two below ``hi - lo``; ``T(r, r + 1) = leaves[r]``."""
    def t(lo: int, hi: int):
        if hi - lo == 1:
            return leaves[lo]
        mid = lo + (1 << ((hi - lo - 1).bit_length() - 1))
        return op(t(lo, mid), t(mid, hi))
    return t(0, len(leaves))


def golden_reduce(arrays: list[np.ndarray], dt: DType, rop: ReduceOp) -> np.ndarray:
    """Reduce in the tree order (:func:`golden_tree`): in the dtype itself (integers wrap, as MPI
    does; bool: or / and), float16/bfloat16 in float32 then rounded once; AVG: that sum divided by
    the number of ranks in the dtype."""
    if dt.reduce == "float32":
        acc = golden_tree([a.astype(np.float32) for a in arrays], rop.ufunc).astype(dt.np)
    else:
        acc = golden_tree([a.copy() for a in arrays], lambda a, b: rop.ufunc(a, b).astype(dt.np))
    if rop.average:
        acc = np.divide(acc, len(arrays)).astype(dt.np)
    return acc


def _ordered16(a: np.ndarray) -> np.ndarray:
    """Map 16-bit float patterns to integers whose order and spacing follow the values (ulps)."""
    u = a.view(np.uint16).astype(np.int32)
    return np.where(u & 0x8000, 0x8000 - u, u)


def count_wrong(got: object, expected: object, *, exact: bool = True, n: int = 1) -> int:
    """Elements of ``got`` that differ from ``expected``.

    ``expected`` is an array, a tuple of them (an operator with several outputs: summed over
    them) or None (a root-only output on another rank: ``got`` must be None too). Exact:
    bit-for-bit (NaN equal to NaN). Inexact: float16/bfloat16 within 1 ulp; float32/float64 within
    a relative 1e-5 / 1e-12 of the value plus an absolute ``n * eps``.
    """
    if expected is None:
        return 0 if got is None else max(int(np.size(got)), 1)
    if isinstance(expected, tuple):
        if not isinstance(got, tuple) or len(got) != len(expected):
            return max(sum(int(np.size(e)) for e in expected if e is not None), 1)
        return sum(count_wrong(g, e, exact=exact, n=n) for g, e in zip(got, expected))
    if not isinstance(got, np.ndarray) or got.shape != expected.shape or got.dtype != expected.dtype:
        return max(int(expected.size), 1)
    if got.size == 0:
        return 0
    if exact or expected.dtype.kind in "iub":
        if expected.dtype.kind in "iub":
            return int(np.count_nonzero(got != expected))
        same = (got == expected) | (np.isnan(got.astype(np.float32)) & np.isnan(expected.astype(np.float32)))
        return int(got.size - np.count_nonzero(same))
    if expected.dtype.itemsize == 2:
        return int(np.count_nonzero(np.abs(_ordered16(got) - _ordered16(expected)) > 1))
    eps = np.finfo(expected.dtype).eps
    rtol = 1e-5 if expected.dtype == np.float32 else 1e-12
    ok = np.isclose(got, expected, rtol=rtol, atol=4 * n * eps)
    return int(got.size - np.count_nonzero(ok))


def reduce_case_names(families: list[str]) -> list[str]:
    """``["even", "uneven"]`` -> ``["even:sum", "even:prod", ..., "uneven:min"]``."""
    return [f"{f}:{r}" for f in families for r in REDUCE_OPS]


# ----------------------------------------------------------------------------- count/displacement plans

PLAN_FAMILIES = ("uniform", "uneven", "zero", "spike", "skew", "gapped", "large")


def counts_matrix(family: str, n: int) -> np.ndarray:
    """``M[i, j]``: elements rank i sends to rank j, for a plan family."""
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    if family == "uniform":
        m = np.full((n, n), 5)
    elif family in ("uneven", "gapped"):
        m = (i * 7 + j * 3 + 1) % 6
    elif family == "zero":
        m = np.zeros((n, n))
    elif family == "spike":
        m = np.where(i == 0, 300, 0)
    elif family == "skew":
        m = (i + 1) * (j + 1) * 50
    elif family == "large":
        m = 20_000 + 7 * i + j
    else:
        raise KeyError(family)
    return m.astype(np.int64)


def displs(c: np.ndarray, gapped: bool) -> tuple[np.ndarray, int]:
    """Displacements for counts ``c`` and the buffer length they need.

    Packed: prefix sums. Gapped: blocks in reverse peer order with 3 unused elements before each.
    """
    if not gapped:
        d = np.concatenate(([0], np.cumsum(c)[:-1])).astype(np.int64)
        return d, int(c.sum())
    d = np.empty_like(c)
    pos = 0
    for k in reversed(range(c.size)):
        pos += 3
        d[k] = pos
        pos += int(c[k])
    return d, pos + 2


# ----------------------------------------------------------------------------- benchmark inputs

def bench_data(rank: int, count: int, dt: DType) -> np.ndarray:
    """Cheap deterministic inputs with an exact golden under every reduce op (values in [-3, 3],
    unsigned [0, 6]): ``((i + 3 * rank) % 7) - 3``."""
    v = (np.arange(count, dtype=np.int64) + 3 * rank) % 7
    return (v if dt.np.kind == "u" else v - 3).astype(dt.np)


def raw_reduce_type(dt: DType):
    """The MPI datatype a raw mpi4py reduction would use (MPICH's native float16; none for bfloat16)."""
    if dt.name == "float16":
        return MPI.FLOAT16_T
    if dt.name == "bfloat16" or dt.reduce == "logical":      # (bool: MPI's LOR on C_BOOL, not this op)
        return None
    return dt.mpi


TORCH_OPS = {"sum": "SUM", "prod": "PRODUCT", "max": "MAX", "min": "MIN", "avg": "AVG"}


def torch_view(torch, a: np.ndarray):
    """A torch tensor sharing ``a``'s memory (bfloat16 through its 16-bit pattern)."""
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)
