"""Reduce: the element-wise reduction of all ranks' inputs, on the root only."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import _shm
from .._dtypes import DTYPES, reduce_op
from .._golden import (TORCH_OPS, BenchRun, BenchSpec, Case, CheckSpec, bench_data, golden_reduce, rank_data,
                       raw_reduce_type, reduce_case_names, register_bench, register_check, torch_view)
from .._numeric import average, reduce_rows
from .._params import ReduceTypeParam
from .._plan import Call, Plan
from ._base import PREPARE, RUN, ReduceTypeOperation
from .allreduce import reduce_pieces

__all__ = ["ReduceOperation", "ReduceParam"]


@dataclass
class ReduceParam(ReduceTypeParam):
    """Reduce parameters: the common fields (``rank_root`` receives) plus ``reduce_type``."""


class ReduceOperation(ReduceTypeOperation):
    """Element-wise reduction over all ranks into rank ``rank_root``.

    The same reduction as :class:`~mpicoll.AllReduceOperation` (the same paths: 16-bit floats
    accumulate in float32 and round once, integers wrap), gathered on the root only: ``execute``
    returns None on the other ranks.

    Example (4 ranks, root 0, ``x = np.array([rank], np.float32)``)::

        ReduceOperation(ReduceParam(rank_root=0)).execute(x)   # rank 0: [6.]; ranks 1-3: None
    """

    NAME = "Reduce"
    PARAM = ReduceParam
    RESIDES = True

    def execute(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray | None:
        """Reduce ``x`` over all ranks into the root.

        Args:
            x: this rank's input; the same shape and dtype on every rank.
            out: on the root, a preallocated output of x's shape and dtype, or ``x`` itself (in
                place); ignored on the other ranks.

        Returns:
            On the root, ``out`` or a new array; on the other ranks, None.
        """
        return self._call((x, out), RUN)

    def prepare(self, x: np.ndarray, out: np.ndarray | None = None) -> Plan:
        """A :class:`~mpicoll.Plan` of ``execute(x, out)``."""
        return self._call((x, out), PREPARE)

    def _bind_param(self) -> None:
        super()._bind_param()
        self._root = int(self.param.rank_root)

    def describe(self, x, out=None) -> Call:
        x, dt, src = self._data(x)
        root = self.rank == self._root
        if root:
            out = self._out(out, x.shape, x.dtype, x if src is None else src, in_place_ok=src is None)
        call = Call(dt, x, out if root else None, x.shape)
        call.src, call.root, call.reduce = src, self._root, self._reduction(dt)
        if call.reduce.average and root:
            call.after = ((average, out, self.size),)
        if src is None:
            call.info = _shm.ref(self._lib, x)
        return call

    def issue(self, call, table, go) -> None:
        reduce_pieces(go, self._lib, call.x, call.out, call.dt, call.reduce, self._root,
                      _shm.resident(self._lib, table, call.x))

    def ride(self, call):
        return call.x

    def land(self, call, rows, table, go) -> None:
        if call.out is not None:
            go.local(reduce_rows, rows, call.dt, call.reduce, call.out)


# ----------------------------------------------------------------------------- golden check
# Root-only results: the golden is None on every other rank, where execute must return None.

_SHAPES = {"even": lambda n: (4 * n, 3), "uneven": lambda n: (37,), "zero": lambda n: (0,), "scalar": lambda n: (),
           "large": lambda n: (40_003,)}


def _cases(n: int) -> list[str]:
    return [f"{c}:root{r}" for c in reduce_case_names(["even", "uneven"]) for r in range(n)] + \
        ["zero:sum:root0", "scalar:max:root0", f"large:sum:root{n - 1}", "inplace:sum:root0"]


def _case(case, dtype, comm_domain, rank, n, seed, validate=True) -> Case:
    family, rname, root = case.split(":")
    root = int(root.removeprefix("root"))
    dt, rop = DTYPES[dtype], reduce_op(rname)
    shape = _SHAPES.get(family, lambda n: (1000,))(n)
    inputs = [rank_data(seed, f"Reduce/{case}/{dtype}", r, shape, dt) for r in range(n)]
    op = ReduceOperation(ReduceParam(comm_domain=comm_domain, rank_size=n, reduce_type=rname, rank_root=root),
                         validate=validate)
    x = inputs[rank].copy()
    expected = golden_reduce(inputs, dt, rop) if rank == root else None
    return Case(op, (x,), {"out": x} if family == "inplace" else {}, expected)


register_check(CheckSpec("Reduce", _cases, _case))


def _bench(c) -> BenchRun:
    x = bench_data(c.rank, c.count, c.dtype)
    out = np.empty_like(x)
    root = c.root
    op = ReduceOperation(ReduceParam(comm_domain=c.comm_domain, rank_size=c.n, reduce_type=c.reduce.name,
                                     rank_root=root), validate=c.validate)
    raw_t = raw_reduce_type(c.dtype)
    comm, mop = c.comm, c.reduce.mpi
    recv = out if c.rank == root else None
    raw = None if raw_t is None else (lambda: comm.Reduce([x, raw_t], None if recv is None else [recv, raw_t], mop,
                                                          root))
    expected = golden_reduce([bench_data(r, c.count, c.dtype) for r in range(c.n)], c.dtype, c.reduce) \
        if c.rank == root else None

    def torch_call(dist, torch, group):
        work = x.copy()
        t, rop = torch_view(torch, work), getattr(dist.ReduceOp, TORCH_OPS[c.reduce.name])
        return lambda: dist.reduce(t, group_dst=root, op=rop, group=group)
    return BenchRun(op, (x,), expected, kwargs={"out": out}, raw=raw, torch_call=torch_call)


register_bench(BenchSpec("Reduce", _bench, lambda n: 1.0, uses_reduce=True, uses_root=True))
