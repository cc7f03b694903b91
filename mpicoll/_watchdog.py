"""The collective watchdog: ``MPICOLL_TIMEOUT=SECONDS`` (or ``Operation(..., timeout=SECONDS)``).

With a timeout, every MPI call mpicoll makes is started non-blocking and polled (:func:`wait`):
the data calls of an operation, blocking or started by a plan, its header agreement, the
error exchange and the set-up of a library communicator. MPICH progresses a non-blocking
collective only inside MPI calls, so for the first ``SPIN_SECONDS`` (at most a tenth of the
timeout) the rank polls continuously, yielding the CPU between polls (``sched_yield``:
oversubscribed ranks still run); after that it sleeps between polls, doubling up to
``MAX_PAUSE``, so a rank waiting for a peer that never comes does not burn a core.

On a timeout it raises :class:`~mpicoll.CollectiveTimeout` naming the operator, its call number on
the communicator as the user counts calls ("the 2nd AllReduce on domain 'ep'"), the step it was
waiting in and, where the communicator keeps arrival marks (:mod:`mpicoll._comm`), the ranks that
never arrived. By default (``MPICOLL_TIMEOUT_ACTION=abort``, as NCCL's watchdog does) it then prints
the error and aborts the whole job, removing the MPICH shared-memory segments this process maps.
``MPICOLL_TIMEOUT_ACTION=raise`` only raises: the communicator then has a collective in flight and
must not be used again.
"""
from __future__ import annotations

import glob
import os
import sys
import time
from typing import Callable

from mpi4py import MPI

from ._errors import CollectiveArgumentError

SPIN_SECONDS = 1.0  # poll continuously this long (capped at timeout / 10): full progress, full speed
MAX_PAUSE = 5e-3    # longest sleep between polls afterwards, seconds
_ACTIONS = ("abort", "raise")


def timeout_default() -> float | None:
    """``MPICOLL_TIMEOUT`` in seconds (unset, empty or 0 = no watchdog)."""
    raw = os.environ.get("MPICOLL_TIMEOUT", "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise CollectiveArgumentError(f"environment MPICOLL_TIMEOUT={raw!r}: must be a number of seconds",
                                      param="MPICOLL_TIMEOUT") from None
    return value if value > 0 else None


def action_default() -> str:
    """``MPICOLL_TIMEOUT_ACTION``: ``abort`` (default) or ``raise``."""
    action = os.environ.get("MPICOLL_TIMEOUT_ACTION", "abort").strip().lower()
    if action not in _ACTIONS:
        raise CollectiveArgumentError(f"environment MPICOLL_TIMEOUT_ACTION={action!r}: must be one of {_ACTIONS}",
                                      param="MPICOLL_TIMEOUT_ACTION")
    return action


def wait(requests: list[MPI.Request], timeout: float, expired: Callable[[], BaseException]) -> None:
    """Complete ``requests`` within ``timeout`` seconds, else raise ``expired()`` (or abort the job)."""
    if done(requests):
        return
    now = time.monotonic()
    deadline, spin_until = now + timeout, now + min(SPIN_SECONDS, timeout / 10)
    pause = 1e-4
    while not done(requests):
        now = time.monotonic()
        if now < spin_until:
            os.sched_yield()      # a pure yield (sleep(0) would pay the kernel's ~50 us timer slack)
            continue
        if now > deadline:
            error = expired()
            if action_default() == "abort":
                abort(f"mpicoll watchdog: {error}; aborting the job (MPICOLL_TIMEOUT_ACTION=raise only raises)")
            raise error
        time.sleep(pause)
        pause = min(pause * 2, MAX_PAUSE)


def done(requests: list[MPI.Request]) -> bool:
    """Whether every request is complete (one ``Test`` each: MPICH 5.0.2's ``Testall`` reports an
    error for a persistent collective that completed at once, on a communicator of one rank)."""
    return all([r.Test() for r in requests])


def own_shm_segments() -> list[str]:
    """The MPICH shared-memory files this process maps (``/dev/shm/mpich_shm_*``)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            paths = {line.split(None, 5)[5].strip() for line in fh if len(line.split(None, 5)) == 6}
    except OSError:
        return []
    return sorted(p.removesuffix(" (deleted)") for p in paths if p.startswith("/dev/shm/mpich_shm_"))


def stale_segments(candidates: set[str] | None = None) -> list[str]:
    """MPICH shared-memory files owned by this user that no live process maps (left by an aborted or
    killed job), optionally only among ``candidates`` (e.g. those that appeared during one run)."""
    found = {p for p in glob.glob("/dev/shm/mpich_shm_*") if os.path.isfile(p) and os.stat(p).st_uid == os.getuid()}
    if candidates is not None:
        found &= set(candidates)
    mapped: set[str] = set()
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            with open(maps, encoding="utf-8", errors="replace") as fh:
                mapped.update(line.split(None, 5)[5].strip().removesuffix(" (deleted)") for line in fh
                              if "/dev/shm/mpich_shm_" in line)
        except OSError:
            continue
    return sorted(found - mapped)


def abort(message: str, code: int = 1) -> None:
    """Print ``message``, unlink this job's shared-memory files (only those this process maps: the
    peers keep their mappings), and abort every rank."""
    sys.stderr.write(message.rstrip() + "\n")
    sys.stderr.flush()
    # Give mpirun's output forwarder a moment: when two ranks time out together, the first Abort
    # kills the job and a message still in the other's pipe was lost (seen once in CI).
    time.sleep(0.2)
    for path in own_shm_segments():
        try:
            os.unlink(path)
        except OSError:
            pass
    MPI.COMM_WORLD.Abort(code)
    os._exit(code)  # Abort does not return; if an MPI ever let it, do not run on
