"""Scatter: the root's array, split in rank-order blocks of dim 0, one block to each rank."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from .. import _validate as V
from .._params import CommParam
from .._call import Call
from .._plan import Plan
from ._base import Operation
from ._modes import PREPARE, RUN

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
    SHAPE_NAME = "block shape (out.shape; x.shape[0] // rank_size on the root)"

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
