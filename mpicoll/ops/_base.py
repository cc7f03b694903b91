"""The Operation base class, the operator registry and the float32-accumulation reduction path.

An operator subclass supplies ``_prepare`` (normalise the execute arguments, cheaply), ``_check``
(local rules, filling the cross-rank header; validation on only), ``_cross`` (rules over the
gathered header table; validation on only) and ``_run`` (the MPI call). ``execute`` strings them
together; with validation off it is ``_run(*_prepare(...))`` and nothing else.
"""
from __future__ import annotations

import zlib
from typing import Any, ClassVar

import numpy as np
from mpi4py import MPI

from .. import _validate as V
from .._domains import domain, library_comm, rank_table, runtime
from .._dtypes import DType, ReduceOp, reduce_op
from .._errors import CollectiveArgumentError, agree, arg_error, as_collective_error
from .._params import CommParam

#: name -> Operation class, for every registered operator (check, bench and the CLI iterate it).
OPERATIONS: dict[str, type["Operation"]] = {}


class Operation:
    """Base of every ``<Name>Operation``: binds a Param to a communicator and runs ``execute``.

    Args:
        param: the operator's Param (default: all defaults, on the world).
        validate: run the cross-rank checks (default: ``MPICOLL_VALIDATE``, on). Off saves one small
            ``Allgather`` per call; bad input may then hang or give wrong results, as in raw MPI.
    """

    NAME: ClassVar[str] = ""
    PARAM: ClassVar[type[CommParam]] = CommParam
    SAME_SHAPE: ClassVar[bool] = True
    USES_ROOT: ClassVar[bool] = False
    USES_REDUCE: ClassVar[bool] = False
    CODE: ClassVar[int] = 0

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if cls.NAME:
            cls.CODE = zlib.crc32(cls.NAME.encode()) & 0x7FFFFFFF
            OPERATIONS[cls.NAME] = cls
            V.OP_NAMES[cls.CODE] = cls.NAME

    def __init__(self, param: CommParam | None = None, *, validate: bool | None = None) -> None:
        if param is None:
            param = self.PARAM()
        if not isinstance(param, self.PARAM):
            raise CollectiveArgumentError(
                f"{self.NAME}: param is a {type(param).__name__}: must be a {self.PARAM.__name__}", op=self.NAME,
                param="param")
        self.param = param
        self.validate = V.validate_default() if validate is None else bool(validate)
        self.comm: MPI.Comm | None = None
        self.rank = -1
        self.size = 0
        self._param_error: BaseException | None = None

    # -- binding -------------------------------------------------------------------------------------
    def _bind(self) -> None:
        """Resolve the communicator (first execute) and check the param against it."""
        p = self.param
        if p.comm is not None:
            if not isinstance(p.comm, MPI.Comm) or p.comm == MPI.COMM_NULL:
                raise CollectiveArgumentError(f"{self.NAME}: comm={p.comm!r}: must be an mpi4py MPI.Comm",
                                              op=self.NAME, param="comm")
            comm = library_comm(p.comm)
        elif p.comm_domain:
            if not isinstance(p.comm_domain, str):
                raise CollectiveArgumentError(f"{self.NAME}: comm_domain={p.comm_domain!r}: must be a str",
                                              op=self.NAME, param="comm_domain")
            comm = domain(p.comm_domain, p.rank_size)
        else:
            comm = runtime().world
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        try:
            if p.rank_table_file:
                rank_table(p.rank_table_file)
            V.check_param(self.NAME, p, comm)
            self._bind_param()
        except Exception as exc:  # noqa: BLE001 - agreed across ranks at execute
            self._param_error = as_collective_error(exc, self.NAME, self.rank)
        self.comm = comm

    def _bind_param(self) -> None:
        """Operator-specific param checks, once the communicator size is known."""

    def _reduce(self) -> ReduceOp:
        return reduce_op(self.param.reduce_type, op=self.NAME, rank=self.rank)

    # -- execution -----------------------------------------------------------------------------------
    def execute(self, *args: Any, **kwargs: Any) -> Any:
        """Run the operator; see the subclass for its inputs and output."""
        if self.comm is None:
            self._bind()
        if self.validate:
            return self._execute_checked(args, kwargs)
        if self._param_error is not None:
            raise self._param_error
        return self._run(*self._prepare(*args, **kwargs))

    def _execute_checked(self, args: tuple, kwargs: dict) -> Any:
        h = V.header(self.size, self.CODE)
        err, call = self._param_error, None
        if err is None:
            try:
                call = self._prepare(*args, **kwargs)
                call = self._check(call, h) or call
            except Exception as exc:  # noqa: BLE001 - every local failure is agreed, never raised alone
                err = as_collective_error(exc, self.NAME, self.rank)
        table = agree(self.comm, h, err)
        V.check_common(self.NAME, table, same_shape=self.SAME_SHAPE, uses_root=self.USES_ROOT,
                       uses_reduce=self.USES_REDUCE)
        call = self._cross(call, table)
        return self._run(*call)

    def _prepare(self, *args: Any, **kwargs: Any) -> tuple:
        raise NotImplementedError

    def _check(self, call: tuple, h: np.ndarray) -> tuple | None:
        """Local rules; fill the header; may return a normalised call. Default: the first argument
        is the data array."""
        x = call[0]
        dt = V.check_array(self.NAME, "x", x, self.rank)
        V.fill_array(h, x, dt)
        h[V.H_ROOT] = self.param.rank_root
        if self.USES_REDUCE:
            h[V.H_REDUCE] = self._reduce().code

    def _cross(self, call: tuple, table: np.ndarray) -> tuple:
        """Rules over the gathered table; may return a call with a faster plan."""
        return call

    def _run(self, *call: Any) -> Any:
        raise NotImplementedError


def contiguous(x: Any) -> np.ndarray:
    """The array itself when already a C-contiguous ndarray, else a contiguous copy."""
    if type(x) is np.ndarray and x.flags.c_contiguous:
        return x
    return np.ascontiguousarray(x)


def check_out(op: str, out: np.ndarray, shape: tuple, dtype: np.dtype, rank: int, x: np.ndarray | None = None,
              in_place_ok: bool = False) -> None:
    """A caller-supplied output buffer: right shape and dtype, C-contiguous, writable, not aliasing x."""
    if not isinstance(out, np.ndarray):
        raise arg_error(op, "out", type(out).__name__, rank, "must be a numpy array")
    if out.shape != tuple(shape) or out.dtype != dtype:
        raise arg_error(op, "out", f"{out.dtype}{list(out.shape)}", rank, f"must be {dtype}{list(shape)}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise arg_error(op, "out", "non-contiguous or read-only", rank, "must be C-contiguous and writable")
    if x is not None and np.shares_memory(out, x) and not (in_place_ok and out is x):
        raise arg_error(op, "out", "aliases x", rank,
                          "must not overlap the input" + (" (pass out=x itself for in-place)" if in_place_ok else ""))


# ----------------------------------------------------------------------------- float32 reduction path

def split_even(total: int, n: int) -> np.ndarray:
    """Chunk sizes for ``total`` elements over ``n`` ranks: the first ``total % n`` get one more."""
    c = np.full(n, total // n, dtype=np.int64)
    c[: total % n] += 1
    return c


def reduce_chunks(parts: np.ndarray, dt: DType, rop: ReduceOp) -> np.ndarray:
    """Reduce ``parts[i]`` (one row per source rank, 16-bit) in float32, in rank order; round once."""
    acc = parts[0].astype(np.float32)
    for i in range(1, parts.shape[0]):  # a loop over ranks, each step vectorised over the chunk
        rop.ufunc(acc, parts[i], out=acc)
    return acc.astype(dt.np)


def reduce_scatter_f32(comm: MPI.Comm, flat: np.ndarray, dt: DType, rop: ReduceOp, send_counts: np.ndarray,
                       sdispls: np.ndarray | None, recv_count: int) -> np.ndarray:
    """Reduce-scatter for dtypes reduced in float32: AllToAll on the 16-bit wire, then a float32
    accumulation of this rank's chunk from every rank (rank order), rounded once.

    ``sdispls=None`` means packed (block j starts at ``sum(send_counts[:j])``) and uniform counts,
    which takes MPICH's ``Alltoall`` (about 2x faster than ``Alltoallv``). Every rank must make the
    same choice, so callers pass None only when it holds on every rank.
    """
    n = comm.Get_size()
    recv = np.empty((n, recv_count), dtype=dt.np)
    rw = recv.view(dt.wire)
    sw = flat.view(dt.wire)
    if sdispls is None:
        comm.Alltoall([sw, dt.mpi], [rw, dt.mpi])
    else:
        comm.Alltoallv([sw, (send_counts, sdispls), dt.mpi],
                       [rw, (np.full(n, recv_count, dtype=np.int64), np.arange(n, dtype=np.int64) * recv_count),
                        dt.mpi])
    return reduce_chunks(recv, dt, rop)
