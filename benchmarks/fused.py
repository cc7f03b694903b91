"""The fused AllToAll + AllGather + BatchMatMul against the unfused sequence, same arrays, same run.

    mpirun -np 4 python benchmarks/fused.py [--E 8 --C 256 --H 1024 --M 1024] [--chunks 1,2,4,8] [--reps 5]
    scripts/cluster run 2 4 --rate 1gbit -- python benchmarks/fused.py          (2 hosts x 2 ranks)

ep = tp = 2 (4 ranks; ep x tp ranks in general), shard 0, float16, GELU, a 2-D bias. Per repetition,
interleaved: the fused operator at each chunk count; the unfused sequence (AllToAllAllGather, then
numpy's batched matmul + bias + GELU in float32); its communication alone; its compute alone. Times
are the slowest rank's, medians over repetitions; "hidden" is the share of the communication the
fused run did not add to its own compute: (comm + compute inside - fused) / comm, where "compute
inside" runs the operator's local steps alone (placing the gathered tokens, then its per-expert
matmul, bias and activation). Also the matmul throughput inside the operator (its per-expert steps)
against one numpy matmul of the same shapes, both with the operator's BLAS thread limit.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll.ops._moe import ROWS_PER_STEP, activate, blas_threads
from mpicoll.ops._moe import as_f32 as _f32, blas_limit as _limit, bmm as _bmm, place_tile as _place
from mpicoll.ops.fused import (AlltoAllAllGatherBatchMatMulOperation as Fused,
                               AlltoAllAllGatherBatchMatMulParam as FusedParam)

W = MPI.COMM_WORLD


def timed(fn) -> float:
    W.Barrier()
    t0 = time.perf_counter()
    fn()
    return W.allreduce(time.perf_counter() - t0, MPI.MAX)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--E", type=int, default=8)
    ap.add_argument("--C", type=int, default=256)
    ap.add_argument("--H", type=int, default=1024)
    ap.add_argument("--M", type=int, default=1024)
    ap.add_argument("--chunks", default="1,2,4,8")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    n = W.Get_size()
    tp = 2
    ep = n // tp
    m = mpicoll.mesh(ep, tp)
    E, C, H, M = args.E, args.C, args.H, args.M
    Ee = E // ep
    rng = np.random.default_rng(W.Get_rank())
    x = (rng.standard_normal((E, C, H // tp)) * 0.5).astype(np.float16)
    w = (rng.standard_normal((Ee, H, M // tp)) * 0.05).astype(np.float16)
    b = (rng.standard_normal((Ee, M // tp)) * 0.1).astype(np.float16)
    common = dict(group_ep=m.ep_domain, group_tp=m.tp_domain, ep_world_size=ep, tp_world_size=tp, act_type="gelu")
    chunk_counts = [int(c) for c in args.chunks.split(",")]
    fused = {k: Fused(FusedParam(chunks=k, **common), validate=False) for k in chunk_counts}
    outs = {k: (np.empty((Ee, ep * C, M // tp), np.float16), None, None) for k in chunk_counts}
    comm_op = mpicoll.AllToAllAllGatherOperation(mpicoll.AllToAllAllGatherParam(
        group_ep=m.ep_domain, group_tp=m.tp_domain, ep_world_size=ep, tp_world_size=tp), validate=False)
    z, g = np.empty_like(x), np.empty((tp, *x.shape), np.float16)
    y1 = np.empty((Ee, ep * C, M // tp), np.float16)
    threads = blas_threads(mpicoll._domains.world())
    w32, b32 = w.astype(np.float32), b.astype(np.float32).reshape(Ee, 1, -1)

    def compute():                    # a user's numpy: the gathered tokens laid out, one batched matmul
        y2 = np.ascontiguousarray(g.reshape(tp, ep, Ee, C, H // tp).transpose(2, 1, 3, 0, 4)).reshape(Ee, ep * C, H)
        with _limit(threads):
            v = np.matmul(y2.astype(np.float32), w32)
        v += b32
        np.copyto(y1, activate(1, v.astype(np.float16).astype(np.float32)), casting="unsafe")

    placed = np.empty((Ee, ep * C, H), np.float16)
    y1i = np.empty((Ee, ep * C, M // tp), np.float16)

    def inside():                     # the operator's local steps alone, one chunk
        _place(g.reshape(tp, ep, Ee, C, H // tp), placed, 0, Ee, 0, C, 0)
        for e in range(Ee):
            for r0 in range(0, ep * C, ROWS_PER_STEP):
                _bmm(placed, w, b, None, y1i, e, r0, min(r0 + ROWS_PER_STEP, ep * C), 1, threads)

    def comm():
        comm_op.execute(x, out=(z, g))

    def unfused():
        comm()
        compute()
    impls = {f"fused, {k} chunk(s)": (lambda k=k: fused[k].execute(x, w, b, outs[k])) for k in chunk_counts}
    impls.update({"unfused": unfused, "its communication": comm, "its compute": compute, "compute inside": inside})
    for fn in impls.values():
        fn()
    times = {k: [] for k in impls}
    order = list(impls)
    for rep in range(args.reps):
        for k in order[rep % len(order):] + order[:rep % len(order)]:
            times[k].append(timed(impls[k]))
    med = {k: statistics.median(v) for k, v in times.items()}
    # the matmul inside the operator (its per-expert steps) vs one numpy matmul of the same shapes
    y2 = np.ascontiguousarray(np.random.default_rng(1).standard_normal((Ee, ep * C, H)).astype(np.float16))
    y3 = np.empty((Ee, ep * C, M // tp), np.float16)
    inside = timed(lambda: [_bmm(y2, w, None, None, y3, e, r0, min(r0 + ROWS_PER_STEP, ep * C), 0, threads)
                            for e in range(Ee) for r0 in range(0, ep * C, ROWS_PER_STEP)])
    with _limit(threads):
        plain = timed(lambda: np.copyto(y3, np.matmul(_f32(y2), _f32(w)), casting="unsafe"))
    if W.Get_rank() == 0:
        print(f"# fused AllToAll+AllGather+BatchMatMul, {n} ranks (ep={ep} x tp={tp}), E={E} C={C} H={H} M={M}, "
              f"float16, GELU, bias; BLAS threads per rank {threads}; {args.reps} interleaved repetitions; "
              f"hosts: {len(set(W.allgather(MPI.Get_processor_name())))}")
        base = med["unfused"]
        for k, t in med.items():
            line = f"{k:<22} {t * 1e3:9.2f} ms   / unfused {t / base:6.3f}"
            if k.startswith("fused"):
                hidden = (med["its communication"] + med["compute inside"] - t) / med["its communication"]
                line += f"   communication hidden {hidden * 100:6.1f}%"
            print(line)
        print(f"matmul inside the operator (per expert) / one numpy matmul: throughput {plain / inside:.3f}")
    else:
        W.allgather(MPI.Get_processor_name())


if __name__ == "__main__":
    main()
