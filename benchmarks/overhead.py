"""Overhead of mpicoll's execute() over the raw mpi4py buffer call, same arrays, same run.

    mpirun -np 2 python benchmarks/overhead.py [--sizes 8,65536,16777216] [--reps 15] [--ops AllReduce,...]

For every primitive and size it interleaves blocks of raw calls and of execute() calls (validation
off, then on), each block timed as the slowest rank's mean per call, and prints the median block
time of each and the ratios. float32 data (the native MPI path, so raw and mpicoll make the same
MPI call). The raw calls run on their own duplicate of the world; mpicoll on its own.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

import mpicoll

W = MPI.COMM_WORLD


def cases(comm: MPI.Comm, nbytes: int):
    """(name, raw callable, mpicoll (validate -> callable)) for each primitive at ``nbytes`` per rank."""
    n, me = comm.Get_size(), comm.Get_rank()
    count = max(nbytes // 4, n) // n * n            # divisible by n, >= n elements
    x = np.ones(count, dtype=np.float32)
    blk = count // n
    counts, displs = np.full(n, blk), np.arange(n) * blk
    out_same, out_gather, out_block = np.empty_like(x), np.empty(count * n, np.float32), np.empty(blk, np.float32)
    S = MPI.SUM
    yield ("AllReduce", lambda: comm.Allreduce(x, out_same, S),
           lambda v: (lambda op: lambda: op.execute(x))(mpicoll.AllReduceOperation(validate=v)))
    yield ("AllGather", lambda: comm.Allgather(x, out_gather),
           lambda v: (lambda op: lambda: op.execute(x))(mpicoll.AllGatherOperation(validate=v)))
    gcounts, gdispls = np.full(n, count), np.arange(n) * count
    yield ("AllGatherV", lambda: comm.Allgatherv(x, [out_gather, (gcounts, gdispls)]),
           lambda v: (lambda op: lambda: op.execute(x, count, gcounts, gdispls))(mpicoll.AllGatherVOperation(validate=v)))
    yield ("ReduceScatter", lambda: comm.Reduce_scatter_block(x, out_block, S),
           lambda v: (lambda op: lambda: op.execute(x))(mpicoll.ReduceScatterOperation(validate=v)))
    yield ("ReduceScatterV", lambda: comm.Reduce_scatter(x, out_block, counts, S),
           lambda v: (lambda op: lambda: op.execute(x, counts, displs, blk))(mpicoll.ReduceScatterVOperation(validate=v)))
    b = x.copy()
    yield ("Broadcast", lambda: comm.Bcast(b, 0),
           lambda v: (lambda op: lambda: op.execute(b))(mpicoll.BroadcastOperation(validate=v)))
    yield ("AllToAll", lambda: comm.Alltoall(x, out_same),
           lambda v: (lambda op: lambda: op.execute(x))(mpicoll.AllToAllOperation(validate=v)))
    yield ("AllToAllV", lambda: comm.Alltoallv([x, (counts, displs)], [out_same, (counts, displs)]),
           lambda v: (lambda op: lambda: op.execute(x))(mpicoll.AllToAllVOperation(
               mpicoll.AllToAllVParam(send_counts=counts, sdispls=displs, recv_counts=counts, rdispls=displs),
               validate=v)))
    yield ("AllToAllVV2", lambda: comm.Alltoallv([x, (counts, displs)], [out_same, (counts, displs)]),
           lambda v: (lambda op: lambda: op.execute(x, counts, displs, counts, displs))(
               mpicoll.AllToAllVV2Operation(validate=v)))


def block_time(comm: MPI.Comm, fn, iters: int) -> float:
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    t = (time.perf_counter() - t0) / iters
    return comm.allreduce(t, MPI.MAX)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="8,65536,16777216")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--ops", default="")
    args = ap.parse_args()
    raw_comm = W.Dup()
    mpicoll.init()
    wanted = set(filter(None, args.ops.split(",")))
    rows = []
    for nbytes in (int(s) for s in args.sizes.split(",")):
        iters = max(3, min(2000, int(2e8 // max(nbytes, 1) // 50)))
        for name, raw, make in cases(raw_comm, nbytes):
            if wanted and name not in wanted:
                continue
            impls = {"raw": raw, "off": make(False), "on": make(True)}
            for fn in impls.values():
                fn()
            times = {k: [] for k in impls}
            for _ in range(args.reps):          # interleaved: drift hits every implementation alike
                for k, fn in impls.items():
                    times[k].append(block_time(raw_comm, fn, iters))
            med = {k: statistics.median(v) for k, v in times.items()}
            rows.append((name, nbytes, med["raw"], med["off"], med["on"]))
    if W.Get_rank() == 0:
        print(f"# mpicoll overhead vs raw mpi4py, float32, {W.Get_size()} ranks, medians of {args.reps} interleaved "
              "blocks (slowest rank)")
        print(f"{'op':<15}{'bytes':>10}{'raw us':>11}{'off us':>11}{'on us':>11}{'off/raw':>9}{'on/raw':>9}")
        for name, nbytes, r, off, on in rows:
            print(f"{name:<15}{nbytes:>10}{r * 1e6:>11.2f}{off * 1e6:>11.2f}{on * 1e6:>11.2f}{off / r:>9.3f}{on / r:>9.3f}")


if __name__ == "__main__":
    main()
