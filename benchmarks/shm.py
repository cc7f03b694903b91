"""The node's shared window (mpicoll._shm) against mpicoll's MPI path and raw mpi4py, same run.

    mpirun -bind-to core -np 2 python benchmarks/shm.py [--sizes 1,4,16,64] [--dtypes float32,bfloat16]
                                                        [--ops AllReduce,ReduceScatter] [--reps 7] [--json F]
    scripts/cluster run 2 4 [--rate 1gbit] -- python benchmarks/shm.py --ops AllReduce --tx    (several hosts)

Sizes are MiB of each rank's input (AllGather: of the output; ``--ops`` also takes AllGather and
Broadcast, whose window variant is MPI's path: only ``--buffer`` changes them). For every operator,
dtype and size it interleaves blocks of ``plan.run()`` on a communicator made with the window
(``MPICOLL_SHM=1``, the default), of ``plan.run()`` on one made without it (``MPICOLL_SHM=0``:
mpicoll's MPI path), of the raw mpi4py call (``comm.Allreduce`` / ``comm.Reduce_scatter_block`` /
``comm.Allgather`` / ``comm.Bcast``; float16 reductions with MPI's native ``FLOAT16_T``, as
``mpicoll.run bench`` does; for bfloat16, which MPI cannot reduce, what an mpi4py user writes: a cast
into a float32 array, the float32 call, a cast back), and of one core's memcpy of the same bytes (rank
0 alone, ``np.copyto``), and (``--buffer``) of a plan whose input is a node buffer
(``mpicoll.node_buffer``: read in place by the peers), and (``--floor``) of the first window's plan
with its Barriers taken out (its copies and reductions at each rank's own pace: an estimate of the
least time that path can take; its results are wrong, racing the peers), each in turn first, each block
timed as the slowest rank's mean. Prints median times, bus bandwidth (nccl-tests' factors: AllReduce
2(n-1)/n, ReduceScatter (n-1)/n of the input bytes) over memcpy's bandwidth, and the medians of the
ratios paired within a repetition. Plans run with validation off: the loop a user writes for speed.

Across hosts (the test bed, docs/multihost.md) the window's variant is the tiered AllReduce
(``_making.tiers``) and ``--tx`` adds, for each variant, the bytes one call sends from the busiest
host (its ``eth0`` counters), over the message size: a bandwidth-optimal AllReduce over N hosts sends
``2 (N - 1) / N``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
from mpi4py import MPI

import mpicoll
import mpicoll._shm
from mpicoll._thresholds import VALUES
from mpicoll import _env
from mpicoll._dtypes import DTYPES
from mpicoll.checks._golden import raw_reduce_type

W = MPI.COMM_WORLD


COMMS: dict = {}      # slot (None: no window) -> its duplicate of the world, made once: the window lives with it


def make_plan(cls, param_cls, slot: int | None, *args, one_shot: int | None = None, **kw):
    """A plan of an operation on a duplicate of the world kept for ``slot``: made with a window of
    ``slot`` bytes per rank per round, or without the window (None)."""
    if slot not in COMMS:
        COMMS[slot] = W.Dup()
    old = os.environ.get("MPICOLL_SHM")
    os.environ["MPICOLL_SHM"] = "0" if slot is None else "1"
    _env.reread()                 # (mpicoll keeps what it read: read it again, here and below)
    if slot:
        VALUES["window.slot"] = slot
    if one_shot is not None:
        VALUES["window.one_shot"] = one_shot
    try:
        more = {"reduce_type": "sum"} if "reduce_type" in param_cls.__dataclass_fields__ else {}
        return cls(param_cls(comm=COMMS[slot], **more), validate=False).prepare(*args, **kw)
    finally:
        if old is None:
            del os.environ["MPICOLL_SHM"]
        else:
            os.environ["MPICOLL_SHM"] = old
        _env.reread()


def without_barriers(plan):
    """``plan`` with its Barriers taken out, before its first run (``--floor``: timing only)."""
    from mpicoll._go import MPI_CALL
    plan._steps = [s for s in plan._steps if not (s.kind == MPI_CALL and s.name == "Barrier")]
    return plan


def variants(op_name: str, dtype: str, nbytes: int, slots: list[int], one_shots: list[int], buffer: bool,
             floor: bool) -> dict:
    """name -> a no-argument call, for one operator, dtype and size."""
    n, dt = W.size, DTYPES[dtype]
    count = max(nbytes // dt.itemsize // n, 1) * n
    x = (np.arange(count) % 7).astype(dt.np)
    raw_comm = COMMS.setdefault("raw", W.Dup())
    if op_name == "AllReduce":
        cls, param, y = mpicoll.AllReduceOperation, mpicoll.AllReduceParam, np.empty_like(x)
        raw = lambda a, b, t: raw_comm.Allreduce([a, t], [b, t], MPI.SUM)                 # noqa: E731
    elif op_name == "ReduceScatter":
        cls, param, y = mpicoll.ReduceScatterOperation, mpicoll.ReduceScatterParam, np.empty(count // n, dt.np)
        raw = lambda a, b, t: raw_comm.Reduce_scatter_block([a, t], [b, t], MPI.SUM)      # noqa: E731
    elif op_name == "AllGather":                   # (the size is the output's: each rank gives 1/n of it)
        x = x[:count // n]
        cls, param, y = mpicoll.AllGatherOperation, mpicoll.AllGatherParam, np.empty((n, x.size), dt.np)
        raw = lambda a, b, t: raw_comm.Allgather([a, t], [b, t])                          # noqa: E731
    else:
        cls, param, y = mpicoll.BroadcastOperation, mpicoll.BroadcastParam, None
        raw = lambda a, b, t: raw_comm.Bcast([a, t], 0)                                   # noqa: E731
    kw = {} if y is None else {"out": y}
    out = {name: make_plan(cls, param, slot, x, one_shot=shot, **kw).run
           for name, slot, shot in [(f"window{k}", s, o) for k, (s, o) in enumerate(zip(slots, one_shots))]
           + [("mpi", None, None)]}
    if buffer:
        resident = mpicoll.node_buffer(x.shape, x.dtype, comm=COMMS[slots[0]])
        resident[:] = x
        out["buffer"] = make_plan(cls, param, slots[0], resident, **kw).run
    if floor:
        out["floor"] = without_barriers(make_plan(cls, param, slots[0], x, one_shot=one_shots[0], **kw)).run
    raw_t = raw_reduce_type(dt) if op_name in ("AllReduce", "ReduceScatter") else dt.mpi
    if raw_t is not None:              # (16-bit floats as their bits: mpi4py takes no bfloat16 buffer)
        a, b = (x, y) if dt.reduce == "native" else (x.view(np.uint16), y if y is None else y.view(np.uint16))
        out["raw"] = lambda: raw(a, b, raw_t)
    else:                              # (bfloat16, which MPI cannot reduce: through float32)
        x32, y32, f32 = x.astype(np.float32), y.astype(np.float32), DTYPES["float32"].mpi

        def raw16():
            np.copyto(x32, x)
            raw(x32, y32, f32)
            np.copyto(y, y32)
        out["raw"] = raw16
    src, dst = x.copy(), np.empty_like(x)

    def memcpy():
        if W.rank == 0:
            np.copyto(dst, src)
    out["memcpy"] = memcpy
    return out


def sent(fn) -> float:
    """The bytes one call of ``fn`` sends from the busiest host (each host's ``eth0`` counter)."""
    def tx() -> int:
        with open("/sys/class/net/eth0/statistics/tx_bytes") as fh:
            return int(fh.read())
    W.Barrier()
    before = tx()
    W.Barrier()
    fn()
    W.Barrier()
    hosts: dict = {}
    for host, delta in W.allgather((MPI.Get_processor_name(), tx() - before)):
        hosts[host] = delta                 # (ranks on one host read the same counter)
    return max(hosts.values())


def block(fn, iters: int) -> float:
    """The slowest rank's mean time per call over ``iters`` calls."""
    W.Barrier()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    t = (time.perf_counter() - t) / iters
    return W.allreduce(t, op=MPI.MAX)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1,4,16,64")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--ops", default="AllReduce,ReduceScatter")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json", default=None)
    ap.add_argument("--buffer", action="store_true", help="also a plan whose input is a node buffer")
    ap.add_argument("--floor", action="store_true",
                    help="also the first window's plan without its Barriers (an estimate of its least time; wrong "
                         "results: timing only)")
    ap.add_argument("--tx", action="store_true", help="also the bytes each variant sends from the busiest host, over "
                                                      "the message size (several hosts: the test bed)")
    ap.add_argument("--slot", default=str(VALUES["window.slot"]),
                    help="window bytes per rank per round; several (comma-separated) compare windows of each "
                         "size in the same run (the first is 'window' in the ratios)")
    ap.add_argument("--one-shot", default=str(VALUES["window.one_shot"]),
                    help="window.one_shot: AllReduce goes in one shot up to this over n (n - 1) bytes per message; "
                         "several compare, paired with --slot's values in order")
    ap.add_argument("--no-threshold", action="store_true",
                    help="use the window at every size (an experiment: how the thresholds were chosen)")
    a = ap.parse_args()
    if a.no_threshold:
        VALUES["window.allreduce"] = VALUES["window.allreduce.16bit"] = VALUES["window.reduce_scatter"] = 0
    ap_slots = [int(s) for s in a.slot.split(",")]
    ap_shots = [int(s) for s in a.one_shot.split(",")]
    k = max(len(ap_slots), len(ap_shots))
    slots = (ap_slots * k)[:k]
    one_shots = (ap_shots * k)[:k]
    n, rows = W.size, []
    wins = [f"window{k}" for k in range(len(slots))] + (["buffer"] if a.buffer else []) + (["floor"] if a.floor else [])
    if W.rank == 0:
        print(f"# mpicoll {mpicoll.__version__}: shared window vs MPI path vs raw mpi4py, {n} ranks, "
              f"{MPI.Get_library_version().splitlines()[0].strip()}; ms = median of the slowest rank's mean")
        print("# windows: " + ", ".join(f"{w} = {s} B per rank per round, one shot up to {o // max(n * (n - 1), 1)} B"
                                        for w, s, o in zip(wins, slots, one_shots))
              + "".join(f"; {w}: window0's plan {how}" for w, how in [("buffer", "on a node buffer"),
                        ("floor", "without its Barriers")] if w in wins))
        print(f"{'op':<14}{'dtype':<9}{'MiB':>5} " + "".join(f"{w + ' ms':>11}{'/mpi':>6}{'/raw':>6}" for w in wins)
              + f" {'mpi ms':>8} {'raw ms':>8} {'memcpy':>8} {'busbw/memcpy':>13}"
              + ("  tx/host: " + " ".join(w for w in wins) + " mpi raw" if a.tx else ""))
    for op_name in a.ops.split(","):
        factor = {"AllReduce": 2 * (n - 1) / n, "Broadcast": 1}.get(op_name, (n - 1) / n)
        for dtype in a.dtypes.split(","):
            for mib in (float(s) for s in a.sizes.split(",")):
                nbytes = int(mib * 2 ** 20)
                calls = variants(op_name, dtype, nbytes, slots, one_shots, a.buffer, a.floor)
                names = list(calls)
                warm = time.perf_counter() + (3.0 if not rows else 0.0)
                while True:                                 # warm up (the first time: fresh window memory is
                    for fn in calls.values():               # slow to write for a few seconds on this VM)
                        fn()
                    if W.allreduce(time.perf_counter() >= warm, op=MPI.LAND):
                        break
                iters = max(2, min(50, int(0.3 / max(block(calls["mpi"], 1), 1e-6))))
                times = {k: [] for k in names}
                for rep in range(a.reps):
                    for k in names[rep % len(names):] + names[:rep % len(names)]:
                        times[k].append(block(calls[k], iters))
                med = {k: statistics.median(v) for k, v in times.items()}
                ratio = {(w, k): statistics.median(a / b for a, b in zip(times[w], times[k]))
                         for w in wins for k in ("mpi", "raw") if k in times}
                busbw = [nbytes * factor / med[w] / (nbytes / med["memcpy"]) for w in wins]
                tx = {k: sent(calls[k]) / nbytes for k in names if k != "memcpy"} if a.tx else {}
                rows.append({"op": op_name, "dtype": dtype, "MiB": mib, "ranks": n, "slots": slots,
                             "ms": {k: v * 1e3 for k, v in med.items()},
                             "ratios": {f"{w}/{k}": v for (w, k), v in ratio.items()}, "busbw/memcpy": busbw,
                             "tx/host": tx})
                if W.rank == 0:
                    def f(v, width, fmt):
                        return f"{'-':>{width}}" if v is None else f"{v:{width}{fmt}}"
                    cells = "".join(f"{med[w] * 1e3:11.2f}{ratio[w, 'mpi']:6.2f}{f(ratio.get((w, 'raw')), 6, '.2f')}"
                                    for w in wins)
                    print(f"{op_name:<14}{dtype:<9}{mib:5g} {cells} {med['mpi'] * 1e3:8.2f} "
                          f"{f(med['raw'] * 1e3 if 'raw' in med else None, 8, '.2f')} {med['memcpy'] * 1e3:8.2f} "
                          f"{' '.join(f'{b:.2f}' for b in busbw):>13}"
                          + ("  " + " ".join(f"{v:.2f}" for v in tx.values()) if tx else ""), flush=True)
    if W.rank == 0 and a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
