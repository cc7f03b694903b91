"""THE validation rules: local checks on one rank's arguments, and the cross-rank rules over the
header table that :func:`mpicoll._agreement.agree` gathers.

Header layout (int64, the same length on every rank of a communicator whatever the operator, so
that different operators called on different ranks still meet in one ``Allgather`` and are told
apart instead of deadlocking): the fields ``H_OP`` up to ``H_AGREED`` must be equal on every rank
(a row comparison), among them ``H_MODE``, the operation's ``validate`` (it decides whether a rank
makes this agreement on later calls); ``H_INFO`` carries facts about each rank that the issuer
may read (its layout bits); ``H_RIDE`` the bytes of payload this rank's row carries (-1: none);
``H_TIME`` when this rank arrived, where a trace runs (:mod:`mpicoll._trace`; else 0, not compared);
then two per-peer vectors of ``n`` entries: what this rank sends to each peer and what it expects
from each (the count-pair rule of the V operators).

Every agreement on a communicator of ``n`` members exchanges rows of :func:`row_width` int64: the
header, then a slot of ``ride`` (:mod:`mpicoll._thresholds`) where a small call's payload travels with it
(:mod:`mpicoll.ops._agree`). The width is the communicator's, never the call's: a rank whose call
differs meets its peers in the same ``Allgather``, and nothing can be truncated.
"""
from __future__ import annotations

import math
import zlib
from typing import Any

import numpy as np
from mpi4py import MPI

from . import _env
from . import _agreement
from ._comm import op_code, ordinal
from ._dtypes import ALL_DTYPES, DType, by_code, of_array, reduce_by_code
from ._errors import CollectiveError, CollectiveMismatchError, agreed, arg_error, mismatch_error
from ._thresholds import value

H_FLAG, H_OP, H_DTYPE, H_REDUCE, H_ROOT, H_PARAMS, H_SEQ, H_MODE, H_SIZE, H_NDIM, H_DIMS = range(11)
MAX_DIMS = 8
H_AGREED = H_DIMS + MAX_DIMS       # [H_OP, H_AGREED) must agree on every rank
H_INFO = H_AGREED                  # per-rank facts, not compared (BIT_PACKED: counts packed in rank order)
H_RIDE = H_INFO + 1                # bytes of payload in this rank's slot (-1: none)
H_TIME = H_RIDE + 1                # when this rank arrived (ns, world rank 0's clock), where a trace runs; else 0
H_LEN = H_TIME + 1
BIT_PACKED = 1


def row_width(n: int) -> int:
    """The int64 width of every agreement row on a communicator of ``n`` members."""
    return H_LEN + 2 * n + value("ride") // 8

_BACKENDS = ("mpi", "hccl", "lccl", "nccl")


def validate_default() -> bool:
    """``MPICOLL_VALIDATE`` (default on): 0/false/off/no turn the cross-rank checks off. The members
    of a communicator agree it when mpicoll makes the communicator (:mod:`mpicoll._comm`)."""
    return _env.value("MPICOLL_VALIDATE")


# ----------------------------------------------------------------------------- the header

class Reads:
    """How the header of a call reads in a mismatch message: its operation's name, the names of its
    per-peer vectors (the count-pair rule), what its shape is, how its operator parameters read. An
    operation (``ops._base.Operation``) is one; so are the rows mpicoll agrees for itself (a plan's
    run, a captured graph's mark)."""

    PAIR_NAMES: tuple[str, str] | None = None
    SHAPE_NAME = "x.shape"

    def __init__(self, name: str, show_params: Any = str) -> None:
        self.NAME, self.show_params = name, show_params


#: how the exchange of how the calls read names itself in a timeout (on a mismatch's error path)
NAMES_STEP = "the exchange of its calls' names (internal MPI Allgather/Allgatherv)"
#: the operation a prepared plan's sequence row names (mpicoll._plan._sequenced)
PLAN_RUN = "plan run"
PLAN_READS = Reads(PLAN_RUN, lambda k: f"the {ordinal(k >> 16)} plan made there"
                   + (f", its round {k & 0xFFFF}" if k & 0xFFFF else ""))

class HeaderOverflow(ValueError):
    """A header value that does not fit in int64: ``args = (field name, value)``."""


def header(n: int, code: int, call: Any, validate: bool, seq: int) -> np.ndarray:
    """This rank's header for one call: the fields of ``call`` (a :class:`~mpicoll._call.Call`, or
    None when describing failed: then the error flag is set), the operation's ``validate``, ``seq``
    (the communicator's sequence number where it keeps one, else 0). Built as a list: on tiny
    arrays, numpy's per-call cost is the larger part.

    Raises:
        HeaderOverflow: a value that does not fit in int64 (an operator parameter of 2**63, ...):
            the caller agrees it as this rank's local error.
    """
    if call is None:
        return np.array([1, code, 0, 0, 0, 0, seq, validate] + [0] * (H_RIDE - H_SIZE) + [-1, 0] + [0] * (2 * n),
                        dtype=np.int64)
    shape = call.shape
    if shape is None:
        dims = [0] * (2 + MAX_DIMS)
    else:
        ndim = len(shape)
        if ndim > MAX_DIMS:   # the last slot: a digest of the trailing dims ((.., 2, 3) and (.., 3, 2) differ)
            shape = (*shape[:MAX_DIMS - 1], zlib.crc32(np.asarray(shape[MAX_DIMS - 1:], dtype=np.int64).tobytes()))
        dims = [math.prod(call.shape), ndim, *shape] + [0] * (MAX_DIMS - len(shape))
    row = [0, code, call.dt.code if call.dt is not None else 0, call.reduce.code if call.reduce is not None else 0,
           call.root, call.params, seq, validate, *dims, call.info, -1, 0]
    row += ([*call.send, *call.recv] if call.send is not None else [0] * (2 * n))
    try:
        return np.array(row, dtype=np.int64)
    except OverflowError:
        names = ["flag", "operation", "dtype", "reduce_type", "rank_root", "operator parameters", "sequence",
                 "validate", "size", "ndim"]
        i = next(i for i, v in enumerate(row) if not -2 ** 63 <= int(v) < 2 ** 63)
        what = names[i] if i < len(names) else "a shape or count entry"
        raise HeaderOverflow(what, row[i]) from None


def plan_row(n: int, serial: int, round_: int = 0) -> np.ndarray:
    """The agreement row of a prepared plan's run (or of one round of it): ``PLAN_RUN``, the plan's
    serial number on its communicator of ``n`` members and the round, laid out as a call's
    (no sequence number: which plan runs is what a skipped run changes, and a started run's
    collectives start when its ranks drive it)."""
    row = np.zeros(row_width(n), dtype=np.int64)
    row[H_OP], row[H_PARAMS], row[H_MODE], row[H_RIDE] = op_code(PLAN_RUN), serial << 16 | round_, 1, -1
    return row


def sent(table: np.ndarray) -> np.ndarray:
    """``[i, j]``: what rank i sends to rank j, from a header table."""
    n = table.shape[0]
    return table[:, H_LEN:H_LEN + n]


def expected(table: np.ndarray) -> np.ndarray:
    """``[j, i]``: what rank j expects from rank i, from a header table."""
    n = table.shape[0]
    return table[:, H_LEN + n:H_LEN + 2 * n]


def check_table_of(k: int, op: str, table: np.ndarray, pair_names: tuple[str, str] | None, where: str,
                   readings: list | None = None) -> None:
    """:func:`check_table` of call ``k`` among several (a captured graph): its errors say so."""
    try:
        check_table(op, table, pair_names, where, readings)
    except CollectiveMismatchError as exc:
        raise CollectiveMismatchError(f"graph call {k} ({op}): {exc}", op=exc.op, param=exc.param,
                                      rank=exc.rank) from None


def check_table(op: str, table: np.ndarray, pair_names: tuple[str, str] | None, where: str,
                readings: list | None = None) -> None:
    """The cross-rank rules, identical on every rank: the agreed fields are equal on every row;
    with ``pair_names`` (how to name the two per-peer vectors), what rank j expects from rank i
    equals what rank i sends to rank j, for every pair. ``readings``: how each row's call reads
    (:func:`reading`), which names the fields of the error; without them the verdict is the same,
    its words are not."""
    rows = table[:, H_OP:H_AGREED].tolist()        # (Python lists: faster than numpy on tiny tables)
    if rows.count(rows[0]) != len(rows):
        raise _diagnose(op, table, where, readings)
    if pair_names is not None and not pairs_hold(table):
        send, recv = sent(table).tolist(), expected(table).tolist()
        n = len(send)
        j, i = next((j, i) for j in range(n) for i in range(n) if recv[j][i] != send[i][j])
        send_name, recv_name = (name.format(i=i, j=j) for name in pair_names)
        raise mismatch_error(op, recv_name, f"{recv_name}={recv[j][i]} on rank {j} but rank {i} has "
                             f"{send_name}={send[i][j]}: what rank {j} receives from rank {i} must equal "
                             f"what rank {i} sends to rank {j}", j)


def pairs_hold(table: np.ndarray) -> bool:
    """The count-pair rule of a header table: what rank j expects from rank i equals what rank i
    sends to rank j, for every pair."""
    send = sent(table).tolist()
    return [list(column) for column in zip(*send)] == expected(table).tolist()    # recv[j][i] == send[i][j]


def check_agreed(lib, op: Any, table: np.ndarray, pair_names: tuple[str, str] | None = None) -> None:
    """:func:`check_table` of a table gathered over ``lib``: its error is marked as raised alike by
    every member (``agreed``: one traceback per job). ``op``: how this rank's call reads
    (:class:`Reads`: its operation), or only its name (then ``pair_names``). Where the rows differ,
    the members exchange how their calls read (:func:`reading`: every member holds the same table,
    so every member is on this error path) and name the difference in those words: the same
    message on every member, whatever each has imported."""
    name, pairs = (op, pair_names) if isinstance(op, str) else (op.NAME, op.PAIR_NAMES)
    try:
        check_table(name, table, pairs, lib.label)
        return
    except CollectiveMismatchError:
        pass
    mine = reading(None if isinstance(op, str) else op, name, pairs, int(table[lib.rank, H_PARAMS]))
    readings = _agreement.values(lib, mine, lib.call_timeout(), (name, None, NAMES_STEP))
    try:
        check_table(name, table, pairs, lib.label, readings)
    except CollectiveError as exc:
        raise agreed(exc, lib.world_ranks) from None
    raise AssertionError("a table that differs once differs again")


def reading(op: Any, name: str, pair_names: tuple[str, str] | None, params: int) -> dict:
    """How one rank's call reads (JSON): ``op``'s name, pair names, shape name and its operator
    parameters ``params`` as ``op.show_params`` shows them; ``op`` None: only ``name`` and
    ``pair_names`` are known here."""
    if op is None:
        return {"name": name, "pairs": pair_names}
    return {"name": op.NAME, "pairs": op.PAIR_NAMES, "shape": op.SHAPE_NAME, "params": op.show_params(params)}


def _shape(row: np.ndarray) -> str:
    """The shape in a header row, as text: ``(2, 3)``; beyond MAX_DIMS the leading dims, the number
    of dims, the size and the digest of the trailing dims (all the header holds of them)."""
    ndim = int(row[H_NDIM])
    if ndim > MAX_DIMS:
        lead = ", ".join(str(int(v)) for v in row[H_DIMS:H_DIMS + MAX_DIMS - 1])
        digest = int(row[H_DIMS + MAX_DIMS - 1])
        return f"({lead}, ...) [{ndim} dims, {int(row[H_SIZE])} elements, trailing dims #{digest:08x}]"
    return str(tuple(int(v) for v in row[H_DIMS:H_DIMS + ndim]))


_FIELDS = (
    ("sequence number (MPICOLL_DEBUG or MPICOLL_TIMEOUT)", lambda r: str(int(r[H_SEQ]))),
    ("validate", lambda r: f"validate={bool(r[H_MODE])}"),
    ("dtype", lambda r: by_code(int(r[H_DTYPE])).name if r[H_DTYPE] else "-"),
    ("reduce_type", lambda r: repr(reduce_by_code(int(r[H_REDUCE])).name) if r[H_REDUCE] else "-"),
    ("rank_root", lambda r: str(int(r[H_ROOT]))),
)


def _ranks(rs: list[int]) -> str:
    return f"rank {rs[0]}" if len(rs) == 1 else f"ranks {rs}"


def _diagnose(op: str, table: np.ndarray, where: str, readings: list | None) -> Exception:
    """The error for a table whose agreed fields differ: the first field that differs, with each
    value and the ranks holding it (``dtype differs across ranks: float32 on ranks [0, 2],
    float64 on rank 1``), in the words of the rows' ``readings`` (:func:`check_table`)."""
    rows = list(table)
    said = readings or [{} for _ in rows]
    full = next((x for x in said if "shape" in x), {})     # (the lowest rank that knows how its call reads)
    names = [x.get("name") or f"operator #{int(r[H_OP])}" for x, r in zip(said, rows)]
    params = [x.get("params") or str(int(r[H_PARAMS])) for x, r in zip(said, rows)]
    fields = (("operation", names), *((n, [show(r) for r in rows]) for n, show in _FIELDS),
              ("operator parameters", params), (full.get("shape", "x.shape"), [_shape(r) for r in rows]))
    for name, shown in fields:
        if len(set(shown)) == 1:
            continue
        by: dict[str, list[int]] = {}
        for r, v in enumerate(shown):
            by.setdefault(v, []).append(r)
        detail = "; ".join(f"{v} on {_ranks(rs)}" for v, rs in by.items())
        first_odd = next(r for r, v in enumerate(shown) if v != shown[0])
        if name == "operation":
            ops = " vs ".join(by)
            return mismatch_error(ops, name, f"{detail}, on {where}: every rank must call the same collective, in the "
                                  "same order", first_odd)
        if name.startswith("sequence"):
            detail += f", on {where}: a rank skipped or added a call"
        if name == "validate":
            detail += (f", on {where}: set it alike on every rank (it decides whether a rank makes this agreement "
                       "on later calls)")
        return mismatch_error(op, name, detail, first_odd)
    raise AssertionError("rows differ in no named field")    # (every agreed column has a name above)


# ----------------------------------------------------------------------------- local rules

def check_param(op: str, param, size: int, rank: int) -> None:
    """rank / rank_size / rank_root / backend / comm_mode against the communicator the op runs on."""
    if param.rank is not None and param.rank != -1 and param.rank != rank:
        raise arg_error(op, "rank", param.rank, rank, f"must equal the rank in the communicator ({rank}) or be -1")
    if param.rank_size is not None:
        if param.rank_size == 0:
            raise arg_error(op, "rank_size", 0, rank, "cannot be 0")
        if param.rank_size != size:
            raise arg_error(op, "rank_size", param.rank_size, rank, f"must equal the communicator size ({size})")
    root = param.rank_root
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < size:
        raise arg_error(op, "rank_root", root, rank, f"must be in [0, rank_size={size})")
    if not isinstance(param.backend, str) or param.backend.lower() not in _BACKENDS:
        raise arg_error(op, "backend", param.backend, rank, f"must be one of {_BACKENDS} (all run on MPI)")
    if int(param.comm_mode) == 1:
        if param.comm is None:
            raise arg_error(op, "comm_mode", "MULTI_THREAD", rank, "needs a user comm (as HCCL multi-thread does)")
        if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
            raise arg_error(op, "comm_mode", "MULTI_THREAD", rank, "needs MPI thread level MULTIPLE")
    elif int(param.comm_mode) != 0:
        raise arg_error(op, "comm_mode", param.comm_mode, rank, "must be MULTI_PROCESS or MULTI_THREAD")


def array(op: str, name: str, x: object, rank: int) -> tuple[np.ndarray, DType]:
    """``x`` as an array of a supported dtype (a list becomes one) and its dtype row."""
    if not isinstance(x, np.ndarray):
        try:
            x = np.asarray(x)
        except Exception:  # noqa: BLE001 - anything numpy cannot take
            raise arg_error(op, name, type(x).__name__, rank, "must be a numpy array") from None
    dt = of_array(x)
    if dt is None:
        raise arg_error(op, name + ".dtype", str(x.dtype), rank, f"unsupported; supported: {', '.join(ALL_DTYPES)}")
    return x, dt


def check_out(op: str, out: Any, shape: tuple, dtype: np.dtype, rank: int, x: np.ndarray | None = None,
              in_place_ok: bool = False, name: str = "out") -> np.ndarray:
    """A caller-supplied output buffer (``name``): right shape and dtype, C-contiguous, writable,
    not overlapping x (``in_place_ok``: it may be x itself). Returns it."""
    if not isinstance(out, np.ndarray):
        raise arg_error(op, name, type(out).__name__, rank, "must be a numpy array")
    if out.shape != tuple(shape) or out.dtype != dtype:
        raise arg_error(op, name, f"{out.dtype}{list(out.shape)}", rank, f"must be {dtype}{list(shape)}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise arg_error(op, name, "non-contiguous or read-only", rank, "must be C-contiguous and writable")
    if x is None or (out.base is None and x.base is None and out is not x):   # (each owns its memory)
        return out
    if np.may_share_memory(out, x) and not (in_place_ok and out is x) and np.shares_memory(out, x):
        raise arg_error(op, name, "aliases x", rank,
                        "must not overlap the input" + (" (pass out=x itself for in-place)" if in_place_ok else ""))
    return out


def same_elements(a: Any, b: np.ndarray) -> bool:
    """Whether array ``a`` is exactly the elements of ``b`` (same start, shape, strides, dtype): how
    the nccl-tests in-place forms are recognised (e.g. AllGather's ``x = out[rank]``)."""
    return (isinstance(a, np.ndarray) and a.shape == b.shape and a.dtype == b.dtype and a.strides == b.strides
            and np.may_share_memory(a, b)          # (bounds first: cheap, and false for most calls)
            and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def check_dim0(op: str, x: np.ndarray, n: int, rank: int, size_name: str = "rank_size") -> None:
    if x.ndim < 1:
        raise arg_error(op, "x.shape", x.shape, rank, "needs at least one dimension")
    if x.shape[0] % n:
        raise arg_error(op, "x.shape[0]", x.shape[0], rank, f"must be divisible by {size_name}={n}")


def counts(op: str, name: str, values: object, n: int, rank: int) -> list[int]:
    """A length-n vector of non-negative integers (list, tuple, integer array or any iterable,
    read once) as a list of ints."""
    t = type(values)
    if t is np.ndarray and values.ndim == 1 and values.size == n and values.dtype.kind in "iu":
        lst = values.tolist()                       # (the common cases first, in few tests)
    elif t is list and len(values) == n and set(map(type, values)) <= _INT:
        lst = values[:]
    elif isinstance(values, np.ndarray):
        if values.ndim != 1 or values.size != n:
            raise arg_error(op, name, _short(values), rank, f"must hold exactly rank_size={n} entries")
        if values.size and values.dtype.kind not in "iu":
            raise arg_error(op, name, _short(values), rank, f"entries must be integers, not {values.dtype}")
        lst = values.tolist()
    else:
        try:
            lst = list(values)  # type: ignore[call-overload]
        except TypeError:
            raise arg_error(op, name, values, rank, "must be a sequence of integers") from None
        if len(lst) != n:
            raise arg_error(op, name, _short(lst), rank, f"must hold exactly rank_size={n} entries")
        if not all(type(v) is int for v in lst):      # (plain ints: the common case, one pass)
            for i, v in enumerate(lst):
                if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                    raise arg_error(op, f"{name}[{i}]", v, rank, "entries must be integers")
            lst = [int(v) for v in lst]
    if lst and not 0 <= min(lst) <= max(lst) < 1 << 62:
        i, v = next((i, v) for i, v in enumerate(lst) if not 0 <= v < 1 << 62)
        raise arg_error(op, f"{name}[{i}]", v, rank, "must be >= 0" if v < 0 else "must be < 2**62")
    return lst


_INT = {int}


def scalar_count(op: str, name: str, value: object, rank: int) -> int:
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.reshape(-1)[0]
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise arg_error(op, name, value, rank, "must be an integer")
    if not 0 <= value < 1 << 62:
        raise arg_error(op, name, int(value), rank, "must be >= 0" if value < 0 else "must be < 2**62")
    return int(value)


def check_regions(op: str, counts_name: str, c: list[int], displs_name: str, d: list[int],
                  limit: int, limit_desc: str, rank: int) -> None:
    """Every region ``[d[i], d[i] + c[i])`` lies inside ``[0, limit)``."""
    for i, (ci, di) in enumerate(zip(c, d)):
        if ci + di > limit:
            raise arg_error(op, f"{displs_name}[{i}]+{counts_name}[{i}]", ci + di, rank,
                            f"must be <= {limit_desc}={limit}")


def check_no_overlap(op: str, counts_name: str, c: list[int], displs_name: str, d: list[int], rank: int) -> None:
    """Receive regions may not overlap (MPI leaves such a receive undefined)."""
    order = sorted((di, i) for i, (ci, di) in enumerate(zip(c, d)) if ci)
    for (d0, i), (d1, j) in zip(order, order[1:]):
        if d1 < d0 + c[i]:
            raise arg_error(op, f"{displs_name}[{j}]", d1, rank,
                            f"receive region of peer {j} overlaps that of peer {i} ([{d0}, {d0 + c[i]}))")


def check_layout(op: str, counts_name: str, c: list[int], displs_name: str, d: list[int], limit: int,
                 limit_desc: str, rank: int, receive: bool = False) -> bool:
    """Every block ``[d[i], d[i] + c[i])`` lies inside ``[0, limit)`` and, for a receive layout, no two
    overlap. Returns whether the blocks are packed in rank order (then only their total needs a
    check: the cheap common case, in one pass)."""
    pos = 0
    for ci, di in zip(c, d):
        if di != pos:
            break
        pos += ci
    else:
        if pos <= limit:
            return True
    check_regions(op, counts_name, c, displs_name, d, limit, limit_desc, rank)
    if receive:
        check_no_overlap(op, counts_name, c, displs_name, d, rank)
    return packed(c, d)


def packed(c: list[int], d: list[int]) -> bool:
    """The displacements ``d`` are the exclusive prefix sums of the counts ``c``: blocks packed in
    rank order."""
    pos = 0
    for ci, di in zip(c, d):
        if di != pos:
            return False
        pos += ci
    return True


def _short(values: object) -> object:
    try:
        return list(np.asarray(values).reshape(-1)[:16].tolist())
    except Exception:  # noqa: BLE001 - only for an error message
        return values
