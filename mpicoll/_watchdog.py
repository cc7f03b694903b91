"""The collective watchdog: ``MPICOLL_TIMEOUT=SECONDS`` (or ``Operation(..., timeout=SECONDS)``).

With a timeout, an operation's communicator is wrapped in a :class:`TimedComm`: every collective
it makes is started non-blocking and polled. MPICH progresses a non-blocking collective only inside
MPI calls, so for the first ``SPIN_SECONDS`` (at most a tenth of the timeout) the rank polls
continuously, yielding the CPU between polls (``sched_yield``: oversubscribed ranks still run); after
that it sleeps between polls, doubling up to ``MAX_PAUSE``, so a rank waiting for a peer that
never comes does not burn a core. Before each call the rank writes ``(communicator, call number)``
into its own two-word RMA window with plain stores (no MPI call on the hot path); on a timeout it
reads every peer's mark (RMA gets in a standing ``Lock_all`` epoch) to name the ranks that never
arrived, and where they are instead. (Over a network without RDMA a get may need the peer's MPI
progress; on shared memory and RDMA networks it does not.)

On a timeout it raises :class:`~mpicoll.CollectiveTimeout` naming the operator, the communicator,
the call number and the missing ranks; by default (``MPICOLL_TIMEOUT_ACTION=abort``, as NCCL's
watchdog does) it then prints the error and aborts the whole job, removing the MPICH shared-memory
segments this process maps. ``MPICOLL_TIMEOUT_ACTION=raise`` only raises: the communicator then
has a collective in flight and must not be used again.
"""
from __future__ import annotations

import hashlib
import os
import sys
import time
from typing import Any

import numpy as np
from mpi4py import MPI

from ._errors import CollectiveArgumentError, CollectiveTimeout

SPIN_SECONDS = 1.0  # poll continuously this long (capped at timeout / 10): full progress, full speed
MAX_PAUSE = 5e-3    # longest sleep between polls afterwards, seconds
_ACTIONS = ("abort", "raise")

#: per communicator (by handle): the number of collectives this rank started on it through the watchdog
_CALLS: dict[int, int] = {}


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
    action = os.environ.get("MPICOLL_TIMEOUT_ACTION", "abort").strip().lower()
    if action not in _ACTIONS:
        raise CollectiveArgumentError(f"environment MPICOLL_TIMEOUT_ACTION={action!r}: must be one of {_ACTIONS}",
                                      param="MPICOLL_TIMEOUT_ACTION")
    return action


def comm_key(comm: MPI.Comm, world_ranks: list[int] | None = None) -> int:
    """A number naming a library communicator alike on every rank: from its name and, when given,
    its members' world ranks (two user communicators both named ``mpicoll.user.comm`` but with
    different members are then told apart)."""
    text = comm.Get_name() + ("" if world_ranks is None else ":" + ",".join(map(str, world_ranks)))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=7).digest(), "little")


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
    import glob
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


def arrivals_window(rt) -> MPI.Win:
    """The arrival marks: 2 int64 on every rank, in a ``Lock_all`` epoch that stays open.
    Created with the runtime, in :func:`init`."""
    return rt.arrivals_win


class TimedComm:
    """A communicator whose collectives time out. Other attributes pass through to ``comm``."""

    def __init__(self, comm: MPI.Comm, timeout: float, action: str, op: str) -> None:
        self.comm = comm
        self.timeout = timeout
        self.action = action
        self.op = op
        self.handle = MPI._handleof(comm)
        from ._domains import runtime
        self.rt = runtime()
        group = comm.Get_group()
        self.world_ranks = MPI.Group.Translate_ranks(group, list(range(comm.Get_size())), self.rt.group)
        group.Free()
        self.key = comm_key(comm, self.world_ranks)
        self._mark = np.frombuffer(arrivals_window(self.rt).tomemory(), dtype=np.int64)   # this rank's mark

    def __getattr__(self, name: str) -> Any:
        return getattr(self.comm, name)

    def __eq__(self, other: object) -> bool:
        return self.comm == (other.comm if isinstance(other, TimedComm) else other)

    __hash__ = None  # type: ignore[assignment]

    # -- the collectives mpicoll makes ---------------------------------------------------------------
    def Allreduce(self, s, r, op=MPI.SUM):  # noqa: N802 - mpi4py's names
        self._run("Allreduce", self.comm.Iallreduce, s, r, op)

    def Allgather(self, s, r):  # noqa: N802
        self._run("Allgather", self.comm.Iallgather, s, r)

    def Allgatherv(self, s, r):  # noqa: N802
        self._run("Allgatherv", self.comm.Iallgatherv, s, r)

    def Alltoall(self, s, r):  # noqa: N802
        self._run("Alltoall", self.comm.Ialltoall, s, r)

    def Alltoallv(self, s, r):  # noqa: N802
        self._run("Alltoallv", self.comm.Ialltoallv, s, r)

    def Bcast(self, buf, root=0):  # noqa: N802
        self._run("Bcast", self.comm.Ibcast, buf, root)

    def Reduce_scatter_block(self, s, r, op=MPI.SUM):  # noqa: N802
        self._run("Reduce_scatter_block", self.comm.Ireduce_scatter_block, s, r, op)

    def Reduce_scatter(self, s, r, counts=None, op=MPI.SUM):  # noqa: N802
        self._run("Reduce_scatter", self.comm.Ireduce_scatter, s, r, counts, op)

    def Barrier(self):  # noqa: N802
        self._run("Barrier", self.comm.Ibarrier)

    # -- machinery -----------------------------------------------------------------------------------
    def _run(self, what: str, start, *args) -> None:
        call = _CALLS[self.handle] = _CALLS.get(self.handle, 0) + 1
        self._arrive(call)
        req = start(*args)
        if req.Test():
            return
        now = time.monotonic()
        deadline, spin_until = now + self.timeout, now + min(SPIN_SECONDS, self.timeout / 10)
        pause = 1e-4
        while not req.Test():
            now = time.monotonic()
            if now < spin_until:
                os.sched_yield()      # a pure yield (sleep(0) would pay the kernel's ~50 us timer slack)
                continue
            if now > deadline:
                self._expired(what, call)
                return
            time.sleep(pause)
            pause = min(pause * 2, MAX_PAUSE)

    def _arrive(self, call: int) -> None:
        self._mark[0], self._mark[1] = self.key, call

    def _expired(self, what: str, call: int) -> None:
        table = np.zeros((self.rt.world.Get_size(), 2), dtype=np.int64)
        win = arrivals_window(self.rt)
        for world in self.world_ranks:
            win.Get([table[world], MPI.INT64_T], world)
            win.Flush(world)
        missing, elsewhere = [], []
        for local, world in enumerate(self.world_ranks):
            key, seen = (int(v) for v in table[world])
            if key == self.key and seen >= call:
                continue
            if key == self.key or key == 0:
                missing.append(local)
            else:
                elsewhere.append(local)
        me = self.comm.Get_rank()
        # A mark holds only a rank's latest collective: one on another communicator may have come
        # before this one (the rank never arrived) or after it (it arrived and moved on).
        parts = [f"ranks that did not arrive: {missing}"] if missing else []
        if elsewhere:
            parts.append(f"ranks {elsewhere} last entered a collective on another communicator")
        detail = "; ".join(parts) or "every rank arrived (one may have died)"
        error = CollectiveTimeout(
            f"{self.op}: timed out after {self.timeout:g} s on rank {me} of {self.comm.Get_name()} "
            f"(collective call #{call} on it, MPI {what}); {detail}", op=self.op, param="timeout",
            rank=missing[0] if missing else None)
        if self.action == "abort":
            abort(f"mpicoll watchdog: {error}; aborting the job (MPICOLL_TIMEOUT_ACTION=raise only raises)")
        raise error
