"""THE validation rules: local checks on one rank's arguments and cross-rank checks on the header
table that :func:`mpicoll._errors.agree` gathers.

Header layout (int64, identical length on every rank of a communicator, whatever the operator, so
that different operators called on different ranks still meet in one ``Allgather`` and are told
apart instead of deadlocking): see the ``H_*`` offsets; the two per-peer vectors ``vec_a`` and
``vec_b`` (``n`` entries each) hold counts for the V operators.
"""
from __future__ import annotations

import os

import numpy as np
from mpi4py import MPI

from ._dtypes import DType, by_code, of_array, reduce_by_code
from ._errors import arg_error, mismatch_error

H_FLAG, H_OP, H_DTYPE, H_REDUCE, H_ROOT, H_SIZE, H_NDIM, H_DIMS = 0, 1, 2, 3, 4, 5, 6, 7
MAX_DIMS = 8
H_SCALAR = H_DIMS + MAX_DIMS       # one op-specific scalar (send_count, recv_count, ...)
H_BITS = H_SCALAR + 1              # op-specific flag bits
H_LEN = 20
BIT_CONTIGUOUS = 1                 # displacements are the packed prefix sums of the counts

_BACKENDS = ("mpi", "hccl", "lccl", "nccl")

#: operator code -> name, filled by Operation subclasses (for "rank 0 called X, rank 1 called Y").
OP_NAMES: dict[int, str] = {}


def validate_default() -> bool:
    """``MPICOLL_VALIDATE`` (default on): 0/false/off/no turn the cross-rank checks off."""
    return os.environ.get("MPICOLL_VALIDATE", "1").strip().lower() not in ("0", "false", "off", "no")


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
    """Size, ndim and up to MAX_DIMS dims (the trailing ones folded into the last slot)."""
    shape = x.shape
    h[H_SIZE] = x.size
    h[H_NDIM] = len(shape)
    if len(shape) > MAX_DIMS:
        shape = (*shape[:MAX_DIMS - 1], x.size // max(1, int(np.prod(shape[:MAX_DIMS - 1]))))
    h[H_DIMS:H_DIMS + len(shape)] = shape


def check_dim0(op: str, x: np.ndarray, n: int, rank: int) -> None:
    if x.ndim < 1:
        raise arg_error(op, "x.shape", x.shape, rank, "needs at least one dimension")
    if x.shape[0] % n:
        raise arg_error(op, "x.shape[0]", x.shape[0], rank, f"must be divisible by rank_size={n}")


def counts(op: str, name: str, values: object, n: int, rank: int) -> np.ndarray:
    """A length-n vector of non-negative integers (list, tuple or int array) as int64."""
    arr = np.asarray(values)
    if arr.ndim != 1 or arr.size != n:
        raise arg_error(op, name, _short(values), rank, f"must hold exactly rank_size={n} entries")
    if arr.size and arr.dtype.kind not in "iu":
        if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        else:
            raise arg_error(op, name, _short(values), rank, "entries must be integers")
    arr = arr.astype(np.int64, copy=False)
    neg = np.flatnonzero(arr < 0)
    if neg.size:
        i = int(neg[0])
        raise arg_error(op, f"{name}[{i}]", int(arr[i]), rank, "must be >= 0")
    return arr


def scalar_count(op: str, name: str, value: object, rank: int) -> int:
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.reshape(-1)[0]
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise arg_error(op, name, value, rank, "must be an integer")
    if value < 0:
        raise arg_error(op, name, int(value), rank, "must be >= 0")
    return int(value)


def check_regions(op: str, counts_name: str, c: np.ndarray, displs_name: str, d: np.ndarray,
                  limit: int, limit_desc: str, rank: int) -> None:
    """Every region ``[d[i], d[i] + c[i])`` lies inside ``[0, limit)``."""
    end = d + c
    bad = np.flatnonzero(end > limit)
    if bad.size:
        i = int(bad[0])
        raise arg_error(op, f"{displs_name}[{i}]+{counts_name}[{i}]", int(end[i]), rank,
                        f"must be <= {limit_desc}={limit}")


def check_no_overlap(op: str, counts_name: str, c: np.ndarray, displs_name: str, d: np.ndarray,
                     rank: int) -> None:
    """Receive regions may not overlap (MPI leaves such a receive undefined)."""
    nz = np.flatnonzero(c > 0)
    if nz.size < 2:
        return
    order = nz[np.argsort(d[nz], kind="stable")]
    clash = np.flatnonzero(d[order[1:]] < d[order[:-1]] + c[order[:-1]])
    if clash.size:
        i, j = int(order[clash[0]]), int(order[clash[0] + 1])
        raise arg_error(op, f"{displs_name}[{j}]", int(d[j]), rank,
                        f"receive region of peer {j} overlaps that of peer {i} "
                        f"([{int(d[i])}, {int(d[i] + c[i])}))")


def is_packed(c: np.ndarray, d: np.ndarray) -> bool:
    """Displacements are the exclusive prefix sums of the counts (data packed in rank order)."""
    return bool(d.size == 0 or (d[0] == 0 and np.array_equal(d[1:], np.cumsum(c[:-1]))))


def _short(values: object) -> object:
    try:
        return list(np.asarray(values).reshape(-1)[:16].tolist())
    except Exception:  # noqa: BLE001 - only for an error message
        return values


# ----------------------------------------------------------------------------- cross-rank rules

def _first_diff(col: np.ndarray) -> int | None:
    diff = np.flatnonzero(col != col[0])
    return int(diff[0]) if diff.size else None


def _shape(row: np.ndarray) -> tuple[int, ...]:
    ndim = int(row[H_NDIM])
    return tuple(int(v) for v in row[H_DIMS:H_DIMS + min(ndim, MAX_DIMS)])


def check_common(op: str, table: np.ndarray) -> None:
    """Operator, dtype, reduce type, root and (optionally) shape agree on every rank.

    The header holds only the fields this operator uses (the others stay 0), so the common case
    is one comparison of the rows' fixed part; the field-by-field diagnosis runs only on a mismatch.
    """
    rows = table[:, H_OP:H_SCALAR].tolist()
    first = rows[0]
    if all(r == first for r in rows):
        return
    r = _first_diff(table[:, H_OP])
    if r is not None:
        names = [OP_NAMES.get(int(c), f"op#{int(c)}") for c in table[:, H_OP]]
        calls = ", ".join(f"rank {i} called {nm}" for i, nm in enumerate(names))
        raise mismatch_error(names[0], "operation", f"{calls}: every rank must call the same collective", r)
    r = _first_diff(table[:, H_DTYPE])
    if r is not None:
        raise mismatch_error(op, "dtype", f"{by_code(int(table[0, H_DTYPE])).name} on rank 0 but "
                             f"{by_code(int(table[r, H_DTYPE])).name} on rank {r}", r)
    r = _first_diff(table[:, H_REDUCE])
    if r is not None:
        raise mismatch_error(op, "reduce_type", f"{reduce_by_code(int(table[0, H_REDUCE])).name!r} on rank 0 "
                             f"but {reduce_by_code(int(table[r, H_REDUCE])).name!r} on rank {r}", r)
    r = _first_diff(table[:, H_ROOT])
    if r is not None:
        raise mismatch_error(op, "rank_root", f"{int(table[0, H_ROOT])} on rank 0 but "
                             f"{int(table[r, H_ROOT])} on rank {r}", r)
    r = next(i for i, row in enumerate(rows) if row != first)
    raise mismatch_error(op, "x.shape", f"{_shape(table[0])} on rank 0 but {_shape(table[r])} on rank {r}", r)


def check_pairs(op: str, sent: np.ndarray, send_name: str, expected: np.ndarray, recv_name: str) -> None:
    """``expected[j, i]`` (what rank j expects from rank i) equals ``sent[i, j]`` (what i sends to j)."""
    if np.array_equal(expected, sent.T):
        return
    bad = np.argwhere(expected != sent.T)
    if bad.size:
        j, i = (int(v) for v in bad[0])
        raise mismatch_error(op, recv_name, f"{recv_name.format(i=i)}={int(expected[j, i])} on rank {j} but "
                             f"rank {i} has {send_name.format(j=j)}={int(sent[i, j])}: what rank {j} receives "
                             f"from rank {i} must equal what rank {i} sends to rank {j}", j)
