"""How much communication a non-blocking plan hides behind computation: ``plan.start()``, numpy
matmuls in chunks with ``handle.test()`` between them, ``handle.wait()``.

    scripts/cluster run 2 2 --rate 1gbit -- python benchmarks/overlap.py [--mib 16] [--chunks 48]
    mpirun -np 2 python benchmarks/overlap.py           (shared memory: expect nothing hidden)

For each operator (float32, ``--mib`` MiB per rank input) it times, interleaved and repeated (medians
of the slowest rank's times): the plan alone (start, wait), the chunked matmul alone, and both
overlapped; and prints comm + compute against overlapped and the fraction of the communication
hidden, (comm + compute - overlapped) / comm. MPI moves a non-blocking collective on only inside
MPI calls (MPICH runs no progress thread by default), so the ``test()`` between chunks is what lets
it advance. BLAS threads are limited to the cores per rank (threadpoolctl; 1 when the host's ranks
outnumber its cores) so that ranks sharing cores do not fight.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll._domains import world as lib_world
from mpicoll.ops.fused import _limit, blas_threads

OPS = ["AllReduce", "AllGather", "ReduceScatter", "AllToAll", "Broadcast"]


def plan_for(name: str, x: np.ndarray) -> mpicoll.Plan:
    n = MPI.COMM_WORLD.Get_size()
    op = mpicoll.OPERATIONS[name]()
    return op.prepare(x.reshape(n, -1) if name in ("ReduceScatter", "AllToAll") else x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--mib", type=float, default=16, help="MiB of float32 input per rank")
    ap.add_argument("--chunks", type=int, default=48, help="matmul chunks, a test() after each")
    ap.add_argument("--dim", type=int, default=512, help="each chunk multiplies two dim x dim float32 matrices")
    ap.add_argument("--blas-threads", type=int, default=0,
                    help="BLAS threads per rank (default 0: the cores per rank of this host)")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    world = MPI.COMM_WORLD
    rank, n = world.Get_rank(), world.Get_size()
    count = max(int(args.mib * (1 << 20) / 4) // n * n, n)
    x = np.ones(count, np.float32)
    a = np.random.default_rng(rank).standard_normal((args.dim, args.dim)).astype(np.float32)
    c = np.empty_like(a)
    threads = args.blas_threads or blas_threads(lib_world())   # the cores per rank on this host (collective)
    with _limit(threads):
        rows = measure(args, x, a, c)
    if rank == 0:
        hosts = len(set(world.gather(MPI.Get_processor_name(), root=0) or []))
        print(f"# overlap of a started plan with {args.chunks} x matmul {args.dim}^2 (test() between chunks), "
              f"float32, {args.mib:g} MiB per rank, {n} ranks on {hosts} host(s), BLAS threads per rank {threads}, "
              f"median of {args.reps}")
        print(f"{'op':<15}{'comm ms':>9}{'compute ms':>12}{'sum ms':>9}{'overlapped ms':>15}{'hidden':>8}")
        for name, m in rows:
            hidden = (m["comm"] + m["compute"] - m["overlapped"]) / m["comm"]
            print(f"{name:<15}{m['comm']:>9.1f}{m['compute']:>12.1f}{m['comm'] + m['compute']:>9.1f}"
                  f"{m['overlapped']:>15.1f}{hidden * 100:>7.0f}%")
    else:
        world.gather(MPI.Get_processor_name(), root=0)


def measure(args, x: np.ndarray, a: np.ndarray, c: np.ndarray) -> list:
    """Per operator: the median ms of the plan alone, the chunked matmul alone, and both overlapped."""
    world = MPI.COMM_WORLD
    rows = []
    for name in args.ops.split(","):
        plan = plan_for(name, x)

        def comm_only(plan=plan) -> None:
            plan.start().wait()

        def compute_only() -> None:
            for _ in range(args.chunks):
                np.matmul(a, a, out=c)

        def overlapped(plan=plan) -> None:
            handle = plan.start()
            for _ in range(args.chunks):
                np.matmul(a, a, out=c)
                handle.test()
            handle.wait()

        runs = {"comm": comm_only, "compute": compute_only, "overlapped": overlapped}
        times: dict[str, list[float]] = {k: [] for k in runs}
        for fn in runs.values():
            fn()
        for rep in range(args.reps):
            for k in list(runs)[rep % 3:] + list(runs)[:rep % 3]:
                world.Barrier()
                t0 = time.perf_counter()
                runs[k]()
                times[k].append(world.allreduce(time.perf_counter() - t0, MPI.MAX))
        plan.free()
        rows.append((name, {k: statistics.median(v) * 1e3 for k, v in times.items()}))
    return rows


if __name__ == "__main__":
    main()
