"""docs/scaling.md's figures from benchmarks/model.py: the scaling table, its plot, the model's check
against measurement, the issue's targets and issue 45's slot size.

    python benchmarks/scaling.py [--machine 1gbit|100gbit]   the compact table (docs/scaling.md)
    python benchmarks/scaling.py --grid [--machine ...]      every point: AllReduce and ReduceScatter, float32
                                   and bfloat16, 8 B - 1 GiB, 2 - 1024 hosts x 1 - 64 ranks, block and
                                   round-robin, every column (time in us, link bytes over the message)
    python benchmarks/scaling.py --worst                     over that grid: the largest time over MPI's
    python benchmarks/scaling.py --plot docs/scaling.png     (matplotlib: pip install ".[plot]")
    python benchmarks/scaling.py --check benchmarks/model_measured.jsonl   predicted / measured, per path and size
    python benchmarks/scaling.py --targets                   the issue's targets, as the model sees them
    python benchmarks/scaling.py --measured-targets benchmarks/model_measured.jsonl   and as measured
    python benchmarks/scaling.py --slot                      a validated small call: one Allgather of slots

Columns: ``exact`` (rank order: mpicoll's paths of the release before the move), ``tree`` (the tree order's
algorithms, the design of docs/scaling.md, now the guarantee),
``fast`` (mpicoll with MPICOLL_EXACT=0), ``mpi`` (MPI's own call as MPICH picks it; for bfloat16, which
MPI cannot reduce, its algorithm on a 16-bit wire, as NCCL does), ``mpi-best`` (the fastest of MPI's
algorithms: ring, recursive doubling, Rabenseifner, node-aware).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as M                              # noqa: E402  (benchmarks/model.py)

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
MACHINES = {"1gbit": M.CLUSTER, "100gbit": M.FAST}
HOSTS = [2 ** k for k in range(1, 11)]
PER_HOST = [1, 2, 4, 8, 16, 32, 64]
SIZES = [8 * 4 ** k for k in range(14)] + [GiB]               # 8 B, 32 B, ... 512 MiB, 1 GiB
COLUMNS = ["exact", "tree", "fast", "mpi", "mpi-best"]
#: the compact table's points
KEY_HOSTS, KEY_SIZES = [2, 64, 1024], [8, 64 * KiB, 16 * MiB, GiB]


def cell(m, op, dtype, h, p, layout, S, col) -> M.Cost:
    return M.predict(col, op, m, M.Group(h * p, p, layout), S, dtype)


def grid(m) -> None:
    print(f"# {m.name}: op dtype hosts ranks/host layout bytes | per column: time us, link bytes / message")
    print("# " + " ".join(COLUMNS))
    for op in ("AllReduce", "ReduceScatter"):
        for dtype in ("float32", "bfloat16"):
            for layout in ("block", "rr"):
                for h in HOSTS:
                    for p in PER_HOST:
                        if layout == "rr" and p == 1:
                            continue
                        for S in SIZES:
                            cs = [cell(m, op, dtype, h, p, layout, S, c) for c in COLUMNS]
                            print(f"{op} {dtype} {h} {p} {layout} {S} " + " ".join(
                                f"{c.t * 1e6:.4g} {c.link / S:.3g}" for c in cs))


def worst(m, in_c: bool = False) -> None:
    """Over the grid: for each column, the largest time over MPI's own and where, and at how many points
    it is within 1.1x. ``in_c``: every Python overhead (mpi4py's call, a plan's step) taken out of
    mpicoll's paths and of MPI's: the algorithms alone, as if mpicoll's steps ran in C."""
    if in_c:
        m = replace(m, name=m.name + ", no Python overheads", call=0.0, step=0.0, win_step=0.0)
    for op in ("AllReduce", "ReduceScatter"):
        for dtype in ("float32", "bfloat16"):
            for layout in ("block", "rr"):
                stats = {c: [] for c in ("exact", "tree", "fast", "tree/mpi-best")}
                for h in HOSTS:
                    for p in PER_HOST:
                        if layout == "rr" and p == 1:
                            continue
                        for S in SIZES:
                            ref = cell(m, op, dtype, h, p, layout, S, "mpi").t
                            for c in stats:
                                if c == "tree/mpi-best":
                                    r = stats["tree"][-1][0] * ref / cell(m, op, dtype, h, p, layout, S, "mpi-best").t
                                else:
                                    r = cell(m, op, dtype, h, p, layout, S, c).t / ref
                                stats[c].append((r, h, p, S))
                line = []
                for c, v in stats.items():
                    r, h, p, S = max(v)
                    ok = sum(1 for x in v if x[0] <= 1.1)
                    above = [x[3] for x in v if x[0] > 1.1]
                    start = min((z for z in SIZES if z > max(above)), default=None) if above else SIZES[0]
                    line.append(f"{c}: worst {r:.2f} ({h}x{p}, {M._size(S)}), <= 1.1 at {ok}/{len(v)}"
                                + (f", everywhere from {M._size(start)}" if start else ""))
                print(f"{m.name} {op} {dtype} {layout}: " + "; ".join(line), flush=True)


def compact(m, ops=(("AllReduce", "float32"), ("AllReduce", "bfloat16"), ("ReduceScatter", "float32"))) -> None:
    """docs/scaling.md's table: time over MPI's own, and bytes a host sends over the message, at the key
    points, 8 ranks a host, block placement; round-robin in brackets where it differs by more than 5%."""
    print(f"**{m.name}**, 8 ranks a host: time / MPI's own (bytes a host sends / the message); block "
          "placement [round-robin, where it differs]\n")
    print("| op | hosts | size | MPI's own | MPI's best algorithm | exact (rank order) | tree order | "
          "MPICOLL_EXACT=0 |")
    print("|---|---|---|---|---|---|---|---|")
    for op, dtype in ops:
        for h in KEY_HOSTS:
            for S in KEY_SIZES:
                cells = []
                ref, rref = (cell(m, op, dtype, h, 8, lay, S, "mpi") for lay in ("block", "rr"))
                for col in ("mpi-best", "exact", "tree", "fast"):
                    b, r = (cell(m, op, dtype, h, 8, lay, S, col) for lay in ("block", "rr"))
                    txt = f"{b.t / ref.t:.2f} ({_r(b.link / S)})"
                    if abs(r.t / rref.t - b.t / ref.t) > 0.05 * b.t / ref.t:
                        txt += f" [{r.t / rref.t:.2f} ({_r(r.link / S)})]"
                    cells.append(txt)
                print(f"| {op} {dtype} | {h} | {M._size(S)} | {_t(ref.t)} ({_r(ref.link / S)}) | " + " | ".join(cells)
                      + " |")


def _r(x: float) -> str:
    return f"{x:.2g}" if x < 10 else f"{x:,.0f}"


def _t(s: float) -> str:
    return f"{s * 1e6:.0f} us" if s < 1e-2 else f"{s * 1e3:.0f} ms" if s < 10 else f"{s:.0f} s"


def plot(path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 4, figsize=(17, 8), sharex=True)
    styles = {"exact": ("tab:red", "-"), "tree": ("tab:green", "-"), "fast": ("tab:blue", "--"),
              "mpi": ("black", ":")}
    for row, m in enumerate((M.CLUSTER, M.FAST)):
        for col, (op, dtype, layout) in enumerate((("AllReduce", "float32", "block"), ("AllReduce", "float32", "rr"),
                                                   ("AllReduce", "bfloat16", "block"),
                                                   ("ReduceScatter", "float32", "block"))):
            ax = axes[row][col]
            for h, width in ((2, 0.8), (64, 1.6), (1024, 2.6)):
                for c, (color, ls) in styles.items():
                    ref = [cell(m, op, dtype, h, 8, layout, S, "mpi").t for S in SIZES]
                    ys = [cell(m, op, dtype, h, 8, layout, S, c).t / r for S, r in zip(SIZES, ref)]
                    ax.plot(SIZES, ys, color=color, ls=ls, lw=width, label=f"{c}, {h} hosts" if col == 0 else None)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.axhline(1.1, color="grey", lw=0.5)
            ax.set_title(f"{op} {dtype}, {'round-robin' if layout == 'rr' else 'block'}, {m.name}", fontsize=9)
            ax.set_xticks([8, KiB, 64 * KiB, MiB, 16 * MiB, GiB])
            ax.set_xticklabels(["8 B", "1 KiB", "64 KiB", "1 MiB", "16 MiB", "1 GiB"])
            if col == 0:
                ax.set_ylabel("time / MPI's own")
    axes[0][0].legend(fontsize=6, ncol=2)
    fig.suptitle("benchmarks/model.py: time over MPI's own, 8 ranks a host, 2 / 64 / 1024 hosts (thin to thick); "
                 "grey line 1.1x", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def check(files: list[str], min_bytes: int) -> None:
    """Predicted / measured per (placement, op, dtype, path, size): the measured rows (model_check.py
    measure) against BED, whose cores the bed's hosts share. Times only from rows measured on a quiet
    machine (``timed``: false for the byte counts taken while it was busy or oversubscribed)."""
    rows = [json.loads(line) for f in files for line in open(f) if line.startswith("{")]
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["hosts"], r["ranks"], r["layout"], r["op"], r["dtype"], r["path"], r["bytes"]),
                          []).append(r)
    print("| hosts x ranks | layout | op | dtype | path | size | time: model / measured (ms) | ratio | "
          "bytes a host sends: model / measured (/ the message) |")
    print("|---|---|---|---|---|---|---|---|---|")
    errs: dict = {}
    for (h, n, layout, op, dtype, path, S), rs in sorted(groups.items()):
        if path not in M.PATHS or S < min_bytes:
            continue
        p = n // h
        g = M.Group(n, p, "block" if layout == "block" else "rr")
        m = replace(M.BED, cores=M.BED.cores / h) if h > 1 else M.BED      # (the bed's hosts share 2 cores)
        if path == "tree":                   # (the prototype: float32 across hosts, even from one rank a host)
            tree = M.tree_allreduce if op == "AllReduce" else M.tree_reduce_scatter
            M._MESSAGE[0] = S
            c = tree(m, g, S, dtype == "bfloat16", raw16=False)
            M._MESSAGE[0] = 0.0
        else:
            c = M.predict(path, op, m, g, S, dtype)
        timed = [r["time"] for r in rs if r.get("timed", True)]
        tx = [r["tx"] for r in rs if "tx" in r]
        btxt = f"{c.link / S:.2f} / {statistics.median(tx) / S:.2f}" if tx else "-"
        if timed:
            t = statistics.median(timed)
            errs.setdefault((f"{h} x {p}", "MPI's own" if path == "mpi" else "mpicoll's paths", S >= 64 * KiB),
                            []).append(c.t / t)
            ttxt = f"{c.t * 1e3:.3g} / {t * 1e3:.3g} | {c.t / t:.2f}"
        else:
            ttxt = f"{c.t * 1e3:.3g} / - | -"
        print(f"| {h} x {p} | {layout} | {op} | {dtype} | {path} | {M._size(S)} | {ttxt} | {btxt} |")
    print("\n| hosts x ranks | paths | sizes | points | model / measured: median | range | within 25% |")
    print("|---|---|---|---|---|---|---|")
    for (where, paths, big), v in sorted(errs.items()):
        v = sorted(v)
        within = sum(1 for x in v if 1 / 1.25 <= x <= 1.25)
        print(f"| {where} | {paths} | {'from 64 KiB' if big else 'below 64 KiB'} | {len(v)} | "
              f"{statistics.median(v):.2f} | {v[0]:.2f}-{v[-1]:.2f} | {within} |")


def targets() -> None:
    """The issue's targets: on the bed (BED, 2 hosts x 2 ranks, 1 Gbit/s) and at 1024 hosts x 8 ranks."""
    bed = replace(M.BED, cores=1)
    for layout in ("block", "rr"):
        g = M.Group(4, 2, layout)
        for S in (MiB, 4 * MiB):
            ref = M.predict("mpi", "AllReduce", bed, g, S, "float32").t
            cols = {c: M.predict(c, "AllReduce", bed, g, S, "float32").t / ref for c in ("exact", "tree")}
            best = M.rank_order_best(bed, g, S, False).t / ref
            print(f"bed 2 x 2 {layout:5} float32 AllReduce {M._size(S):>6}: exact/MPI {cols['exact']:.2f}, "
                  f"tree/MPI {cols['tree']:.2f}, the best rank-order path/MPI {best:.2f} (target <= 1.2)")
    g = M.Group(4, 2)
    for S in (MiB, 4 * MiB):
        tiers = M.predict("fast", "AllReduce", bed, g, S, "bfloat16").t
        ex = M.predict("exact", "AllReduce", bed, g, S, "bfloat16").t
        tr = M.predict("tree", "AllReduce", bed, g, S, "bfloat16").t
        print(f"bed 2 x 2 block bfloat16 AllReduce {M._size(S):>6}: exact/tiers {ex / tiers:.2f}, "
              f"tree/tiers {tr / tiers:.2f} (target <= 1.3; the float32 partials' floor: 1.5x the bytes)")
    for m in (M.CLUSTER, M.FAST):
        g = M.Group(8192, 8)
        S = 16 * MiB
        ref = M.predict("mpi", "AllReduce", m, g, S, "float32").t
        print(f"{m.name}: 1024 x 8, 16 MiB float32 AllReduce: exact/MPI "
              f"{M.predict('exact', 'AllReduce', m, g, S, 'float32').t / ref:.2f}, tree/MPI "
              f"{M.predict('tree', 'AllReduce', m, g, S, 'float32').t / ref:.2f}, the best rank-order path/MPI "
              f"{M.rank_order_best(m, g, S, False).t / ref:.2f} (target <= 1.1)")


def measured_targets(files: list[str]) -> None:
    """The targets as measured (model_check.py measure on the bed, 2 hosts x 2 ranks): medians of the
    time ratios paired within a repetition; float32 over MPI's own, bfloat16 over the tiers
    (MPICOLL_EXACT=0)."""
    rows = [json.loads(line) for f in files for line in open(f) if line.startswith("{")]
    for layout in ("block", "round-robin"):
        for dtype, ref in (("float32", "mpi"), ("bfloat16", "fast")):
            for S in (MiB, 4 * MiB):
                got = {r["path"]: r["times"] for r in rows if r["op"] == "AllReduce" and r["dtype"] == dtype and
                       r["bytes"] == S and r["layout"] == layout and r["ranks"] == 4 and r["hosts"] == 2
                       and r.get("timed", True)}
                if ref not in got:
                    continue
                txt = [f"{k}/{ref} {statistics.median(a / b for a, b in zip(got[k], got[ref])):.2f}"
                       for k in ("exact", "tree") if k in got]
                print(f"measured, bed 2 x 2 {layout} {dtype} AllReduce {M._size(S)}: " + ", ".join(txt))


def slot() -> None:
    """Issue 45: a validated AllReduce of S <= slot bytes as one Allgather of (header + slot), against
    today's two exchanges (the header's Allgather, then the data call), on one host and across hosts
    (8 ranks a host), with today's header (160 + 16 n bytes) and with its fixed 160 bytes alone. Per slot
    size: the time of an 8-byte call and of a slot-sized call, fused / today; the best slot is the
    largest with neither above 1."""
    sizes = [256, 512, KiB, 2 * KiB, 4 * KiB, 8 * KiB]
    for m, label, shape, counts in ((M.CLUSTER, "one host", lambda n: M.Group(n, n), True),
                                    (M.CLUSTER, "one host, a 160-byte header", lambda n: M.Group(n, n), False),
                                    (M.CLUSTER, "1 Gbit/s, 8 a host", lambda n: M.Group(n, min(n, 8)), True),
                                    (M.FAST, "100 Gbit/s, 8 a host", lambda n: M.Group(n, min(n, 8)), True)):
        print(f"\n{label}: a validated call fused / today, for an 8 B call and a call of s bytes\n")
        print("| ranks | 8 B today (us) | " + " | ".join(f"s = {M._size(s)}" for s in sizes) + " | best s |")
        print("|---" * (len(sizes) + 3) + "|")
        for n in (2, 4, 8, 16, 32, 64):
            g = shape(n)
            sep8 = M.separate_call(m, g, 8, counts).t
            cells, best = [], None
            for s in sizes:
                r8 = M.slot_call(m, g, 8, s, counts).t / sep8
                rs = M.slot_call(m, g, s, s, counts).t / M.separate_call(m, g, s, counts).t
                cells.append(f"{r8:.2f}, {rs:.2f}")
                if max(r8, rs) <= 1.0:
                    best = s
            print(f"| {n} | {sep8 * 1e6:.0f} | " + " | ".join(cells) + f" | {M._size(best) if best else '-'} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--machine", default="1gbit", choices=list(MACHINES))
    ap.add_argument("--grid", action="store_true")
    ap.add_argument("--worst", action="store_true")
    ap.add_argument("--plot")
    ap.add_argument("--check", nargs="+")
    ap.add_argument("--min-bytes", type=int, default=0, help="--check: only sizes from this many bytes")
    ap.add_argument("--targets", action="store_true")
    ap.add_argument("--measured-targets", nargs="+", metavar="FILE", help="the targets from measured rows")
    ap.add_argument("--slot", action="store_true")
    a = ap.parse_args()
    m = MACHINES[a.machine]
    if a.grid:
        grid(m)
    elif a.worst:
        for mm in MACHINES.values():
            worst(mm)
            worst(mm, in_c=True)
    elif a.plot:
        plot(a.plot)
    elif a.check:
        check(a.check, a.min_bytes)
    elif a.targets:
        targets()
    elif a.measured_targets:
        measured_targets(a.measured_targets)
    elif a.slot:
        slot()
    else:
        compact(m, (("AllReduce", "float32"), ("AllReduce", "bfloat16"), ("ReduceScatter", "float32"))
                if a.machine == "1gbit" else (("AllReduce", "float32"), ("ReduceScatter", "float32")))


if __name__ == "__main__":
    main()
