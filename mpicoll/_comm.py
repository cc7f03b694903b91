"""The library communicator: one MPI communicator mpicoll owns, and what every call on it needs.

mpicoll never runs on a user's communicator: it runs on a :class:`LibComm`, made once per
communicator it uses (a duplicate of the world, of a user comm, a comm domain). Every collective
mpicoll calls on it goes through :meth:`LibComm.call` (blocking), :meth:`LibComm.bind` (a plan's
bound call) or :meth:`LibComm.start` / :meth:`LibComm.wait` (non-blocking and persistent, made by
:meth:`LibComm.persistent`), so that the watchdog (:mod:`mpicoll._watchdog`) covers all of them
alike and one method, :meth:`LibComm.direct`, decides when a call may go straight to MPI. (What
makes a communicator or a window from it, ``Split``, ``Dup``, ``Win.Allocate_shared``, follows a
watched ``meet`` Barrier instead: it is not a call on it.) Under a watchdog on any member, every
member makes the non-blocking form of each call, timed or not: MPI matches a blocking collective
only with a blocking one.

Collectives on one communicator must start in the same order on every rank. Work in flight that
still has collectives to start (a started plan of several steps, :class:`~mpicoll._handle.Handle`)
waits in the communicator's ``pending`` queue; any later collective on it first drives the work
ahead of it until that work has started all its collectives there (:meth:`LibComm.drain`). The
order is then the program order, the same on every rank, without a copy of the communicator.

One is made by :func:`mpicoll._making.make`, collectively over its members, who agree its settings,
its layout over the nodes (``local``, ``per_node``) and whether any of them runs a watchdog
(``MPICOLL_TIMEOUT``): then every member keeps an arrival mark, a few int64 in an RMA window, that a
timed-out peer reads to name the ranks that never arrived.
"""
from __future__ import annotations

import threading
import zlib
from functools import lru_cache, partial
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from . import _exit, _trace, _watchdog
from ._errors import CollectiveError, CollectiveTimeout

#: guards the process-wide state (caches, the queues) for programs that call mpicoll from threads
LOCK = threading.RLock()
#: how many started runs wait in some communicator's ``pending`` queue (a plan's run() drains its
#: communicators only when this is not 0)
QUEUED = 0
#: the work this thread is running (``RUNNING.job``: a worker's job, set by :mod:`mpicoll._async`, or a
#: started plan's run driving its steps): a call it makes drains only what was queued ahead of it
RUNNING = threading.local()
#: how many communicators :meth:`LibComm.free` freed, plus one once MPI finalizes (0: a call has
#: nothing to look at: :func:`check_live`, ``MPI.Is_finalized``)
FREED = 0


#: an arrival mark: the sequence number, the call's number there, then its operator's name (utf-8, up
#: to ``8 * NAME_WORDS`` bytes): a timed-out peer reading it names the call as its maker does
NAME_WORDS = 8
MARK_WORDS = 2 + NAME_WORDS


@lru_cache(maxsize=None)
def name_words(name: str) -> np.ndarray:
    """``name`` as an arrival mark holds it (int64 words)."""
    return np.frombuffer(name.encode()[:8 * NAME_WORDS].ljust(8 * NAME_WORDS, b"\0"), dtype=np.int64)


def op_code(name: str) -> int:
    """A stable number for an operator name (the same on every rank)."""
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def ordinal(k: int) -> str:
    suffix = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k}{suffix}"


class LibComm:
    """A communicator mpicoll owns (see the module docstring).

    Attributes:
        mpi: the ``mpi4py`` communicator.
        label: how messages name it ("domain 'ep'", "the world", ...).
        rank, size: this rank in it, and its size.
        world_ranks: its members' world ranks, in its rank order.
        ident: a number for it, the same on every member (its label and members): how a captured
            graph tells its communicators apart.
        validate, debug: the agreed defaults of ``MPICOLL_VALIDATE`` and ``MPICOLL_DEBUG``.
        timeout: its own watchdog timeout in seconds (a torch group's ``timeout=``: given alike by
            every member when it was made), or None: ``MPICOLL_TIMEOUT``'s. A call on it that gives
            none takes it (:meth:`call_timeout`); its own timeout only raises, never aborts.
        local: every member runs on one node and ``MPICOLL_SHM`` is on (agreed): large reductions
            may use the node window (:func:`mpicoll._shm.node_window`).
        exact: ``MPICOLL_EXACT`` (agreed, on by default): float reductions reduce in the tree order on
            every path (``ops._paths.ordered``, docs/reproducibility.md), never in MPI's own
            reduction, whose order depends on the size and the MPI library.
        buffers: its node buffers (:func:`mpicoll._shm.node_buffer`), freed with it.
        per_node: the members span several nodes, each holding this many (more than one) of them,
            and ``MPICOLL_SHM`` is on (agreed; else 0): a large AllReduce may go in tiers
            (:func:`mpicoll._making.tiers`).
        blocks: with ``per_node``, each node holds consecutive ranks, the nodes in rank order (block
            placement, agreed): with a power of two on each, a tree-order sum can go in tiers
            (``ops._paths.aligned``).
        crowded: this rank's node runs more ranks than it has cores (:func:`mpicoll._watchdog.crowded`,
            from its members' CPU sets there and the launcher's count): with ``MPICOLL_WAIT=auto`` its
            messages are waited for by polling between sleeps (:mod:`mpicoll._messages`).
        calls: operator name -> how many calls of it this rank has made on it (as the user counts).
        seq: how many collectives mpicoll has started on it (kept where it is read: with arrival
            marks or in debug mode).
        pending: started work with collectives still to start here, and calls queued on its worker
            (:mod:`mpicoll._async`) until they have finished, oldest first.
        worker: the thread that runs its ``async_op=True`` calls (made at the first; None before).
        freed: :meth:`free` ran (``Comm.Free`` of the user's communicator runs it): operations and
            plans on it raise (:func:`check_live`) instead of calling MPI on a freed handle.
        node_comm: with ``per_node``, this rank's node's members (an MPI communicator, kept for the
            tiers), else None; tiered: the tiers, once made (:func:`mpicoll._making.tiers`).
        flight: its flight recorder (:class:`mpicoll._trace.Ring`: its last ``MPICOLL_FLIGHT`` calls),
            or None (``MPICOLL_FLIGHT=0``).
    """

    __slots__ = ("mpi", "label", "rank", "size", "world_ranks", "ident", "validate", "debug", "local", "exact",
                 "timeout", "busy", "worker",
                 "calls", "seq", "pending", "plain", "freed", "per_node", "blocks", "crowded", "buffers", "_win",
                 "_mark", "_node",
                 "node_comm", "tiered", "flight", "__weakref__")

    def __init__(self, mpi: MPI.Comm, label: str, validate: bool, debug: bool, watched: bool,
                 local: bool = False, split: MPI.Comm | None = None, exact: bool = True,
                 blocks: bool = False, timeout: float | None = None, crowded: bool = False) -> None:
        self.mpi, self.label = mpi, label
        self.rank, self.size = mpi.Get_rank(), mpi.Get_size()
        self.world_ranks = world_ranks(mpi)
        self.ident = zlib.crc32(f"{label}:{self.world_ranks}".encode()) | len(self.world_ranks) << 32   # (the same on every member)
        self.validate, self.debug, self.local, self.exact, self.timeout = validate, debug, local, exact, timeout
        self._node = self.tiered = None
        self.buffers: list = []            # its node buffers (mpicoll._shm.node_buffer), in allocation order
        self.node_comm = split
        self.per_node = 0 if split is None else split.Get_size()
        self.blocks, self.crowded = blocks, crowded
        self.calls: dict[str, int] = {}
        self.seq = 0
        self.pending: list = []
        self.worker = None
        self._win = self._mark = None
        self.plain = not debug and not watched
        self.freed = False
        self.busy = threading.RLock()      # held by the thread inside a call on it (:meth:`enter`)
        self.flight = _trace.Ring(_trace.flight_size(), label, self.world_ranks, self.rank)
        if watched:
            self._win = MPI.Win.Allocate(MARK_WORDS * 8, 8, comm=mpi)
            self._mark = np.frombuffer(self._win.tomemory(), dtype=np.int64)
            self._mark[:] = 0
            mpi.Barrier()                  # every mark is zero before anyone reads one
            # (every member holds a shared lock on all, none ever an exclusive one: NOCHECK, so that
            # taking it needs no message, else it waits for the others to make MPI progress)
            self._win.Lock_all(MPI.MODE_NOCHECK)
            _exit.hold(self)

    def meet(self, what: str) -> None:
        """A Barrier under the watchdog before a collective set-up step that is not timed itself
        (``Allocate_shared``, ``Split``), after the work queued here: a member that never comes
        gives ``CollectiveTimeout`` saying ``what`` it was waiting for."""
        if self.pending:
            self.drain(None)
        timed_call(self.mpi, "Barrier", (), self.call_timeout(),
                   lambda: f"{self.label}: timed out waiting for every member to {what}", own=self.own)

    def add_buffer(self, buf) -> None:
        """Register a node buffer (:class:`mpicoll._shm.NodeBuffer`) just allocated on it."""
        self.buffers.append(buf)
        self.hold_open()

    def hold_open(self) -> None:
        """List it among the communicators whose windows a clean exit frees."""
        _exit.hold(self)

    @property
    def own(self) -> bool:
        """Whether its timeout is its own (``timeout``), which only raises
        (:func:`~mpicoll._watchdog.aborts`)."""
        return self.timeout is not None

    @property
    def watched(self) -> bool:
        """Whether the members keep arrival marks (a watchdog runs on some member)."""
        return self._win is not None

    def enter(self, op: str) -> None:
        """A call of ``op`` begins on it (``busy`` is released when it ends). The rule: one thread at
        a time per communicator (MPI orders the collectives of a communicator by the order its calls
        start, which threads would make differ by rank).

        Raises:
            CollectiveError: another thread of this rank is inside a call on it.
        """
        if not self.busy.acquire(False):
            raise CollectiveError(f"{op}: another thread of rank {self.rank} is inside a call on {self.label}: "
                                  "mpicoll's calls on one communicator come from one thread at a time (a communicator "
                                  "per thread: comm_mode=MULTI_THREAD with a user comm each)", op=op, param="thread",
                                  rank=self.rank)

    def call_timeout(self, given: Any = None, op: str = "mpicoll") -> float | None:
        """The watchdog timeout of a call on it (the one place this is decided): ``given`` (the
        call's ``timeout=``; 0 or less: none) wins, else its own, else ``MPICOLL_TIMEOUT``'s.

        Raises:
            CollectiveArgumentError: ``given`` is not a number of seconds (naming ``op`` and this rank).
        """
        return _watchdog.timeout_seconds(self.timeout if given is None else given, op, self.rank)

    # -- calls -----------------------------------------------------------------------------------
    def direct(self, timeout: float | None) -> bool:
        """Whether a blocking call may go straight to MPI: no watchdog timing it (``timeout``), and
        ``plain``: no arrival mark and no sequence number to keep (the one place that decides it;
        :meth:`call` tests the same two, inline)."""
        return timeout is None and self.plain

    def call(self, name: str, args: tuple, timeout: float | None, where: tuple) -> None:
        """One blocking MPI collective ``self.mpi.<name>(*args)``, under the watchdog when timed.

        ``where`` is ``(operator, its call number here or None for the latest counted, step)``:
        it names the call in a timeout.
        """
        if self.pending:
            self.drain(None)
        if timeout is None and self.plain:       # (direct(timeout), inline: every call passes here)
            getattr(self.mpi, name)(*args)
            return
        self.seq += 1
        if self._mark is not None:
            self._arrive(where)
        # (debug mode or a watchdog somewhere: every member takes the non-blocking form, timed or not,
        # as a started plan's steps do: MPI matches a blocking collective only with a blocking one)
        self.wait([getattr(self.mpi, nonblocking(name))(*args)], timeout, name, where)

    def bind(self, name: str, args: tuple, timeout: float | None, where: tuple) -> Callable[[], None]:
        """:meth:`call` bound once, for a plan's blocking run (the caller drains ``pending`` first)."""
        if self.direct(timeout):
            return partial(getattr(self.mpi, name), *args)
        return partial(self.call, name, args, timeout, where)

    def start(self, name: str | MPI.Prequest, args: tuple, where: tuple, by: Any = None) -> MPI.Request:
        """Start a collective non-blocking: ``name`` of a blocking call (its ``I`` form is used), or
        a persistent request made by ``self.mpi.<name>_init``. ``by``: the started work making it
        (work queued ahead of it here is driven first), or None."""
        if self.pending:
            self.drain(by)
        if not self.plain:
            self.seq += 1
            if self._mark is not None:
                self._arrive(where)
        if isinstance(name, str):
            return getattr(self.mpi, nonblocking(name))(*args)
        name.Start()
        return name

    def message(self, sends: bool, data: np.ndarray, peer: int, tag: int) -> MPI.Request:
        """Post a point-to-point message of the bytes ``data`` (``Isend`` to, or ``Irecv`` from,
        ``peer``; :mod:`mpicoll._messages` completes it). Not a collective: it neither waits for
        the work queued here nor counts as a call."""
        return (self.mpi.Isend if sends else self.mpi.Irecv)([data, MPI.BYTE], peer, tag)

    def persistent(self, name: str, args: tuple) -> MPI.Prequest:
        """The persistent request of collective ``name`` (``self.mpi.<name>_init``: collective and
        non-blocking in MPI 4, made by every member at the same point of its program), started by
        :meth:`start`, which counts the sequence and marks the arrival of each start."""
        return getattr(self.mpi, name + "_init")(*args)

    def wait(self, requests: list[MPI.Request], timeout: float | None, name: str, where: tuple) -> None:
        """Complete ``requests`` (a collective ``name`` started with :meth:`start`, ``where`` as for
        :meth:`call`); with a timeout, raise (or abort) when they do not complete in time."""
        _watchdog.wait(requests, timeout, self._expired, self._lost, self.own, about=(timeout, name, where))

    def drain(self, by: Any) -> None:
        """Drive the started work queued here ahead of ``by`` (None: the job this thread runs, on a
        worker thread, :mod:`mpicoll._async`; else all of it) until it has started every collective
        it has here: then a new collective starts after them, on every rank alike (see the module
        docstring). What was queued after a worker's job waits for it, never the other way round."""
        if by is None:
            by = getattr(RUNNING, "job", None)
        for work in list(self.pending):
            if work is by:
                return
            work.issue_all()

    # -- the watchdog's arrival marks --------------------------------------------------------------
    def _arrive(self, where: tuple) -> None:
        mark, op, number = self._mark, where[0], where[1]
        mark[0] = self.seq
        mark[1] = self.calls.get(op, 0) if number is None else number
        mark[2:] = name_words(op)

    def _head(self, timeout: float, name: str, where: tuple) -> tuple[str, str]:
        op, number, step = where
        if number is None:            # (the call in progress is the latest counted)
            number = self.calls.get(op, 0)
        which = f"its {ordinal(number)} {op} call there" if number else f"a call of {op}"   # (0: a tier's)
        return op, (f"{op}: timed out after {timeout:g} s on rank {self.rank} of {self.label}, in {which}, "
                    f"waiting in {step or f'MPI {name}'}")

    def _expired(self, timeout: float, name: str, where: tuple) -> CollectiveTimeout:
        op, head = self._head(timeout, name, where)
        if self._win is None:
            return CollectiveTimeout(f"{head}; set MPICOLL_TIMEOUT (on any rank, before mpicoll makes the "
                                     "communicator) to have the missing ranks named", op=op, param="timeout",
                                     seconds=timeout)
        marks = np.zeros((self.size, MARK_WORDS), dtype=np.int64)
        for peer in range(self.size):
            self._win.Get([marks[peer], MPI.INT64_T], peer)
            self._win.Flush(peer)
        missing = [r for r in range(self.size) if marks[r, 0] < self.seq]
        if not missing:
            return CollectiveTimeout(f"{head}; every rank arrived (one may have died)", op=op, param="timeout",
                                     seconds=timeout)
        where_now = []
        for r in missing:
            seq, k = int(marks[r, 0]), int(marks[r, 1])
            if seq == 0:
                where_now.append(f"rank {r} has made no mpicoll call there")
            else:
                peer_op = marks[r, 2:].tobytes().rstrip(b"\0").decode(errors="replace")
                which = f"its {ordinal(k)} {peer_op} call there" if k else f"a call of {peer_op}"   # (0: a tier's)
                where_now.append(f"rank {r} is in or after {which}")
        world = "" if self.world_ranks == tuple(range(self.size)) else \
            f" (world ranks {[self.world_ranks[r] for r in missing]})"
        return CollectiveTimeout(f"{head}; ranks that did not arrive: {missing}{world} ({'; '.join(where_now)})",
                                 op=op, param="timeout", rank=missing[0], seconds=timeout)

    def _lost(self, timeout: float, name: str, where: tuple) -> str:
        """The timeout text when MPI itself does not return (a peer's host unreachable): built from
        what this rank knows, without an MPI call (read by the watchdog's backstop thread)."""
        _, head = self._head(timeout, name, where)
        peers = [(r, w) for r, w in enumerate(self.world_ranks) if r != self.rank]
        return (f"{head}; MPI did not return (a peer's host or link may be down), so which ranks arrived "
                f"is unknown; it waited for ranks {[r for r, _ in peers]} there (world ranks "
                f"{[w for _, w in peers]})")

    def free(self) -> None:
        """Free the windows and the communicator, with its tiers' (collective over the members)."""
        global FREED
        if self.worker is not None:
            self.worker.stop()                 # (its queued calls finish first)
            self.worker = None
        self.freed = True
        FREED += 1
        self.close()
        if self.tiered is not None:
            for tier in self.tiered:
                tier.free()
        elif self.node_comm is not None:
            self.node_comm.Free()
        self.node_comm = self.tiered = None
        self.mpi.Free()

    def close(self) -> None:
        """Free the arrival window, the node window and the node buffers, if any, and its tiers'
        (collective over the members)."""
        for tier in self.tiered or ():
            tier.close()
        _exit.release(self)
        if self._node:
            self._node.free()              # (kept, freed: a plan still holding it raises, not crashes)
        for buf in self.buffers:
            buf.free()
        if self._win is not None:
            win, self._win, self._mark = self._win, None, None
            self.plain = not self.debug
            win.Unlock_all()
            win.Free()


def world_ranks(mpi: MPI.Comm) -> tuple[int, ...]:
    """The world ranks of the members of ``mpi``, in its rank order."""
    group, world = mpi.Get_group(), MPI.COMM_WORLD.Get_group()
    ranks = tuple(MPI.Group.Translate_ranks(group, list(range(mpi.Get_size())), world))
    group.Free()
    world.Free()
    return ranks


def finalized(op: str, what: str) -> CollectiveError:
    """The error of a call made after ``MPI.Finalize()``: MPI would end the process from C."""
    return CollectiveError(f"{op}: {what} after MPI is finalized (MPI.Finalize() was called, or the program is "
                           "exiting): no MPI call can run any more", op=op, param="MPI")


def check_live(comms: tuple, op: str) -> None:
    """Raise, naming the communicator, when one of ``comms`` was freed (``LibComm.freed``): MPI's
    calls on a freed handle raise its own error at best (Open MPI's non-blocking ones crash).
    Until a communicator is freed (``FREED``), a global read."""
    if not FREED:
        return
    for c in comms:
        if c.freed:
            raise CollectiveError(f"{op}: {c.label} was freed (Comm.Free): an operation or plan made on it cannot "
                                  "run any more; make it again on a live communicator", op=op, param="comm",
                                  rank=c.rank)


def alive(what: str) -> None:
    """Raise :func:`finalized` for ``what`` once MPI is finalized (set-up calls: domains, groups)."""
    if MPI.Is_finalized():
        raise finalized(what, "a call")


def nonblocking(name: str) -> str:
    """The mpi4py name of a blocking collective's non-blocking form: ``Allreduce`` -> ``Iallreduce``."""
    return "I" + name[0].lower() + name[1:]


def timed_call(mpi: MPI.Comm, name: str, args: tuple, timeout: float | None, expired: Callable[[], str],
               own: bool = False) -> None:
    """A collective on a communicator that is not (yet) a LibComm, under the watchdog when timed;
    always the non-blocking form, so that members with and without ``MPICOLL_TIMEOUT`` make the
    same MPI call (MPI matches a blocking collective only with a blocking one). ``own``: the limit
    is the communicator's own (it only raises, :func:`~mpicoll._watchdog.aborts`)."""
    _watchdog.wait([getattr(mpi, nonblocking(name))(*args)], timeout, expired, own=own)


def finalizing() -> None:
    """MPI is finalizing (:func:`mpicoll._exit.register`): from then on every call looks at whether
    MPI is finalized (a call's one test is ``FREED``)."""
    global FREED
    FREED += 1
