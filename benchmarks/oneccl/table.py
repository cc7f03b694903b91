"""The oneCCL table of docs/benchmark.md from what benchmarks/oneccl/run.sh printed.

    python benchmarks/oneccl/table.py out.txt

Per operator and size, the medians over the rounds of: mpicoll's ``bench`` (out of place;
Broadcast, which has no out-of-place form, in place) with
validation on (the default) and off, raw mpi4py (``--compare mpi4py``) and oneCCL; and the ratios
mpicoll / oneCCL and mpicoll / raw mpi4py (< 1: mpicoll faster).
"""
from __future__ import annotations

import re
import statistics
import sys
from collections import defaultdict


def read(path: str) -> dict:
    """(implementation, op, bytes) -> the times of every round."""
    times: dict = defaultdict(list)
    who = op = None
    for line in open(path, encoding="utf-8"):
        if line.startswith("# oneCCL"):
            who = "oneccl"
        elif m := re.match(r"# mpicoll \(validation (\d)\)", line):
            who = f"v{m.group(1)}"
        elif m := re.match(r"# (\w+): \d+ rank", line):
            op = m.group(1)
        elif who == "oneccl" and (m := re.match(r"(\w+)\s+(\d+)\s+([\d.]+)$", line.strip())):
            times["oneccl", m.group(1), int(m.group(2))].append(float(m.group(3)))
        elif who and who != "oneccl" and op and re.match(r"\s+\d", line):
            f = line.split()
            mine = f[5] if f[5] != "n/a" else f[9]                  # (out of place; Broadcast: in place only)
            times[who, op, int(f[0])].append(float(mine))
            if f[-2] != "n/a":
                times[f"raw{who}", op, int(f[0])].append(float(f[-2]))   # (mpi4py, the same run)
    return times


def main() -> None:
    times = read(sys.argv[1])
    med = {k: statistics.median(v) for k, v in times.items()}
    ops = list(dict.fromkeys(k[1] for k in med if k[0] == "oneccl"))
    sizes = sorted({k[2] for k in med if k[0] == "oneccl"})
    print("| op | bytes | mpicoll (validated) us | mpicoll (off) us | raw mpi4py us | oneCCL us | validated / oneCCL "
          "| off / oneCCL | validated / raw | off / raw |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for op in ops:
        for b in sizes:
            on, off, ccl = med.get(("v1", op, b)), med.get(("v0", op, b)), med.get(("oneccl", op, b))
            raw = statistics.median(times.get(("rawv1", op, b), []) + times.get(("rawv0", op, b), []) or [float("nan")])
            if None in (on, off, ccl):
                continue
            print(f"| {op} | {b} | {on:.2f} | {off:.2f} | {raw:.2f} | {ccl:.2f} | {on / ccl:.2f} | {off / ccl:.2f} "
                  f"| {on / raw:.2f} | {off / raw:.2f} |")


if __name__ == "__main__":
    main()
