"""THE dtype table and the reduce-op table: numpy dtype <-> MPI datatype, reduce path.

Nothing else in mpicoll maps a numpy dtype to an MPI datatype (the torch backend only maps torch
dtypes onto numpy's; the benchmark's raw baselines name MPI's own types, as a user would). Each
entry says how an array of that dtype travels (``mpi``: the MPI datatype handed to MPI with the
array itself, always explicitly) and how it is reduced:

* ``native``: by MPI itself (integers, float32, float64);
* ``float32``: in numpy (or the optional C kernels) with float32 accumulation, rounded once
  (float16, bfloat16);
* ``logical``: bool (torch's, numpy's ``bool_``), one byte of 0 or 1, reduced by MPI as a logical
  or (SUM, MAX) or a logical and (PROD, MIN), as c10d maps it for NCCL: :meth:`ReduceOp.on`. MPICH has no bfloat16 datatype and its float16 reductions are ~12x slower
  than float32 for the same bytes (measured: docs/benchmark.md), so these travel as their 16-bit patterns
  (``UINT16_T``) and are reduced by mpicoll. No view is needed: given an explicit datatype, mpi4py
  asks numpy for the raw bytes only, not for a buffer format (which bfloat16 has none of).
"""
from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from enum import IntEnum

import numpy as np
from mpi4py import MPI

from ._errors import CollectiveArgumentError


class HcclDataType(IntEnum):
    """The accelerator stack's dtype enum (the Ascend C Hccl API's); accepted wherever a dtype is."""

    INT8 = 0
    INT16 = 1
    INT32 = 2
    FP16 = 3
    FP32 = 4
    INT64 = 5
    UINT64 = 6
    UINT8 = 7
    UINT16 = 8
    UINT32 = 9
    FP64 = 10
    BFP16 = 11


@dataclass(frozen=True, eq=False)
class DType:
    """One row of the dtype table (rows are compared and hashed as themselves: one object each).

    ``np`` is the numpy dtype; a row whose dtype comes from another package (bfloat16, ml_dtypes)
    is given it as a :class:`Later` and gets it at its first use (:meth:`__getattr__`): importing
    ml_dtypes 0.7 takes 0.5-1 s of CPU (measured here, against 0.06 s for 0.6), which every rank of
    every job would pay at ``import mpicoll`` whether it moves bfloat16 or not. An array of that
    dtype can only exist once the package is imported, and then the row finds it (:func:`of_array`).
    """

    name: str
    np: np.dtype
    mpi: MPI.Datatype
    reduce: str          # "native" | "float32" | "logical"
    hccl: HcclDataType | None
    code: int            # small stable id used in cross-rank headers

    def __post_init__(self) -> None:
        later = self.np if isinstance(self.np, Later) else None
        if later is not None:
            _LATE[self] = later.path
            object.__delattr__(self, "np")          # (read through __getattr__ until first used)
        # a plain attribute, not a property: read on every execute, where a property call costs
        # a noticeable part of the Python overhead allowed beside the MPI call
        object.__setattr__(self, "itemsize", later.itemsize if later is not None else self.np.itemsize)
        # a float: its SUM and PROD round, so their bits depend on the order they combine inputs in
        object.__setattr__(self, "floating", self.reduce == "float32" or (later is None and self.np.kind == "f"))

    def __getattr__(self, attr: str):
        # (only for an attribute not set: the numpy dtype of a row whose package is not imported yet)
        if attr != "np" or self not in _LATE:
            raise AttributeError(attr)
        module, _, name = _LATE[self].rpartition(".")
        dtype = np.dtype(getattr(importlib.import_module(module), name))
        object.__setattr__(self, "np", dtype)
        del _LATE[self]
        BY_NP[dtype] = self
        return dtype


@dataclass(frozen=True)
class Later:
    """A numpy dtype of another package, taken at its first use: ``path`` ("module.name") and its
    ``itemsize`` (known before)."""

    path: str
    itemsize: int


#: rows whose numpy dtype is not resolved yet -> "module.name" of it
_LATE: dict[DType, str] = {}


def _row(name, np_dtype, mpi, reduce, hccl):
    return name, np_dtype if isinstance(np_dtype, Later) else np.dtype(np_dtype), mpi, reduce, hccl


_ROWS = [
    _row("int8", np.int8, MPI.INT8_T, "native", HcclDataType.INT8),
    _row("int16", np.int16, MPI.INT16_T, "native", HcclDataType.INT16),
    _row("int32", np.int32, MPI.INT32_T, "native", HcclDataType.INT32),
    _row("int64", np.int64, MPI.INT64_T, "native", HcclDataType.INT64),
    _row("uint8", np.uint8, MPI.UINT8_T, "native", HcclDataType.UINT8),
    _row("uint16", np.uint16, MPI.UINT16_T, "native", HcclDataType.UINT16),
    _row("uint32", np.uint32, MPI.UINT32_T, "native", HcclDataType.UINT32),
    _row("uint64", np.uint64, MPI.UINT64_T, "native", HcclDataType.UINT64),
    _row("float16", np.float16, MPI.UINT16_T, "float32", HcclDataType.FP16),
    _row("bfloat16", Later("ml_dtypes.bfloat16", 2), MPI.UINT16_T, "float32", HcclDataType.BFP16),
    _row("float32", np.float32, MPI.FLOAT, "native", HcclDataType.FP32),
    _row("float64", np.float64, MPI.DOUBLE, "native", HcclDataType.FP64),
    _row("bool", np.bool_, MPI.UINT8_T, "logical", None),
]

DTYPES: dict[str, DType] = {r[0]: DType(*r, code=i + 1) for i, r in enumerate(_ROWS)}
#: numpy dtype -> row (a dict lookup by dtype equality: a dtype that is not a row's, a byte-swapped
#: or structured one included, is not found)
BY_NP: dict[np.dtype, DType] = {d.np: d for d in DTYPES.values() if d not in _LATE}    # (and each late row once used)


_BY_HCCL: dict[int, DType] = {int(d.hccl): d for d in DTYPES.values() if d.hccl is not None}
_BY_CODE: dict[int, DType] = {d.code: d for d in DTYPES.values()}

#: The dtypes every operator supports, in table order (used by check, bench and tests).
ALL_DTYPES: tuple[str, ...] = tuple(DTYPES)
#: The dtypes the accelerator stack's ``HcclDataType`` names (every one but bool): the Hccl client's.
HCCL_DTYPES: tuple[str, ...] = tuple(n for n, d in DTYPES.items() if d.hccl is not None)
#: The 16-bit floats (float16, bfloat16): reduced in float32 (``reduce == "float32"``), the fused operators' dtypes.
HALF_FLOATS: tuple[str, ...] = tuple(n for n, d in DTYPES.items() if d.reduce == "float32")


def of_array(x: np.ndarray) -> DType | None:
    """The table row for an array's dtype, or None when unsupported (hot path: one dict lookup)."""
    return BY_NP.get(x.dtype) or _late(x.dtype)


def _late(dtype: np.dtype) -> DType | None:
    """The row of ``dtype`` among the rows not resolved yet whose package is imported (an array of
    that dtype exists only then), or None."""
    for row, where in list(_LATE.items()):
        if where.rpartition(".")[0] in sys.modules:
            row.np                                   # noqa: B018 - resolves it, into BY_NP
    return BY_NP.get(dtype)


def by_code(code: int) -> DType:
    return _BY_CODE[code]


def lookup(dtype: object, *, op: str = "mpicoll", param: str = "dtype", rank: int = -1) -> DType:
    """Resolve a dtype given as a name, numpy dtype, numpy type or ``HcclDataType``.

    Raises:
        CollectiveArgumentError: unsupported dtype (the message lists the supported ones).
    """
    row = None
    if isinstance(dtype, DType):
        return dtype
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        row = _BY_HCCL.get(int(dtype))
    elif isinstance(dtype, str) and dtype in DTYPES:
        row = DTYPES[dtype]
    else:
        try:
            dtype = np.dtype(dtype)
            row = BY_NP.get(dtype) or _late(dtype)
        except TypeError:
            row = None
    if row is None:
        raise CollectiveArgumentError(
            f"{op}: {param}={dtype!r} on rank {rank}: unsupported dtype; supported: {', '.join(ALL_DTYPES)}",
            op=op, param=param, rank=rank)
    return row


@dataclass(frozen=True)
class ReduceOp:
    """One row of the reduce-op table (the one place reduce ops are named and mapped, for every API:
    the operators' ``reduce_type``, the functional ``op``, torch's ``ReduceOp``)."""

    name: str
    mpi: MPI.Op
    ufunc: np.ufunc
    code: int
    #: it rounds on floats (SUM, PROD, AVG): the order that combines the inputs decides the bits; MAX
    #: and MIN pick one input (which one, for NaN and signed zeros, depends on the code: ops._base.ordered)
    rounds: bool
    #: AVG: the SUM, then divided by the number of ranks in the result's dtype (floating dtypes only)
    average: bool = False

    def __post_init__(self) -> None:
        # the C kernels' number of the operation (mpicoll/_kernels.c: 0 sum, 1 prod, 2 max, 3 min)
        object.__setattr__(self, "kernel", {np.add: 0, np.multiply: 1, np.maximum: 2, np.minimum: 3}.get(self.ufunc, -1))

    def on(self, dt: DType) -> "ReduceOp":
        """The row that reduces ``dt`` (the same name and code, so headers and messages name the op
        as given): bool's SUM and MAX are a logical or, PROD and MIN a logical and (MPI's ``LOR`` /
        ``LAND`` on its bytes); every other dtype's is this row."""
        return _LOGICAL[self.code] if dt.reduce == "logical" else self

    def refuses(self, dt: DType) -> str | None:
        """Why this op cannot reduce ``dt`` (None: it can): AVG takes floating dtypes only, as
        torch's backends do."""
        if self.average and not dt.floating:
            return f"averages floating-point dtypes only, not {dt.name}"
        return None


REDUCE_OPS: dict[str, ReduceOp] = {
    "sum": ReduceOp("sum", MPI.SUM, np.add, 1, True),
    "prod": ReduceOp("prod", MPI.PROD, np.multiply, 2, True),
    "max": ReduceOp("max", MPI.MAX, np.maximum, 3, False),
    "min": ReduceOp("min", MPI.MIN, np.minimum, 4, False),
    "avg": ReduceOp("avg", MPI.SUM, np.add, 5, True, True),
}
_REDUCE_BY_CODE = {r.code: r for r in REDUCE_OPS.values()}
#: bool's rows, by the op's code (:meth:`ReduceOp.on`)
_LOGICAL = {code: ReduceOp(r.name, MPI.LOR if r.ufunc in (np.add, np.maximum) else MPI.LAND,
                           np.logical_or if r.ufunc in (np.add, np.maximum) else np.logical_and, code, False)
            for code, r in _REDUCE_BY_CODE.items() if not r.average}
#: the rule a reduce op breaks (every message that refuses one says it)
REDUCE_RULE = "must be one of 'sum', 'prod', 'max', 'min', 'avg'"
# Names the accelerator stacks (and torch) use for the same operations.
_REDUCE_ALIASES = {"sum": "sum", "prod": "prod", "max": "max", "min": "min", "avg": "avg", "product": "prod",
                   "hccl_reduce_sum": "sum", "hccl_reduce_prod": "prod", "hccl_reduce_max": "max",
                   "hccl_reduce_min": "min", "reduce_sum": "sum", "reduce_prod": "prod",
                   "reduce_max": "max", "reduce_min": "min", "average": "avg", "mean": "avg"}


def reduce_ops_for(dt: DType) -> list[str]:
    """The reduce ops that can reduce ``dt``, in table order (what check, bench and the tests
    iterate)."""
    return [name for name, r in REDUCE_OPS.items() if r.refuses(dt) is None]


class HcclReduceOp(IntEnum):
    """The accelerator stack's reduce-op enum (the Ascend C Hccl API's)."""

    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3


def reduce_op(value: object, *, op: str = "mpicoll", param: str = "reduce_type", rank: int = -1) -> ReduceOp:
    """Resolve "sum"|"prod"|"max"|"min"|"avg" (any case, HCCL spellings, ``HcclReduceOp``).

    Raises:
        CollectiveArgumentError: anything else.
    """
    if type(value) is str and value in REDUCE_OPS:      # (the common case first: a call per collective)
        return REDUCE_OPS[value]
    if isinstance(value, ReduceOp):
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and 0 <= value <= 3:
        value = HcclReduceOp(int(value)).name
    if isinstance(value, str):
        name = _REDUCE_ALIASES.get(value.lower())
        if name is not None:
            return REDUCE_OPS[name]
    raise CollectiveArgumentError(
        f"{op}: {param}={value!r} on rank {rank}: {REDUCE_RULE}",
        op=op, param=param, rank=rank)


def reduce_by_code(code: int) -> ReduceOp:
    return _REDUCE_BY_CODE[code]
