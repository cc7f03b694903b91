"""What a one-shot non-blocking call costs: ``op._start(x, out=y).wait()`` (the functional API's
``async_op=True``) against the raw non-blocking mpi4py call plus its wait, and against a blocking
``execute``, same arrays, same run.

    mpirun -bind-to core -np 2 python benchmarks/async_call.py [--reps 15]

Two calls: an 8-byte float32 AllReduce (one MPI call: ``Iallreduce``) and a 128 KiB float16 AllReduce
(three steps: AllToAll, a float32 reduction, AllGather). Blocks interleaved, each the slowest rank's
mean per call; medians of the blocks and of the ratios paired within a repetition.

Run against an older tree (one without ``Operation._start``), the one-shot call is what a user had
then: ``op.prepare(...)`` (which made a private copy of the communicator for a plan of several
steps), ``start().wait()``, ``free()``.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

import mpicoll

W = MPI.COMM_WORLD


def block(fn, iters: int) -> float:
    W.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return W.allreduce((time.perf_counter() - t0) / iters, MPI.MAX)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    raw = W.Dup()
    mpicoll.init()
    has_start = hasattr(mpicoll.Operation, "_start")
    rows = []
    for label, dtype, count, iters in (("8 B float32", np.float32, 2, 2000), ("128 KiB float16", np.float16, 65536, 200)):
        x, y = np.ones(count, dtype), np.empty(count, dtype)
        off = mpicoll.AllReduceOperation(validate=False)
        on = mpicoll.AllReduceOperation(validate=True)
        off.execute(x, out=y)

        def one_shot(op):
            if has_start:
                return lambda: op._start(x, y).wait()

            def old():
                plan = op.prepare(x, out=y)
                plan.start().wait()
                plan.free()
            return old
        impls = {"execute": lambda: off.execute(x, out=y), "async off": one_shot(off), "async on": one_shot(on)}
        if dtype == np.float32:
            def raw_call():
                raw.Iallreduce([x, MPI.FLOAT], [y, MPI.FLOAT], MPI.SUM).Wait()
            impls = {"raw I+Wait": raw_call, **impls}
        for fn in impls.values():
            for _ in range(5):
                fn()
        times = {k: [] for k in impls}
        order = list(impls)
        for rep in range(args.reps):
            for k in order[rep % len(order):] + order[:rep % len(order)]:
                times[k].append(block(impls[k], iters))
        rows.append((label, times))
    if W.Get_rank() == 0:
        print(f"# one-shot non-blocking call, {W.Get_size()} ranks, {args.reps} interleaved repetitions, "
              f"{'Operation._start' if has_start else 'prepare + start + wait + free (older tree)'}")
        for label, times in rows:
            med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
            base = "raw I+Wait" if "raw I+Wait" in times else "execute"
            line = ", ".join(f"{k} {v:.2f} us" for k, v in med.items())
            ratios = ", ".join(f"{k} - {base} {statistics.median([a - b for a, b in zip(times[k], times[base])]) * 1e6:+.2f} us"
                               for k in times if k != base)
            print(f"{label}: {line}\n    {ratios}")


if __name__ == "__main__":
    main()
