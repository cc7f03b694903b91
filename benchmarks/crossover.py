"""Measure the crossovers of the algorithm thresholds table (mpicoll._thresholds) on this machine.

    mpirun -bind-to core -np 2 python benchmarks/crossover.py [--names window.allreduce,window.reduce_scatter]
                                                             [--reps 7] [--span 8]

For each threshold named, a sweep of message sizes around its value (powers of two from value / span
to value x span): at each size the path the threshold chooses from there ("above": the threshold
set to 0 while the plan is made) and the path below it (the threshold set past every size) run in
interleaved blocks, each block timed as the slowest rank's mean, with validation off (the plan a
user runs for speed). It prints both medians, the median of the ratios paired within a repetition
(above / below), and the measured crossover: the smallest size from which the "above" path is never
slower (ratio <= 1 at it and every larger size swept), beside the table's value. A user on another
node puts what they measure into ``mpicoll._thresholds.VALUES`` (the same on every rank) or reads
it as the place to look.

The thresholds swept are the one-node switches with two paths for one call: ``window.allreduce``
(float32 AllReduce: MPI's own reduction or the shared window), ``window.allreduce.16bit``
(bfloat16), ``window.ordered`` (float32 at 3+ ranks, the tree order: an Allgather of every input or
the window), ``window.reduce_scatter`` (float32 ReduceScatter, the size of each rank's input),
``nodebuf.broadcast`` (a Broadcast of a node buffer: MPI's or a copy from the root's buffer). At 3+
ranks a float reduction takes the tree order (``window.ordered``): ``window.allreduce`` is swept with
int32 there, ``window.allreduce.16bit`` not at all.
"""
from __future__ import annotations

import argparse
import statistics

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll._dtypes import DTYPES
from mpicoll.bench import _time as block      # (the bench's timing: the slowest rank's mean a call)
from mpicoll._thresholds import TABLE, VALUES, shown

W = MPI.COMM_WORLD
NEVER = 1 << 62

#: threshold -> (operator, dtype at 2 ranks, dtype at 3+ ranks: a float reduction over 3+ ranks takes the
#: tree order, whose window threshold is window.ordered; None: not swept there)
SWEPT = {
    "window.allreduce": ("AllReduce", "float32", "int32"),
    "window.allreduce.16bit": ("AllReduce", "bfloat16", None),
    "window.ordered": ("AllReduce", None, "float32"),
    "window.reduce_scatter": ("ReduceScatter", "float32", "float32"),
    "nodebuf.broadcast": ("Broadcast", "float32", "float32"),
}


def plan(name: str, op: str, dtype: str, nbytes: int, setting: int, comm: MPI.Comm):
    """A prepared plan's run for ``op`` over ``nbytes`` of input, made with threshold ``name`` at ``setting``."""
    dt = DTYPES[dtype].np
    n = comm.size
    count = max(nbytes // dt.itemsize // n, 1) * n
    kept = VALUES[name]
    VALUES[name] = setting
    try:
        if op == "Broadcast":
            x = mpicoll.node_buffer((count,), dt, comm=comm)
            x[:] = 1
            return mpicoll.BroadcastOperation(mpicoll.BroadcastParam(comm=comm), validate=False).prepare(x).run
        x = (np.arange(count) % 7).astype(dt)
        if op == "AllReduce":
            return mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=comm, reduce_type="sum"),
                                              validate=False).prepare(x, out=np.empty_like(x)).run
        return mpicoll.ReduceScatterOperation(mpicoll.ReduceScatterParam(comm=comm, reduce_type="sum"),
                                              validate=False).prepare(x, out=np.empty(count // n, dt)).run
    finally:
        VALUES[name] = kept


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--names", default=",".join(SWEPT), help="thresholds to sweep (comma-separated)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--span", type=int, default=8, help="sweep from value / span to value x span")
    a = ap.parse_args()
    unknown = [name for name in a.names.split(",") if name not in SWEPT]
    if unknown:
        ap.error(f"--names: {', '.join(unknown)}: not swept here (these are: {', '.join(SWEPT)})")
    comm = W.Dup()
    if W.rank == 0:
        print(f"# mpicoll {mpicoll.__version__}: threshold crossovers, {W.size} ranks, "
              f"{MPI.Get_library_version().splitlines()[0].strip()}; us = median of the slowest rank's mean")
    for name in a.names.split(","):
        op, *dtypes = SWEPT[name]
        dtype = dtypes[W.size > 2]
        if dtype is None:
            if W.rank == 0:
                print(f"# {name}: not at {W.size} ranks (" + ("3+ ranks take the tree order: window.ordered)"
                                                           if W.size > 2 else "it is the tree order's, at 3+ ranks)"))
            continue
        value = TABLE[name].value
        sizes = [value // a.span << k for k in range(2 * a.span.bit_length() - 1)]
        if W.rank == 0:
            print(f"# {name} (table: {shown(TABLE[name])}): {op} {dtype}; above = {TABLE[name].chooses}")
            print(f"{'bytes':>10} {'above us':>10} {'below us':>10} {'above/below':>12}")
        ratios = []
        for nbytes in sizes:
            runs = {"above": plan(name, op, dtype, nbytes, 0, comm), "below": plan(name, op, dtype, nbytes, NEVER, comm)}
            for fn in runs.values():
                fn()
            iters = max(5, min(2000, int(0.02 / max(block(W, runs["below"], 3), 1e-7))))
            times: dict[str, list[float]] = {k: [] for k in runs}
            for rep in range(a.reps):
                for k in (list(runs) if rep % 2 else list(runs)[::-1]):
                    times[k].append(block(W, runs[k], iters))
            ratio = statistics.median(x / y for x, y in zip(times["above"], times["below"]))
            ratios.append(ratio)
            if W.rank == 0:
                print(f"{nbytes:>10} {statistics.median(times['above']) * 1e6:>10.2f} "
                      f"{statistics.median(times['below']) * 1e6:>10.2f} {ratio:>12.2f}", flush=True)
        at = next((s for i, s in enumerate(sizes) if all(r <= 1 for r in ratios[i:])), None)
        if W.rank == 0:
            print(f"# {name}: measured crossover {at if at is not None else 'past ' + str(sizes[-1])} B "
                  f"(table {shown(TABLE[name])})")
    comm.Free()


if __name__ == "__main__":
    main()
