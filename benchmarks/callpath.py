"""How many Python functions a call passes through before it reaches MPI, per entry point and path.

    mpirun -np 2 python benchmarks/callpath.py

For each entry point and path (a validated ``execute``: warm, cold, allocating its output, of 1 MiB,
with a new view of its output; an unvalidated one; one on a comm domain, whose first MPI call is on
the domain's communicator; ``plan.run()``; the functional ``all_reduce``; and, where torch is
installed, ``dist.all_reduce`` on the mpicoll backend) it traces the 4th identical call of a float32
AllReduce (8 bytes unless said) with ``sys.setprofile`` and counts, up to its first MPI call, every
Python function entered (mpicoll's, numpy's Python parts, torch's) and every C function called that
Python can see (builtins, numpy's C functions; mpi4py's own methods are not visible to a profiler),
and the deepest nesting reached. The first MPI call is found by a proxy in front of the ``mpi4py``
objects of mpicoll's communicators (the world's, the domain's, the torch group's), installed once
each has made its windows and before the traced operations bind: its method wrapper is the point
where counting stops (not counted itself). Prints one table on rank 0.
"""
from __future__ import annotations

import importlib
import sys

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll import _domains
from mpicoll import functional as F

W = MPI.COMM_WORLD
#: set when a call reaches MPI (the proxy's wrapper runs)
_REACHED = [False]


class _Proxy:
    """An mpi4py communicator whose methods mark the moment a call reaches MPI, then call it."""

    def __init__(self, comm: MPI.Comm) -> None:
        self._comm = comm

    def __getattr__(self, name: str):
        method = getattr(self._comm, name)
        if not callable(method):
            return method

        def reached(*args, **kw):
            _REACHED[0] = True
            return method(*args, **kw)
        return reached


#: the proxy's code: its method lookup (a call made now), its wrapper (a plan's call, looked up at binding)
_MARKS = (_Proxy.__getattr__.__code__, _Proxy(MPI.COMM_SELF).Barrier.__code__)


def trace(fn) -> tuple[int, int, int]:
    """(Python functions entered, C functions called, deepest nesting) of ``fn()`` before MPI."""
    python = c = depth = deepest = 0
    _REACHED[0] = False

    def prof(frame, event, arg):
        nonlocal python, c, depth, deepest
        if _REACHED[0]:
            return
        if event == "call" and frame.f_code in _MARKS:       # (the proxy: the call is reaching MPI)
            _REACHED[0] = True
            return
        if event == "call":
            python += 1
            depth += 1
            deepest = max(deepest, depth)
        elif event == "return":
            depth -= 1
        elif event == "c_call":
            c += 1

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return python - 1, c, deepest - 1        # (fn itself is the caller's lambda, not the path's)


def _proxied(lib) -> None:
    """Put the proxy in front of a library communicator's mpi4py object (once its windows are made:
    MPI wants the real communicator for them)."""
    if not isinstance(lib.mpi, _Proxy):
        lib.mpi = _Proxy(lib.mpi)


def main() -> None:
    small, out = np.ones(2, np.float32), np.empty(2, np.float32)
    big, big_out = np.ones(1 << 18, np.float32), np.empty(1 << 18, np.float32)
    mpicoll.AllReduceOperation().execute(big)      # (the node window made first: MPI wants the real communicator)
    n, parity = W.Get_size(), W.Get_rank() % 2
    on_domain = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm_domain=f"parity{parity}",
                                                                  rank_size=(n - parity + 1) // 2), validate=False)
    on_domain.execute(big)
    _proxied(_domains.world())                     # (before any traced operation binds or records a call)
    _proxied(on_domain._lib)
    on = mpicoll.AllReduceOperation(validate=True)
    off = mpicoll.AllReduceOperation(validate=False)
    plan = on.prepare(small, out)
    t = np.ones(2, np.float32)
    rows = {"execute, validated, warm (rides its agreement)": lambda: on.execute(small, out=out),
            "execute, validated, out=None (a new output each call)": lambda: on.execute(small),
            "execute, validated, a new view of out each call": lambda: on.execute(small, out=out[...]),
            "execute, validated, 1 MiB (agreement, then data)": lambda: on.execute(big, out=big_out),
            "execute, validation off, warm": lambda: off.execute(small, out=out),
            "execute, validation off, out=None": lambda: off.execute(small),
            "execute on a comm domain, validation off, warm": lambda: on_domain.execute(small, out=out),
            "plan.run()": lambda: plan.run(),
            "functional.all_reduce, warm": lambda: F.all_reduce(t)}
    try:
        import torch
        import torch.distributed as dist
        importlib.import_module("mpicoll.torch")          # (registers the backend)
        dist.init_process_group("mpicoll", init_method="mpi://")
        tt = torch.ones(2)
        dist.all_reduce(torch.ones(1 << 18))               # (the group's windows made)
        group = dist.distributed_c10d._get_default_group()
        _proxied(next(iter(group._ops.values()))._lib)     # (the group's own operations: its communicator)
        rows["torch dist.all_reduce, warm"] = lambda: dist.all_reduce(tt)
        rows["torch group.allreduce (the backend's own), warm"] = lambda: group.allreduce([tt]).wait()
    except ImportError:
        pass
    found = {"execute, validated, cold (the first call of an operation)":
             trace(lambda: mpicoll.AllReduceOperation(validate=True).execute(small, out=out))}
    for name, fn in rows.items():
        for _ in range(3):                  # warm: bound, compiled
            fn()
        found[name] = trace(fn)
    if W.Get_rank() == 0:
        print(f"# Python functions (and C functions) a float32 AllReduce passes through before its first MPI call, "
              f"{W.Get_size()} ranks")
        print(f"{'entry point, path':<60}{'python':>8}{'C':>6}{'depth':>7}")
        for name, (python, c, deepest) in found.items():
            print(f"{name:<60}{python:>8}{c:>6}{deepest:>7}")


if __name__ == "__main__":
    main()
