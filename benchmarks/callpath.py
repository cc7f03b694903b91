"""How many Python functions a call passes through on its way to MPI, and how deep, per entry point.

    mpirun -np 2 python benchmarks/callpath.py

For each entry point (a validated ``execute``, an unvalidated one with ``out=`` given, ``plan.run()``,
the functional ``all_reduce``, and, where torch is installed, ``dist.all_reduce`` on the mpicoll
backend) it traces one warm call of an 8-byte float32 AllReduce with ``sys.setprofile``: every Python
function entered (mpicoll's, numpy's Python parts, torch's), counted once per call, up to and
including the one that calls MPI, and the deepest nesting reached. Prints one table on rank 0.
"""
from __future__ import annotations

import importlib
import sys

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll import functional as F

W = MPI.COMM_WORLD


def trace(fn) -> tuple[int, int]:
    """(Python functions called, deepest nesting) of one ``fn()``."""
    calls, depth, deepest = 0, 0, 0

    def prof(frame, event, arg):
        nonlocal calls, depth, deepest
        if event == "call":
            calls += 1
            depth += 1
            deepest = max(deepest, depth)
        elif event == "return":
            depth -= 1

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls - 1, deepest - 1          # (fn itself is the caller's, not the path's)


def main() -> None:
    x, out = np.ones(2, np.float32), np.empty(2, np.float32)
    on = mpicoll.AllReduceOperation(validate=True)
    off = mpicoll.AllReduceOperation(validate=False)
    plan = on.prepare(x, out)
    t = np.ones(2, np.float32)
    rows = {"execute, validated": lambda: on.execute(x, out=out),
            "execute, validation off, out= given": lambda: off.execute(x, out=out),
            "plan.run()": plan.run,
            "functional.all_reduce": lambda: F.all_reduce(t)}
    try:
        import torch
        import torch.distributed as dist
        importlib.import_module("mpicoll.torch")          # (registers the backend)
        dist.init_process_group("mpicoll", init_method="mpi://")
        tt = torch.ones(2)
        rows["torch dist.all_reduce"] = lambda: dist.all_reduce(tt)
    except ImportError:
        pass
    found = {}
    for name, fn in rows.items():
        for _ in range(3):                  # warm: bound, remembered, recorded
            fn()
        found[name] = trace(fn)
    if W.Get_rank() == 0:
        print(f"# Python functions from the entry point to the MPI call (one warm 8-byte AllReduce, {W.Get_size()} "
              "ranks)")
        print(f"{'entry point':<40}{'functions':>10}{'depth':>7}")
        for name, (calls, deepest) in found.items():
            print(f"{name:<40}{calls:>10}{deepest:>7}")


if __name__ == "__main__":
    main()
