"""The Hccl handle API's cost: a committed-then-waited task against the blocking primitive on the
same buffers, and the tiled AllGather of the Ascend C documentation's example against the untiled one.

    mpirun -bind-to core -np 2 python benchmarks/hccl.py [--sizes 65536,1048576,16777216] [--reps 15]

Part 1, per task kind of the client (its registry; a kind without statements in ``STATEMENTS`` is
named in the output) and size (float32, ``nbytes`` per rank input, stride 0, repeat 1, AllToAllV with
equal packed counts): blocks of ``commit(h); wait(h)`` on a task prepared once, interleaved with
blocks of the raw mpi4py call, of the primitive operator's ``execute(x, out=y)`` (AllToAllV:
AllToAllVV2's, which takes its counts as arguments too; validation off and on) on the same arrays.
Part 2: 16 MiB of float16 gathered (the output), tiled as Ascend's example does (per rank: 2 tiles of 128/300 of the
data with ``repeat=2``, a tail of the rest; two tasks, committed, then waited) against one untiled
task. Blocks are timed as the slowest rank's mean per call (benchmarks/overhead.py); ratios are
paired within a repetition, median and quartiles over the repetitions.
"""
from __future__ import annotations

import argparse
import statistics

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll import Hccl, HcclDataType, HcclReduceOp
from mpicoll._hccl_tasks import KINDS as _KINDS
from overhead import block_time, loop

W = MPI.COMM_WORLD


#: Per Hccl task kind: its prepare, the raw mpi4py call, and the primitive operator (a name in
#: mpicoll.OPERATIONS) with its execute, all on the same arrays (the names of kinds() below).
STATEMENTS = {
    "AllReduce": ("hccl.all_reduce(x, same, count, FP32, SUM)", "comm.Allreduce([x, F], [same, F], S)",
                  "AllReduce", "op.execute(x, out=same)"),
    "AllGather": ("hccl.all_gather(x, gathered, count, FP32)", "comm.Allgather([x, F], [gathered, F])",
                  "AllGather", "op.execute(x, out=stacked)"),
    "ReduceScatter": ("hccl.reduce_scatter(x, block, blk, FP32, SUM)",
                      "comm.Reduce_scatter_block([x, F], [block, F], S)", "ReduceScatter", "op.execute(x, out=block)"),
    "AllToAll": ("hccl.all_to_all(x, same, blk, FP32)", "comm.Alltoall([x, F], [same, F])",
                 "AllToAll", "op.execute(x, out=same)"),
    "AllToAllV": ("hccl.all_to_all_v(x, counts, displs, same, counts, displs, FP32)",
                  "comm.Alltoallv([x, (counts, displs), F], [same, (counts, displs), F])",
                  "AllToAllVV2", "op.execute(x, counts, displs, counts, displs, out=row)"),
}
#: the client's task kinds (its registry, mpicoll._hccl_tasks.KINDS), in its order
KINDS = [k.NAME.removeprefix("Hccl.") for k in _KINDS]


def kinds(comm: MPI.Comm, hccl: Hccl, nbytes: int) -> list[tuple[str, str, str, type, dict]]:
    """(name, raw statement, execute statement, primitive class, names) per kind that has
    statements here; ``h`` in the names is the kind's prepared task."""
    n = comm.Get_size()
    count = max(nbytes // 4, n) // n * n
    blk = count // n
    x = np.ones(count, np.float32)
    same, gathered, block = np.empty_like(x), np.empty(n * count, np.float32), np.empty(blk, np.float32)
    ns = dict(comm=comm, hccl=hccl, x=x, same=same, row=same.reshape(1, count), gathered=gathered, block=block,
              stacked=gathered.reshape(n, count), count=count, blk=blk, counts=np.full(n, blk),
              displs=np.arange(n) * blk, F=MPI.FLOAT, S=MPI.SUM, FP32=HcclDataType.FP32, SUM=HcclReduceOp.SUM,
              commit=hccl.commit, wait=hccl.wait)
    out = []
    for name in KINDS:
        if name in STATEMENTS:
            prepare, raw, primitive, call = STATEMENTS[name]
            h = eval(prepare, {}, dict(ns))          # noqa: S307 - the kind's task, prepared once
            out.append((name, raw, call, mpicoll.OPERATIONS[primitive], {**ns, "h": h}))
    return out


def timed(comm, impls: dict, reps: int, iters: int) -> dict[str, list[float]]:
    for t in impls.values():                    # binds; warms up
        t.timeit(2)
    times = {k: [] for k in impls}
    order = list(impls)
    for rep in range(reps):                     # interleaved, each in turn first
        for k in order[rep % len(order):] + order[:rep % len(order)]:
            times[k].append(block_time(comm, impls[k], iters))
    return times


def ratio(times, a, b) -> list[float]:
    return statistics.quantiles([x / y for x, y in zip(times[a], times[b])], n=4)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="65536,1048576,16777216")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--min-iters", type=int, default=10)
    args = ap.parse_args()
    if args.reps < 2:
        ap.error("--reps must be at least 2 (the ratios' quartiles)")
    stale = sorted(set(STATEMENTS) - set(KINDS))
    if stale:
        ap.error(f"STATEMENTS names {stale}: not task kinds of the Hccl client ({KINDS})")
    untimed = [k for k in KINDS if k not in STATEMENTS]
    raw_comm = W.Dup()
    mpicoll.init()
    me, n = W.Get_rank(), W.Get_size()
    rows = []
    for nbytes in (int(s) for s in args.sizes.split(",")):
        iters = max(args.min_iters, min(4000, int(2e9 // max(nbytes, 1) // 100)))
        with Hccl().init() as hccl:
            for name, raw, call, cls, ns in kinds(raw_comm, hccl, nbytes):
                req = eval(raw.replace("(", "_init(", 1), {}, dict(ns))       # noqa: S307 - the raw persistent call
                impls = {"raw": loop(raw, ns), "task": loop("commit(h); wait(h)", ns),
                         "pers": loop("req.Start(); req.Wait()", ns, req=req),
                         "off": loop(call, ns, op=cls(validate=False)), "on": loop(call, ns, op=cls(validate=True))}
                t = timed(raw_comm, impls, args.reps, iters)
                rows.append((name, nbytes, {k: statistics.median(v) for k, v in t.items()},
                             {k: ratio(t, "task", k) for k in ("raw", "pers", "off", "on")}))
                req.Free()
    # part 2: Ascend's example tiling of a 16 MiB float16 AllGather (output size)
    per = (8 << 20) // n                        # float16 elements per rank
    tile = per * 128 // 300
    tail = per - 2 * tile
    x, y = np.ones(per, np.float16), np.empty(per * n, np.float16)
    with Hccl().init() as hccl:
        whole = hccl.all_gather(x, y, per, HcclDataType.FP16)
        h1 = hccl.all_gather(x, y, tile, HcclDataType.FP16, per, repeat=2)
        h2 = hccl.all_gather(x[2 * tile:], y[2 * tile:], tail, HcclDataType.FP16, per)
        ns = dict(commit=hccl.commit, wait=hccl.wait, whole=whole, h1=h1, h2=h2)
        impls = {"untiled": loop("commit(whole); wait(whole)", ns),
                 "tiled": loop("commit(h1); commit(h1); commit(h2); wait(h1); wait(h2)", ns)}
        tiles = timed(raw_comm, impls, args.reps, args.min_iters)
    if me == 0:
        print(f"# Hccl tasks vs blocking calls, float32, {n} ranks, {args.reps} interleaved repetitions "
              "(blocks timed on the slowest rank)")
        print("# task: commit(h); wait(h) of a task prepared once (stride 0, repeat 1); raw: the blocking mpi4py\n"
              "# call; pers: the same call as a raw MPI persistent request (req.Start(); req.Wait());\n"
              "# off/on: the primitive's execute(x, out=...) with validation off/on, same arrays;\n"
              "# x/y: median of the ratios paired within a repetition, [q1-q3]")
        if untimed:
            print(f"# not timed, no statements in benchmarks/hccl.py: {', '.join(untimed)}")
        print(f"{'kind':<14}{'bytes':>10}{'raw us':>9}{'pers us':>9}{'task us':>9}{'off us':>9}{'on us':>9}"
              f"{'task/raw':>20}{'task/pers':>20}{'task/off':>20}{'task/on':>20}")
        for name, nbytes, m, q in rows:
            cells = "".join(f"{f'{r[1]:.3f} [{r[0]:.2f}-{r[2]:.2f}]':>20}" for r in (q["raw"], q["pers"], q["off"],
                                                                                    q["on"]))
            print(f"{name:<14}{nbytes:>10}" + "".join(f"{m[k] * 1e6:>9.1f}" for k in ("raw", "pers", "task", "off", "on"))
                  + cells)
        r = ratio(tiles, "tiled", "untiled")
        print(f"# Ascend example tiling, AllGather of 16 MiB float16 (output), {per} elements per rank as 2 x {tile} + {tail}:")
        print(f"untiled {statistics.median(tiles['untiled']) * 1e3:.2f} ms, tiled "
              f"{statistics.median(tiles['tiled']) * 1e3:.2f} ms, tiled/untiled {r[1]:.3f} [{r[0]:.2f}-{r[2]:.2f}]")


if __name__ == "__main__":
    main()
