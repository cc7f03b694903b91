"""Reductions through one MPI shared window per node-local communicator.

Where every member of a communicator runs on one node (``LibComm.local``: agreed when mpicoll makes
the communicator, and ``MPICOLL_SHM`` on), AllReduce and ReduceScatter(V) from a size up (the
thresholds below: constants, the same on every rank, so the choice is made from agreed facts only)
run through a window of MPI shared memory (``MPI.Win.Allocate_shared``) instead of MPI's collective:

* each rank copies the blocks the other ranks reduce into its own slot of the window;
* the ranks synchronise (``Win.Sync`` + ``Barrier`` + ``Win.Sync``: the MPI memory model's rule for
  shared windows; the ``Barrier`` is an ordinary mpicoll collective, timed by the watchdog);
* each rank reduces its own block in one pass over every rank's copy, in rank order
  (:func:`~mpicoll._numeric.reduce_rows`: its own block straight from its input, float16/bfloat16
  accumulated in float32), writing the result where it is needed (ReduceScatter: the output);
* AllReduce: the ranks synchronise again and each copies the reduced blocks of the others out.

Small AllReduces (``ONE_SHOT_BYTES``) go in one shot instead: every rank copies its whole input in
and, after one Barrier, reduces the whole message from every slot. Large payloads go in rounds of
at most ``SLOT_BYTES`` (AllReduce: of the message; ReduceScatter: of all blocks together, each in
proportion to its count). The window has two halves per rank, used by alternate rounds, so one
round's copies-in never overwrite what a peer may still read from the round before: a
ReduceScatter round or a one-shot AllReduce needs one ``Barrier``, a two-shot AllReduce round two.
The half in use is state of the window, advanced by every round at run time: every member runs the
same rounds in the same order, and a started run holds a call's steps together
(``Recorder.hold``), so that runs in flight never interleave them.

One window per communicator, ``2 * SLOT_BYTES`` per rank, made (collectively) by the first call
that needs it and freed with the communicator (or at exit). MPI owns the memory: MPICH unlinks its
backing file once every rank has mapped it, so nothing is left in ``/dev/shm`` however the job ends.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from mpi4py import MPI

from ._errors import CollectiveError
from ._numeric import reduce_rows, stream_copy

if TYPE_CHECKING:
    from ._comm import LibComm
    from ._dtypes import DType, ReduceOp

#: bytes per rank per round (and per half of the window)
SLOT_BYTES = 2 * 1024 * 1024
#: AllReduce payloads of at least this many bytes use the window (measured: benchmarks/shm.py)
ALLREDUCE_BYTES = 64 * 1024
#: ReduceScatter(V) payloads (all blocks of one rank) of at least this many bytes use the window
REDUCE_SCATTER_BYTES = 64 * 1024
#: AllReduce payloads whose size times the rank count is at most this many bytes go in one shot: every
#: rank copies its whole input into its slot and, after one Barrier, reduces the whole message from
#: every slot (one Barrier instead of two, but every rank reads every rank's whole input: measured
#: 0.6-0.7x the two-shot time at 64 KiB, 2 and 4 ranks; 1.1-1.5x at 1-2 MiB, 4 ranks)
ONE_SHOT_BYTES = 512 * 1024


def serves(comm: LibComm, nbytes: int, threshold: int) -> bool:
    """Whether a reduction of ``nbytes`` (the same on every rank) on ``comm`` goes through its node
    window: every member on one node (agreed), more than one member, at least ``threshold`` bytes."""
    return comm.local and comm.size > 1 and nbytes >= threshold


class NodeWindow:
    """One communicator's shared window: ``2 * SLOT_BYTES`` per rank, in two halves.

    Attributes:
        win: the MPI window (every member holds a passive-target epoch on it from the start).
        half: the half the next round uses (0 or 1), the same on every member.
        slot_bytes: bytes per rank per half (``SLOT_BYTES`` when it was made).
    """

    def __init__(self, comm: LibComm) -> None:
        self.label, self.slot_bytes = comm.label, max(SLOT_BYTES // 64 * 64, 64)   # (every dtype's multiple)
        self.win = MPI.Win.Allocate_shared(2 * self.slot_bytes, 1, comm=comm.mpi)
        self.win.Lock_all(MPI.MODE_NOCHECK)
        self._segments = [np.frombuffer(self.win.Shared_query(r)[0], dtype=np.uint8) for r in range(comm.size)]
        self.half = 0

    def slots(self, rank: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        """Rank ``rank``'s two halves, as arrays of ``dtype``."""
        self.check()
        seg, b = self._segments[rank], self.slot_bytes
        return seg[:b].view(dtype), seg[b:2 * b].view(dtype)

    def free(self) -> None:
        """Free the window (collective over the members)."""
        if self.win is not None:
            win, self.win, self._segments = self.win, None, []
            win.Unlock_all()
            win.Free()

    # -- the steps of a round (recorded by plans; each picks the views of the half in use) ----------
    def check(self) -> None:
        """Raise, rather than touch freed memory, when a plan runs after its communicator was freed."""
        if self.win is None:
            raise CollectiveError(f"{self.label} was freed (or the program is exiting): its shared window is gone",
                                  param="comm")

    def put(self, pairs: tuple[list, list]) -> None:
        """Copy this rank's blocks into its slot (stores that bypass the cache: the lines were last
        read by a peer), then make the writes visible."""
        self.win.Sync()                # (the peers' reads of this half, a Barrier ago, are over)
        for dst, src in pairs[self.half]:
            stream_copy(dst, src)
        self.win.Sync()

    def reduce(self, rows: tuple[list, list], dt: DType, rop: ReduceOp, out: np.ndarray,
               shared: tuple[np.ndarray, np.ndarray] | None) -> None:
        """Reduce this rank's block from every rank's copy into ``out`` (after a Barrier);
        ``shared``: also place the result in the window, where the peers read it next (AllReduce)."""
        self.win.Sync()
        reduce_rows(rows[self.half], dt, rop, out)
        if shared is not None:
            stream_copy(shared[self.half], out)
            self.win.Sync()

    def get(self, pairs: tuple[list, list]) -> None:
        """Copy the reduced blocks out (after a Barrier)."""
        self.win.Sync()
        for dst, src in pairs[self.half]:
            np.copyto(dst, src)

    def flip(self) -> None:
        self.half ^= 1


def allreduce(go, comm: LibComm, x: np.ndarray, out: np.ndarray | None, dt: DType, rop: ReduceOp,
              in_place: bool) -> None:
    """AllReduce (or Reduce) of ``x`` into ``out`` (``in_place``: ``out`` is ``x``; None: a Reduce's other ranks)
    through the node window. Up to ``ONE_SHOT_BYTES / n``, in one shot (each rank with an ``out``
    reduces the whole message from every slot, in rank order); else in rounds of at most
    ``SLOT_BYTES``: each rank reduces one block of the round (``split_even``: the first ranks get one
    element more), in rank order, and places it in its slot; then every rank with an ``out`` copies
    the blocks out."""
    from .ops._base import prefix, split_even
    node, n, me = comm.node_window(), comm.size, comm.rank
    flat, oflat = x.reshape(-1), None if out is None else out.reshape(-1)
    per = node.slot_bytes // dt.itemsize
    slots = [node.slots(r, dt.np) for r in range(n)]
    go.hold(True)
    go.local(node.check)
    if flat.nbytes * n <= ONE_SHOT_BYTES and flat.nbytes <= node.slot_bytes:
        own = tuple(m[:flat.size] for m in slots[me])     # (in place on a rank > 0: its row from its slot)
        rows = tuple([flat if r == me and (me == 0 or not in_place) else slots[r][h][:flat.size]
                      for r in range(n)] for h in (0, 1))
        go.local(node.put, tuple([(o, flat)] for o in own))
        go.mpi(comm, "Barrier")
        if oflat is not None:
            go.local(node.reduce, rows, dt, rop, oflat, None)
        go.local(node.flip)
        go.hold(False)
        return
    mine = np.empty(-(-min(per, flat.size) // n), dtype=dt.np)   # this rank's reduced block, privately
    for s in range(0, flat.size, per):
        xs = flat[s:s + per]
        counts = split_even(xs.size, n)
        bounds = [(int(a), int(a + c)) for a, c in zip(prefix(counts), counts)]
        lo, hi = bounds[me]
        put = tuple([(m[:lo], xs[:lo]), (m[hi:xs.size], xs[hi:])] for m in slots[me])
        rows = tuple([xs[lo:hi] if r == me else slots[r][h][lo:hi] for r in range(n)] for h in (0, 1))
        go.local(node.put, put)
        go.mpi(comm, "Barrier")
        go.local(node.reduce, rows, dt, rop, mine[:hi - lo], tuple(m[lo:hi] for m in slots[me]))
        go.mpi(comm, "Barrier")
        if oflat is not None:
            os_ = oflat[s:s + per]
            get = tuple([(os_[a:b], mine[:hi - lo] if r == me else slots[r][h][a:b])
                         for r, (a, b) in enumerate(bounds)] for h in (0, 1))
            go.local(node.get, get)
        go.local(node.flip)
    go.hold(False)


def reduce_scatter(go, comm: LibComm, blocks: np.ndarray, counts: list[int], dt: DType, rop: ReduceOp,
                   out: np.ndarray) -> None:
    """ReduceScatter(V) of the packed ``blocks`` (block j: ``counts[j]`` elements, rank j's) into
    ``out`` through the node window, in rounds: round k takes the k-th ``take[j]`` elements of every
    block j (``take`` in proportion to the counts, together at most a slot, so that skewed counts
    need no more rounds than even ones); each rank copies the others' parts into its slot and, after
    a Barrier, reduces its own part from every slot (its own straight from ``blocks``) into ``out``."""
    from .ops._base import prefix
    node, n, me = comm.node_window(), comm.size, comm.rank
    flat, oflat = blocks.reshape(-1), out.reshape(-1)
    per = node.slot_bytes // dt.itemsize
    rounds = max(-(-sum(counts) // max(per - n, 1)), 1)        # (sum of ceil(c / rounds) <= per)
    take = [-(-c // rounds) for c in counts]
    at = prefix(take)                                          # block j's place in a slot
    starts = prefix(counts)
    slots = [node.slots(r, dt.np) for r in range(n)]
    go.hold(True)
    go.local(node.check)
    for k in range(rounds):
        part = [(k * t, min((k + 1) * t, c)) for t, c in zip(take, counts)]     # block j's range this round
        put = tuple([(m[at[j]:at[j] + e - a], flat[starts[j] + a:starts[j] + e])
                     for j, (a, e) in enumerate(part) if j != me and e > a] for m in slots[me])
        go.local(node.put, put)
        go.mpi(comm, "Barrier")
        a, e = part[me]
        if e > a:
            mine = flat[starts[me] + a:starts[me] + e]
            rows = tuple([mine if r == me else slots[r][h][at[me]:at[me] + e - a] for r in range(n)] for h in (0, 1))
            go.local(node.reduce, rows, dt, rop, oflat[a:e], None)
        go.local(node.flip)
    go.hold(False)
