"""Measure what benchmarks/model.py predicts: its constants (``calibrate``) and the times and bytes per
host of the paths it models (``measure``), for ``python benchmarks/model.py --check``.

    mpirun -bind-to core -np 2 python benchmarks/model_check.py calibrate          (this machine)
    scripts/cluster run 2 2 --rate 1gbit -- python benchmarks/model_check.py calibrate   (the bed's links)
    mpirun -bind-to core -np N python benchmarks/model_check.py measure [--json F] [--sizes ...]
    scripts/cluster run H NP --rate 1gbit [--round-robin] -- python benchmarks/model_check.py measure ...

``calibrate`` prints one JSON line of constants (seconds, seconds per byte): one core's copy, the
rank-order reduction of k rows (float32, bfloat16 accumulated in float32), bfloat16 <-> float32
casts, and between ranks 0 and the last rank (another host on the bed): a Sendrecv of 8 B and of
4 MiB, a Barrier, an 8-byte Allreduce raw and through an mpicoll plan.

``measure`` prints (and appends to ``--json``) one JSON line per operator, dtype, size and path, with the
median time (blocks of calls, each the slowest rank's mean, paths interleaved, each in turn first:
benchmarks/exact.py's ``timed``) and, on the bed, the bytes one call sends from the busiest host
(``eth0`` counters, over ``--tx-calls`` calls, less the same count of Barriers). Paths: ``mpi`` (raw
mpi4py: ``Allreduce``, ``Reduce_scatter_block``; none for bfloat16), ``exact`` and ``fast`` (mpicoll
plans made with ``MPICOLL_EXACT=1`` and ``0``: benchmarks/exact.py's ``plan``), and ``tree``, where the
ranks span several hosts holding the same number each: a prototype of the node-first shape that a
tree order allows (docs/scaling.md), from today's pieces: mpicoll's ReduceScatter on each host's
members (the node window), MPI's ``Reduce_scatter_block`` among the members with the same index on every
host, then ``Allgather`` there and on each host (bfloat16: in float32 until the last rounding, the
cross-host reduce-scatter in float32, the gathers in bfloat16). Its bits are the tree's where the
hosts are 2 and hold 2 ranks each (one addition per element in each tier); elsewhere it is a timing
of that shape only.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from exact import plan, raw, timed            # noqa: E402  (benchmarks/exact.py: the same plans and timing)

import mpicoll                                # noqa: E402
from mpicoll._dtypes import DTYPES, reduce_op  # noqa: E402
from mpicoll._numeric import from_f32, reduce_rows, to_f32  # noqa: E402

W = MPI.COMM_WORLD
TX = "/sys/class/net/eth0/statistics/tx_bytes"


def _tx() -> int:
    with open(TX) as fh:
        return int(fh.read())


def sent_per_call(fn, calls: int) -> float:
    """Bytes one call of ``fn`` sends from the busiest host: ``calls`` calls between Barriers, less
    ``calls`` Barriers alone (TCP's acknowledgements and the Barriers' own bytes), over ``calls``."""
    def busiest(work) -> int:
        W.Barrier()
        before = _tx()
        W.Barrier()
        for _ in range(calls):
            work()
        W.Barrier()
        hosts = dict(W.allgather((MPI.Get_processor_name(), _tx() - before)))   # (a host's ranks: one counter)
        return max(hosts.values())
    return (busiest(fn) - busiest(W.Barrier)) / calls


def best(fn, seconds: float = 0.2, reps: int = 7) -> float:
    """The median over ``reps`` blocks of ``fn`` (each about ``seconds / reps``) of the mean time per call."""
    iters = max(3, int(seconds / reps / max(_once(fn), 1e-7)))
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        out.append((time.perf_counter() - t) / iters)
    return statistics.median(out)


def _once(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def calibrate() -> dict:
    """This machine's constants (rank 0 alone for the local ones; then rank 0 and the last rank)."""
    c: dict = {"ranks": W.size, "hosts": len(set(W.allgather(MPI.Get_processor_name())))}
    if W.rank == 0:
        f32, bf16 = DTYPES["float32"], DTYPES["bfloat16"]
        add = reduce_op("sum")
        for label, nbytes in (("cache", 256 << 10), ("mem", 16 << 20)):
            a, b = np.ones(nbytes // 4, np.float32), np.empty(nbytes // 4, np.float32)
            c[f"copy_{label}"] = best(lambda: np.copyto(b, a)) / nbytes
            for dt in (f32, bf16):
                count = nbytes // dt.itemsize
                for k in (2, 4, 8):
                    rows = [np.ones(count, dt.np) for _ in range(k)]
                    out = np.empty(count, dt.np)
                    c[f"reduce_{dt.name}_{k}_{label}"] = best(lambda: reduce_rows(rows, dt, add, out)) / nbytes
            b2 = np.ones(nbytes // 4, np.float32)
            c[f"mpi_add_{label}"] = best(lambda: MPI.SUM.Reduce_local(a, b2)) / nbytes   # (MPI's own loop)
            x16, acc = np.ones(nbytes // 2, bf16.np), np.empty(nbytes // 2, np.float32)
            c[f"to_f32_{label}"] = best(lambda: to_f32(x16, acc)) / (nbytes // 2)       # per 16-bit byte in
            c[f"from_f32_{label}"] = best(lambda: from_f32(acc, x16)) / (nbytes // 2)
    W.Barrier()
    peer = W.size - 1
    pair = W.Split(0 if W.rank in (0, peer) else MPI.UNDEFINED, W.rank)
    if pair != MPI.COMM_NULL:
        other = 1 - pair.rank
        for nbytes in (8, 4 << 20):
            s, r = np.zeros(nbytes, np.uint8), np.empty(nbytes, np.uint8)
            c[f"sendrecv_{nbytes}"] = _pair_time(pair, lambda: pair.Sendrecv(s, other, 0, r, other, 0))
        c["barrier_pair"] = _pair_time(pair, pair.Barrier)
        if os.path.exists(TX):                       # (the bed: bytes on the link of one 16-byte exchange)
            s16, r16 = np.zeros(16, np.uint8), np.empty(16, np.uint8)
            pair.Barrier()
            before = _tx()
            for _ in range(100):
                pair.Sendrecv(s16, other, 0, r16, other, 0)
            pair.Barrier()
            c[f"tx_sendrecv_16_rank{W.rank}"] = (_tx() - before) / 100
        x, y = np.ones(2, np.float32), np.empty(2, np.float32)
        c["allreduce_8_pair"] = _pair_time(pair, lambda: pair.Allreduce(x, y, MPI.SUM))
        os.environ["MPICOLL_EXACT"] = "0"
        p = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=pair), validate=False).prepare(x, y)
        c["plan_allreduce_8_pair"] = _pair_time(pair, p.run)
    x, y = np.ones(2, np.float32), np.empty(2, np.float32)
    c["allreduce_8_all"] = timed(lambda: W.Allreduce(x, y, MPI.SUM), 2000)
    c["barrier_all"] = timed(W.Barrier, 2000)
    s8, r8 = np.zeros(8 * W.size, np.uint8), np.empty(8 * W.size, np.uint8)
    c["alltoall_8_all"] = timed(lambda: W.Alltoall(s8, r8), 1000)
    big = np.ones(4 << 18, np.float32)
    out = np.empty_like(big)
    c["allreduce_4MiB_all"] = statistics.median(timed(lambda: W.Allreduce(big, out, MPI.SUM), 5) for _ in range(5))
    every = W.gather(c)
    return {k: v for d in (every or []) for k, v in d.items()}


def _pair_time(comm, fn, iters: int | None = None) -> float:
    """Median of 7 blocks of ``fn`` on both members of ``comm``, the slower member's mean per call."""
    comm.Barrier()
    t = time.perf_counter()
    fn()
    comm.Barrier()
    once = comm.allreduce(time.perf_counter() - t, MPI.MAX)
    iters = iters or max(3, min(5000, int(0.03 / max(once, 1e-7))))
    out = []
    for _ in range(7):
        comm.Barrier()
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        out.append(comm.allreduce((time.perf_counter() - t) / iters, MPI.MAX))
    return statistics.median(out)


_TIERS: list = []


def _tiers() -> tuple:
    """This rank's host's members and the members with its index on every host (made once)."""
    if not _TIERS:
        node = W.Split_type(MPI.COMM_TYPE_SHARED, key=W.rank)
        _TIERS.extend((node, W.Split(node.rank, W.rank)))
    return tuple(_TIERS)


class Tree:
    """The node-first shape a tree order allows (module docstring), from today's pieces, on hosts
    holding the same number of consecutive ranks (block placement)."""

    def __init__(self, name: str, dt, x: np.ndarray, out: np.ndarray) -> None:
        self.node, self.across = node, across = _tiers()
        p, h = node.size, across.size
        self.name, self.dt, self.out = name, dt, out
        wide = np.float32 if dt.name == "bfloat16" else dt.np
        self.x, self.wide = x, np.empty(x.size, wide)
        if name == "ReduceScatter":                 # node member k gets the blocks bound for member k of every host
            blk = x.size // (h * p)
            self.order = np.arange(x.size).reshape(h, p, blk).transpose(1, 0, 2).reshape(-1)
        else:
            self.order = None
        mine = self.wide.size // p
        self.part = np.empty(mine, wide)             # this rank's part of its host's partial
        self.red = np.empty(mine // h, wide)         # its part of the result, reduced over the hosts
        self.red16 = np.empty(mine // h, dt.np)
        self.gathered = np.empty(mine, dt.np)
        os.environ["MPICOLL_EXACT"] = "1"           # (rank order on each host: the tree's for 2 ranks a host)
        self.rs = mpicoll.ReduceScatterOperation(mpicoll.ReduceScatterParam(comm=node), validate=False)
        self.m = MPI.DOUBLE if wide == np.float64 else MPI.FLOAT

    def __call__(self) -> None:
        src = self.x if self.order is None else self.x[self.order]
        if self.dt.name == "bfloat16":
            to_f32(np.ascontiguousarray(src), self.wide)
        else:
            np.copyto(self.wide, src)
        self.rs.execute(self.wide, out=self.part)
        self.across.Reduce_scatter_block([self.part, self.m], [self.red, self.m], MPI.SUM)
        if self.dt.name == "bfloat16":              # (16 bits travel as uint16: mpi4py refuses bfloat16 buffers)
            from_f32(self.red, self.red16)
            red, gathered, out = (a.view(np.uint16) for a in (self.red16, self.gathered, self.out.reshape(-1)))
            m = MPI.UINT16_T
        else:
            red, gathered, out, m = self.red, self.gathered, self.out.reshape(-1), self.m
        if self.name == "ReduceScatter":
            np.copyto(out, red)
            return
        self.across.Allgather([red, m], [gathered, m])
        self.node.Allgather([gathered, m], [out, m])


def measure(a) -> list[dict]:
    n = W.size
    hosts = W.allgather(MPI.Get_processor_name())
    h = len(set(hosts))
    p = n // h
    block = all(hosts[r] == hosts[r - r % p] for r in range(n))
    layout = "block" if block else "round-robin"
    on_bed = os.path.exists(TX) and h > 1
    rows = []
    for name in a.ops.split(","):
        for dname in a.dtypes.split(","):
            dt = DTYPES[dname]
            for nbytes in (int(s) for s in a.sizes.split(",")):
                count = max(nbytes // dt.itemsize // n * n, n)
                x = (np.arange(count) % 7 * (W.rank + 1) * 0.01).astype(dt.np)
                out = np.empty(count // n if name == "ReduceScatter" else count, dt.np)
                fns = {"mpi": raw(name, x, out, dt), "exact": plan(name, 1, x, out), "fast": plan(name, 0, x, out)}
                if h > 1 and p * h == n and block and count % (n * 2) == 0:
                    fns["tree"] = Tree(name, dt, x, out)
                fns = {k: f for k, f in fns.items() if f is not None and k in a.paths.split(",")}
                once = max(timed(f, 1) for f in fns.values())
                iters = max(2, min(2000, int(a.block / max(once, 1e-6))))
                times: dict = {k: [] for k in fns}
                for rep in range(a.reps):
                    keys = list(fns)
                    for k in keys[rep % len(keys):] + keys[:rep % len(keys)]:
                        times[k].append(timed(fns[k], iters))
                for k, f in fns.items():
                    row = {"op": name, "dtype": dname, "bytes": count * dt.itemsize, "path": k, "ranks": n,
                           "hosts": h, "layout": layout, "time": statistics.median(times[k]),
                           "times": times[k], "load": os.getloadavg()[0]}
                    if on_bed:
                        row["tx"] = sent_per_call(f, a.tx_calls if nbytes >= 1 << 20 else 20)
                    rows.append(row)
                    if W.rank == 0:
                        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("calibrate")
    m = sub.add_parser("measure")
    m.add_argument("--ops", default="AllReduce,ReduceScatter")
    m.add_argument("--dtypes", default="float32,bfloat16")
    m.add_argument("--sizes", default="8,4096,65536,1048576,4194304,16777216")
    m.add_argument("--paths", default="mpi,exact,fast,tree")
    m.add_argument("--reps", type=int, default=5)
    m.add_argument("--block", type=float, default=0.03, help="seconds per timed block (default 0.03)")
    m.add_argument("--tx-calls", type=int, default=3)
    m.add_argument("--json", help="append the rows here too (JSON lines)")
    a = ap.parse_args()
    if a.cmd == "calibrate":
        c = calibrate()
        if W.rank == 0:
            print(json.dumps(c), flush=True)
        return
    if W.rank == 0:
        print(f"# {W.size} ranks, {MPI.Get_library_version().splitlines()[0]}, load {os.getloadavg()[0]:.2f}",
              flush=True)
    rows = measure(a)
    if W.rank == 0 and a.json:
        with open(a.json, "a") as fh:
            for r in rows:
                fh.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
