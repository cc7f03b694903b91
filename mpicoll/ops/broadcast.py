"""Broadcast: the root's array overwrites every rank's array, in place."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import _shm
from .. import _validate as V
from .._numeric import copy_pairs
from .._params import CommParam
from .._call import Call
from .._plan import Plan
from .._thresholds import value
from .._numeric import pack, scatter_pairs
from ._base import Operation
from ._modes import PREPARE, RUN


__all__ = ["BroadcastOperation", "BroadcastParam"]


@dataclass
class BroadcastParam(CommParam):
    """Broadcast parameters: the common fields; ``rank_root`` is the source."""


class BroadcastOperation(Operation):
    """Copy rank ``rank_root``'s ``x`` into every rank's ``x``, in place.

    Example (4 ranks, root 0, ``x = np.array([[rank]], np.int32)``)::

        BroadcastOperation(BroadcastParam(rank_root=0)).execute(x)   # [[0]] on every rank
    """

    NAME = "Broadcast"
    PARAM = BroadcastParam
    WRITES_X = True
    RESIDES = True

    def execute(self, x: np.ndarray) -> np.ndarray:
        """Fill ``x`` with the root's ``x``.

        Args:
            x: a C-contiguous, writable array of the same shape and dtype on every rank.

        Returns:
            ``x``, filled with the root's data.
        """
        return self._call((x,), RUN)

    def prepare(self, x: np.ndarray) -> Plan:
        """A :class:`~mpicoll.Plan` of ``execute(x)``."""
        return self._call((x,), PREPARE)

    def _bind_param(self) -> None:
        self._root = int(self.param.rank_root)

    def describe(self, x) -> Call:
        if not isinstance(x, np.ndarray) or not x.flags.c_contiguous or not x.flags.writeable:
            raise V.arg_error(self.NAME, "x", type(x).__name__ if not isinstance(x, np.ndarray) else "non-contiguous "
                              "or read-only array", self.rank, "must be a C-contiguous writable numpy array "
                              "(it is filled in place)")
        x, dt = V.array(self.NAME, "x", x, self.rank)
        call = Call(dt, x, x, x.shape)
        call.root, call.info = self._root, _shm.ref(self._lib, x)
        return call

    def issue(self, call, table, go) -> None:
        inputs = _shm.resident(self._lib, table, call.x)
        if _shm.copies(self._lib, call.x.nbytes, inputs, (value("nodebuf.broadcast"), np.inf)):   # node buffers: copied once
            dests = [call.x.reshape(-1) if r == self._root != self.rank else None for r in range(self.size)]
            _shm.gather(go, self._lib, inputs, dests)
            return
        go.mpi(self._lib, "Bcast", [call.x, call.dt.mpi], self._root)

    def ride(self, call):
        flat = call.x.reshape(-1)
        return flat if self.rank == self._root else flat[:0]

    def land(self, call, rows, table, go) -> None:
        if self.rank != self._root:
            go.local(np.copyto, call.x.reshape(-1), rows[self._root])

    def coalesce_key(self, call, exact=True) -> tuple | None:
        if not self._one_issue(BroadcastOperation):
            return None
        return ("Broadcast", self._lib.ident, call.dt.code, self._root)

    def issue_many(self, calls, go) -> None:
        staging = np.empty(sum(c.x.size for c in calls), dtype=calls[0].dt.np)
        xs = [c.x for c in calls]
        if self.rank == self._root:
            go.local(pack, [x.reshape(-1) for x in xs], staging)
        go.mpi(self._lib, "Bcast", [staging, calls[0].dt.mpi], self._root)
        if self.rank != self._root:
            go.local(copy_pairs, scatter_pairs(staging, xs))
