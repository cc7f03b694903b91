"""How much communication a non-blocking plan hides behind computation: ``plan.start()``, numpy
matmuls in chunks with ``handle.test()`` between them, ``handle.wait()``.

    scripts/cluster run 2 2 --rate 1gbit -- python benchmarks/overlap.py [--mib 16] [--chunks 48] [--ops AllReduce,...]
    mpirun -np 2 python benchmarks/overlap.py           (shared memory: expect nothing hidden)

For each registered operator (``mpicoll.OPERATIONS``; ``--ops`` to choose), on the buffers and call of
its benchmark spec (as ``python -m mpicoll.run bench`` makes them: ``--mib`` MiB per rank in
nccl-tests' size convention, the larger buffer: AllGather's output, ReduceScatter's input; float32,
else the first dtype it takes), it times, interleaved and repeated (medians of the slowest rank's
times): the plan alone (start, wait), the chunked matmul alone, and both overlapped; and prints comm
+ compute against overlapped and the fraction of the communication hidden, (comm + compute -
overlapped) / comm. An operator that cannot run here (no benchmark spec, or not at this rank count)
is named in the output. MPI moves a non-blocking collective on only inside MPI calls (MPICH runs no
progress thread by default), so the ``test()`` between chunks is what lets it advance. BLAS threads
are limited to the cores per rank (threadpoolctl; 1 when the host's ranks outnumber its cores) so
that ranks sharing cores do not fight.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll._domains import world as lib_world
from mpicoll._dtypes import DTYPES, REDUCE_OPS
from mpicoll.checks import BENCHES, BenchCase
from mpicoll.ops._moe import blas_limit as _limit, blas_threads


def setups(names: list[str], mib: float, raw_comm: MPI.Comm):
    """Per operator of ``names`` that can run here: ``(name, dtype, plan, close)``, the plan
    prepared from its benchmark spec's out-of-place call (else its in-place one); ``close()``
    frees what the spec made. Operators that cannot run are yielded as ``(name, why, None, None)``."""
    rank, n = raw_comm.Get_rank(), raw_comm.Get_size()
    for name in names:
        spec = BENCHES.get(name)
        why = "no benchmark spec" if spec is None else spec.skip_at(n)
        if why:
            yield name, why, None, None
            continue
        dname = "float32" if "float32" in spec.dtypes else spec.dtypes[0]
        dt, mult = DTYPES[dname], max(spec.count_multiple(n), 1)
        count = max(int(mib * (1 << 20)) // dt.itemsize // mult * mult, mult)
        run = spec.setup(BenchCase(count, dt, REDUCE_OPS["sum"] if spec.uses_reduce else None, 0, n, rank, "", True,
                                   raw_comm, MPI.COMM_WORLD.Get_rank()))
        args, kwargs = (run.args, run.kwargs) if run.args is not None else run.inplace
        yield name, dname, run.op.prepare(*args, **kwargs), run.close


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", default="", help="operators, comma-separated (default: every registered one)")
    ap.add_argument("--mib", type=float, default=16,
                    help="MiB per rank, nccl-tests' size (the larger buffer: AllGather's output)")
    ap.add_argument("--chunks", type=int, default=48, help="matmul chunks, a test() after each")
    ap.add_argument("--dim", type=int, default=512, help="each chunk multiplies two dim x dim float32 matrices")
    ap.add_argument("--blas-threads", type=int, default=0,
                    help="BLAS threads per rank (default 0: the cores per rank of this host)")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    names = [o for o in args.ops.split(",") if o] or list(mpicoll.OPERATIONS)
    unknown = [o for o in names if o not in mpicoll.OPERATIONS]
    if unknown:
        ap.error(f"--ops: not registered operators: {', '.join(unknown)} (known: {', '.join(mpicoll.OPERATIONS)})")
    world = MPI.COMM_WORLD
    rank, n = world.Get_rank(), world.Get_size()
    a = np.random.default_rng(rank).standard_normal((args.dim, args.dim)).astype(np.float32)
    c = np.empty_like(a)
    threads = args.blas_threads or blas_threads(lib_world())   # the cores per rank on this host (collective)
    raw_comm = world.Dup()
    with _limit(threads):
        rows, skipped = measure(args, names, raw_comm, a, c)
    raw_comm.Free()
    if rank == 0:
        hosts = len(set(world.gather(MPI.Get_processor_name(), root=0) or []))
        print(f"# overlap of a started plan with {args.chunks} x matmul {args.dim}^2 (test() between chunks), "
              f"{args.mib:g} MiB per rank (nccl-tests size), {n} ranks on {hosts} host(s), BLAS threads per rank "
              f"{threads}, median of {args.reps}")
        if skipped:
            print("# not measured: " + "; ".join(f"{name} ({why})" for name, why in skipped))
        w = max([len(name) for name, _, _ in rows] + [2]) + 2
        print(f"{'op':<{w}}{'type':<9}{'comm ms':>9}{'compute ms':>12}{'sum ms':>9}{'overlapped ms':>15}{'hidden':>8}")
        for name, dname, m in rows:
            hidden = (m["comm"] + m["compute"] - m["overlapped"]) / m["comm"]
            print(f"{name:<{w}}{dname:<9}{m['comm']:>9.1f}{m['compute']:>12.1f}{m['comm'] + m['compute']:>9.1f}"
                  f"{m['overlapped']:>15.1f}{hidden * 100:>7.0f}%")
    else:
        world.gather(MPI.Get_processor_name(), root=0)


def measure(args, names: list[str], raw_comm: MPI.Comm, a: np.ndarray, c: np.ndarray) -> tuple[list, list]:
    """Per operator: the median ms of the plan alone, the chunked matmul alone, and both overlapped;
    and the operators that cannot run here, with why."""
    world = MPI.COMM_WORLD
    rows, skipped = [], []
    for name, dname_or_why, plan, close in setups(names, args.mib, raw_comm):
        if plan is None:
            skipped.append((name, dname_or_why))
            continue

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
        if close is not None:
            close()
        rows.append((name, dname_or_why, {k: statistics.median(v) * 1e3 for k, v in times.items()}))
    return rows, skipped


if __name__ == "__main__":
    main()
