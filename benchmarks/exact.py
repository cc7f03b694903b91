"""What reproducible reductions cost: the tree order (``MPICOLL_EXACT=1``, the default) against MPI's own
reduction order (``MPICOLL_EXACT=0``, the default before) and raw mpi4py, same run, interleaved.

    mpirun -bind-to core -np 4 python benchmarks/exact.py [--sizes 8,1024,65536] [--dtypes float32,bfloat16]
                                                          [--ops AllReduce,ReduceScatter,Reduce] [--reps 7]
    MPICOLL_SHM=0 mpirun ... (no node window: the paths several hosts take)
    scripts/cluster run 2 4 -- python benchmarks/exact.py          (the test bed, docs/multihost.md)

Sizes are bytes of each rank's input. For every operator, dtype and size it times blocks of
``plan.run()`` on a duplicate of the world made with ``MPICOLL_EXACT=1``, of ``plan.run()`` on one made
with ``MPICOLL_EXACT=0`` and of the raw mpi4py call (none for bfloat16, which MPI cannot reduce), each
block the slowest rank's mean, the three in turn, each in turn first. Prints the median times and the
median of the ratios paired within a repetition (SUM). At 1 or 2 ranks both settings make the same
calls for a SUM (one operation per element: any order gives the same bits), so the ratio is 1 there.
Plans run with validation off: the loop a user writes for speed. ``--validated`` times the default
instead: ``execute`` with validation on, whose small calls (at most the ``ride`` threshold, 1 KiB, a rank) move their
data in their agreement and reduce it in the tree order under either setting.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll import _env
from mpicoll._dtypes import DTYPES
from mpicoll.checks._golden import raw_reduce_type

W = MPI.COMM_WORLD
OPS = {"AllReduce": (mpicoll.AllReduceOperation, mpicoll.AllReduceParam),
       "ReduceScatter": (mpicoll.ReduceScatterOperation, mpicoll.ReduceScatterParam),
       "Reduce": (mpicoll.ReduceOperation, mpicoll.ReduceParam)}
COMMS = {exact: W.Dup() for exact in (1, 0)}      # one duplicate per setting: it is agreed when first used


def plan(name: str, exact: int, x: np.ndarray, out: np.ndarray, validated: bool = False):
    """A plan of ``name`` on the duplicate made with ``MPICOLL_EXACT=exact`` (read when it is bound);
    ``validated``: instead, its validated ``execute``."""
    cls, param = OPS[name]
    os.environ["MPICOLL_EXACT"] = str(exact)
    _env.reread()                                     # (mpicoll keeps what it read: read it again)
    op = cls(param(comm=COMMS[exact]), validate=validated)
    if validated:
        op.execute(x, out=out)                         # (binds here, with the setting above)
        return lambda: op.execute(x, out=out)
    p = op.prepare(x, out)
    p.run()                                           # (binds here, with the setting above)
    return p.run


def raw(name: str, x: np.ndarray, out: np.ndarray, dt):
    t = raw_reduce_type(dt)
    if t is None:
        return None
    return {"AllReduce": lambda: W.Allreduce([x, t], [out, t], MPI.SUM),
            "ReduceScatter": lambda: W.Reduce_scatter_block([x, t], [out, t], MPI.SUM),
            "Reduce": lambda: W.Reduce([x, t], [out, t], MPI.SUM, 0)}[name]


def timed(fn, iters: int) -> float:
    W.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return W.allreduce((time.perf_counter() - t0) / iters, MPI.MAX)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="8,64,512,4096,16384,65536,262144,1048576,4194304,16777216,67108864")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--ops", default="AllReduce,ReduceScatter,Reduce")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--validated", action="store_true", help="time execute with validation on (the default)")
    a = ap.parse_args()
    n = W.size
    if W.rank == 0:
        print(f"# {n} ranks, {MPI.Get_library_version().splitlines()[0]}, MPICOLL_SHM={os.environ.get('MPICOLL_SHM', '1')}, "
              f"{'validated execute' if a.validated else 'plans, validation off'}")
        print(f"{'op':<14}{'dtype':<9}{'bytes':>10}{'exact us':>12}{'before us':>12}{'raw us':>12}"
              f"{'exact/before':>14}{'exact/raw':>11}")
    for name in a.ops.split(","):
        for dname in a.dtypes.split(","):
            dt = DTYPES[dname]
            for nbytes in (int(s) for s in a.sizes.split(",")):
                count = max(nbytes // dt.itemsize // n * n, n)
                x = (np.arange(count) % 7 * (W.rank + 1) * 0.01).astype(dt.np)
                out = np.empty(count // n if name == "ReduceScatter" else count, dt.np)
                fns = {"exact": plan(name, 1, x, out, a.validated), "before": plan(name, 0, x, out, a.validated),
                       "raw": raw(name, x, out, dt)}
                fns = {k: f for k, f in fns.items() if f is not None}
                iters = max(3, min(2000, int(0.03 / max(timed(fns["before"], 2), 1e-6))))
                times: dict = {k: [] for k in fns}
                for rep in range(a.reps):
                    keys = list(fns)
                    for k in keys[rep % len(keys):] + keys[:rep % len(keys)]:
                        times[k].append(timed(fns[k], iters))
                med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
                ratio = statistics.median(e / b for e, b in zip(times["exact"], times["before"]))
                vs_raw = statistics.median(e / r for e, r in zip(times["exact"], times["raw"])) if "raw" in times else None
                if W.rank == 0:
                    print(f"{name:<14}{dname:<9}{count * dt.itemsize:>10}{med['exact']:>12.1f}{med['before']:>12.1f}"
                          f"{med.get('raw', float('nan')):>12.1f}{ratio:>14.2f}"
                          f"{'' if vs_raw is None else f'{vs_raw:.2f}':>11}", flush=True)


if __name__ == "__main__":
    main()
