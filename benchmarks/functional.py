"""The functional API and graph mode against raw mpi4py, same arrays, same run.

    mpirun -bind-to core -np 2 python benchmarks/functional.py [--reps 15] [--dtype float32]

1. 16 small collectives (8 B .. 4 KiB, AllReduce, Broadcast and AllGather mixed, independent
   arrays): a graph's replay, the same 16 raw mpi4py calls in a Python loop, and the same 16
   eager functional calls (validation off).
2. functional all_reduce of 1 MiB float32, called repeatedly, against the raw Allreduce.
3. eager functional all_reduce of 8 B, validation off and on, against the raw Allreduce.

Blocks interleaved, each in turn first; each block the slowest rank's mean per iteration; medians of
the blocks, and of the ratios paired within a repetition.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

from mpicoll import _adapters as A, functional as F, graph

W = MPI.COMM_WORLD


def block(fn, iters: int) -> float:
    W.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return W.allreduce((time.perf_counter() - t0) / iters, MPI.MAX)


def compare(impls: dict, iters: int, reps: int) -> dict:
    for fn in impls.values():
        for _ in range(3):
            fn()
    times = {k: [] for k in impls}
    order = list(impls)
    for rep in range(reps):
        for k in order[rep % len(order):] + order[:rep % len(order)]:
            times[k].append(block(impls[k], iters))
    return times


def report(title: str, times: dict, base: str) -> None:
    if W.Get_rank():
        return
    print(f"## {title}")
    for k, v in times.items():
        line = f"  {k:<28} {statistics.median(v) * 1e6:10.2f} us"
        if k != base:
            ratios = [a / b for a, b in zip(v, times[base])]
            diff = [(a - b) * 1e6 for a, b in zip(v, times[base])]
            line += f"   / {base}: {statistics.median(ratios):.3f}   - {base}: {statistics.median(diff):+.2f} us"
        print(line)


def sixteen(dtype: np.dtype, raw: MPI.Comm):
    """16 calls on independent arrays: sizes 8 B .. 4 KiB; AllReduce, Broadcast, AllGather in turn."""
    n, itemsize = W.Get_size(), np.dtype(dtype).itemsize
    sizes = [max(1, b // itemsize) for b in (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8, 64, 512, 4096,
                                              32, 1024)]
    m = MPI._typedict[np.dtype(dtype).char]
    calls_raw, calls_f = [], []
    for k, c in enumerate(sizes):
        x = np.ones(c, dtype)
        kind = k % 3
        if kind == 0:
            calls_raw.append(lambda x=x: raw.Allreduce(MPI.IN_PLACE, [x, m], MPI.SUM))
            calls_f.append(lambda x=x: F.all_reduce(x))
        elif kind == 1:
            calls_raw.append(lambda x=x: raw.Bcast([x, m], 0))
            calls_f.append(lambda x=x: F.broadcast(x, src=0))
        else:
            out = np.empty(n * c, dtype)
            calls_raw.append(lambda x=x, out=out: raw.Allgather([x, m], [out, m]))
            calls_f.append(lambda x=x, out=out: F.all_gather_into_tensor(out, x))
    return calls_raw, calls_f


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--inexact", action="store_true", help="capture(exact=False): float reductions merged too")
    args = ap.parse_args()
    raw = W.Dup()
    dtype = np.dtype(args.dtype)
    F.barrier()
    for op in list(F._OPS.values()):
        op.validate = False
    calls_raw, calls_f = sixteen(dtype, raw)
    for fn in calls_f:                     # (the operations exist, agreed once; then validation off)
        fn()
    for op in F._OPS.values():
        op.validate = False
    with graph.capture(exact=not args.inexact) as g:
        for fn in calls_f:
            fn()

    def run_raw():
        for fn in calls_raw:
            fn()

    def run_eager():
        for fn in calls_f:
            fn()
    times = compare({"raw mpi4py (16 calls)": run_raw, "graph replay": g.replay, "eager functional": run_eager},
                    200, args.reps)
    if W.Get_rank() == 0:
        print(f"# functional API and graph mode, {W.Get_size()} ranks, {args.reps} interleaved repetitions; "
              f"{g.summary()}")
    report(f"16 small collectives ({dtype.name}, 8 B .. 4 KiB)", times, "raw mpi4py (16 calls)")
    g.free()

    big = np.ones(1 << 18, np.float32)
    same = np.empty_like(big)
    F.all_reduce(big)
    for op in F._OPS.values():
        op.validate = False
    times = compare({"raw Allreduce": lambda: raw.Allreduce([big, MPI.FLOAT], [same, MPI.FLOAT], MPI.SUM),
                     "functional all_reduce": lambda: F.all_reduce(big)}, 100, args.reps)
    report("all_reduce of 1 MiB float32, repeated (validation off)", times, "raw Allreduce")

    tiny, tout = np.ones(2, np.float32), np.empty(2, np.float32)
    on = A.AllReduce(A.AllReduce.PARAM(reduce_type="sum"))     # (its own operation: the cached one is off)
    on.validate = True
    times = compare({"raw Allreduce": lambda: raw.Allreduce([tiny, MPI.FLOAT], [tout, MPI.FLOAT], MPI.SUM),
                     "functional (validation off)": lambda: F.all_reduce(tiny),
                     "functional (validation on)": lambda: on.execute(tiny)}, 2000, args.reps)
    report("all_reduce of 8 B, eager", times, "raw Allreduce")


if __name__ == "__main__":
    main()
