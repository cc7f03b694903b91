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
from functools import partial

import numpy as np
from mpi4py import MPI

import mpicoll

W = MPI.COMM_WORLD


def cases(comm: MPI.Comm, nbytes: int):
    """(name, raw callable, Operation class, Param, out, call) at ``nbytes`` per rank; ``call(op, out)``
    is ``execute(..., out=out)`` as a zero-argument callable with no Python frame of its own
    (``functools.partial``), as the raw callable is one frame around the mpi4py call.

    The raw call and ``execute(..., out=...)`` use the same input and output arrays, and the raw call
    names its MPI datatype (mpi4py's fastest form, as mpicoll's own calls).
    """
    n = comm.Get_size()
    count = max(nbytes // 4, n) // n * n            # divisible by n, >= n elements
    x = np.ones(count, dtype=np.float32)
    blk = count // n
    counts, displs = np.full(n, blk), np.arange(n) * blk
    gcounts, gdispls = np.full(n, count), np.arange(n) * count
    same, gathered, block, row = (np.empty_like(x), np.empty(count * n, np.float32), np.empty(blk, np.float32),
                                  np.empty((1, count), np.float32))
    b = x.copy()
    S, F = MPI.SUM, MPI.FLOAT
    P = mpicoll
    yield ("AllReduce", lambda: comm.Allreduce([x, F], [same, F], S), P.AllReduceOperation, None, same,
           lambda op, out: partial(op.execute, x, out=out))
    yield ("AllGather", lambda: comm.Allgather([x, F], [gathered, F]), P.AllGatherOperation, None,
           gathered.reshape(n, count), lambda op, out: partial(op.execute, x, out=out))
    yield ("AllGatherV", lambda: comm.Allgatherv([x, F], [gathered, (gcounts, gdispls), F]), P.AllGatherVOperation,
           None, gathered, lambda op, out: partial(op.execute, x, count, gcounts, gdispls, out=out))
    yield ("ReduceScatter", lambda: comm.Reduce_scatter_block([x, F], [block, F], S), P.ReduceScatterOperation, None,
           block, lambda op, out: partial(op.execute, x, out=out))
    yield ("ReduceScatterV", lambda: comm.Reduce_scatter([x, F], [block, F], counts, S), P.ReduceScatterVOperation,
           None, block, lambda op, out: partial(op.execute, x, counts, displs, blk, out=out))
    yield ("Broadcast", lambda: comm.Bcast([b, F], 0), P.BroadcastOperation, None, None,
           lambda op, out: partial(op.execute, b))
    yield ("AllToAll", lambda: comm.Alltoall([x, F], [same, F]), P.AllToAllOperation, None, same,
           lambda op, out: partial(op.execute, x, out=out))
    plan = P.AllToAllVParam(send_counts=counts, sdispls=displs, recv_counts=counts, rdispls=displs)
    yield ("AllToAllV", lambda: comm.Alltoallv([x, (counts, displs), F], [row, (counts, displs), F]),
           P.AllToAllVOperation, plan, row, lambda op, out: partial(op.execute, x, out=out))
    yield ("AllToAllVV2", lambda: comm.Alltoallv([x, (counts, displs), F], [row, (counts, displs), F]),
           P.AllToAllVV2Operation, None, row, lambda op, out: partial(op.execute, x, counts, displs, counts, displs,
                                                                      out=out))


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
        iters = max(5, min(4000, int(2e9 // max(nbytes, 1) // 100)))     # blocks of >= ~10 ms
        for name, raw, cls, param, out, call in cases(raw_comm, nbytes):
            if wanted and name not in wanted:
                continue
            off, on = cls(param, validate=False), cls(param, validate=True)
            call(off, out)()                    # binds: execute is then the operator's own _run
            impls = {"raw": raw, "off": call(off, out), "on": call(on, out), "alloc": call(off, None)}
            for fn in impls.values():
                fn()
            times = {k: [] for k in impls}
            order = list(impls)
            for rep in range(args.reps):        # interleaved, each in turn first: drift hits all alike
                for k in order[rep % len(order):] + order[:rep % len(order)]:
                    times[k].append(block_time(raw_comm, impls[k], iters))
            med = {k: statistics.median(v) for k, v in times.items()}
            rows.append((name, nbytes, med))
    if W.Get_rank() == 0:
        print(f"# mpicoll overhead vs raw mpi4py, float32, {W.Get_size()} ranks, medians of {args.reps} interleaved "
              "blocks (slowest rank)")
        print("# off/on: execute(..., out=buf) with validation off/on, on the raw call's arrays; alloc: execute()\n"
              "# allocating its output (validation off)")
        print(f"{'op':<15}{'bytes':>10}{'raw us':>11}{'off us':>11}{'on us':>11}{'alloc us':>11}"
              f"{'off/raw':>9}{'on/raw':>9}{'alloc/raw':>10}")
        for name, nbytes, m in rows:
            r = m["raw"]
            print(f"{name:<15}{nbytes:>10}{r * 1e6:>11.2f}{m['off'] * 1e6:>11.2f}{m['on'] * 1e6:>11.2f}"
                  f"{m['alloc'] * 1e6:>11.2f}{m['off'] / r:>9.3f}{m['on'] / r:>9.3f}{m['alloc'] / r:>10.3f}")


if __name__ == "__main__":
    main()
