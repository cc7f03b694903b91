"""The local work of the fused MoE operators (mpicoll/ops/fused.py): a tile's packing and placing,
the batched matmul steps (float32 from 16-bit floats, rounded after each step), the activations,
and how many BLAS threads a rank may use (the cores of its node, shared by its ranks there)."""
from __future__ import annotations

import math

import numpy as np

from .._cpus import node_affinities
from .._numeric import from_f32, to_f32

#: rows of y2 one matmul step takes at most: between steps, MPI moves the collectives in flight on
ROWS_PER_STEP = 128


_ERFC = (np.float32(-0.82215223), np.float32(1.48851587), np.float32(-1.13520398), np.float32(0.27886807),
         np.float32(-0.18628806), np.float32(0.09678418), np.float32(0.37409196), np.float32(1.00002368),
         np.float32(-1.26551223))


def _erfc(x: np.ndarray) -> np.ndarray:
    """erfc of float32 ``x``, float32, with a relative error below 1.2e-7 everywhere (the Chebyshev
    fit of Press et al., Numerical Recipes 6.2): GELU of a large negative value keeps its
    significant bits, where 1 + erf(x) would cancel. numpy has no erf. In place, pass by pass."""
    z = np.abs(x)
    t = np.multiply(z, np.float32(0.5))
    t += np.float32(1)
    np.reciprocal(t, out=t)
    p = np.multiply(t, np.float32(0.17087277))
    for k in _ERFC[:-1]:
        p += k
        p *= t
    p += _ERFC[-1]
    np.multiply(z, z, out=z)
    p -= z
    np.exp(p, out=p)
    p *= t
    np.subtract(np.float32(2), p, out=p, where=x < 0)
    return p


def activate(act: int, v: np.ndarray) -> np.ndarray:
    """The activation ``act`` of float32 ``v``, in place (returns ``v``)."""
    if act == 1:                   # 0.5 x (1 + erf(x / sqrt 2)) = 0.5 x erfc(-x / sqrt 2)
        e = _erfc(v * np.float32(-1 / math.sqrt(2)))
        v *= np.float32(0.5)
        v *= e
    elif act in (2, 4):            # x sigmoid(x) and x sigmoid(1.702 x)
        d = np.multiply(v, np.float32(-1 if act == 2 else -1.702))
        with np.errstate(over="ignore"):                  # exp overflow: inf, then x / inf = -0, the limit
            np.exp(d, out=d)
        d += np.float32(1)
        v /= d
    elif act == 3:
        np.maximum(v, np.float32(0), out=v)
    return v


def as_f32(a: np.ndarray) -> np.ndarray:
    """A float32 copy of a 16-bit float array (the C kernels where built)."""
    out = np.empty(a.shape, np.float32)
    if a.flags.c_contiguous:
        return to_f32(a.reshape(-1), out.reshape(-1)).reshape(a.shape)
    np.copyto(out, a)
    return out


def round_into(v: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Round float32 ``v`` into 16-bit ``out`` (contiguous), to nearest even."""
    return from_f32(np.ascontiguousarray(v).reshape(-1), out.reshape(-1)).reshape(out.shape)


# ----------------------------------------------------------------------------- BLAS threads

_THREADS: dict[int, int] = {}
_CONTROLLER: list = []


def blas_threads(lib) -> int:
    """Cores per rank on this node: the cores this process may use, shared by the node's ranks of
    ``lib`` (collective over ``lib`` the first time, when the operation binds)."""
    if lib.ident not in _THREADS:
        lib.meet("count the cores of its node")
        sets, here = node_affinities(lib.mpi)
        _THREADS[lib.ident] = max(1, min(len(here), len(set().union(*sets)) // len(sets)))
    return _THREADS[lib.ident]


def blas_limit(threads: int):
    """threadpoolctl's limit of BLAS threads (the controller made once per process)."""
    if not _CONTROLLER:
        from threadpoolctl import ThreadpoolController
        _CONTROLLER.append(ThreadpoolController())
    return _CONTROLLER[0].limit(limits=threads, user_api="blas")


def rows_of(ep: int, tp: int, C: int, cx: int, c0: int, c1: int, shard: int):
    """The runs of y2's rows a tile fills, cut at ROWS_PER_STEP: token rows [c0, c1) of each
    source block, a block being ``s*C`` (shard 0, cx = C) or ``(s*tp + t)*(C/tp)`` (shard 1)."""
    if c0 == 0 and c1 == cx:
        runs = [(0, ep * C)]                          # (whole experts: one run)
    else:
        runs = [(blk * cx + c0, blk * cx + c1) for blk in range(ep if shard == 0 else ep * tp)]
    for first, end in runs:
        for r0 in range(first, end, ROWS_PER_STEP):
            yield r0, min(r0 + ROWS_PER_STEP, end)


def pack_tile(x: np.ndarray, send: np.ndarray, Ee: int, e0: int, e1: int, c0: int, c1: int) -> None:
    """send[j] = x's experts [j*Ee + e0, j*Ee + e1), token rows [c0, c1): block j of dim 0 goes to ep
    rank j."""
    ep = send.shape[0]
    np.copyto(send, x.reshape(ep, Ee, *x.shape[1:])[:, e0:e1, c0:c1])


def place_tile(gat: np.ndarray, y2: np.ndarray, e0: int, e1: int, c0: int, c1: int, shard: int) -> None:
    """A gathered tile (tp, ep, k, rows c0..c1, H') into y2 by SPEC's index formulas."""
    tp, ep, k, _, h = gat.shape
    if shard == 0:    # y2[e, s*C + c, t*(H/tp) + h] = gat[t, s, e, c, h]
        C = y2.shape[1] // ep
        y2[e0:e1].reshape(k, ep, C, tp, h)[:, :, c0:c1] = gat.transpose(2, 1, 3, 0, 4)
    else:             # y2[e, (s*tp + t)*(C/tp) + c, h] = gat[t, s, e, c, h]
        cs = y2.shape[1] // (ep * tp)
        y2[e0:e1].reshape(k, ep, tp, cs, h)[:, :, :, c0:c1] = gat.transpose(2, 1, 0, 3, 4)


def bmm(y2: np.ndarray, w: np.ndarray, b: np.ndarray | None, y3: np.ndarray | None, y1: np.ndarray, e: int,
         r0: int, r1: int, act: int, threads: int) -> None:
    """Rows [r0, r1) of expert e: y3 = round(f32(y2) @ f32(w) + f32(b)); y1 = round(act(f32(y3)))."""
    with blas_limit(threads):
        v = np.matmul(as_f32(y2[e, r0:r1]), as_f32(w[e]))
    if b is not None:
        v += as_f32(b[e]).reshape(1, -1) if b.dtype != np.float32 else b[e].reshape(1, -1)
    if act == 0:
        round_into(v, y1[e, r0:r1])
        return
    tgt = y3[e, r0:r1] if y3 is not None else np.empty(v.shape, y1.dtype)
    round_into(v, tgt)
    round_into(activate(act, as_f32(tgt)), y1[e, r0:r1])


def bmm_part(x: np.ndarray, w: np.ndarray, part: np.ndarray, e0: int, e: int, shard: int, threads: int) -> None:
    """Expert e's partial product, rounded, into its tp blocks: part[t, e - e0, s] is the block of
    tokens from ep rank s that tp rank t keeps (by the forward's index formulas, inverted)."""
    with blas_limit(threads):
        v = np.matmul(as_f32(x[e]), as_f32(w[e]))                   # (ep*C, H)
    tp, _, ep, c, h = part.shape
    if shard == 0:    # row s*C + c, column t*(H/tp) + h
        src = v.reshape(ep, c, tp, h).transpose(2, 0, 1, 3)
    else:             # row (s*tp + t)*(C/tp) + c, column h
        src = v.reshape(ep, tp, c, h).transpose(1, 0, 2, 3)
    round_into(np.ascontiguousarray(src), part[:, e - e0])


def bias_and_pack(mine: np.ndarray, b: np.ndarray | None, e0: int, e1: int, send: np.ndarray) -> None:
    """send[s, e] = mine[e, s] + bias[e] (float32, rounded): what goes back to ep rank s."""
    if b is None:
        np.copyto(send, mine.transpose(1, 0, 2, 3))
        return
    k = e1 - e0
    v = as_f32(mine) + (as_f32(b[e0:e1]) if b.dtype != np.float32 else b[e0:e1]).reshape(k, 1, 1, -1)
    round_into(np.ascontiguousarray(v.transpose(1, 0, 2, 3)), send)


def unpack_back(back: np.ndarray, y: np.ndarray, Ee: int, e0: int, e1: int) -> None:
    """y[j*Ee + e, c, h] = back[j, e - e0, c, h]: expert owner j's results for this rank's tokens."""
    ep = back.shape[0]
    y.reshape(ep, Ee, *y.shape[1:])[:, e0:e1] = back
