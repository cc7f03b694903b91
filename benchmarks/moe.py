"""A MoE layer's dispatch loop, mpicoll beside raw mpi4py: time a step and count its MPI calls.

    mpirun -bind-to core -np 2 python benchmarks/moe.py [--tokens 64] [--hidden 128] [--steps 400] [--reps 11]
    LD_PRELOAD=$(python benchmarks/mpicalls.py) mpirun -np 2 python benchmarks/moe.py     # with MPI call counts

Each step is what the seeds' MoE example does: this step's routing (how many of this rank's
``--tokens`` tokens go to each rank: new every step) is exchanged with an AllToAll, then the tokens
(``tokens x hidden`` float16) with an AllToAllV whose counts are those: raw, ``comm.Alltoall`` then
``comm.Alltoallv`` (mpi4py's buffer calls, the counts as int64 arrays); mpicoll,
``AllToAllOperation.execute(send_counts)`` then ``AllToAllVV2Operation.execute(x, counts...)``
(validated, and with validation off). Both loops compute the displacements the same way (numpy), and
allocate the output of the token exchange every step. The loops are interleaved, each block the
slowest rank's mean per step; printed: the median per step, the median of the ratios to raw paired
within a repetition with their quartiles, and (with the PMPI shim of ``benchmarks/mpicalls.c``
preloaded) the MPI calls a step makes.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

import mpicoll

sys.path.insert(0, str(Path(__file__).parent))
import mpicalls  # noqa: E402


def loops(comm: MPI.Comm, tokens: int, hidden: int, routes: list[np.ndarray]) -> dict:
    """Each implementation as a function running ``k`` steps."""
    n = comm.Get_size()
    x = np.ones((tokens, hidden), np.float16)
    I64, F16 = MPI.INT64_T, MPI.INT16_T

    def raw(k: int) -> None:
        for s in range(k):
            sc = routes[s % len(routes)]
            rc = np.empty(n, np.int64)
            comm.Alltoall([sc, I64], [rc, I64])
            sce, rce = sc * hidden, rc * hidden
            sd = np.zeros(n, np.int64)
            sd[1:] = np.cumsum(sce)[:-1]
            rd = np.zeros(n, np.int64)
            rd[1:] = np.cumsum(rce)[:-1]
            out = np.empty(int(rce.sum()), np.float16)
            comm.Alltoallv([x, (sce, sd), F16], [out, (rce, rd), F16])

    def ours(validate: bool):
        a2a = mpicoll.AllToAllOperation(validate=validate)
        vv2 = mpicoll.AllToAllVV2Operation(validate=validate)

        def run(k: int) -> None:
            for s in range(k):
                sc = routes[s % len(routes)]
                rc = a2a.execute(sc)
                sce, rce = sc * hidden, rc * hidden
                sd = np.zeros(n, np.int64)
                sd[1:] = np.cumsum(sce)[:-1]
                rd = np.zeros(n, np.int64)
                rd[1:] = np.cumsum(rce)[:-1]
                vv2.execute(x, sce, sd, rce, rd)
        return run
    return {"raw": raw, "validated": ours(True), "off": ours(False)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--steps", type=int, default=400, help="steps per timed block")
    ap.add_argument("--reps", type=int, default=11)
    args = ap.parse_args()
    if args.reps < 2:
        ap.error("--reps must be at least 2 (the ratios' quartiles)")
    world = MPI.COMM_WORLD
    comm = world.Dup()
    n, rank = comm.Get_size(), comm.Get_rank()
    rng = np.random.default_rng(1234 + rank)
    routes = [rng.multinomial(args.tokens, [1 / n] * n).astype(np.int64) for _ in range(64)]
    impls = loops(comm, args.tokens, args.hidden, routes)
    calls = {}
    for name, run in impls.items():
        run(8)                                       # (warm: bound, compiled)
        if mpicalls.counting():
            mpicalls.reset()
            run(10)
            calls[name] = mpicalls.counts()
    times = {k: [] for k in impls}
    order = list(impls)
    for rep in range(args.reps):
        for name in order[rep % len(order):] + order[:rep % len(order)]:
            comm.Barrier()
            t0 = time.perf_counter()
            impls[name](args.steps)
            times[name].append(comm.allreduce((time.perf_counter() - t0) / args.steps, MPI.MAX))
    if rank:
        return
    print(f"# MoE dispatch step: AllToAll of the routing + AllToAllV of {args.tokens} x {args.hidden} float16 "
          f"tokens a rank, {n} ranks, {args.reps} interleaved blocks of {args.steps} steps")
    print(f"{'loop':<12}{'us/step':>10}{'x raw':>8}{'q1-q3':>14}  MPI calls in 10 steps")
    for name, t in times.items():
        q = statistics.quantiles([a / b for a, b in zip(t, times["raw"])], n=4)
        shown = ", ".join(f"{k} {v}" for k, v in sorted(calls.get(name, {}).items())) or "(shim not loaded)"
        print(f"{name:<12}{statistics.median(t) * 1e6:>10.2f}{q[1]:>8.3f}{q[0]:>8.3f}-{q[2]:.3f}  {shown}")


if __name__ == "__main__":
    main()
