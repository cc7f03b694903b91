"""Scatter: the root's array, split in rank-order blocks of dim 0, one block to each rank."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from .. import _validate as V
from .._dtypes import DTYPES
from .._golden import BenchRun, BenchSpec, Case, CheckSpec, bench_data, rank_data, register_bench, register_check, \
    torch_view
from .._params import CommParam
from .._plan import Call, Plan
from ._base import PREPARE, RUN, Operation

__all__ = ["ScatterOperation", "ScatterParam"]


@dataclass
class ScatterParam(CommParam):
    """Scatter parameters: the common fields; ``rank_root`` sends."""


class ScatterOperation(Operation):
    """Split the root's ``x`` into ``rank_size`` blocks along dim 0; rank r gets block r.

    Off the root ``x`` is not read (pass None) and ``out`` is required: it gives the block's shape
    and dtype, which must be the same on every rank.

    Example (4 ranks, root 0; on the root ``x = np.arange(8).reshape(4, 2)``)::

        op = ScatterOperation(ScatterParam(rank_root=0))
        op.execute(x)                                  # root: [[0, 1]]
        op.execute(None, out=np.empty((1, 2), int))    # rank 2: [[4, 5]]
    """

    NAME = "Scatter"
    PARAM = ScatterParam

    def execute(self, x: np.ndarray | None, out: np.ndarray | None = None) -> np.ndarray:
        """Receive this rank's block of the root's ``x``.

        Args:
            x: on the root, the array to split (``x.shape[0]`` divisible by rank_size); elsewhere
                not read (None).
            out: this rank's block, shape ``[x.shape[0] // rank_size, *x.shape[1:]]`` and x's dtype;
                required off the root; on the root optional, or x's block ``rank`` itself (in
                place: the root's block stays where it is).

        Returns:
            ``out``, or (on the root) a new array: block ``rank`` of dim 0 of the root's x.
        """
        return self._call((x, out), RUN)

    def prepare(self, x: np.ndarray | None, out: np.ndarray | None = None) -> Plan:
        """A :class:`~mpicoll.Plan` of ``execute(x, out)``."""
        return self._call((x, out), PREPARE)

    def _bind_param(self) -> None:
        self._root = int(self.param.rank_root)

    def describe(self, x, out=None) -> Call:
        if self.rank != self._root:
            if out is None:
                raise V.arg_error(self.NAME, "out", None, self.rank, "required off the root (it gives the block's "
                                  "shape and dtype)")
            out, dt = V.array(self.NAME, "out", out, self.rank)
            out = V.check_out(self.NAME, out, out.shape, out.dtype, self.rank)
            call = Call(dt, None, out, out.shape)
            call.root = self._root
            return call
        x, dt, src = self._data(x)
        V.check_dim0(self.NAME, x, self.size, self.rank)
        k = x.shape[0] // self.size
        block = (k, *x.shape[1:])
        in_place = src is None and V.same_elements(out, x[self.rank * k:(self.rank + 1) * k])
        out = out if in_place else self._out(out, block, x.dtype, x if src is None else src)
        call = Call(dt, x, out, block)
        call.src, call.root, call.info = src, self._root, in_place
        return call

    def issue(self, call, table, go) -> None:
        m, root = call.dt.mpi, self._root
        if call.x is None:
            go.mpi(self._lib, "Scatter", None, [call.out, m], root)
        else:
            go.mpi(self._lib, "Scatter", [call.x, m], MPI.IN_PLACE if call.info else [call.out, m], root)

    def ride(self, call):
        return call.out.reshape(-1)[:0] if call.x is None else call.x

    def land(self, call, rows, table, go) -> None:
        k = call.out.size
        go.local(np.copyto, call.out.reshape(-1), rows[self._root][self.rank * k:(self.rank + 1) * k])


V.SHAPE_NAMES["Scatter"] = "block shape (out.shape; x.shape[0] // rank_size on the root)"


# ----------------------------------------------------------------------------- golden check
# Only the root's input matters: the others pass None and an output of the block's shape.

_SHAPES = {"even": lambda n: (2 * n, 3), "zero": lambda n: (0, 2), "large": lambda n: (25_000 * n,),
           "inplace": lambda n: (3 * n,)}


def _case(case, dtype, comm_domain, rank, n, seed, validate=True) -> Case:
    family, root = case.split(":")
    root = int(root.removeprefix("root"))
    dt = DTYPES[dtype]
    x = rank_data(seed, f"Scatter/{case}/{dtype}", root, _SHAPES[family](n), dt)
    k = x.shape[0] // n
    expected = x[rank * k:(rank + 1) * k].copy()
    op = ScatterOperation(ScatterParam(comm_domain=comm_domain, rank_size=n, rank_root=root), validate=validate)
    if rank != root:
        return Case(op, (None,), {"out": np.empty_like(expected)}, expected)
    return Case(op, (x,), {"out": x[rank * k:(rank + 1) * k]} if family == "inplace" else {}, expected)


register_check(CheckSpec("Scatter", lambda n: [f"even:root{r}" for r in range(n)] + ["zero:root0", f"large:root{n - 1}",
                                                                                     "inplace:root0"], _case))


def _bench(c) -> BenchRun:
    per = c.count // c.n
    root, comm, t = c.root, c.comm, c.dtype.mpi
    x = bench_data(root, c.count, c.dtype) if c.rank == root else None
    out = np.empty(per, dtype=c.dtype.np)
    op = ScatterOperation(ScatterParam(comm_domain=c.comm_domain, rank_size=c.n, rank_root=root), validate=c.validate)
    send = None if x is None else [x, t]
    expected = bench_data(root, c.count, c.dtype)[c.rank * per:(c.rank + 1) * per]

    def torch_call(dist, torch, group):
        o = torch_view(torch, out)
        parts = None if x is None else [torch_view(torch, p) for p in np.split(x, c.n)]
        return lambda: dist.scatter(o, parts, group=group, group_src=root)
    return BenchRun(op, (x,), expected, kwargs={"out": out}, raw=lambda: comm.Scatter(send, [out, t], root),
                    torch_call=torch_call)


register_bench(BenchSpec("Scatter", _bench, lambda n: (n - 1) / n if n else 0, count_multiple=lambda n: n,
                         uses_root=True))
