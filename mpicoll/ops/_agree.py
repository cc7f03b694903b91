"""The agreement of calls: what the ranks exchange before (or with) the data of a call.

Every agreement on a communicator is one ``Allgather`` of rows of the same width
(:func:`mpicoll._validate.row_width`), whatever the call: an int64 header (:func:`header_row`:
operator, dtype, reduce op, root, shape, the per-peer counts, this rank's facts, its local error
flag), then a slot of ``ride``. A rank whose call fits offers its payload in the slot
(``Operation.ride``); when every rank did, the exchange carried the data too, and each rank computes
its result from the gathered rows (``Operation.land``): one exchange per small call, safety riding
on the data. Either way the gathered headers are checked first (:func:`~mpicoll._validate.check_table`):
every rank holds the same table, so every rank raises the same error, or none does.

A captured graph agrees all its calls at once (:func:`agree_calls`): one such row first (the graph's
mark and how many calls each rank has), then every call's header in one ``Allgatherv``.
"""
from __future__ import annotations

from typing import ClassVar, Protocol

import numpy as np
from mpi4py import MPI

from .. import _trace
from .. import _validate as V
from .._comm import LibComm, op_code
from .._agreement import AGREEMENT, agree, values
from .._errors import CollectiveError, CollectiveMismatchError, agreed, arg_error
from .._numeric import prefix
from .._call import Call
from ._observe import stamp

#: the operation a captured graph's agreement names (its first row), and how it reads in a mismatch
GRAPH = "graph capture"
GRAPH_READS = V.Reads(GRAPH)
#: how the per-peer vectors of a graph's call are named where only the verdict is sought (how a
#: call reads is exchanged for the message: :func:`agree_calls`)
_SOME_PAIRS = ("send[{j}]", "recv[{i}]")


class Agreeing(Protocol):
    """What an agreement reads of the operation whose call it agrees (an ``ops._base.Operation``,
    which sits above this module), and marks on it (``_agreed_once``)."""

    NAME: ClassVar[str]
    CODE: ClassVar[int]
    PAIR_NAMES: ClassVar[tuple[str, str] | None]
    SHAPE_NAME: ClassVar[str]
    timeout: float | None
    _lib: LibComm | None            # (bound: a call's operation has its communicator)
    _validate: bool
    _agreed_once: bool

    def show_params(self, value: int) -> str: ...


class Slots:
    """The buffers of one call's agreement: this rank's row and every rank's (a compiled call keeps
    its own: its row built once, its payload copied in on every call)."""

    __slots__ = ("send", "table", "payload", "header", "rides")

    def __init__(self, lib: LibComm) -> None:
        width, self.header = V.row_width(lib.size), V.H_LEN + 2 * lib.size
        self.send = np.zeros(width, dtype=np.int64)
        self.table = np.empty((lib.size, width), dtype=np.int64)
        self.payload = self.send.view(np.uint8)[self.header * 8:]     # this rank's slot
        self.rides = self.table[:, V.H_RIDE]                           # (every rank's payload bytes, -1: none)

    def offer(self, payload: np.ndarray) -> None:
        """Put ``payload`` (C-contiguous, at most ``ride``) in this rank's slot."""
        size = payload.nbytes
        self.payload[:size] = payload.reshape(-1).view(np.uint8)
        self.send[V.H_RIDE] = size

    @staticmethod
    def rows_of(lib: LibComm, table: np.ndarray, call: Call) -> list[np.ndarray]:
        """Every rank's payload in a gathered ``table``, as 1-D arrays of the call's dtype (views)."""
        at, dtype = (V.H_LEN + 2 * lib.size) * 8, np.uint8 if call.dt is None else call.dt.np
        flat = table.view(np.uint8)
        return [flat[r, at:at + int(table[r, V.H_RIDE])].view(dtype) for r in range(lib.size)]


def header_row(lib: LibComm, op: Agreeing, call: Call | None, err: BaseException | None
               ) -> tuple[np.ndarray, BaseException | None]:
    """The header of one call, and its local error (a value that cannot travel is one). Work queued
    on the communicator starts its collectives first: the sequence number in the row must count them
    on every rank alike, whatever each rank's ``test()`` calls had started already."""
    if lib.pending:
        lib.drain(None)
    try:
        return V.header(lib.size, op.CODE, call, op._validate, 0 if lib.plain else lib.seq), err
    except V.HeaderOverflow as exc:          # a value this rank cannot send is its local error
        what, value = exc.args
        return V.header(lib.size, op.CODE, None, op._validate, 0), err or arg_error(
            op.NAME, what, value, lib.rank, "must fit in a signed 64-bit integer")


def agree_call(lib: LibComm, op: Agreeing, call: Call | None, err: BaseException | None, number: int,
               payload: np.ndarray | None, slots: Slots | None = None) -> tuple[np.ndarray, bool]:
    """Agree one call over ``lib``: one ``Allgather`` of every rank's row (its header, built now,
    and ``payload``, a C-contiguous array of at most ``ride``, or None, in its slot). Every
    rank raises the same error (a local one flagged by any rank, then a mismatch of the gathered
    headers), or every rank gets the same table.

    Returns:
        ``(table, rode)``: the gathered rows (``slots.table``), and whether every rank's payload
        travelled in them (then the call's data has moved: ``Operation.land`` finishes it).
    """
    slots = slots or Slots(lib)
    send = slots.send
    row, err = header_row(lib, op, call, err)
    send[:slots.header] = row
    if payload is None:
        send[V.H_RIDE] = -1
    else:
        slots.offer(payload)
    if _trace.ON:
        stamp(send)
    table = agree(lib, send, err, op.timeout, (op.NAME, number, AGREEMENT), out=slots.table)
    if _trace.ON:
        _trace.NOTE.table = table
    rode = payload is not None and min(slots.rides.tolist()) >= 0
    V.check_agreed(lib, op, table)
    op._agreed_once = True
    return table, rode


def agree_calls(lib: LibComm, entries: list[tuple[Agreeing, Call | None, BaseException | None]],
                timeout: float | None, joins: list[bool]) -> list[tuple[np.ndarray, bool]]:
    """Agree the calls of a captured graph, at once, over ``lib`` (the graph's group): every rank
    sends one row per call (the call's communicator, its rank and size there, a local ``joins``
    bit, and its header row, ``V.header``), gathered from every rank (:func:`exchange_rows`). Then,
    for each communicator the calls run on (in the order the rows name them, the same on every
    rank), the members' subsequences of calls there must match call by call (``V.check_table``):
    every rank raises the same error, naming the first differing call by its index in the graph of
    the lowest rank that has it, or every rank gets, for each of its calls, its header table and its
    ``joins`` bit agreed (true on every member).

    A local error in any rank's calls (raised while it described them) is raised on every rank.
    """
    width = 4 + V.H_LEN + 2 * lib.size
    rows, err = np.zeros((len(entries), width), dtype=np.int64), None
    for i, (op, call, e) in enumerate(entries):
        ol = op._lib
        assert ol is not None               # (a captured call's operation was bound when it was captured)
        row, e = header_row(ol, op, call, e)
        rows[i, :4] = (ol.ident, ol.rank, ol.size, joins[i])
        rows[i, 4:4 + row.size] = row
        err = err or e
    every, counts = exchange_rows(lib, rows, err, timeout)
    try:
        return _check_calls(lib, entries, every, counts, None)
    except CollectiveError:
        pass
    # (every rank holds the same rows: every rank is here, and exchanges how its calls read)
    mine = [V.reading(op, op.NAME, op.PAIR_NAMES, int(r[4 + V.H_PARAMS])) for (op, _, _), r in zip(entries, rows)]
    readings = values(lib, mine, timeout, (GRAPH, 1, V.NAMES_STEP))
    try:
        _check_calls(lib, entries, every, counts, readings)
    except CollectiveError as exc:
        raise agreed(exc, lib.world_ranks) from None
    raise AssertionError("rows that differ once differ again")


def exchange_rows(lib: LibComm, rows: np.ndarray, error: BaseException | None, timeout: float | None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Gather every rank's ``rows`` (``(k, width)`` int64; ``k`` may differ by rank) over ``lib``: one
    agreement row first (the graph's mark, how many rows this rank has, its error flag: a peer
    making another call meets it there, and every rank raises the same mismatch), then the rows
    (``Allgatherv``). A rank's local ``error`` is raised on every rank first (the lowest failing
    rank's, :func:`settle`).

    Returns:
        ``(every, counts)``: all ranks' rows, rank 0's first, and how many each rank sent.
    """
    n, width = lib.size, rows.shape[1]
    where = (GRAPH, 1, "its agreement (internal MPI Allgather/Allgatherv)")
    mark = np.zeros(V.row_width(n), dtype=np.int64)
    mark[V.H_OP], mark[V.H_MODE], mark[V.H_INFO], mark[V.H_RIDE] = op_code(GRAPH), 1, rows.shape[0], -1
    heads = agree(lib, mark, error, timeout, where)
    if len(set(heads[:, V.H_OP].tolist())) > 1:
        V.check_agreed(lib, GRAPH_READS, heads)             # (another call on some rank: named)
    counts = heads[:, V.H_INFO]
    every = np.empty((int(counts.sum()), width), dtype=np.int64)
    sizes = counts * width
    lib.call("Allgatherv", ([np.ascontiguousarray(rows).reshape(-1), MPI.INT64_T],
                            [every, (sizes, prefix(sizes)), MPI.INT64_T]),
             timeout, where)
    return every, counts


def _check_calls(lib: LibComm, entries: list, every: np.ndarray, counts: np.ndarray, readings: list | None
                 ) -> list[tuple[np.ndarray, bool]]:
    """:func:`agree_calls`' comparison of the gathered rows (the same on every rank). ``readings``:
    how every rank's calls read (``readings[rank][call]``, :func:`~mpicoll._validate.reading`), which
    words its errors; None: only the verdict counts."""
    owner = np.repeat(np.arange(lib.size), counts)
    local = np.concatenate([np.arange(c) for c in counts.tolist()]) if len(every) else np.zeros(0, np.int64)
    mine: dict[int, tuple[np.ndarray, bool]] = {}
    for ident in dict.fromkeys(every[:, 0].tolist()):
        sel = np.nonzero(every[:, 0] == ident)[0]
        size = int(every[sel[0], 2])
        on: dict[int, list[int]] = {}
        for k in sel.tolist():
            on.setdefault(int(owner[k]), []).append(k)
        members = sorted(on, key=lambda r: int(every[on[r][0], 1]))          # in the communicator's rank order
        first = min(on)
        where = f"the communicator of world ranks {[lib.world_ranks[r] for r in members]}"

        def read(k: int) -> dict:
            return readings[int(owner[k])][int(local[k])] if readings else {}

        def name_of(k: int) -> str:
            return read(k).get("name") or f"operator #{int(every[k, 4 + V.H_OP])}"
        if len(on) != size:
            k = on[first][0]
            raise CollectiveMismatchError(
                f"graph: graph call {int(local[k])} ({name_of(k)}) runs on a communicator of {size} ranks, but only "
                f"world ranks {[lib.world_ranks[r] for r in members]} captured calls on it: every member must capture "
                "the same calls, in the same order", op="graph", param="captured calls", rank=members[0])
        m = min(len(v) for v in on.values())
        for j in range(m):
            ks = [on[r][j] for r in members]
            table = every[ks, 4:4 + V.H_LEN + 2 * size]
            pairs = read(ks[0]).get("pairs") if readings else _SOME_PAIRS
            V.check_table_of(int(local[on[first][j]]), name_of(on[first][j]), table, pairs and tuple(pairs), where,
                             [read(k) for k in ks] if readings else None)
            if lib.rank in on:
                mine[int(local[on[lib.rank][j]])] = (table, bool(every[ks, 3].all()))
        longer = [r for r in members if len(on[r]) > m]
        if longer:
            k = on[longer[0]][m]
            raise CollectiveMismatchError(
                f"graph: graph call {int(local[k])} ({name_of(k)}) on world rank {lib.world_ranks[longer[0]]} has no "
                f"counterpart on world ranks {[lib.world_ranks[r] for r in members if len(on[r]) == m]} ({where}): "
                "every member must capture the same calls, in the same order", op="graph", param="captured calls",
                rank=longer[0])
    for op, _, _ in entries:
        op._agreed_once = True
    return [mine[i] for i in range(len(entries))]


def uniform(table: np.ndarray) -> bool:
    """Whether every rank sends every rank the same count and packs its blocks in rank order (the
    agreed table's per-peer vectors and ``BIT_PACKED``): an all-to-all may then be MPI's
    ``Alltoall``, about 2x faster than its ``Alltoallv`` in MPICH."""
    sent = V.sent(table).ravel().tolist()
    return sent.count(sent[0]) == len(sent) and all(b & V.BIT_PACKED for b in table[:, V.H_INFO].tolist())
