"""One MPI shared window per node-local communicator, and node buffers.

Where every member of a communicator runs on one node (``LibComm.local``: agreed when mpicoll makes
the communicator, and ``MPICOLL_SHM`` on), AllReduce and ReduceScatter(V) from a size up (the
thresholds of :mod:`mpicoll._thresholds`: constants, the same on every rank, so the choice is made
from agreed facts only, in :mod:`mpicoll.ops._paths`) run through a window of MPI shared memory
(``MPI.Win.Allocate_shared``) instead of MPI's collective (the rounds: :mod:`mpicoll.ops._window`):

* each rank copies the blocks the other ranks reduce into its own slot of the window;
* the ranks synchronise (``Win.Sync`` + ``Barrier`` + ``Win.Sync``: the MPI memory model's rule for
  shared windows; the ``Barrier`` is an ordinary mpicoll collective, timed by the watchdog);
* each rank reduces its own block in one pass over every rank's copy, in the tree order
  (:func:`~mpicoll._numeric.reduce_rows`: its own block straight from its input, float16/bfloat16
  accumulated in float32), writing the result where it is needed (ReduceScatter: the output);
* AllReduce: the ranks synchronise again and each copies the reduced blocks of the others out
  (streamed from ``window.stream_out`` of output).

Small AllReduces (up to ``window.one_shot / (n (n - 1))``: the extra reading) go in one shot instead:
every rank copies its whole input in and, after one Barrier, reduces the whole message from every
slot. Large payloads go in rounds of at most ``window.slot`` (AllReduce: of the message;
ReduceScatter: of all blocks together, each in proportion to its count). The window has two halves
per rank, used by alternate rounds, so one round's copies-in never overwrite what a peer may still
read from the round before: a ReduceScatter round or a one-shot AllReduce needs one ``Barrier``, a
two-shot AllReduce round two. The half in use is state of the window, advanced by every round at run
time: every member runs the same rounds in the same order, and a started run holds a call's steps
together (``Recorder.hold``), so that runs in flight never interleave them.

One window per communicator, ``2 * window.slot`` per rank, made (collectively) by the first call
that needs it and freed with the communicator (or at exit). MPI owns the memory: MPICH unlinks its
backing file once every rank has mapped it, so nothing is left in ``/dev/shm`` however the job ends.
Where ``/dev/shm`` cannot hold the window (agreed, :class:`_Shared`), it is not made: the
communicator's reductions take MPI's path, with a ``RuntimeWarning``.

Inputs that live in shared memory already (:func:`node_buffer`: a window of its own, allocated by
the user once) skip the copies in: when every rank's input is the same place of the same node buffer
(agreed: the header's ``H_INFO`` carries it, :func:`ref`; so only agreed calls, plans among them, use
it), each rank reduces straight from the peers' inputs (:func:`resident`), and a last ``Barrier``
keeps every input untouched until the peers have read it. AllGather and Broadcast of node buffers
copy once, straight from the peers' (:func:`gather`); of private arrays they stay with MPI.
"""
from __future__ import annotations

import ctypes
import errno
import mmap
import os
import time
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np
from mpi4py import MPI

from . import _agreement
from . import _validate as V
from ._comm import LibComm
from ._domains import resolve
from ._dtypes import lookup
from ._errors import CollectiveError, agreed, arg_error, as_collective_error
from ._numeric import copy_pairs, reduce_rows
from ._thresholds import value

if TYPE_CHECKING:
    from ._dtypes import DType, ReduceOp

#: Copies into the window are streamed (stores that bypass the cache) or plain (``np.copyto``),
#: whichever this rank measured faster lately. Copies of at least ``window.probe`` bytes are counted and timed:
#: of every PROBE_EVERY of them the last PROBE_LEN take the other kind to compare, and the kind
#: changes only at the end of such a period. Smaller copies take the kind in use (timing them cost
#: a 16-32 KiB one-shot AllReduce a quarter of its time). Of the timed copies only warm ones are
#: used: into a place the same kind wrote last (every copy records its kind at its place, found
#: when the steps are recorded: ``keyed``). A plain copy into lines that streamed stores sent to
#: memory must fetch them first: timed that way, single plain probes looked 1.5-2x slower than a
#: run of them, and a rank stayed with streamed copies at 1.2-1.3x the time. A round writes up to 4
#: places (a two-shot AllReduce: its blocks in, its result; two halves), so PROBE_LEN is twice
#: that. On this 2-core VM, plain copies into lines another core read ran 7-10x slower for seconds
#: at a time (streamed copies do not); otherwise plain ones win, and leave the peers' reads in
#: cache. A local choice: either kind writes the same bytes.
PROBE_EVERY = 128
PROBE_LEN = 8
#: ``madvise`` advice that gives a range its pages now, and fails (EFAULT, ENOMEM) where a store
#: would raise SIGBUS: Linux 5.14 on (older kernels and other systems say EINVAL: not checked there)
MADV_POPULATE_WRITE = 23
#: Room that a shared allocation of n bytes per member needs in ``/dev/shm``:
#: ``ROOM_FACTOR * members * (n + ROOM_EXTRA)``. Open MPI's shared memory asks for 5% more room than
#: a segment takes, plus its header, which grows with the members (measured: it fails below 1.05x
#: the window plus 2-9 KiB at 2 and 4 ranks), and there it fails on the one member that makes the
#: segment while the others wait in ``Allocate_shared`` for good. MPICH needs the bytes alone: the
#: margin only makes it refuse a window that would have fitted in the last 5% of ``/dev/shm``.
ROOM_FACTOR, ROOM_EXTRA = 1.05, 16 * 1024


def node_window(comm: LibComm) -> "NodeWindow | None":
    """``comm``'s shared window, made on its first use: collective over the members, which all
    reach it at the same call (it is made from an ``issue`` choice on agreed facts). Freed with the
    communicator (:meth:`LibComm.close`). None (for good, on every member, with a ``RuntimeWarning``)
    where the node's shared memory cannot hold it: the reductions then take MPI's path."""
    if comm._node is None:
        comm.meet("make its shared window (a rank never made its first large reduction there)")
        node = NodeWindow(comm)
        if node.short:
            comm._node = False
            # (the same text for every communicator: Python shows it once per process by default,
            # and under -W error every member raises it alike)
            warnings.warn(f"mpicoll: {node.short}; reductions on communicators whose window it cannot hold "
                          "take MPI's path instead (MPICOLL_SHM=0 skips the attempt; it also turns node "
                          "buffers and tiers off)", RuntimeWarning)
        else:
            comm._node = node
            comm.hold_open()
    return comm._node or None


def serves(comm: LibComm, nbytes: int, threshold: int, window: bool = True) -> bool:
    """Whether a reduction of ``nbytes`` (the same on every rank) on ``comm`` goes through its node
    window: every member on one node (agreed), more than one member, at least ``threshold`` bytes,
    and, where the call needs the window (``window``: a ReduceScatter from node buffers does not),
    the window could be made (here, by the first call that needs it: :func:`node_window`)."""
    return comm.local and comm.size > 1 and nbytes >= threshold and (not window or node_window(comm) is not None)


def _back(seg: np.ndarray) -> int:
    """Give this member's part of a shared window its pages now (``MADV_POPULATE_WRITE``); 0 when
    it has them (or the kernel cannot tell), else the errno."""
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, TypeError, AttributeError):        # (no C library to ask: not checked)
        return 0
    if not seg.nbytes:
        return 0
    start = seg.ctypes.data // mmap.PAGESIZE * mmap.PAGESIZE     # (madvise takes whole pages)
    size = seg.ctypes.data + seg.nbytes - start
    if madvise(ctypes.c_void_p(start), ctypes.c_size_t(size), MADV_POPULATE_WRITE) == 0:
        return 0
    err = ctypes.get_errno()
    return 0 if err == errno.EINVAL else err


def _room() -> float:
    """Bytes free in the node's shared memory (``/dev/shm``; where there is none: no limit known)."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return float("inf")
    return st.f_bavail * st.f_frsize


def _agree(comm: LibComm, err: int, nbytes: int, what: str) -> str:
    """Gather every member's ``err`` (0: fine) about a shared allocation of ``nbytes`` per member:
    why it cannot be had (the same message on every member, and for every communicator), or ""."""
    errs = _agreement.gather(comm, np.array([err], dtype=np.int64), comm.call_timeout(),
                             ("shared memory", None, f"agreeing where its {what} fits")).reshape(-1)
    if not errs.any():
        return ""
    first = int(errs[np.flatnonzero(errs)[0]])                  # (the lowest failing member's)
    why = "no room for its pages" if first == errno.EFAULT else os.strerror(first)
    return (f"the node's shared memory (/dev/shm) cannot hold a {what} of {nbytes} bytes per member ({why}): "
            "it is too small or full (a container's default is 64 MiB: docker run --shm-size)")


class _Shared:
    """``nbytes`` of MPI shared memory per member (collective over the communicator's members):
    ``segments[r]`` is member r's part, mapped here; every member holds a passive-target epoch on
    ``win`` from the start, so that ``Win.Sync`` may order the stores and loads."""

    def __init__(self, comm: LibComm, nbytes: int, what: str) -> None:
        self.label = comm.label
        self.win, self.segments = None, []
        # The node's shared memory (/dev/shm) may be too small (a container's: 64 MiB). Open MPI's
        # Allocate_shared then fails on one rank and leaves the others waiting in it; MPICH's maps
        # the memory before the node has it, and the first store into a page it cannot give ends
        # the process (SIGBUS). So the members agree that there is room (with Open MPI's margin:
        # ``ROOM_FACTOR``), and after allocating, each asks for its pages (``_back``) and they agree
        # again.
        room = _room() >= ROOM_FACTOR * comm.size * (nbytes + ROOM_EXTRA)
        self.short = _agree(comm, 0 if room else errno.ENOSPC, nbytes, what)
        if not self.short:
            # (a window is made on the communicator, not called on it: not a LibComm call; the
            # agreement above is the watched collective every member passed to get here)
            self.win = MPI.Win.Allocate_shared(nbytes, 1, comm=comm.mpi)
            self.win.Lock_all(MPI.MODE_NOCHECK)
            self.segments = [np.frombuffer(self.win.Shared_query(r)[0], dtype=np.uint8) for r in range(comm.size)]
            self.short = _agree(comm, _back(self.segments[comm.rank]), nbytes, what)
            if self.short:
                self.free()

    def free(self) -> None:
        """Free the window (collective over the members); a plan that still holds it raises."""
        if self.win is not None:
            win, self.win, self.segments = self.win, None, []
            win.Unlock_all()
            win.Free()


class NodeWindow(_Shared):
    """One communicator's shared window: ``2 * slot_bytes`` per rank, in two halves.

    Attributes:
        half: the half the next round uses (0 or 1), the same on every member.
        slot_bytes: bytes per rank per half: ``window.slot`` when it was made, rounded down to a
            multiple of 64 (every dtype's), and at least 64 per member (an element of every dtype
            for each).
    """

    def __init__(self, comm: LibComm) -> None:
        self.slot_bytes = max(value("window.slot") // 64 * 64, 64 * comm.size)   # (every dtype's multiple; >= n elements)
        super().__init__(comm, 2 * self.slot_bytes, "shared window")
        self.half = 0
        self.plain = False              # the kind of copy in use (False: streamed)
        self._cost = [0.0, 0.0]         # seconds per byte lately: streamed, plain (0: not measured yet)
        self._copies = 0
        self._last: dict[int, bool] = {}    # where a copy began -> the kind that wrote there last

    def slots(self, rank: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        """Rank ``rank``'s two halves, as arrays of ``dtype``."""
        self.check()
        seg, b = self.segments[rank], self.slot_bytes
        return seg[:b].view(dtype), seg[b:2 * b].view(dtype)

    # -- the steps of a round (recorded by plans; each picks the views of the half in use) ----------
    def check(self) -> None:
        """Raise, rather than touch freed memory, when a plan runs after its communicator was freed."""
        if self.win is None:
            raise CollectiveError(f"{self.label} was freed (or the program is exiting): its shared window is gone",
                                  param="comm")

    def _copy(self, at: int, nbytes: int, pairs: list) -> None:
        """Copy ``(dst, src)`` pairs into the window (``at``: where they begin, ``nbytes``: how many
        bytes; :func:`keyed`), streamed or plain (``PROBE_EVERY``); copies of ``window.probe`` or
        more are counted and timed, smaller ones take the kind in use."""
        timed = nbytes >= value("window.probe")
        k = self._copies % PROBE_EVERY
        plain = self.plain != (timed and k >= PROBE_EVERY - PROBE_LEN)
        t = time.perf_counter()
        copy_pairs(pairs, stream=not plain)
        took = time.perf_counter() - t
        warm = self._last.get(at) == plain
        if len(self._last) > 64:        # (calls of many shapes: forget, rather than grow)
            self._last.clear()
        self._last[at] = plain
        if not timed:
            return
        self._copies += 1
        if warm:
            cost, old = took / nbytes, self._cost[plain]
            self._cost[plain] = 0.75 * old + 0.25 * cost if old else cost
        if k == PROBE_EVERY - 1 and all(self._cost):
            self.plain = self._cost[1] < self._cost[0]

    def put(self, halves: tuple[tuple, tuple]) -> None:
        """Copy this rank's blocks into its slot (``halves``: :func:`keyed`), then make the writes
        visible."""
        self.win.Sync()                # (the peers' reads of this half, a Barrier ago, are over)
        self._copy(*halves[self.half])
        self.win.Sync()

    def reduce(self, rows: tuple[list, list], dt: DType, rop: ReduceOp, out: np.ndarray,
               shared: tuple[tuple, tuple] | None) -> None:
        """Reduce this rank's block from every rank's copy into ``out`` (after a Barrier);
        ``shared`` (:func:`keyed`): also copy the result into the window, where the peers read it
        next (AllReduce)."""
        self.win.Sync()
        reduce_rows(rows[self.half], dt, rop, out)
        if shared is not None:
            self._copy(*shared[self.half])
            self.win.Sync()

    def get(self, pairs: tuple[list, list], stream: bool) -> None:
        """Copy the reduced blocks out (after a Barrier); ``stream``: with streamed stores."""
        self.win.Sync()
        copy_pairs(pairs[self.half], stream)

    def flip(self) -> None:
        self.half ^= 1


def keyed(halves: tuple[list, list]) -> tuple[tuple, tuple]:
    """Each half's ``(dst, src)`` copies into the window as ``(at, nbytes, pairs)``: where they begin
    (the first non-empty destination's address: :meth:`NodeWindow._copy`'s key) and how many bytes
    they write, found once, when the steps are recorded (``ndarray.ctypes`` takes 1.4 us)."""
    return tuple((next((d.ctypes.data for d, _ in pairs if d.size), 0), sum(d.nbytes for d, _ in pairs), pairs)
                 for pairs in halves)


class NodeBuffer(_Shared):
    """An array's memory in a shared window of its own (:func:`node_buffer`), registered on its
    communicator (``LibComm.buffers``); ``base``: where this member's part starts here."""

    def __init__(self, comm: LibComm, nbytes: int) -> None:
        super().__init__(comm, nbytes, "node buffer")
        self.nbytes = nbytes
        self.base = self.segments[comm.rank].ctypes.data if nbytes and not self.short else 0

    def views(self, offset: int, sizes: list[int], dtype: np.dtype) -> list[np.ndarray]:
        """Member r's bytes ``[offset, offset + sizes[r])`` of its part, as flat arrays of ``dtype``."""
        return [seg[offset:offset + b].view(dtype) for seg, b in zip(self.segments, sizes)]

    def sync(self) -> None:
        """``Win.Sync`` (around the Barrier that publishes the members' inputs); raise once freed."""
        if self.win is None:
            raise CollectiveError(f"a node buffer of {self.label} was freed with it: a plan on it cannot run",
                                  param="x")
        self.win.Sync()


def node_buffer(shape: int | tuple, dtype: Any = np.float32, comm: MPI.Comm | None = None,
                comm_domain: str = "") -> np.ndarray:
    """A new array whose memory every member of the communicator can read: pass it (or a
    C-contiguous part of it, at the same place on every rank) as the input of AllReduce, Reduce,
    ReduceScatter or ReduceScatterV, and the ranks reduce straight from each other's arrays instead
    of copying them into the communicator's window first; AllGather(V) and Broadcast copy straight
    from them (docs/shm.md). Collective over the members (a shared window per buffer: allocate a
    few, once, and reuse them); a bad argument on one rank raises on every rank. It lives as long as
    the communicator (the world's: until exit); after that the array points at unmapped memory
    (touching it crashes the process; a plan that reads it in place raises). Where the members span
    several nodes (or the window is off: ``MPICOLL_SHM=0``), an ordinary array. Its content is not
    initialised, but its pages are the node's from the start (asked for at once, so that a node
    whose shared memory, /dev/shm, cannot hold it fails here: every member raises
    ``CollectiveError``, ``param`` "shape", instead of a SIGBUS at the first store).

    Args:
        shape, dtype: the array's (every dtype mpicoll knows).
        comm, comm_domain: the communicator, as an operation's Param names it (default: the world).
    """
    lib = resolve("node_buffer", comm, comm_domain, None, "comm_domain")
    error = None
    try:
        dt = lookup(dtype, op="node_buffer", param="dtype", rank=lib.rank)
        shape = (int(shape),) if np.ndim(shape) == 0 else tuple(int(d) for d in shape)
        if any(d < 0 for d in shape):
            raise arg_error("node_buffer", "shape", shape, lib.rank, "dims must be >= 0")
    except Exception as exc:  # noqa: BLE001 - agreed: every member raises it
        error = as_collective_error(exc, "node_buffer", lib.rank)
    if lib.pending:
        lib.drain(None)
    _agreement.agree(lib, np.zeros(1, dtype=np.int64), error, lib.call_timeout(),
                     ("node_buffer", 0, _agreement.AGREEMENT))
    if not lib.local:                                   # (agreed when the communicator was made)
        return np.empty(shape, dtype=dt.np)
    if len(lib.buffers) >= 0xFFFF:                      # (the same count on every member)
        raise CollectiveError(f"node_buffer: {lib.label} has {len(lib.buffers)} node buffers already, the most "
                              "one communicator holds: reuse them", op="node_buffer", param="shape")
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    buf = NodeBuffer(lib, nbytes)
    if buf.short:
        raise agreed(CollectiveError(f"node_buffer on {lib.label}: {buf.short}", op="node_buffer", param="shape"),
                     lib.world_ranks)
    lib.add_buffer(buf)
    return buf.segments[lib.rank][:nbytes].view(dt.np).reshape(shape)


def ref(comm: LibComm, x: np.ndarray) -> int:
    """The ``H_INFO`` bits that say where ``x`` (C-contiguous) lies in a node buffer of ``comm``:
    ``(offset << 16 | buffer number) << 1``; 0 when it lies in none."""
    if comm.buffers:
        at = x.ctypes.data
        for k, buf in enumerate(comm.buffers, 1):
            if buf.base <= at and at + x.nbytes <= buf.base + buf.nbytes:
                return ((at - buf.base) << 16 | k) << 1
    return 0


def resident(comm: LibComm, table: np.ndarray | None, x: np.ndarray,
             counts: list[int] | None = None) -> tuple[NodeBuffer, list] | None:
    """When every rank's ``x`` is the same place of the same node buffer (the agreed ``table``'s
    ``H_INFO``): that buffer and every rank's ``x`` (flat views; rank r's of ``counts[r]`` elements
    when given, else of x's size); else None."""
    if table is None or not comm.local:
        return None
    refs = table[:, V.H_INFO] >> 1
    if not refs[0] or (refs != refs[0]).any():
        return None
    k, offset = int(refs[0]) & 0xFFFF, int(refs[0]) >> 16
    buf = comm.buffers[k - 1]
    sizes = [x.nbytes] * comm.size if counts is None else [c * x.itemsize for c in counts]
    return buf, buf.views(offset, sizes, x.dtype)


def copies(comm: LibComm, nbytes: int, inputs: tuple[NodeBuffer, list] | None, sizes: tuple[int, float]) -> bool:
    """Whether an AllGather or Broadcast of ``nbytes`` of output copies from node buffers (``sizes``:
    ``nodebuf.gather``, or ``nodebuf.broadcast`` and no upper bound)."""
    return inputs is not None and comm.size > 1 and sizes[0] <= nbytes <= sizes[1]


def publish(go, comm: LibComm, buf: NodeBuffer) -> None:
    """The steps after which every member's node-buffer input is visible to every member:
    ``Win.Sync``, ``Barrier``, ``Win.Sync``."""
    go.local(buf.sync)
    go.mpi(comm, "Barrier")
    go.local(buf.sync)


def gather(go, comm: LibComm, inputs: tuple[NodeBuffer, list], dests: list) -> None:
    """AllGather(V) or Broadcast by copying from the peers' node buffers once: rank r's input into
    ``dests[r]`` (None: nothing of rank r's), between two Barriers: the first publishes the inputs,
    the second keeps them until every rank has copied them."""
    go.took("nodebuf")
    buf, peers = inputs
    pairs = [(d, p) for d, p in zip(dests, peers) if d is not None]
    publish(go, comm, buf)
    go.local(copy_pairs, pairs)
    go.mpi(comm, "Barrier")
