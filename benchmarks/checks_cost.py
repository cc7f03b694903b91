"""What each reliability feature costs per call, same arrays, same run, interleaved.

    mpirun -np 2 python benchmarks/checks_cost.py [--sizes 8,65536,16777216] [--ops AllReduce,AllToAllVV2]

Columns: raw mpi4py call; mpicoll with validation off; validation on (the default); MPICOLL_DEBUG
(sequence numbers in the header); the watchdog (a per-operation timeout, validation on: every call
non-blocking and polled). Medians of interleaved blocks, slowest rank.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics

from mpi4py import MPI

import mpicoll
from mpicoll import _env
from mpicoll._domains import user_comm
from overhead import block_time, cases, loop   # same directory

W = MPI.COMM_WORLD


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="8,65536,16777216")
    ap.add_argument("--ops", default="AllReduce,AllGather,Broadcast,AllToAllVV2")
    ap.add_argument("--reps", type=int, default=9)
    args = ap.parse_args()
    raw_comm = W.Dup()
    mpicoll.init()
    wanted = set(args.ops.split(","))
    rows = []
    for nbytes in (int(s) for s in args.sizes.split(",")):
        iters = max(3, min(1000, int(2e8 // max(nbytes, 1) // 50)))
        for c in cases(raw_comm, nbytes):
            if c.name not in wanted:
                continue
            # MPICOLL_DEBUG is agreed when mpicoll makes a communicator: a fresh one for it, made
            # after reading the setting again (mpicoll keeps what it read)
            os.environ["MPICOLL_DEBUG"] = "1"
            _env.reread()
            dbg_comm = raw_comm.Dup()
            user_comm(dbg_comm)
            os.environ["MPICOLL_DEBUG"] = "0"
            _env.reread()
            debug = c.cls(dataclasses.replace(c.param or c.cls.PARAM(), comm=dbg_comm))
            ops = {"off": c.cls(c.param, validate=False), "on": c.cls(c.param, validate=True), "debug": debug,
                   "timeout": c.cls(c.param, validate=True, timeout=600)}
            impls = {"raw": loop(c.raw, c.ns), **{k: loop(c.call, c.ns, op=op) for k, op in ops.items()}}
            for t in impls.values():            # binds the ops; warms up
                t.timeit(2)
            times = {k: [] for k in impls}
            for _ in range(args.reps):
                for k, t in impls.items():
                    times[k].append(block_time(raw_comm, t, iters))
            rows.append((c.name, nbytes, {k: statistics.median(v) * 1e6 for k, v in times.items()}))
    if W.Get_rank() == 0:
        print(f"# cost of the checks, {W.Get_size()} ranks, float32, us per call (median of {args.reps}), "
              "ratios to raw mpi4py")
        print(f"{'op':<13}{'bytes':>10}{'raw':>10}{'off':>10}{'on':>10}{'debug':>10}{'timeout':>10}"
              f"{'on/raw':>8}{'dbg/raw':>8}{'tmo/raw':>8}")
        for name, nbytes, m in rows:
            r = m["raw"]
            print(f"{name:<13}{nbytes:>10}{r:>10.1f}{m['off']:>10.1f}{m['on']:>10.1f}{m['debug']:>10.1f}"
                  f"{m['timeout']:>10.1f}{m['on'] / r:>8.2f}{m['debug'] / r:>8.2f}{m['timeout'] / r:>8.2f}")


if __name__ == "__main__":
    main()
