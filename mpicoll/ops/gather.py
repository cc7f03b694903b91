"""Gather: every rank's data, stacked in rank order, on the root only."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._numeric import copy_pairs
from .._params import CommParam
from .._call import Call
from .._plan import Plan
from ._base import Operation
from ._modes import PREPARE, RUN

__all__ = ["GatherOperation", "GatherParam"]


@dataclass
class GatherParam(CommParam):
    """Gather parameters: the common fields; ``rank_root`` receives."""


class GatherOperation(Operation):
    """Gather every rank's ``x`` to rank ``rank_root``, stacked on a new leading axis (as AllGather).

    Only the root gets a result: ``execute`` returns None on the others.

    Example (4 ranks, root 0, ``x = np.array([rank], np.int32)``)::

        GatherOperation(GatherParam(rank_root=0)).execute(x)   # rank 0: [[0], [1], [2], [3]]; others: None
    """

    NAME = "Gather"
    PARAM = GatherParam

    def execute(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray | None:
        """Gather ``x`` from every rank into the root.

        Args:
            x: this rank's input; the same shape and dtype on every rank.
            out: on the root, a preallocated output of shape ``[rank_size, *x.shape]``; ignored on
                the other ranks.

        Returns:
            On the root, ``out`` or a new array (row i is rank i's x); on the other ranks, None.
        """
        return self._call((x, out), RUN)

    def prepare(self, x: np.ndarray, out: np.ndarray | None = None) -> Plan:
        """A :class:`~mpicoll.Plan` of ``execute(x, out)``."""
        return self._call((x, out), PREPARE)

    def _bind_param(self) -> None:
        self._root = int(self.param.rank_root)

    def describe(self, x, out=None) -> Call:
        x, dt, src = self._data(x)
        if self.rank == self._root:
            out = self._out(out, (self.size, *x.shape), x.dtype, x if src is None else src)
        else:
            out = None
        call = Call(dt, x, out, x.shape)
        call.src, call.root = src, self._root
        return call

    def issue(self, call, table, go) -> None:
        m = call.dt.mpi
        go.mpi(self._lib, "Gather", [call.x, m], None if call.out is None else [call.out, m], self._root)

    def ride(self, call):
        return call.x

    def land(self, call, rows, table, go) -> None:
        if call.out is not None:
            go.local(copy_pairs, list(zip(call.out.reshape(self.size, -1), rows)))
