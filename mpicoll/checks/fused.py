"""The fused MoE operators (mpicoll/ops/fused.py): golden cases and bench spec.

A mesh ep x tp over the check's communicator (tp = 2, ep = n / 2: 4 ranks and more; the documented
sizes only), domain names derived from it (formed by their members, rank_size given). The goldens
follow SPEC's index formulas, in numpy.
"""
from __future__ import annotations

import math

import numpy as np

from .._dtypes import DTYPES, HALF_FLOATS
from ..ops.fused import (ACT_TYPES, SIZES, AlltoAllAllGatherBatchMatMulOperation,
                         AlltoAllAllGatherBatchMatMulParam, BatchMatMulReduceScatterAlltoAllOperation,
                         BatchMatMulReduceScatterAlltoAllParam)
from ._golden import golden_tree, rank_data
from ._spec import BenchRun, BenchSpec, Case, CheckSpec


def mesh_of(n: int) -> tuple[int, int] | None:
    """``(ep, tp)`` for the checks at ``n`` ranks, or None when no documented mesh fits."""
    return (n // 2, 2) if n % 2 == 0 and n // 2 in SIZES else None


def no_mesh(n: int) -> str | None:
    """Why the checks and the bench cannot run the fused operators at ``n`` ranks (None: they can)."""
    if mesh_of(n):
        return None
    ranks = [2 * ep for ep in SIZES]
    return f"needs {', '.join(map(str, ranks[:-1]))} or {ranks[-1]} ranks (an ep x 2 mesh), not {n}"


def _names(comm_domain: str, rank: int, n: int, layout: str) -> tuple[str, str, int, int]:
    ep, tp = mesh_of(n)
    s, t = divmod(rank, tp) if layout == "tp" else (rank % ep, rank // ep)
    base = f"fused.{comm_domain or 'world'}.{layout}"
    return f"{base}.ep{t}", f"{base}.tp{s}", s, t


def _inputs(seed, case, dtype, n, layout, shard):
    """Every mesh rank's x, and this case's shapes: E = 2 ep, C = 4, H = 4 tp, M = 3 tp."""
    ep, tp = mesh_of(n)
    dt = DTYPES[dtype]
    E, C, H, M = 2 * ep, 4, 4 * tp, 3 * tp
    shape = (E, C, H // tp) if shard == 0 else (E, C // tp, H)
    return {r: rank_data(seed, f"Fused/{case}/{dtype}", r, shape, dt) for r in range(n)}, (E, C, H, M)


def forward_golden(xs: dict, where, s: int, ep: int, tp: int, shard: int, w, b, act: int, dt):
    """y1, y2, y3 of mesh rank (s, .) by SPEC's formulas; ``where(s, t)``: the rank of (s, t)."""
    E = next(iter(xs.values())).shape[0]
    Ee = E // ep
    sample = xs[where(0, 0)]
    C, H = (sample.shape[1], sample.shape[2] * tp) if shard == 0 else (sample.shape[1] * tp, sample.shape[2])
    y2 = np.zeros((Ee, ep * C, H), dt.np)
    for e in range(Ee):
        for s2 in range(ep):
            for t2 in range(tp):
                block = xs[where(s2, t2)][s * Ee + e]
                if shard == 0:
                    y2[e, s2 * C:(s2 + 1) * C, t2 * (H // tp):(t2 + 1) * (H // tp)] = block
                else:
                    cs = C // tp
                    y2[e, (s2 * tp + t2) * cs:(s2 * tp + t2 + 1) * cs, :] = block
    v = y2.astype(np.float32) @ w.astype(np.float32)
    if b is not None:
        v = v + b.astype(np.float32).reshape(Ee, 1, -1)
    y3 = v.astype(dt.np)
    f = y3.astype(np.float64)
    a = {0: f, 1: 0.5 * f * np.vectorize(math.erfc)(-f / math.sqrt(2)), 2: f / (1 + np.exp(-f)),
         3: np.maximum(f, 0), 4: f / (1 + np.exp(-1.702 * f))}[act]
    return a.astype(np.float32).astype(dt.np), y2, y3


_CASES = ["0:gelu:none:tp", "1:silu:2d:tp", "0:relu:3d:ep", "1:fastgelu:3d:ep", "0:none:2d:ep"]


def _case(case, dtype, comm_domain, rank, n, seed, validate=True) -> Case:
    shard, act, bias, layout = case.split(":")
    shard, act = int(shard), ACT_TYPES[act]
    ep, tp = mesh_of(n)
    group_ep, group_tp, s, t = _names(comm_domain, rank, n, layout)
    xs, (E, C, H, M) = _inputs(seed, case, dtype, n, layout, shard)
    dt = DTYPES[dtype]
    w = rank_data(seed, f"Fused/{case}/w", rank, (E // ep, H, M // tp), dt)
    bdt = DTYPES["float16" if dtype == "float16" else "float32"]
    b = None if bias == "none" else rank_data(seed, f"Fused/{case}/b", rank, (E // ep, M // tp) if bias == "2d" else
                                              (E // ep, 1, M // tp), bdt)
    where = (lambda s2, t2: s2 * tp + t2) if layout == "tp" else (lambda s2, t2: t2 * ep + s2)
    y1, y2, y3 = forward_golden(xs, where, s, ep, tp, shard, w, b, act, dt)
    op = AlltoAllAllGatherBatchMatMulOperation(AlltoAllAllGatherBatchMatMulParam(
        comm_domain=comm_domain, rank_size=n, group_ep=group_ep, group_tp=group_tp, ep_world_size=ep,
        tp_world_size=tp, x_shard_type=shard, act_type=act, output_y2=True, output_y3=act != 0, chunks=2),
        validate=validate)
    return Case(op, (xs[rank], w, b), {}, (y1, y2, y3 if act else None), exact=False)


def _bench(c) -> BenchRun:
    """x of ``count`` elements as (E, C, H/tp), E = 2 ep, H = 256 tp (shard 0), M = H; the raw
    form: mpi4py's Alltoall and Allgather on the same mesh, then numpy's matmul."""
    ep, tp = mesh_of(c.n)
    s, t = divmod(c.rank, tp)
    E, H = 2 * ep, 256 * tp
    C = max(1, c.count // (E * (H // tp)))
    dt = c.dtype
    x = (np.arange(E * C * (H // tp)) % 7 - 3).astype(dt.np).reshape(E, C, H // tp)
    w = (np.arange((E // ep) * H * (H // tp)) % 5 - 2).astype(dt.np).reshape(E // ep, H, H // tp)
    base = f"fused.bench.{c.comm_domain or 'world'}"
    op = AlltoAllAllGatherBatchMatMulOperation(AlltoAllAllGatherBatchMatMulParam(
        comm_domain=c.comm_domain, rank_size=c.n, group_ep=f"{base}.ep{t}", group_tp=f"{base}.tp{s}",
        ep_world_size=ep, tp_world_size=tp), validate=c.validate)
    raw_ep, raw_tp = c.comm.Split(t, c.rank), c.comm.Split(s, c.rank)
    z, g = np.empty_like(x), np.empty((tp, *x.shape), dt.np)
    y1 = np.empty((E // ep, ep * C, H // tp), dt.np)
    m, w32 = dt.mpi, w.astype(np.float32)

    def raw():
        raw_ep.Alltoall([x, m], [z, m])
        raw_tp.Allgather([z, m], [g, m])
        y2 = g.reshape(tp, ep, E // ep, C, H // tp).transpose(2, 1, 3, 0, 4).reshape(E // ep, ep * C, H)
        np.copyto(y1, np.matmul(y2.astype(np.float32), w32), casting="unsafe")
    xs = {r: x for r in range(c.n)}                     # (every rank's x is the same here)
    expected = (forward_golden(xs, lambda s2, t2: s2 * tp + t2, s, ep, tp, 0, w, None, 0, dt)[0], None, None)
    return BenchRun(op, (x, w), expected, kwargs={"out": (y1, None, None)}, raw=raw, exact=False,
                    close=lambda: (raw_ep.Free(), raw_tp.Free()))


def reverse_golden(xs: dict, ws: dict, bs: dict, where, s: int, t: int, ep: int, tp: int, shard: int, dt):
    """y of mesh rank (s, t) by the reverse's formula: partial products rounded, summed over tp in
    float32 in the tree order over tp ranks and rounded, the bias added in float32 and rounded."""
    Ee, rows, _ = next(iter(xs.values())).shape
    C = rows // ep
    H = next(iter(ws.values())).shape[2]
    hs, cs = H // tp, C // tp
    y = np.zeros((Ee * ep, C, hs) if shard == 0 else (Ee * ep, cs, H), dt.np)
    for j in range(ep):
        for e in range(Ee):
            parts = []
            for t2 in range(tp):
                r = where(j, t2)
                p = (xs[r][e].astype(np.float32) @ ws[r][e].astype(np.float32)).astype(dt.np).astype(np.float32)
                parts.append(p[s * C:(s + 1) * C, t * hs:(t + 1) * hs] if shard == 0 else
                             p[(s * tp + t) * cs:(s * tp + t + 1) * cs, :])
            v = golden_tree(parts, np.add).astype(dt.np).astype(np.float32)
            b = bs[where(j, t)]
            if b is not None:
                v = v + b.astype(np.float32).reshape(Ee, -1)[e]
            y[j * Ee + e] = v.astype(dt.np)
    return y


_REVERSE_CASES = ["0:2d:tp", "1:none:ep", "0:3d:ep", "1:3d:tp"]


def _reverse_case(case, dtype, comm_domain, rank, n, seed, validate=True) -> Case:
    shard, bias, layout = case.split(":")
    shard = int(shard)
    ep, tp = mesh_of(n)
    group_ep, group_tp, s, t = _names(comm_domain, rank, n, layout)
    dt = DTYPES[dtype]
    Ee, C, H, mt = 2, 4, 4 * tp, 3
    bdt = DTYPES["float16" if dtype == "float16" else "float32"]
    share = H // tp if shard == 0 else H
    xs = {r: rank_data(seed, f"FusedR/{case}/{dtype}/x", r, (Ee, ep * C, mt), dt) for r in range(n)}
    ws = {r: rank_data(seed, f"FusedR/{case}/{dtype}/w", r, (Ee, mt, H), dt) for r in range(n)}
    bs = {r: None if bias == "none" else rank_data(seed, f"FusedR/{case}/{dtype}/b", r, (Ee, share) if bias == "2d"
                                                    else (Ee, 1, share), bdt) for r in range(n)}
    where = (lambda s2, t2: s2 * tp + t2) if layout == "tp" else (lambda s2, t2: t2 * ep + s2)
    op = BatchMatMulReduceScatterAlltoAllOperation(BatchMatMulReduceScatterAlltoAllParam(
        comm_domain=comm_domain, rank_size=n, group_ep=group_ep, group_tp=group_tp, ep_world_size=ep,
        tp_world_size=tp, y_shard_type=shard, chunks=2), validate=validate)
    return Case(op, (xs[rank], ws[rank], bs[rank]), {}, reverse_golden(xs, ws, bs, where, s, t, ep, tp, shard, dt))


CHECKS = (
    CheckSpec("AlltoAllAllGatherBatchMatMul", lambda n: _CASES, _case, dtypes=HALF_FLOATS, skip_at=no_mesh),
    CheckSpec("BatchMatMulReduceScatterAlltoAll", lambda n: _REVERSE_CASES, _reverse_case, dtypes=HALF_FLOATS,
              skip_at=no_mesh),
)
BENCHES = (
    BenchSpec("AlltoAllAllGatherBatchMatMul", _bench,
              lambda n: (mesh_of(n)[0] - 1) / mesh_of(n)[0] + (mesh_of(n)[1] - 1) if mesh_of(n) else 0,
              count_multiple=lambda n: 2 * mesh_of(n)[0] * 256 if mesh_of(n) else 1, dtypes=HALF_FLOATS,
              skip_at=no_mesh),
)
