"""The collective watchdog: ``MPICOLL_TIMEOUT=SECONDS`` (or ``Operation(..., timeout=SECONDS)``).

With a timeout, every collective mpicoll makes on its communicators is started non-blocking and
polled (:func:`wait`): the data calls of an operation, blocking or started by a plan, its
agreement, the error exchange, the exchanges that set a library communicator up, and the
messages of the functional API. The set-up steps MPI offers only blocking (``Comm.Split_type``,
``Win.Allocate_shared``, ``Comm.Create_group``) are not; a watched ``Barrier``
(``LibComm.meet``) or a timed rendezvous (a comm domain's) before each makes sure every member is
there first. MPICH progresses a non-blocking
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

MPI may never return from a call whose peer is unreachable (a host or link down: the TCP netmod
retries inside ``MPI_Test``), and then the polling loop never sees its deadline. A backstop thread
covers that: every timed wait arms it; if the wait is still not over ``BACKSTOP`` seconds after its
deadline (or the reading of the arrival marks hangs the same way), the thread prints the timeout
text built without MPI (the operator, its call, the ranks it waited for) and ends the process with
status 1, after giving ``MPI_Abort`` a moment to end the job.

How a rank waits for a point-to-point message (``MPICOLL_WAIT``, :func:`sleeps`; the messages of
:mod:`mpicoll._messages`), with or without a timeout: MPI's own wait polls without pause, which
costs nothing while each rank has a core of its own; where a node runs more ranks than it has cores
(``auto``: :func:`crowded`, decided for each library communicator when it is made), a rank waiting
for its neighbour's message (a pipeline stage) then spins on the core that neighbour computes it
on. Such a rank polls between sleeps instead (:func:`poll`: from ``FIRST_PAUSE``, doubling up to
``POLL_PAUSE``; no spinning phase in a timed wait). Collectives keep MPI's own wait: every member
is in the call, and a member that sleeps delays them all (measured at 4 ranks on 2 cores: DDP's
step took 1.6-1.9x as long, FSDP2's 1.8x).
"""
from __future__ import annotations

import glob
import math
import os
import sys
import threading
import time
from datetime import timedelta
from functools import partial
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from . import _env, _trace
from ._errors import CollectiveArgumentError, CollectiveTimeout

SPIN_SECONDS = 1.0  # poll continuously this long (capped at timeout / 10): full progress, full speed
MAX_PAUSE = 5e-3    # longest sleep between polls afterwards, seconds
#: a rank that sleeps between polls (:func:`sleeps`): its first pause and its longest, seconds (the
#: kernel's timer slack adds ~50 us to each). Measured (torch pipelining, 1F1B, 4 ranks on 2 cores, step
#: time): MPI's own wait 129-137 ms, yielding between polls 150-189 ms, sleeping from 20 us 82-84 ms
#: (gloo's 67 ms)
FIRST_PAUSE, POLL_PAUSE = 2e-5, 1e-3
BACKSTOP = 3.0      # seconds past a wait's deadline before the backstop thread ends the process


def crowded(sets: list[set[int]]) -> bool:
    """Whether a node runs more ranks than it has cores: ``sets``, the CPU sets of a communicator's
    members on this node (``_cpus.node_affinities``: taskset, cpusets and binding count), their
    union the cores; the ranks, the larger of their count and the launcher's count of the job's
    ranks on the node (MPICH's ``MPI_LOCALNRANKS``, Open MPI's ``OMPI_COMM_WORLD_LOCAL_SIZE``: the
    job's other ranks there compete for the cores too)."""
    told = [os.environ.get(name, "") for name in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE")]
    ranks = max([len(sets), *(int(v) for v in told if v.isdigit())])
    return ranks > len(set().union(*sets))


def sleeps(crowded: bool) -> bool:
    """Whether a rank waits for its messages by polling between sleeps (see the module docstring):
    ``MPICOLL_WAIT=sleep``, or ``auto`` (the default) where its communicator is ``crowded``
    (``LibComm.crowded``)."""
    how = _env.value("MPICOLL_WAIT")
    return how == "sleep" or (how == "auto" and crowded)


def poll(test: Callable[[], bool]) -> None:
    """Call ``test()`` (a look at requests in flight) until it is true, sleeping between calls from
    ``FIRST_PAUSE``, doubling up to ``POLL_PAUSE``: a rank that :func:`sleeps` waits so."""
    pause = FIRST_PAUSE
    while not test():
        time.sleep(pause)
        pause = min(2 * pause, POLL_PAUSE)


def timeout_default() -> float | None:
    """``MPICOLL_TIMEOUT`` in seconds (unset, empty or 0 = no watchdog)."""
    return _env.value("MPICOLL_TIMEOUT")


def timeout_seconds(timeout: Any, op: str = "mpicoll", rank: int = -1) -> float | None:
    """A ``timeout=`` argument as the watchdog takes it (the one place it is normalised): None =
    ``MPICOLL_TIMEOUT``; 0 or less = no watchdog; else seconds (a number, or a ``timedelta``).

    Raises:
        CollectiveArgumentError: anything else (a string, NaN, infinity), naming ``op`` and ``rank``.
    """
    if timeout is None:
        return timeout_default()
    return _seconds(timeout, f"{op}: timeout={timeout!r}", op, rank, "or None (MPICOLL_TIMEOUT's)")


def wait_seconds(timeout: Any, op: str, rank: int) -> float | None:
    """The ``timeout`` of a ``wait(timeout)`` (a functional or torch ``Work``, a message): what an
    Operation's ``timeout=`` takes (a number of seconds or a ``timedelta``; 0 or less: none), None:
    no limit of its own (the call's watchdog, if any, still runs).

    Raises:
        CollectiveArgumentError: anything else (a string, NaN, infinity), naming ``op`` and ``rank``,
            whether the call is still in flight or not.
    """
    if timeout is None:
        return None
    return _seconds(timeout, f"{op}: wait(timeout={timeout!r})", op, rank, "or None (no limit)")


def _seconds(timeout: Any, said: str, op: str, rank: int, none: str) -> float | None:
    value = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or \
            not math.isfinite(value):
        raise CollectiveArgumentError(f"{said} on rank {rank}: must be a finite number of seconds (0 or less: none), "
                                      f"a timedelta, {none}", op=op, param="timeout", rank=rank)
    return float(value) if value > 0 else None



def aborts(own: bool) -> bool:
    """Whether a timeout ends the job (the one place raise-vs-abort is decided): by default
    (``MPICOLL_TIMEOUT_ACTION=abort``), unless the limit that ran out is the waiter's ``own``: a
    communicator's own timeout (a torch group's ``timeout=``), a caller's ``wait(timeout)``, a
    start-up step's limit. Such a timeout only raises."""
    return not own and _env.value("MPICOLL_TIMEOUT_ACTION") == "abort"


def expire(error: BaseException, own: bool) -> BaseException:
    """The error of a timeout, to raise (or to end a message with), once the flight recorder is
    written (the error says where: :func:`mpicoll._trace.dumped_note`) and the job aborted where
    :func:`aborts` says so."""
    if error.args and isinstance(error.args[0], str):
        error.args = (error.args[0] + _trace.dumped_note("timeout"), *error.args[1:])
    if aborts(own):
        abort(f"mpicoll watchdog: {error}; aborting the job (MPICOLL_TIMEOUT_ACTION=raise only raises)")
    return error


def wait(requests: list, timeout: float | None, expired: Callable[..., Any], lost: Callable[..., Any] | None = None,
         own: bool = False, polite: bool = False, about: tuple = ()) -> None:
    """THE watched wait: complete ``requests`` (MPI requests, or objects with their ``Test`` and
    ``Wait``). Untimed (``timeout`` None): MPI's own wait, or, ``polite``, polls between sleeps
    (:func:`poll`: a rank that :func:`sleeps`). Timed: polled (see the module docstring) until they
    complete, else ``expired(*about)`` (an error, or the text of one) is raised, or the job aborted
    (:func:`expire`; ``own``: the limit is the waiter's own, which only raises). ``lost(*about)``
    (default: ``expired``'s text): what the backstop prints if MPI never returns."""
    if timeout is None:
        if polite:
            poll(partial(done, requests))
        elif len(requests) == 1:
            requests[0].Wait()
        else:
            MPI.Request.Waitall(requests)
        return
    if done(requests):
        return
    now = time.monotonic()
    deadline, spin_until = now + timeout, now + (0.0 if polite else min(SPIN_SECONDS, timeout / 10))
    pause, longest = (FIRST_PAUSE, POLL_PAUSE) if polite else (1e-4, MAX_PAUSE)
    ticket = _BACKSTOP.arm(deadline + BACKSTOP, partial(lost or expired, *about))
    try:
        while not done(requests):
            now = time.monotonic()
            if now < spin_until:
                os.sched_yield()      # a pure yield (sleep(0) would pay the kernel's ~50 us timer slack)
                continue
            if now > deadline:
                error = expired(*about)
                if not isinstance(error, BaseException):
                    error = CollectiveTimeout(str(error), param="timeout", seconds=timeout)
                raise expire(error, own)
            time.sleep(pause)
            pause = min(pause * 2, longest)
    finally:
        _BACKSTOP.disarm(ticket)


def set_up_limit(timeout: Any, set_up: Any) -> tuple[float | None, bool]:
    """``(seconds, own)``: the limit of a step that makes a library communicator: ``set_up`` (how
    long its making may wait), else ``timeout`` (the communicator's own), else ``MPICOLL_TIMEOUT``'s;
    ``own``: one of the first two was given (a timeout then only raises, :func:`aborts`)."""
    given = timeout if set_up is None else set_up
    return timeout_seconds(given), given is not None


class _Backstop:
    """One daemon thread per process, armed by every timed wait (see the module docstring); it
    watches the earliest deadline of the waits in progress (several threads may wait at once: a
    caller, workers, the message thread)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._ticket = 0
        self._armed: dict[int, tuple[float, Callable[[], Any]]] = {}
        self._thread: threading.Thread | None = None
        self._wake = float("inf")       # when the thread next looks (inf: it waits to be notified)

    def arm(self, at: float, lost: Callable[[], Any]) -> int:
        with self._cond:
            self._ticket += 1
            self._armed[self._ticket] = (at, lost)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="mpicoll-watchdog", daemon=True)
                self._thread.start()
            if at < self._wake:         # (else it looks before then anyway: waking it on every timed
                self._cond.notify()     # wait would cost a thread switch per call)
            return self._ticket

    def disarm(self, ticket: int) -> None:
        with self._cond:
            self._armed.pop(ticket, None)

    def _run(self) -> None:
        with self._cond:
            while True:
                if not self._armed:
                    self._wake = float("inf")
                    self._cond.wait()
                    continue
                at, lost = min(self._armed.values(), key=lambda armed: armed[0])
                left = at - time.monotonic()
                if left > 0:
                    self._wake = at
                    self._cond.wait(left)
                    continue
                break
        try:
            text = str(lost())
        except Exception as exc:  # noqa: BLE001 - the process ends either way
            text = f"a timed MPI call did not return ({exc})"
        end_process(f"mpicoll watchdog: {text}; ending this process (MPI did not return within "
                    f"{BACKSTOP:g} s of the deadline)")


_BACKSTOP = _Backstop()


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
    """MPICH shared-memory files owned by this user that no live process maps or holds open (left by
    an aborted or killed job), optionally only among ``candidates`` (e.g. those that appeared during
    one run). A job starting at the same time creates its file, then maps it, then closes it: each
    process's open files are read before its mappings, so the file is seen in one or the other
    (removing it in between would leave that job's ranks on different memory)."""
    found = {p for p in glob.glob("/dev/shm/mpich_shm_*") if os.path.isfile(p) and os.stat(p).st_uid == os.getuid()}
    if candidates is not None:
        found &= set(candidates)
    used: set[str] = set()
    for proc in glob.glob("/proc/[0-9]*"):
        try:
            for fd in os.listdir(f"{proc}/fd"):
                try:
                    target = os.readlink(f"{proc}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith("/dev/shm/mpich_shm_"):
                    used.add(target.removesuffix(" (deleted)"))
            with open(f"{proc}/maps", encoding="utf-8", errors="replace") as fh:
                used.update(line.split(None, 5)[5].strip().removesuffix(" (deleted)") for line in fh
                            if "/dev/shm/mpich_shm_" in line)
        except OSError:
            continue
    return sorted(found - used)


def abort(message: str, code: int = 1) -> None:
    """Print ``message``, write the flight recorder, unlink this job's shared-memory files (only those
    this process maps: the peers keep their mappings), and abort every rank."""
    _say(message)
    _trace.dump_all("abort")
    # Give mpirun's output forwarder a moment: when two ranks time out together, the first Abort
    # kills the job and a message still in the other's pipe was lost (seen once in CI).
    time.sleep(0.2)
    unlink_own_segments()
    MPI.COMM_WORLD.Abort(code)
    os._exit(code)  # Abort does not return; if an MPI ever let it, do not run on


def end_process(message: str, code: int = 1) -> None:
    """From a thread other than the one stuck in MPI: print ``message``, unlink this process's
    shared-memory files, give ``MPI_Abort`` (in a thread of its own: it may block too) a moment to
    end the job, then end this process whatever MPI does."""
    _say(message)
    unlink_own_segments()
    if MPI.Is_initialized() and not MPI.Is_finalized() and MPI.Query_thread() == MPI.THREAD_MULTIPLE:
        threading.Thread(target=MPI.COMM_WORLD.Abort, args=(code,), daemon=True).start()
        time.sleep(1.0)
    os._exit(code)


def _say(message: str) -> None:
    try:
        sys.stderr.write(message.rstrip() + "\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a closed stderr must not stop an abort
        pass


def unlink_own_segments() -> None:
    """Remove the names of the MPICH shared-memory files (one per host and job) this process maps.
    MPICH removes them in MPI_Finalize only, so a job that ends otherwise (aborted by ``python -m
    mpi4py`` after an uncaught exception, Ctrl-C, killed) would leave them, a few MB each. Safe once
    every rank of the job has started (each mapped the file in MPI_Init): the memory lives on
    until the last of them exits. mpicoll calls it once it has made its first communicator,
    whichever it is (:func:`mpicoll._domains._own`), and again before it aborts."""
    for path in own_shm_segments():
        try:
            os.unlink(path)
        except OSError:
            pass
