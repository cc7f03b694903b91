"""The Operation base class, the operator registry and the float32-accumulation reduction path.

One call flows in one straight line (docs/design.md)::

    execute(args) = describe(args) -> [agree: one header Allgather + a row comparison] -> issue(call, table, go)
    prepare(args) = describe(args) ->  agree                                            -> issue(..., Recorder) -> Plan

An operator subclass supplies ``describe`` (local and pure: its arguments -> a
:class:`~mpicoll._plan.Call`, raising on a rule one rank can see) and ``issue`` (the only place that
picks its MPI calls, from the call and, when validated, the agreed header table), and its public
``execute`` / ``prepare`` with its real signature, each one line.
"""
from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from mpi4py import MPI

from .. import _validate as V
from .._comm import OP_NAMES, LibComm, op_code
from .._domains import lib_domain, lookup, rank_table, user_comm, world
from .._dtypes import BY_NP, DType, ReduceOp, reduce_op
from .._errors import CollectiveArgumentError, agree, arg_error, as_collective_error
from .._native import KERNELS
from .._params import CommParam
from .._plan import Call, Plan, Recorder, Runner
from .._watchdog import timeout_default

#: name -> Operation class, for every registered operator (check, bench and the CLI iterate it).
OPERATIONS: dict[str, type["Operation"]] = {}


class Operation:
    """Base of every ``<Name>Operation``: binds a Param to its communicator(s) and runs calls.

    Args:
        param: the operator's Param (default: all defaults, on the world).
        validate: run the cross-rank checks (default: ``MPICOLL_VALIDATE``, on). Off saves one small
            ``Allgather`` per ``execute``; bad input may then hang or give wrong results, as in raw
            MPI. ``prepare`` always checks. Set it alike on every rank.
        timeout: seconds before a collective that some rank never joins raises
            :class:`~mpicoll.CollectiveTimeout` (and, by default, aborts the job); default
            ``MPICOLL_TIMEOUT``, unset = wait forever, as MPI does.
    """

    NAME: ClassVar[str] = ""
    PARAM: ClassVar[type[CommParam]] = CommParam
    CODE: ClassVar[int] = 0
    #: how errors name the per-peer send / expect vectors of the count-pair rule (V operators)
    PAIR_NAMES: ClassVar[tuple[str, str] | None] = None

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if cls.__dict__.get("NAME"):     # (a subclass that keeps its parent's NAME does not replace it)
            cls.CODE = op_code(cls.NAME)
            OPERATIONS[cls.NAME] = cls
            OP_NAMES[cls.CODE] = cls.NAME

    def __init__(self, param: CommParam | None = None, *, validate: bool | None = None,
                 timeout: float | None = None) -> None:
        if param is None:
            param = self.PARAM()
        if not isinstance(param, self.PARAM):
            raise CollectiveArgumentError(
                f"{self.NAME}: param is {type(param).__name__}: must be {self.PARAM.__name__}", op=self.NAME,
                param="param")
        self.param = param
        self.timeout = timeout_default() if timeout is None else (float(timeout) if timeout and timeout > 0 else None)
        self.validate = V.validate_default() if validate is None else bool(validate)
        self._validate_given = validate is not None
        self.comm: MPI.Comm | None = None
        self.rank, self.size = -1, 0
        self._lib: LibComm | None = None
        self._comms: tuple[LibComm, ...] = ()
        self._param_error: BaseException | None = None
        self._runner = Runner(self.NAME, self.timeout)

    # -- binding -------------------------------------------------------------------------------------
    def _bind(self) -> LibComm:
        """Resolve the communicator (first call) and check the param against it. A param error is
        kept, and raised on every rank by the first agreement."""
        lib = self._resolve(self.param.comm, self.param.comm_domain, self.param.rank_size, "comm_domain")
        self.comm, self.rank, self.size = lib.mpi, lib.rank, lib.size
        self._lib, self._comms = lib, (lib,)
        p = self.param
        try:
            if p.comm is not None and p.comm_domain:
                raise arg_error(self.NAME, "comm_domain", p.comm_domain, self.rank,
                                "give either a user comm or a comm_domain, not both")
            if p.rank_table_file:
                rank_table(p.rank_table_file)
            V.check_param(self.NAME, p, self.size, self.rank)
            self._bind_param()
        except Exception as exc:  # noqa: BLE001 - agreed across ranks at the first call
            self._param_error = as_collective_error(exc, self.NAME, self.rank)
        if not self._validate_given:      # the default its members agreed when the communicator was made
            self.validate = lib.validate
        if lib.debug:
            self.validate = True
        return lib

    def _resolve(self, comm: Any, name: Any, rank_size: Any, what: str) -> LibComm:
        """The library communicator for a user comm, else a domain name, else the world."""
        if comm is not None:
            if not isinstance(comm, MPI.Comm) or comm == MPI.COMM_NULL:
                raise CollectiveArgumentError(f"{self.NAME}: comm={comm!r}: must be an mpi4py MPI.Comm",
                                              op=self.NAME, param="comm")
            return user_comm(comm)
        if name:
            if not isinstance(name, str):
                raise CollectiveArgumentError(f"{self.NAME}: {what}={name!r}: must be a str", op=self.NAME,
                                              param=what)
            return lookup(name) or lib_domain(name, rank_size)
        return world()

    def _bind_param(self) -> None:
        """Operator-specific param checks and bindings, once the communicator is known."""

    # -- the call path ---------------------------------------------------------------------------------
    def _execute(self, *args: Any) -> Any:
        """``execute``: describe -> agree (validation on) -> issue, at once."""
        lib = self._lib or self._bind()
        calls = lib.calls                 # (this call's number, as the user counts calls)
        number = calls[self.NAME] = calls.get(self.NAME, 0) + 1
        if len(self._comms) > 1:
            for c in self._comms[1:]:
                c.count(self.NAME)
        if self.validate:
            call, table = self._agreed(args, number)
        else:
            if self._param_error is not None:
                raise self._param_error
            call, table = self.describe(*args), None
        if call.src is not None:
            np.copyto(call.x, call.src)
        self.issue(call, table, self._runner)
        return call.result

    def _prepare(self, *args: Any) -> Plan:
        """``prepare``: describe -> agree (always) -> issue into a Recorder -> a Plan."""
        if self._lib is None:
            self._bind()
        call, table = self._agreed(args, self._count())
        go = Recorder()
        if call.src is not None:
            go.local(np.copyto, call.x, call.src)
        self.issue(call, table, go)
        return Plan(self.NAME, call, go.steps, self._comms, self.timeout)

    def _count(self) -> int:
        """Count this call on each communicator; returns its number on the first."""
        return [c.count(self.NAME) for c in self._comms][0]

    def _agreed(self, args: tuple, number: int) -> tuple[Call | None, np.ndarray]:
        """Describe (a local failure is kept), then agree over the operation's communicator: every
        rank raises the same error, or every rank has the same table."""
        lib, err, call = self._lib, self._param_error, None
        if err is None:
            try:
                call = self.describe(*args)
            except Exception as exc:  # noqa: BLE001 - every local failure is agreed, never raised alone
                err = as_collective_error(exc, self.NAME, self.rank)
        h = V.header(lib.size, self.CODE, call, lib.seq if lib.debug else 0)
        table = agree(lib, h, err, self.timeout, self.NAME, number)
        V.check_table(self.NAME, table, self.PAIR_NAMES, lib.label)
        return call, table

    def describe(self, *args: Any) -> Call:
        """Local and pure: this rank's arguments -> a :class:`~mpicoll._plan.Call`; raise
        :class:`~mpicoll.CollectiveArgumentError` on a rule one rank can see."""
        raise NotImplementedError

    def issue(self, call: Call, table: np.ndarray | None, go: Any) -> None:
        """The MPI calls (``go.mpi``) and local work (``go.local``) of one call, in order. ``table``
        is the agreed header table, or None (validation off): choices that depend on other ranks'
        values may only be made from it."""
        raise NotImplementedError

    # -- describe helpers ------------------------------------------------------------------------------
    def _data(self, x: Any, name: str = "x") -> tuple[np.ndarray, DType, np.ndarray | None]:
        """``(array MPI reads, dtype row, src)``: x itself when C-contiguous, else a buffer of its
        shape that the call refreshes from ``src`` (x) before it runs."""
        if type(x) is np.ndarray and x.flags.c_contiguous and (dt := BY_NP.get(x.dtype)) is not None:
            return x, dt, None                 # (the common case, in one test)
        x, dt = V.array(self.NAME, name, x, self.rank)
        if x.flags.c_contiguous:
            return x, dt, None
        return np.empty(x.shape, dtype=x.dtype), dt, x

    def _out(self, out: Any, shape: tuple, dtype: np.dtype, x: np.ndarray | None = None,
             in_place_ok: bool = False, name: str = "out") -> np.ndarray:
        """``out`` checked against the output's shape and dtype, or a fresh array."""
        if out is None:
            return np.empty(shape, dtype=dtype)
        return V.check_out(self.NAME, out, shape, dtype, self.rank, x, in_place_ok, name)


class ReduceTypeOperation(Operation):
    """An operator with a ``reduce_type``, bound once."""

    def _bind_param(self) -> None:
        self._rop: ReduceOp = reduce_op(self.param.reduce_type, op=self.NAME, rank=self.rank)


# ----------------------------------------------------------------------------- float32 reduction path

def split_even(total: int, n: int) -> np.ndarray:
    """Chunk sizes for ``total`` elements over ``n`` ranks: the first ``total % n`` get one more."""
    c = np.full(n, total // n, dtype=np.int64)
    c[: total % n] += 1
    return c


def prefix(counts) -> np.ndarray:
    """The exclusive prefix sums of ``counts``: packed displacements."""
    return np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)


#: elements per cache tile of the numpy float32 reduction (two float32 tiles stay in L2)
TILE = 1 << 16


def to_f32(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Contiguous 16-bit floats -> float32 ``out`` (the C kernel for float16 when built)."""
    if KERNELS is not None and x.dtype == np.float16:
        KERNELS.f16_to_f32(x, out)
    else:
        np.copyto(out, x.reshape(out.shape))
    return out


def from_f32(acc: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Round a contiguous float32 array into ``out`` (float16 or bfloat16), to nearest even."""
    if KERNELS is not None and out.dtype == np.float16:
        KERNELS.f32_to_f16(acc, out)
    else:
        with np.errstate(over="ignore", invalid="ignore"):   # overflow to inf is the IEEE answer
            np.copyto(out, acc.reshape(out.shape), casting="unsafe")
    return out


def reduce_chunks(parts: np.ndarray, dt: DType, rop: ReduceOp, out: np.ndarray) -> np.ndarray:
    """Reduce ``parts[i]`` (one row per source rank) in rank order into ``out``: integers in their
    own dtype (wrapping, as MPI does), 16-bit floats accumulated in float32 and rounded once.

    With the C kernels: one vectorised pass over the rows, bit-identical to numpy. Otherwise numpy
    tile by tile, so that the float32 accumulator and the converted row stay in cache.
    """
    n, c = parts.shape
    out = out.reshape(-1)
    if dt.reduce == "native":
        if n:
            rop.ufunc.reduce(parts, axis=0, out=out)
        return out
    if KERNELS is not None and n:
        kernel = KERNELS.reduce_f16 if dt.name == "float16" else KERNELS.reduce_bf16
        kernel(parts.view(np.uint16), out.view(np.uint16), n, rop.code - 1)
        return out
    acc = np.empty(min(c, TILE), dtype=np.float32)
    tmp = np.empty_like(acc)
    with np.errstate(over="ignore", invalid="ignore"):   # overflow to inf / NaN are the IEEE answers
        for s in range(0, c, TILE):  # each step is vectorised over a tile and over the ranks' rows
            e = min(s + TILE, c)
            a, t = acc[:e - s], tmp[:e - s]
            np.copyto(a, parts[0, s:e])
            for i in range(1, n):
                np.copyto(t, parts[i, s:e])
                rop.ufunc(a, t, out=a)
            np.copyto(out[s:e], a, casting="unsafe")
    return out


def alltoall_reduce(go: Any, comm: LibComm, flat: np.ndarray, dt: DType, rop: ReduceOp, counts: np.ndarray,
                    displs: np.ndarray | None, out: np.ndarray, recv: np.ndarray | None = None) -> None:
    """Reduce-scatter as an AllToAll of the blocks plus a local reduction of this rank's block from
    every rank (:func:`reduce_chunks`, rank order): 16-bit floats travel as 16 bits and accumulate
    in float32; 8-bit integers reduce in numpy, faster than MPICH's own byte loop for large blocks.

    Block j (``counts[j]`` elements at ``displs[j]`` of ``flat``) goes to rank j; ``out`` receives
    this rank's reduced block (``counts[rank]`` elements). ``displs=None`` means packed and uniform
    counts (``Alltoall``, about 2x faster than ``Alltoallv`` in MPICH): callers pass it only when
    that holds on every rank. ``recv``: scratch of ``n * counts[rank]`` elements, or None (fresh).
    """
    n, c = comm.size, out.size
    recv = np.empty((n, c), dtype=dt.np) if recv is None else recv[:n * c].reshape(n, c)
    if displs is None:
        go.mpi(comm, "Alltoall", [flat, dt.mpi], [recv, dt.mpi])
    else:
        go.mpi(comm, "Alltoallv", [flat, (counts, displs), dt.mpi], [recv, (np.full(n, c), np.arange(n) * c), dt.mpi])
    go.local(reduce_chunks, recv, dt, rop, out)
