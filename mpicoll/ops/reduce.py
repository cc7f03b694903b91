"""Reduce: the element-wise reduction of all ranks' inputs, on the root only."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import _shm
from .._numeric import average, reduce_rows
from .._params import ReduceTypeParam
from .._call import Call
from .._plan import Plan
from ._base import ReduceTypeOperation
from ._modes import PREPARE, RUN
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
