"""THE validation rules: local checks on one rank's arguments and cross-rank checks on the header
table that :func:`mpicoll._errors.agree` gathers.

Header layout (int64, identical length on every rank of a communicator, whatever the operator, so
that different operators called on different ranks still meet in one ``Allgather`` and are told
apart instead of deadlocking): see the ``H_*`` offsets; the two per-peer vectors ``vec_a`` and
``vec_b`` (``n`` entries each) hold counts for the V operators.
"""
from __future__ import annotations

import os
import zlib

import numpy as np
from mpi4py import MPI

from ._dtypes import DType, by_code, of_array, reduce_by_code
from ._errors import CollectiveArgumentError, arg_error, mismatch_error
from ._native import HALF

H_FLAG, H_OP, H_DTYPE, H_REDUCE, H_ROOT, H_SIZE, H_NDIM, H_DIMS = 0, 1, 2, 3, 4, 5, 6, 7
MAX_DIMS = 8
H_SCALAR = H_DIMS + MAX_DIMS       # one op-specific scalar (send_count, recv_count, ...)
H_BITS = H_SCALAR + 1              # op-specific flag bits
H_SEQ = H_BITS + 1                 # debug mode: this communicator's collective sequence number
H_EXTRA = H_SEQ + 1                # operator-specific parameters that must agree (QuantAllReduce)
H_LEN = 20
BIT_CONTIGUOUS = 1                 # displacements are the packed prefix sums of the counts

_BACKENDS = ("mpi", "hccl", "lccl", "nccl")

#: operator code -> name, filled by Operation subclasses (for "rank 0 called X, rank 1 called Y").
OP_NAMES: dict[int, str] = {}


def validate_default() -> bool:
    """``MPICOLL_VALIDATE`` (default on): 0/false/off/no turn the cross-rank checks off."""
    return os.environ.get("MPICOLL_VALIDATE", "1").strip().lower() not in ("0", "false", "off", "no")


def debug_default() -> bool:
    """``MPICOLL_DEBUG=1``: fingerprint every collective (sequence number included) and report a
    field-by-field diff naming the disagreeing ranks. Implies validation."""
    return os.environ.get("MPICOLL_DEBUG", "0").strip().lower() in ("1", "true", "on", "yes")


#: per library communicator (by handle): how many mpicoll collectives this rank started on it
_SEQ: dict[int, int] = {}


def next_seq(comm: MPI.Comm) -> int:
    key = MPI._handleof(comm)
    _SEQ[key] = seq = _SEQ.get(key, 0) + 1
    return seq


_FIELDS = (("sequence number", H_SEQ, str), ("operation", H_OP, lambda c: OP_NAMES.get(c, f"op#{c}")),
           ("dtype", H_DTYPE, lambda c: by_code(c).name if c else "-"),
           ("reduce_type", H_REDUCE, lambda c: reduce_by_code(c).name if c else "-"), ("rank_root", H_ROOT, str))


def check_fingerprint(op: str, table: np.ndarray, comm: MPI.Comm) -> None:
    """Debug mode: every rank's fingerprint must match; the error names the communicator and the
    sequence number, and lists each differing field with the ranks holding each value
    (``dtype: float32 on ranks [0, 2, 3], float16 on rank [1]``)."""
    rows = table.tolist()
    keys = [r[H_OP:H_SCALAR] + [r[H_SEQ], r[H_EXTRA]] for r in rows]
    if all(k == keys[0] for k in keys):
        return
    check_debug_everywhere(table)
    comm_name = comm.Get_name()
    diffs = []
    for name, col, show in _FIELDS:
        _group(diffs, name, [show(int(r[col])) for r in rows])
    _group(diffs, "x.shape", [_shape(np.asarray(r)) for r in rows])
    _group(diffs, "operator parameters", [str(r[H_EXTRA]) for r in rows])
    if diffs:   # (per-rank counts legitimately differ: the V operators' pair rules judge them)
        first = OP_NAMES.get(int(rows[0][H_OP]), op)
        seqs = {r[H_SEQ] for r in rows}
        where = f"on {comm_name}" + (f" (sequence number {rows[0][H_SEQ]})" if len(seqs) == 1 else "")
        raise mismatch_error(first, "fingerprint", f"{where}: " + "; ".join(diffs), None)


def check_debug_everywhere(table: np.ndarray) -> None:
    """``MPICOLL_DEBUG`` must be set alike on every rank: a debugging rank carries a sequence number
    (>= 1), the others 0. Run on every rank (debugging or not), so that all raise the same error
    instead of the debugging ranks alone."""
    seqs = table[:, H_SEQ].tolist()
    if all(seqs) or not any(seqs):
        return
    on = [r for r, s in enumerate(seqs) if s]
    off = [r for r, s in enumerate(seqs) if not s]
    first = OP_NAMES.get(int(table[0, H_OP]), f"op#{int(table[0, H_OP])}")
    raise mismatch_error(first, "MPICOLL_DEBUG", f"set on rank{'s' if len(on) > 1 else ''} {on} but not on "
                         f"rank{'s' if len(off) > 1 else ''} {off}: set it alike on every rank", off[0])


def _group(diffs: list[str], name: str, values: list[str]) -> None:
    if len(set(values)) > 1:
        by: dict[str, list[int]] = {}
        for r, v in enumerate(values):
            by.setdefault(v, []).append(r)
        diffs.append(f"{name}: " + ", ".join(f"{v} on rank{'s' if len(rs) > 1 else ''} {rs}" for v, rs in by.items()))


def header(n: int, op_code: int) -> np.ndarray:
    h = np.zeros(H_LEN + 2 * n, dtype=np.int64)
    h[H_OP] = op_code
    return h


def vec_a(h: np.ndarray, n: int) -> np.ndarray:
    return h[H_LEN:H_LEN + n]


def vec_b(h: np.ndarray, n: int) -> np.ndarray:
    return h[H_LEN + n:H_LEN + 2 * n]


# ----------------------------------------------------------------------------- local rules

def check_param(op: str, param, comm: MPI.Comm) -> None:
    """rank / rank_size / rank_root / backend / comm_mode against the communicator the op runs on."""
    rank, size = comm.Get_rank(), comm.Get_size()
    if param.rank is not None and param.rank != -1 and param.rank != rank:
        raise arg_error(op, "rank", param.rank, rank, f"must equal the rank in the communicator ({rank}) or be -1")
    if param.rank_size is not None:
        if param.rank_size == 0:
            raise arg_error(op, "rank_size", 0, rank, "cannot be 0")
        if param.rank_size != size:
            raise arg_error(op, "rank_size", param.rank_size, rank,
                            f"must equal the communicator size ({size})")
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


def check_array(op: str, name: str, x: object, rank: int) -> DType:
    """An ndarray of a supported dtype; returns its dtype row."""
    if not isinstance(x, np.ndarray):
        raise arg_error(op, name, type(x).__name__, rank, "must be a numpy array")
    dt = of_array(x)
    if dt is None:
        from ._dtypes import ALL_DTYPES
        raise arg_error(op, name + ".dtype", str(x.dtype), rank, f"unsupported; supported: {', '.join(ALL_DTYPES)}")
    return dt


def fill_shape(h: np.ndarray, x: np.ndarray) -> None:
    """Size, ndim and up to MAX_DIMS dims; beyond that the last slot holds a digest of the trailing
    dims (not their product: ``(.., 2, 3)`` and ``(.., 3, 2)`` must still differ)."""
    if _fill_shape_c is not None and _fill_shape_c(h, x, H_SIZE, MAX_DIMS):
        return
    shape = x.shape
    if len(shape) > MAX_DIMS:
        shape = (*shape[:MAX_DIMS - 1], zlib.crc32(np.asarray(shape[MAX_DIMS - 1:], dtype=np.int64).tobytes()))
    _put_shape(h, H_SIZE, x.size, x.ndim, shape)


def _put_shape(h: np.ndarray, at: int, size: int, ndim: int, dims: tuple) -> None:
    """``h[at] = size``, ``h[at + 1] = ndim``, then the dims: the shape part of a header (the Python
    twin of ``put_shape`` in ``_half.c``)."""
    h[at], h[at + 1] = size, ndim
    h[at + 2:at + 2 + len(dims)] = dims


def check_dim0(op: str, x: np.ndarray, n: int, rank: int) -> None:
    if x.ndim < 1:
        raise arg_error(op, "x.shape", x.shape, rank, "needs at least one dimension")
    if x.shape[0] % n:
        raise arg_error(op, "x.shape[0]", x.shape[0], rank, f"must be divisible by rank_size={n}")


def counts(op: str, name: str, values: object, n: int, rank: int) -> list[int]:
    """A length-n vector of non-negative integers (list, tuple or integer array) as a list.

    Plain Python over n entries: for the rank counts collectives run at, this is several times
    faster than a chain of numpy calls on tiny arrays.
    """
    if isinstance(values, np.ndarray):
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
            raise arg_error(op, name, _short(values), rank, f"must hold exactly rank_size={n} entries")
        for i, v in enumerate(lst):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise arg_error(op, f"{name}[{i}]", v, rank, "entries must be integers")
        lst = [int(v) for v in lst]
    if lst and min(lst) < 0:
        i = next(i for i, v in enumerate(lst) if v < 0)
        raise arg_error(op, f"{name}[{i}]", lst[i], rank, "must be >= 0")
    return lst


def scalar_count(op: str, name: str, value: object, rank: int) -> int:
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.reshape(-1)[0]
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise arg_error(op, name, value, rank, "must be an integer")
    if value < 0:
        raise arg_error(op, name, int(value), rank, "must be >= 0")
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


_ndarray = np.ndarray


def packed_layout(c, d) -> tuple[int, int]:
    """``(total, block)``: ``total`` is ``sum(c)`` when the displacements ``d`` are the exclusive
    prefix sums of the counts ``c`` (data packed in rank order), else -1; ``block`` is the count
    every entry of ``c`` equals, else -1 (whatever ``d`` is). One pass over plain lists: on the
    execute path (``_half.packed_layout`` is the same in C for integer arrays)."""
    if type(c) is _ndarray:
        c = c.tolist()
    if type(d) is _ndarray:
        d = d.tolist()
    block = c[0] if c and c.count(c[0]) == len(c) else -1
    if len(c) != len(d):
        return -1, block
    pos = 0
    for ci, di in zip(c, d):
        if di != pos:
            return -1, block
        pos += ci
    return pos, block


_SEQUENCES = (list, tuple, np.ndarray)


def read_once(values):
    """``values`` itself when it is a list, tuple or array; any other iterable (a generator, ...)
    read once into a list, so that it can be checked and then handed to MPI."""
    return values if type(values) in _SEQUENCES else list(values)


def layout_read_once(c, d) -> tuple:
    """The Python side of a validation-off layout check, for what the C check does not take:
    ``(c, d, total, block)`` with ``c`` and ``d`` read once (:func:`read_once`) and
    :func:`packed_layout` of them."""
    if type(c) not in _SEQUENCES:       # (read_once inline: this runs beside every such call)
        c = list(c)
    if type(d) not in _SEQUENCES:
        d = list(d)
    total, block = packed_layout(c, d)
    return c, d, total, block


def total(c) -> int:
    """``sum(counts)`` for a list or an integer array, without numpy's per-call cost on tiny arrays."""
    return sum(c.tolist()) if isinstance(c, np.ndarray) else sum(c)


def _short(values: object) -> object:
    try:
        return list(np.asarray(values).reshape(-1)[:16].tolist())
    except Exception:  # noqa: BLE001 - only for an error message
        return values


# ----------------------------------------------------------------------------- cross-rank rules

def _first_diff(col: np.ndarray) -> int | None:
    diff = np.flatnonzero(col != col[0])
    return int(diff[0]) if diff.size else None


def _shape(row: np.ndarray) -> str:
    """The shape in a header row, as text: ``(2, 3)``; beyond MAX_DIMS the leading dims, the number
    of dims, the size and the digest of the trailing dims (all the header holds of them)."""
    ndim = int(row[H_NDIM])
    if ndim > MAX_DIMS:
        lead = ", ".join(str(int(v)) for v in row[H_DIMS:H_DIMS + MAX_DIMS - 1])
        digest = int(row[H_DIMS + MAX_DIMS - 1])
        return f"({lead}, ...) [{ndim} dims, {int(row[H_SIZE])} elements, trailing dims #{digest:08x}]"
    return str(tuple(int(v) for v in row[H_DIMS:H_DIMS + ndim]))


def check_common(op: str, table: np.ndarray) -> None:
    """Operator, dtype, reduce type, root and (optionally) shape agree on every rank, and so does
    ``MPICOLL_DEBUG``.

    The header holds only the fields this operator uses (the others stay 0), so the common case
    is one comparison of the rows' fixed part; the field-by-field diagnosis runs only on a mismatch.
    """
    if _first_diff_row is not None and _first_diff_row(table, H_OP, H_SCALAR, H_SEQ, H_EXTRA + 1) == -1:
        return        # (the same fields equal on every row, sequence numbers included: in C, ~0.1 us)
    rows = [r[H_OP:H_SCALAR] + [r[H_EXTRA], r[H_SEQ] > 0] for r in table.tolist()]
    first = rows[0]
    if all(r == first for r in rows):
        return
    check_debug_everywhere(table)
    r = _first_diff(table[:, H_OP])
    if r is not None:
        names = [OP_NAMES.get(int(c), f"op#{int(c)}") for c in table[:, H_OP]]
        calls = ", ".join(f"rank {i} called {nm}" for i, nm in enumerate(names))
        raise mismatch_error(names[0], "operation", f"{calls}: every rank must call the same collective", r)
    shows = (("dtype", H_DTYPE, lambda c: by_code(c).name), ("reduce_type", H_REDUCE, lambda c: repr(reduce_by_code(c).name)),
             ("rank_root", H_ROOT, str), ("operator parameters", H_EXTRA, lambda c: describe_extra(op, c)))
    for name, col, show in shows:
        r = _first_diff(table[:, col])
        if r is not None:
            raise mismatch_error(op, name, f"{show(int(table[0, col]))} on rank 0 but {show(int(table[r, col]))} "
                                 f"on rank {r}", r)
    r = next(i for i, row in enumerate(rows) if row != first)
    raise mismatch_error(op, "x.shape", f"{_shape(table[0])} on rank 0 but {_shape(table[r])} on rank {r}", r)


#: operator name -> how to show its H_EXTRA value in a mismatch message
EXTRA_DESCRIBERS: dict = {}


def describe_extra(op: str, value: int) -> str:
    return EXTRA_DESCRIBERS.get(op, str)(value)


def check_pairs(op: str, table: np.ndarray, sent_at: tuple[int, int], send_name: str,
                expected_at: tuple[int, int], recv_name: str) -> None:
    """What rank j expects from rank i equals what rank i sends to rank j, for every pair.

    Both are read from the header table at ``(offset, step)``: rank i sends ``table[i, s_off + j *
    s_step]`` to rank j, and rank j expects ``table[j, e_off + i * e_step]`` from rank i (step 0: one
    scalar column, the same for every peer).
    """
    n = table.shape[0]
    (so, ss), (eo, es) = sent_at, expected_at
    hit = -2 if _pair_mismatch_c is None else _pair_mismatch_c(table, so, ss, eo, es)
    if hit == -2:
        hit = pair_mismatch(table, so, ss, eo, es)
    if hit < 0:
        return
    j, i = divmod(hit, n)
    sent, expected = int(table[i, so + j * ss]), int(table[j, eo + i * es])
    raise mismatch_error(op, recv_name.format(i=i), f"{recv_name.format(i=i)}={expected} on rank {j} but "
                         f"rank {i} has {send_name.format(j=j)}={sent}: what rank {j} receives "
                         f"from rank {i} must equal what rank {i} sends to rank {j}", j)


def pair_mismatch(table: np.ndarray, so: int, ss: int, eo: int, es: int) -> int:
    """The Python twin of ``_half.pair_mismatch``: ``j * n + i`` for the first pair (j-major) with
    ``table[j, eo + i * es] != table[i, so + j * ss]``, -1 when there is none."""
    n = table.shape[0]
    if n <= 32:   # plain Python beats numpy's per-call cost on small tables
        t = table.tolist()
        return next((j * n + i for j in range(n) for i in range(n) if t[j][eo + i * es] != t[i][so + j * ss]), -1)
    idx = np.arange(n)
    where = np.argwhere(table[:, eo + idx * es] != table[:, so + idx * ss].T)
    return int(where[0, 0]) * n + int(where[0, 1]) if where.size else -1


def overflow_error(op: str, dt, acc, values: np.ndarray, rank: int | None, first_index: int = 0):
    """None, or the error for a checked integer SUM whose exact result leaves ``dt``'s range."""
    info = np.iinfo(dt.np)
    bad = np.flatnonzero((values < info.min) | (values > info.max))
    if not bad.size:
        return None
    i = int(bad[0])
    where = f" (rank {rank}'s block)" if rank is not None else ""
    return CollectiveArgumentError(
        f"{op}: reduce_type='sum' overflows {dt.name}{where}: element {first_index + i} sums to {int(values[i])}, "
        f"outside [{info.min}, {info.max}] ({bad.size} element(s) in all). With validation on, {dt.name} sums are "
        f"accumulated in {acc.name} and never wrap: use a wider dtype, or validation off to wrap as MPI does",
        op=op, param="reduce_type", rank=rank)


# ----------------------------------------------------------------------------- the plain case
#
# The validated ``execute`` of the common operators first asks whether a call is *plain*: x an
# exact, C-contiguous, native ndarray of a table dtype, out absent or a fresh C-contiguous array of
# the right shape and dtype, counts packed in rank order. A plain call fills its header in one step
# (the header ``_check`` would fill for it, no other) and skips ``_check``; every other call takes
# the general path. Both make the same one ``Allgather``, so ranks may mix them. The table is then
# tested in one step; anything but agreement goes through the general path's rules
# (``settle``, ``check_common``), and ``_cross`` always runs (Operation._checked).

def plain_header(x, tmpl: np.ndarray, codes: tuple, dtype_at: int, shape_at: int, max_dims: int):
    """A copy of ``tmpl`` with x's dtype code (and, when ``shape_at >= 0``, its size, ndim and
    shape), or None when x is not plain: the Python twin of ``_half.plain_header``."""
    if type(x) is not np.ndarray or not x.flags.c_contiguous:
        return None
    d = x.dtype
    if d.num >= len(codes) or not d.isnative or d.names is not None or codes[d.num] is None:
        return None
    if shape_at >= 0 and (x.ndim > max_dims or shape_at + 2 + max_dims > tmpl.size):
        return None
    h = tmpl.copy()
    h[dtype_at] = codes[d.num]
    if shape_at >= 0:
        _put_shape(h, shape_at, x.size, x.ndim, x.shape)
    return h


def plain_out(out, x: np.ndarray, shape: tuple) -> bool:
    """``out`` is an exact, C-contiguous, writable ndarray of ``shape`` and x's dtype, not
    overlapping the C-contiguous x: the Python twin of ``_half.plain_out``."""
    return (type(out) is np.ndarray and out.flags.c_contiguous and out.flags.writeable and x.flags.c_contiguous
            and out.shape == shape and out.dtype == x.dtype and not np.may_share_memory(out, x))


def table_agrees(table: np.ndarray) -> bool:
    """Every row equals row 0 in the error flag and the fields ``check_common`` compares (a plain
    rank's own flag is 0, so no rank has an error either); False sends the table to the general
    path's rules, which name what differs. Without the C kernels: always False (those rules run)."""
    return _first_diff_row is not None and _first_diff_row(table, H_FLAG, H_SCALAR, H_SEQ, H_EXTRA + 1) == -1


#: the header-table tests in C (None without the extension: the Python code above then runs alone)
_first_diff_row = getattr(HALF, "first_diff_row", None)
_pair_mismatch_c = getattr(HALF, "pair_mismatch", None)
_fill_shape_c = getattr(HALF, "fill_shape", None)
#: the plain-case tests, in C or their Python twins
plain_header_fn = getattr(HALF, "plain_header", None) or plain_header
plain_out_fn = getattr(HALF, "plain_out", None) or plain_out
