"""What the collectives did (docs/trace.md): a trace of every call, and a flight recorder.

**The trace** (``MPICOLL_TRACE=DIR`` for the whole run, or :func:`trace` around a region): each rank
writes one event per call (a collective, a plan's run, a graph's replay, a Hccl task, a
point-to-point message, an async job on its worker's lane) to ``DIR/trace.<world rank>.json``, in
the Chrome trace event format (a JSON array of complete events, ``"ph": "X"``; Perfetto and
chrome://tracing load it, also when a job ended before the file was closed). An event says the
operator, the communicator, the dtype, the bytes, the algorithm its call took (``path``), how long it
took, its outcome, and, where its call agreed (the header exchanged by a validated call), when each
rank arrived: which rank came last, and how long this rank waited for it. Times are
``time.time_ns()`` of each host, less an offset to world rank 0's clock measured when the trace
starts (0 on rank 0's host: the ranks of one host share its clock). Tracing off, a call tests one
module global (:data:`ON`).

**The flight recorder**: every library communicator keeps its last ``MPICOLL_FLIGHT`` calls
(:class:`Ring`: the call's number there, 1 for the first, its operator, whether it ended, and
how: ok or the error's class), which each rank writes to ``MPICOLL_DUMP_DIR`` (:func:`dump`) when a call
times out, when mpicoll aborts the job, when an uncaught error ends it, and when the process gets
``SIGUSR1`` (a live job: ``kill -USR1 <pid>``, or ``mpirun``'s signal forwarding). ``python -m
mpicoll.run trace DIR`` reads both (:mod:`mpicoll._trace_read`).
"""
from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import sys
import threading
import time
import weakref
from typing import Any

import numpy as np
from mpi4py import MPI

from . import _env

#: a trace is being written (the one test a call makes; set by :func:`start`, cleared by :func:`stop`)
ON = False
#: the process ids of the ranks on this host that share a communicator with this one (learnt as the
#: communicators are made: :func:`mpicoll._making.make`), asked to dump with it (:func:`dump_all`)
PEERS: set[int] = set()
#: the communicators' flight recorders, for a dump
RINGS: "weakref.WeakSet[Ring]" = weakref.WeakSet()
_LOCK = threading.Lock()
_WRITER: "_Writer | None" = None
#: this process's clock less world rank 0's, in ns (measured when a trace starts over several hosts)
OFFSET = 0
#: events kept in memory before they are written (a call's event costs a tuple, its JSON is written later)
FLUSH_EVERY = 1 << 16
#: the lanes (threads) events are drawn on: the caller's, then each worker's
_LANES: dict[int, int] = {}
#: what the stages of the calling thread's call noted for its event (``path``, ``table``:
#: mpicoll.ops._observe), where a trace runs
NOTE = threading.local()


# ----------------------------------------------------------------------------- the flight recorder

class Ring:
    """One communicator's last ``size`` calls, written inline by the call's door
    (``ops/_base.Operation._call``: two stores a call): ``entered`` counts the calls begun there
    (the k-th call is number k), ``ended`` is the number of the last one that ended; entry
    ``k % size`` is call k's operator, or ``(operator, error class)`` for a call that failed. A
    recorder of ``size`` 0 (``MPICOLL_FLIGHT=0``) keeps one entry and is never dumped."""

    __slots__ = ("items", "size", "entered", "ended", "label", "world_ranks", "rank", "__weakref__")

    def __init__(self, size: int, label: str, world_ranks: tuple, rank: int) -> None:
        self.items: list = [None] * max(size, 1)
        self.size, self.entered, self.ended = max(size, 1), 0, 0
        self.label, self.world_ranks, self.rank = label, tuple(world_ranks), rank
        if size:
            RINGS.add(self)

    def dumped(self) -> dict:
        """What a dump says of this communicator: its calls kept, oldest first."""
        entered, ended, items = self.entered, self.ended, list(self.items)
        calls = []
        for k in range(max(1, entered - self.size + 1), entered + 1):
            item = items[k % self.size]
            op, outcome = item if isinstance(item, tuple) else (item, "ok" if k <= ended else "in flight")
            calls.append({"seq": k, "op": op, "outcome": outcome})
        return {"label": self.label, "world_ranks": list(self.world_ranks), "rank": self.rank,
                "entered": entered, "ended": ended, "calls": calls}


def flight_size() -> int:
    """``MPICOLL_FLIGHT``: calls each communicator keeps (0: none)."""
    return _env.value("MPICOLL_FLIGHT")


def dump_dir() -> str:
    """Where dumps go: ``MPICOLL_DUMP_DIR``, else ``mpicoll-flight`` in the working directory."""
    return _env.value("MPICOLL_DUMP_DIR") or os.path.join(os.getcwd(), "mpicoll-flight")


def world_rank() -> int:
    """This process's world rank (-1 once MPI is finalized)."""
    return MPI.COMM_WORLD.Get_rank() if MPI.Is_initialized() and not MPI.Is_finalized() else -1


def dump(reason: str) -> str | None:
    """Write this rank's flight recorders (every communicator's last calls) to
    ``<dump dir>/flight.<world rank>.json``; its path (None: it could not be written). Safe to call
    from any thread and from a signal's thread, several times (each dump replaces the last)."""
    flush()                                     # (the trace's events so far, if one runs)
    rank = world_rank()
    body = {"rank": rank, "host": socket.gethostname(), "pid": os.getpid(), "reason": reason,
            "time_us": (time.time_ns() - OFFSET) / 1e3,
            "comms": [r.dumped() for r in list(RINGS)]}
    where = dump_dir()
    path = os.path.join(where, f"flight.{rank}.json")
    try:
        os.makedirs(where, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"   # (a signal's thread may dump meanwhile)
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(body, f)
        os.replace(tmp, path)
    except OSError:
        return None
    return path


def dump_all(reason: str, within: float = 2.0) -> str | None:
    """:func:`dump`, and ask this rank's peers on its host (:data:`PEERS`) to dump theirs too
    (``SIGUSR1``) before the job ends (an abort through mpicoll, an uncaught error): wait up to
    ``within`` seconds for their files. Peers on other hosts dump when their own watchdog fires, or
    on a ``SIGUSR1`` that mpirun forwards."""
    path, t0 = dump(reason), time.time()
    asked = 0
    for pid in PEERS:
        try:
            os.kill(pid, signal.SIGUSR1)
            asked += 1
        except (OSError, AttributeError):     # (gone already; or no SIGUSR1 here)
            pass
    where = dump_dir()
    while asked and time.time() < t0 + within:
        try:
            fresh = sum(os.path.getmtime(os.path.join(where, n)) >= t0 for n in os.listdir(where)
                        if n.startswith("flight.") and n.endswith(".json"))
        except OSError:
            fresh = 0
        if fresh >= asked + (path is not None):
            break
        time.sleep(0.01)
    return path


def dumped_note(reason: str) -> str:
    """Dump, and the words an error adds: where the dumps went (or why not)."""
    path = dump(reason)
    if path is None:
        return f"; the flight recorder could not be written to {dump_dir()}"
    return (f"; each rank's last calls: {os.path.dirname(path)}/flight.<rank>.json "
            f"(python -m mpicoll.run trace {os.path.dirname(path)})")


_SIGNALLED: list = []
#: this process dumps on ``SIGUSR1`` (:func:`on_signal` set it up; a peer asks only such a process:
#: ``SIGUSR1``'s default action ends a process)
LISTENING = False


def on_signal() -> None:
    """Dump on ``SIGUSR1`` (once per process; from the main thread at the first communicator):
    Python runs a handler only between bytecodes of the main thread, so a thread woken by the
    signal (through ``signal.set_wakeup_fd``) dumps while the main thread waits inside MPI."""
    global LISTENING
    if _SIGNALLED or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGUSR1"):
        return
    _SIGNALLED.append(True)
    if signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, None):
        return                                  # (the program's own handler: left alone)
    signal.signal(signal.SIGUSR1, lambda *_: None)      # (the C handler writes the wakeup fd; nothing else)
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except ValueError:
        os.close(r)
        os.close(w)
        return
    if previous != -1:                          # (someone else's, an event loop's: theirs stays)
        signal.set_wakeup_fd(previous)
        os.close(r)
        os.close(w)
        return

    def wait() -> None:
        while True:
            try:
                got = os.read(r, 64)
            except OSError:
                return
            if not got:
                return
            if signal.SIGUSR1 in got:
                path = dump("SIGUSR1")
                if path is not None:
                    sys.stderr.write(f"mpicoll: world rank {world_rank()}: SIGUSR1: the flight recorder is in "
                                     f"{path}\n")
                    sys.stderr.flush()
    threading.Thread(target=wait, name="mpicoll flight recorder", daemon=True).start()
    LISTENING = True


def deaf() -> None:
    """At exit: ignore ``SIGUSR1`` from now on. Python restores its default action (end the
    process) when it finalizes, before ``MPI_Finalize``, which waits for the peers: a peer's late
    request to dump would end this rank, and its ``mpirun`` the whole job, before the failing rank
    has printed its error."""
    if LISTENING:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)


# ----------------------------------------------------------------------------- the trace

class _Writer:
    """The events of this rank, kept as tuples as they come (a call pays for a tuple, not for its
    JSON) and written to ``DIR/trace.<rank>.json`` every :data:`FLUSH_EVERY` events, when a dump
    is written and when the trace stops (a JSON array, closed then)."""

    def __init__(self, where: str, rank: int) -> None:
        os.makedirs(where, exist_ok=True)
        self.path = os.path.join(where, f"trace.{rank}.json")
        self.rank = rank
        self.file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self.file.write("[\n")
        self.count = 0
        self.pending: list[tuple] = []
        self.meta({"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank} "
                                                                              f"({socket.gethostname()})"}})
        self.meta({"name": "process_sort_index", "ph": "M", "pid": rank, "args": {"sort_index": rank}})

    def meta(self, event: dict) -> None:
        self.file.write(json.dumps(event) + ",\n")

    def flush(self) -> None:
        """Write the events kept (under :data:`_LOCK`)."""
        events, self.pending = self.pending, []
        pid, dumps = f', "pid": {self.rank}, "tid": ', json.dumps      # (what json.dumps of the event writes)
        self.file.write("".join(f'{{"name": {quoted(name)}, "cat": {quoted(cat)}, "ph": "X", "ts": {(t0 - OFFSET) / 1e3}, '
                                f'"dur": {(t1 - t0) / 1e3}{pid}{tid}, '
                                f'"args": {dumps(args) if type(args) is dict else args[0](*args[1:])}}},\n'
                                for name, cat, t0, t1, tid, args in events))
        self.file.flush()
        self.count += len(events)

    def close(self) -> None:
        self.flush()
        self.meta({"name": "mpicoll", "ph": "M", "pid": self.rank, "args": {"events": self.count,
                                                                             "clock_offset_ns": OFFSET}})
        self.file.write("{}]\n")
        self.file.close()


def quoted(text: str, _seen: dict[str, str] = {}) -> str:     # noqa: B006 - the cache
    """``json.dumps(text)``, kept: an event's name and its fields' names and dtypes come from a few."""
    q = _seen.get(text)
    if q is None:
        q = _seen[text] = json.dumps(text)
    return q


def lane() -> int:
    """The lane (Chrome ``tid``) of the calling thread: 0 the main thread, 1, 2... others in order."""
    ident = threading.get_ident()
    k = _LANES.get(ident)
    if k is None:
        with _LOCK:
            k = _LANES.setdefault(ident, 0 if threading.current_thread() is threading.main_thread() else
                                  max(_LANES.values(), default=0) + 1)
            if _WRITER is not None:
                _WRITER.meta({"name": "thread_name", "ph": "M", "pid": _WRITER.rank, "tid": k,
                              "args": {"name": threading.current_thread().name}})
    return k


def event(name: str, cat: str, t0: int, t1: int, args: dict | tuple) -> None:
    """Keep one complete event: ``name`` (the operator), ``cat`` (collective, plan, graph, hccl,
    message), from ``t0`` to ``t1`` (``time.time_ns()``), ``args`` its fields: a dict, or
    ``(fn, *facts)`` whose ``fn(*facts)`` makes their JSON object when the event is written."""
    w = _WRITER
    if w is None:
        return
    w.pending.append((name, cat, t0, t1, lane(), args))
    if len(w.pending) >= FLUSH_EVERY:
        flush()


def flush() -> None:
    """Write the trace's events kept so far (before a dump, and every :data:`FLUSH_EVERY`)."""
    with _LOCK:
        if _WRITER is not None:
            _WRITER.flush()


def timed(name: str, cat: str, fields: str, fn: Any) -> Any:
    """``fn()``, and its event: ``fields``, the JSON object of its fields without its closing brace,
    and its outcome (ok, or the error's class)."""
    t0, outcome = time.time_ns(), "ok"
    try:
        return fn()
    except BaseException as exc:
        outcome = type(exc).__name__
        raise
    finally:
        event(name, cat, t0, time.time_ns(), (_closed, fields, outcome))


def _closed(fields: str, outcome: str) -> str:
    return f'{fields}, "outcome": {quoted(outcome)}}}'


def start(where: str, rank: int, offset: int = 0) -> str:
    """Start writing this rank's trace into ``where`` (:func:`trace` and ``MPICOLL_TRACE``); its file."""
    global ON, _WRITER, OFFSET
    with _LOCK:
        if _WRITER is not None:
            _WRITER.close()
        OFFSET = offset
        _WRITER = _Writer(where, rank)
        ON = True
        _LANES.clear()
    return _WRITER.path


def current() -> str | None:
    """The trace file being written (None: none)."""
    w = _WRITER
    return None if w is None else w.path


def clock_offset(comm: MPI.Comm) -> int:
    """This rank's clock less world rank 0's, in ns (collective over ``comm``, the world's
    members): 0 where every rank runs on one host (they share its clock); else from round trips
    with rank 0, the one of least delay kept (good to half of it)."""
    hosts = comm.allgather(socket.gethostname())
    if len(set(hosts)) == 1:
        return 0
    me, buf, best = comm.Get_rank(), np.zeros(1, np.int64), (None, 0)
    for peer in range(1, comm.Get_size()):
        for _ in range(8):
            if me == 0:
                comm.Recv([buf, MPI.INT64_T], peer, 77)
                buf[0] = time.time_ns()
                comm.Send([buf, MPI.INT64_T], peer, 77)
            elif me == peer:
                t0 = time.time_ns()
                comm.Send([buf, MPI.INT64_T], 0, 77)
                comm.Recv([buf, MPI.INT64_T], 0, 77)
                t1 = time.time_ns()
                if best[0] is None or t1 - t0 < best[0]:
                    best = (t1 - t0, (t0 + t1) // 2 - int(buf[0]))
    return best[1]


def from_settings(first: bool, comm: MPI.Comm | None) -> None:
    """``MPICOLL_TRACE``: start this rank's trace at its first library communicator (``first``),
    and measure its clock's offset to world rank 0's when the world's is made (``comm``: its
    members, collective)."""
    where = _env.value("MPICOLL_TRACE")
    if not where:
        return
    global OFFSET
    if first and _WRITER is None:
        start(where, world_rank(), OFFSET)
    if comm is not None:
        OFFSET = clock_offset(comm)


def stop() -> str | None:
    """Stop tracing; the file written (None: none was)."""
    global ON, _WRITER
    with _LOCK:
        ON = False
        w, _WRITER = _WRITER, None
        if w is not None:
            w.close()
    return None if w is None else w.path


atexit.register(stop)
