"""Overhead of mpicoll's execute() and of a prepared plan's run() over the raw mpi4py buffer call,
same arrays, same run.

    mpirun -bind-to core -np 2 python benchmarks/overhead.py [--sizes 8,65536,16777216] [--reps 21] [--ops AllReduce,...]
                                                               [--min-iters 10] [--max-iters 4000]
    LD_PRELOAD=$(python benchmarks/mpicalls.py) mpirun ... benchmarks/overhead.py ...   # with MPI call counts
    mpirun -bind-to core -np 2 python benchmarks/overhead.py --sizes 8 --trace /tmp/t   # with tracing's cost

(``-bind-to core``, Open MPI ``--bind-to core``: unbound, more ranks than cores are moved by the
scheduler and synchronizing calls change speed from run to run; docs/benchmark.md.)

Each implementation is timed as the loop a user writes: ``for ...: comm.Allreduce([x, F], [y, F], S)``
against ``for ...: op.execute(x, out=y)``, the statement compiled inline into the loop (``timeit``),
every name a local. For every registered operator (``mpicoll.OPERATIONS``) that has raw mpi4py
statements here (``STATEMENTS``; the others are named in the output, not left out silently) and
every size it interleaves blocks of raw calls, of execute() calls (validation off, on, and
allocating its output) and of ``plan.run()`` (a plan prepared from the same arguments), each in
turn first, each block timed as the slowest rank's mean per call. It prints the median block time
of each and the median of the ratios paired within a repetition, with their quartiles (the noise
band). float32 data: the native MPI path, where mpicoll makes the raw row's MPI call, except
AllGatherV with equal counts (mpicoll: ``Allgather``), ReduceScatterV with equal counts
(``Reduce_scatter_block``) and AllToAllV/VV2 with uniform packed counts, validated or in a plan
(``Alltoall``); mpicoll hands counts to mpi4py as lists where the raw rows pass integer arrays (as a
user's code most often has them). The raw calls run on their own duplicate of the world; mpicoll on
its own. With the PMPI shim of ``benchmarks/mpicalls.c`` preloaded it also prints the MPI calls each
implementation makes per call, counted over 10 warm calls (exact, where times are noise). With
``--trace DIR`` it also times plan, off and on inside a traced region (``mpicoll.trace(DIR)``, entered
around each of their blocks, outside the timing; the writing of the block's events timed with it)
and prints what tracing adds to a call: the median of the differences paired with the untraced
blocks of the same repetition.
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
import timeit
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll import _trace

sys.path.insert(0, str(Path(__file__).parent))
import mpicalls  # noqa: E402

W = MPI.COMM_WORLD


@dataclass
class Case:
    """One operator: the raw mpi4py statement and mpicoll's, over the names in ``ns``; ``op`` in
    ``call``/``alloc`` is the Operation under test (``alloc``: execute allocating its output)."""

    name: str
    cls: type
    raw: str
    call: str
    alloc: str
    ns: dict = field(default_factory=dict)
    param: object = None


#: Per operator name: ``(raw statement, execute(..., out=...), execute allocating)`` over the names
#: of cases() below. The raw call names its MPI datatype (mpi4py's fastest form, as mpicoll's own
#: calls). A registered operator missing here is named in the output (untimed()), not left out silently.
STATEMENTS = {
    "AllReduce": ("comm.Allreduce([x, F], [same, F], S)", "op.execute(x, out=same)", "op.execute(x)"),
    "AllGather": ("comm.Allgather([x, F], [gathered, F])", "op.execute(x, out=stacked)", "op.execute(x)"),
    "AllGatherV": ("comm.Allgatherv([x, F], [gathered, (gcounts, gdispls), F])",
                   "op.execute(x, count, gcounts, gdispls, out=gathered)", "op.execute(x, count, gcounts, gdispls)"),
    "ReduceScatter": ("comm.Reduce_scatter_block([x, F], [block, F], S)", "op.execute(x, out=block)", "op.execute(x)"),
    "ReduceScatterV": ("comm.Reduce_scatter([x, F], [block, F], counts, S)",
                       "op.execute(x, counts, displs, blk, out=block)", "op.execute(x, counts, displs, blk)"),
    "Broadcast": ("comm.Bcast([b, F], 0)", "op.execute(b)", "op.execute(b)"),
    "AllToAll": ("comm.Alltoall([x, F], [same, F])", "op.execute(x, out=same)", "op.execute(x)"),
    "AllToAllV": ("comm.Alltoallv([x, (counts, displs), F], [row, (counts, displs), F])", "op.execute(x, out=row)",
                  "op.execute(x)"),
    "AllToAllVV2": ("comm.Alltoallv([x, (counts, displs), F], [row, (counts, displs), F])",
                    "op.execute(x, counts, displs, counts, displs, out=row)",
                    "op.execute(x, counts, displs, counts, displs)"),
    "Reduce": ("comm.Reduce([x, F], [same, F] if root else None, S, 0)", "op.execute(x, out=same)", "op.execute(x)"),
    "Gather": ("comm.Gather([x, F], [gathered, F] if root else None, 0)", "op.execute(x, out=stacked)",
               "op.execute(x)"),
    "Scatter": ("comm.Scatter([x, F] if root else None, [block, F], 0)", "op.execute(sx, out=block)",
                "op.execute(sx, out=block)"),
}


def untimed() -> list[str]:
    """The registered operators (``mpicoll.OPERATIONS``) that have no raw statement here.

    Raises:
        SystemExit: STATEMENTS names an operator that is not registered.
    """
    stale = sorted(set(STATEMENTS) - set(mpicoll.OPERATIONS))
    if stale:
        raise SystemExit(f"benchmarks/overhead.py: STATEMENTS names {stale}: not registered operators")
    return [name for name in mpicoll.OPERATIONS if name not in STATEMENTS]


def cases(comm: MPI.Comm, nbytes: int) -> list[Case]:
    """Every registered operator that has raw statements here (STATEMENTS, in its order) at
    ``nbytes`` per rank. The raw call and ``execute(..., out=...)`` use the same input and output
    arrays."""
    untimed()
    n = comm.Get_size()
    count = max(nbytes // 4, n) // n * n            # divisible by n, >= n elements
    x = np.ones(count, dtype=np.float32)
    blk = count // n
    counts, displs = np.full(n, blk), np.arange(n) * blk
    ns = dict(comm=comm, x=x, b=x.copy(), root=comm.Get_rank() == 0, F=MPI.FLOAT, S=MPI.SUM, count=count, blk=blk,
              counts=counts, displs=displs, gcounts=np.full(n, count), gdispls=np.arange(n) * count,
              same=np.empty_like(x), gathered=np.empty(count * n, np.float32), block=np.empty(blk, np.float32),
              row=np.empty((1, count), np.float32))
    ns["stacked"] = ns["gathered"].reshape(n, count)
    ns["sx"] = x if comm.Get_rank() == 0 else None
    params = {"AllToAllV": mpicoll.AllToAllVParam(send_counts=counts, sdispls=displs, recv_counts=counts,
                                                  rdispls=displs)}
    return [Case(name, mpicoll.OPERATIONS[name], *row, ns=ns, param=params.get(name))
            for name, row in STATEMENTS.items()]


def loop(stmt: str, ns: dict, **more) -> timeit.Timer:
    """``stmt`` compiled inline into timeit's loop, every name in ``ns`` (and ``more``) a local."""
    names = {**ns, **more}
    setup = "\n".join(f"{k} = _ns[{k!r}]" for k in names)
    return timeit.Timer(stmt, setup=setup, globals={"_ns": names})


def block_time(comm: MPI.Comm, timer: timeit.Timer, iters: int, trace: str | None = None) -> float:
    """Mean time per call of ``iters`` calls, the slowest rank's (``trace``: inside a traced region
    writing there, entered and left outside the timing; the writing of the block's events is timed)."""
    if trace is None:
        comm.Barrier()
        return comm.allreduce(timer.timeit(iters) / iters, MPI.MAX)
    with mpicoll.trace(trace):
        comm.Barrier()
        t = timer.timeit(iters)
        t0 = time.perf_counter()
        _trace.flush()                          # (the events' JSON: in batches of _trace.FLUSH_EVERY, timed here)
        t += time.perf_counter() - t0
        return comm.allreduce(t / iters, MPI.MAX)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="8,65536,16777216")
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--ops", default="")
    ap.add_argument("--min-iters", type=int, default=10,
                    help="calls per timed block at least (16 MiB: 10 calls, blocks of 50-400 ms)")
    ap.add_argument("--max-iters", type=int, default=4000,
                    help="calls per timed block at most (small sizes; lower it when ranks outnumber cores)")
    ap.add_argument("--trace", default=None, metavar="DIR",
                    help="also time plan, off and on traced (events written to DIR): what tracing adds to a call")
    args = ap.parse_args()
    if args.reps < 2:
        ap.error("--reps must be at least 2 (the ratios' quartiles)")
    if args.reps < 2:
        ap.error("--reps must be >= 2 (the quartiles need two repetitions)")
    wanted = set(filter(None, args.ops.split(",")))
    missing = untimed()
    if wanted - set(mpicoll.OPERATIONS):
        ap.error(f"--ops: not registered operators: {', '.join(sorted(wanted - set(mpicoll.OPERATIONS)))}")
    if wanted & set(missing):
        ap.error(f"--ops: no raw mpi4py statement in STATEMENTS for {', '.join(sorted(wanted & set(missing)))}")
    raw_comm = W.Dup()
    mpicoll.init()
    rows = []
    for nbytes in (int(s) for s in args.sizes.split(",")):
        iters = max(args.min_iters, min(args.max_iters, int(2e9 // max(nbytes, 1) // 100)))   # blocks of >= ~10 ms
        for c in cases(raw_comm, nbytes):
            if wanted and c.name not in wanted:
                continue
            off, on = c.cls(c.param, validate=False), c.cls(c.param, validate=True)
            plan = eval(c.call.replace("op.execute(", "op.prepare("), {}, {**c.ns, "op": on})  # noqa: S307
            fresh = re.sub(r"out=(\w+)", r"out=\1[...]", c.call)    # (a new view of the output each call)
            impls = {"raw": loop(c.raw, c.ns), "off": loop(c.call, c.ns, op=off), "on": loop(c.call, c.ns, op=on),
                     "plan": loop("run()", c.ns, run=plan.run), "alloc": loop(c.alloc, c.ns, op=off),
                     "fresh": loop(fresh, c.ns, op=off)}
            traced = {f"{k}+trace": impls[k] for k in ("plan", "off", "on")} if args.trace else {}
            for t in impls.values():            # binds the ops; warms up
                t.timeit(2)
            counted = {}
            if mpicalls.counting():             # (MPI calls per call, over 10 warm calls)
                for k, t in impls.items():
                    mpicalls.reset()
                    t.timeit(10)
                    counted[k] = {name: v / 10 for name, v in mpicalls.counts().items()}
            times = {k: [] for k in [*impls, *traced]}
            order = list(times)
            for rep in range(args.reps):        # interleaved, each in turn first: drift hits all alike
                for k in order[rep % len(order):] + order[:rep % len(order)]:
                    times[k].append(block_time(raw_comm, {**impls, **traced}[k], iters, args.trace if k in traced
                                               else None))
            med = {k: statistics.median(v) for k, v in times.items()}
            # ratios paired within each repetition (the blocks compared ran back to back), then
            # the median and the quartiles over the repetitions: the spread is the noise band
            ratios = {k: statistics.quantiles([a / b for a, b in zip(times[k], times["raw"])], n=4)
                      for k in ("off", "on", "plan", "alloc", "fresh")}
            extra = {k: statistics.median([a - b for a, b in zip(times[k], times["raw"])])
                     for k in ("off", "on", "fresh")}
            extra.update({k: statistics.median([a - b for a, b in zip(times[k], times[k.split("+")[0]])])
                          for k in traced})
            rows.append((c.name, nbytes, med, ratios, extra, counted))
            plan.free()
    if W.Get_rank() == 0:
        print(f"# mpicoll overhead vs raw mpi4py, float32, {W.Get_size()} ranks, {args.reps} interleaved "
              "repetitions (blocks timed on the slowest rank)")
        print("# off/on: execute(..., out=buf) with validation off/on, on the raw call's arrays; plan: run() of a\n"
              "# plan prepared from the same call; alloc: execute() allocating its output (validation off);\n"
              "# fresh: execute(..., out=buf[...]), a new view of the output each call (never remembered: the\n"
              "# call described afresh; validation off). us: median block time per call; x/raw: median of the\n"
              "# ratios paired within a repetition; q1-q3: their quartiles (the noise band); +us: median of\n"
              "# the paired differences from raw")
        if missing and not wanted:
            print(f"# not timed, no raw mpi4py statement in benchmarks/overhead.py: {', '.join(missing)}")
        print(f"{'op':<15}{'bytes':>10}{'raw us':>10}{'plan us':>10}{'off us':>10}{'on us':>10}"
              f"{'plan/raw':>9}{'plan q1-q3':>13}{'off/raw':>9}{'off q1-q3':>13}{'on/raw':>8}{'alloc/raw':>10}"
              f"{'fresh/raw':>10}{'off +us':>9}{'on +us':>8}{'fresh +us':>10}")
        for name, nbytes, m, q, d, _ in rows:
            print(f"{name:<15}{nbytes:>10}{m['raw'] * 1e6:>10.2f}{m['plan'] * 1e6:>10.2f}{m['off'] * 1e6:>10.2f}"
                  f"{m['on'] * 1e6:>10.2f}{q['plan'][1]:>9.3f}{q['plan'][0]:>7.3f}-{q['plan'][2]:.3f}"
                  f"{q['off'][1]:>9.3f}{q['off'][0]:>7.3f}-{q['off'][2]:.3f}{q['on'][1]:>8.3f}{q['alloc'][1]:>10.3f}"
                  f"{q['fresh'][1]:>10.3f}{d['off'] * 1e6:>9.2f}{d['on'] * 1e6:>8.2f}{d['fresh'] * 1e6:>10.2f}")
        if args.trace:
            print(f"# tracing on (events in {args.trace}): what it adds to a call, its event written, us (median "
                  "of the differences paired with the untraced blocks)")
            print(f"{'op':<15}{'bytes':>10}{'plan +us':>10}{'off +us':>10}{'on +us':>10}")
            for name, nbytes, m, q, d, _ in rows:
                print(f"{name:<15}{nbytes:>10}" + "".join(f"{d[k + '+trace'] * 1e6:>10.2f}" for k in ("plan", "off", "on")))
        if any(r[5] for r in rows):
            print("# MPI calls per call (PMPI shim, 10 warm calls), by implementation")
            for name, nbytes, *_, counted in rows:
                shown = "; ".join(f"{k}: " + (", ".join(f"{c} {v:g}" for c, v in sorted(v.items())) or "none")
                                  for k, v in counted.items())
                print(f"{name:<15}{nbytes:>10}  {shown}")


if __name__ == "__main__":
    main()
