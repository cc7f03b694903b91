"""AllToAllAllGather: AllToAll over an expert-parallel domain, then AllGather over a tensor-parallel one.

The communication of an expert-parallel MoE layer split over ``ep x tp`` ranks: tokens go to the
ranks holding their experts (AllToAll over ep), then every rank of a tensor-parallel group gets the
whole group's tokens (AllGather over tp). One operator on two domains, with two outputs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import _validate as V
from .._params import CommParam
from .._call import Call
from .._plan import Plan
from .._mesh import check_domains, mesh_domains
from ._base import Operation
from ._modes import PREPARE, RUN

__all__ = ["AllToAllAllGatherOperation", "AllToAllAllGatherParam"]


@dataclass
class AllToAllAllGatherParam(CommParam):
    """AllToAllAllGather parameters: the common fields (``comm_domain``/``comm``: the whole ``ep x
    tp`` mesh, default the world) plus its two domains.

    Args:
        group_ep: the expert-parallel domain name (JSON ``groupEp``).
        group_tp: the tensor-parallel domain name; must differ from ``group_ep``.
        ep_world_size, tp_world_size: their sizes (needed to form undeclared domains; checked
            against formed or declared ones).
    """

    group_ep: str = ""
    group_tp: str = ""
    ep_world_size: int | None = None
    tp_world_size: int | None = None


class AllToAllAllGatherOperation(Operation):
    """AllToAll of ``x`` over the ep domain, then AllGather of the result over the tp domain.

    ``x.shape[0]`` must be divisible by the ep size: block j of dim 0 goes to ep-rank j, received
    blocks stacked in source order (``z``, x's shape); then every tp-rank gets every tp-rank's
    ``z``, stacked (``y``, ``[tp, *x.shape]``). Returns ``(z, y)``. Validation agrees over the
    whole mesh (``comm_domain``), so every rank raises the same error.

    Example (2 x 2 mesh, ``m = mpicoll.mesh(2, 2)``; rank r holds ``x = [10r, 10r + 1]``)::

        op = AllToAllAllGatherOperation(AllToAllAllGatherParam(group_ep=m.ep_domain, group_tp=m.tp_domain))
        z, y = op.execute(x)   # rank 0: z = [0, 20], y = [[0, 20], [10, 30]]
    """

    NAME = "AllToAllAllGather"
    PARAM = AllToAllAllGatherParam

    @staticmethod
    def show_params(value: int) -> str:
        return f"ep={value >> 20} x tp={value & 0xFFFFF}"

    def execute(self, x: np.ndarray, out: tuple[np.ndarray, np.ndarray] | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
        """Exchange ``x`` over ep, then gather the result over tp.

        Args:
            x: this rank's input; ``x.shape[0]`` divisible by the ep size; the same shape everywhere.
            out: preallocated outputs ``(z, y)`` of shapes ``x.shape`` and ``[tp, *x.shape]``.

        Returns:
            ``(z, y)``: the AllToAll result and the AllGather of it.
        """
        return self._call((x, out), RUN)

    def prepare(self, x: np.ndarray, out: tuple[np.ndarray, np.ndarray] | None = None) -> Plan:
        """A :class:`~mpicoll.Plan` of ``execute(x, out)``."""
        return self._call((x, out), PREPARE)

    def _bind_param(self) -> None:
        p, op, r = self.param, self.NAME, self.rank
        self._ep, self._tp = mesh_domains(op, r, p.group_ep, p.group_tp, p.ep_world_size, p.tp_world_size)
        check_domains(op, r, self._lib, self._ep, self._tp, p.ep_world_size, p.tp_world_size)
        self._comms = (self._lib, self._ep, self._tp)

    def describe(self, x, out=None) -> Call:
        x, dt, src = self._data(x)
        ep, tp = self._ep.size, self._tp.size
        V.check_dim0(self.NAME, x, ep, self.rank, "the ep size")
        if out is not None and (not isinstance(out, (tuple, list)) or len(out) != 2):
            raise V.arg_error(self.NAME, "out", type(out).__name__, self.rank, "must be a pair (z, y) of arrays")
        z_out, y_out = (None, None) if out is None else out
        z = self._out(z_out, x.shape, x.dtype, x if src is None else src, name="out[0]")
        y = self._out(y_out, (tp, *x.shape), x.dtype, x if src is None else src, name="out[1]")
        call = Call(dt, x, z, x.shape)
        call.src, call.result, call.params, call.args = src, (z, y), ep << 20 | tp, (y,)
        return call

    def issue(self, call, table, go) -> None:
        m, z, (y,) = call.dt.mpi, call.out, call.args
        go.mpi(self._ep, "Alltoall", [call.x, m], [z, m])
        go.mpi(self._tp, "Allgather", [z, m], [y, m])
