"""Count the MPI calls a process makes, by name, with a PMPI shim (benchmarks/mpicalls.c).

    from mpicalls import counting, counts, reset
    if counting():          # (the shim is preloaded: LD_PRELOAD, see build())
        reset(); ...; print(counts())

``build()`` compiles the shim with the MPI's own ``mpicc`` (once, into ``~/.cache/mpicoll``) and
returns its path; a job started with ``LD_PRELOAD=<path>`` counts every MPI call made through the
``MPI_`` names (mpi4py's buffer calls and mpicoll's alike). Counts, not times: exact on a noisy machine.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("mpicalls.c")


def build() -> Path:
    """The shim's shared library, built if needed (RuntimeError: no mpicc)."""
    mpicc = shutil.which("mpicc")
    if mpicc is None:
        raise RuntimeError("mpicalls: no mpicc on PATH (the mpich wheel brings one)")
    text = SOURCE.read_bytes()
    out = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mpicoll" / \
        f"libmpicalls-{hashlib.sha1(text + mpicc.encode()).hexdigest()[:12]}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run([mpicc, "-shared", "-fPIC", "-O2", "-o", str(tmp), str(SOURCE)], check=True)
        os.replace(tmp, out)
    return out


def _lib():
    lib = ctypes.CDLL(None)
    try:
        return lib.mpicalls_read, lib.mpicalls_reset
    except AttributeError:
        return None


def counting() -> bool:
    """Whether this process counts its MPI calls (the shim preloaded)."""
    return _lib() is not None


def reset() -> None:
    _lib()[1]()


def counts() -> dict[str, int]:
    """The MPI calls made since the last reset, by name."""
    buf = ctypes.create_string_buffer(4096)
    n = _lib()[0](buf, len(buf))
    return {name: int(k) for name, k in (line.split() for line in buf.raw[:n].decode().splitlines())}


if __name__ == "__main__":
    print(build())          # (the path to preload: LD_PRELOAD=$(python benchmarks/mpicalls.py))
