#!/usr/bin/env python
"""Overlap with the Hccl handle API: prepare an AllGather, commit it, run a numpy matmul in chunks
(calling query() between chunks, which moves MPI's non-blocking collective on), then wait.

    mpirun -np 2 python scripts/hccl_overlap.py [--mib 16] [--chunks 16] [--dim 512] [--reps 7]

It times, interleaved and repeated (medians, each the slowest rank's): the AllGather alone (commit,
wait), the chunked matmul alone, and both overlapped; and prints comm + compute against overlapped,
and the fraction of the communication hidden: (comm + compute - overlapped) / comm. Over shared
memory expect nothing hidden (the same cores copy the bytes); over a network (scripts/cluster, or a
real cluster) the wire time can hide behind the matmul. numpy's BLAS threads are limited to the cores
per rank (threadpoolctl; 1 when the host's ranks outnumber its cores), so that the ranks' BLAS threads
do not compete for the cores.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

from mpicoll import Hccl, HcclDataType
from mpicoll._domains import world as lib_world
from mpicoll.ops._moe import blas_limit as _limit, blas_threads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=float, default=16, help="MiB gathered (the output, float32)")
    ap.add_argument("--chunks", type=int, default=16, help="matmul chunks (a query() after each)")
    ap.add_argument("--dim", type=int, default=512, help="each chunk multiplies two dim x dim float32 matrices")
    ap.add_argument("--blas-threads", type=int, default=0,
                    help="BLAS threads per rank (default 0: the cores per rank of this host)")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    world = MPI.COMM_WORLD
    rank, n = world.Get_rank(), world.Get_size()
    per = max(int(args.mib * (1 << 20) / 4 / n), 1)
    x = np.full(per, rank, np.float32)
    y = np.empty(per * n, np.float32)
    a = np.random.default_rng(rank).standard_normal((args.dim, args.dim)).astype(np.float32)
    c = np.empty_like(a)
    threads = args.blas_threads or blas_threads(lib_world())   # the cores per rank on this host (collective)

    with Hccl().init() as hccl, _limit(threads):
        h = hccl.all_gather(x, y, per, HcclDataType.FP32)

        def comm_only() -> None:
            hccl.commit(h)
            hccl.wait(h)

        def compute_only() -> None:
            for _ in range(args.chunks):
                np.matmul(a, a, out=c)

        def overlapped() -> None:
            hccl.commit(h)
            for _ in range(args.chunks):
                np.matmul(a, a, out=c)
                hccl.query(h)                   # MPI progresses the AllGather inside this call
            hccl.wait(h)

        runs = {"comm": comm_only, "compute": compute_only, "overlapped": overlapped}
        times: dict[str, list[float]] = {k: [] for k in runs}
        for fn in runs.values():                # warm-up
            fn()
        for rep in range(args.reps):
            order = list(runs)[rep % 3:] + list(runs)[:rep % 3]
            for k in order:
                world.Barrier()
                t0 = time.perf_counter()
                runs[k]()
                times[k].append(world.allreduce(time.perf_counter() - t0, MPI.MAX))
    assert np.array_equal(y.reshape(n, per)[:, 0], np.arange(n, dtype=np.float32))
    if rank == 0:
        m = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        hidden = (m["comm"] + m["compute"] - m["overlapped"]) / m["comm"]
        print(f"# Hccl AllGather of {per * n * 4 / (1 << 20):.1f} MiB (float32) beside {args.chunks} x matmul "
              f"{args.dim}^2, {n} ranks, BLAS threads per rank {threads}, median of {args.reps}")
        print(f"comm {m['comm']:.2f} ms + compute {m['compute']:.2f} ms = {m['comm'] + m['compute']:.2f} ms; "
              f"overlapped {m['overlapped']:.2f} ms; hidden {max(hidden, 0.0) * 100:.0f}% of the communication "
              f"({hidden * 100:+.0f}%)")


if __name__ == "__main__":
    main()
