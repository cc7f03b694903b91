"""Markdown summary of ``python -m mpicoll.run bench --compare mpi4py,gloo --json FILE`` results.

    python benchmarks/summarize.py FILE.json [FILE.json ...]

Per operator and dtype: busbw at the largest size, and over the sizes >= 64 KiB the median and worst
ratio mpicoll/raw mpi4py (time; < 1 = mpicoll faster), and over all sizes the smallest gloo/mpicoll
time ratio (> 1 = mpicoll faster) with the size where it happens.
"""
from __future__ import annotations

import json
import statistics
import sys


def _mine(r):
    return r["time_us"] if r["time_us"] is not None else r["ip_time_us"]


def summarize(path: str) -> str:
    doc = json.load(open(path, encoding="utf-8"))
    rows = doc["rows"]
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["op"], r["type"], r["redop"]), []).append(r)
    out = [f"**{doc['ranks']} ranks** (`{doc['command']}`)", "",
           "| op | dtype | busbw at max size (GB/s) | mpicoll/mpi4py >= 64 KiB: median, worst | "
           "gloo/mpicoll: smallest (at size) | #wrong |", "|---|---|---|---|---|---|"]
    for (op, dt, _), rs in groups.items():
        big = max(rs, key=lambda r: r["size"])
        bw = big["busbw"] if big["busbw"] is not None else big["ip_busbw"]
        raw = [_mine(r) / r["compare"]["mpi4py"] for r in rs if r["size"] >= 65536 and r["compare"].get("mpi4py")]
        gl = [(r["compare"]["gloo"] / _mine(r), r["size"]) for r in rs if r["compare"].get("gloo")]
        wrong = sum((r["wrong"] or 0) + (r["ip_wrong"] or 0) for r in rs)
        rtxt = f"{statistics.median(raw):.2f}, {max(raw):.2f}" if raw else "n/a (no raw MPI reduction)"
        g = min(gl) if gl else None
        gtxt = f"{g[0]:.2f} ({_size(g[1])})" if g else "n/a"
        out.append(f"| {op} | {dt} | {bw:.2f} | {rtxt} | {gtxt} | {wrong} |")
    return "\n".join(out)


def _size(b: int) -> str:
    for unit, k in (("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if b >= k:
            return f"{b // k} {unit}"
    return f"{b} B"


if __name__ == "__main__":
    print("\n\n".join(summarize(p) for p in sys.argv[1:]))
