"""AllToAll, AllToAllV and AllToAllVV2: every rank sends a (possibly different) block to every rank."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import _validate as V
from .._errors import CollectiveArgumentError
from .._params import CommParam
from .._call import Call
from .._plan import Plan
from .._numeric import copy_pairs
from ._agree import uniform
from ._base import Operation
from ._modes import PREPARE, RUN


__all__ = ["AllToAllOperation", "AllToAllParam", "AllToAllVOperation", "AllToAllVParam", "AllToAllVV2Operation",
           "AllToAllVV2Param"]


@dataclass
class AllToAllParam(CommParam):
    """AllToAll parameters: the common fields."""


@dataclass
class AllToAllVParam(CommParam):
    """AllToAllV parameters: the common fields plus the plan (JSON ``sendCounts``, ``sdispls``,
    ``recvCounts``, ``rdispls``), one entry per rank, in elements."""

    send_counts: object = None
    sdispls: object = None
    recv_counts: object = None
    rdispls: object = None


@dataclass
class AllToAllVV2Param(CommParam):
    """AllToAllVV2 parameters: the common fields (the plan is an execute input)."""


class AllToAllOperation(Operation):
    """Block j of dim 0 goes to rank j; received blocks are stacked in source-rank order.

    Example (2 ranks, rank r has ``x = [10r, 10r + 1]``)::

        AllToAllOperation(AllToAllParam()).execute(x)   # rank 0: [0, 10], rank 1: [1, 11]
    """

    NAME = "AllToAll"
    PARAM = AllToAllParam

    def execute(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Exchange the blocks of dim 0.

        Args:
            x: this rank's input; ``x.shape[0]`` divisible by rank_size; the same shape everywhere.
            out: a preallocated output of x's shape, or ``x`` itself (in place, as nccl-tests:
                x is read from a copy first).

        Returns:
            ``out``, or a new array of x's shape: block j is rank j's block ``rank``.
        """
        return self._call((x, out), RUN)

    def prepare(self, x: np.ndarray, out: np.ndarray | None = None) -> Plan:
        """A :class:`~mpicoll.Plan` of ``execute(x, out)``."""
        return self._call((x, out), PREPARE)

    def describe(self, x, out=None) -> Call:
        x, dt, src = self._data(x)
        V.check_dim0(self.NAME, x, self.size, self.rank)
        if out is x and src is None:              # in place: the exchange reads a copy of x
            out = V.check_out(self.NAME, out, x.shape, x.dtype, self.rank)
            x, src = np.empty_like(x), x
        else:
            out = self._out(out, x.shape, x.dtype, x if src is None else src)
        call = Call(dt, x, out, x.shape)
        call.src = src
        return call

    def issue(self, call, table, go) -> None:
        m = call.dt.mpi
        go.mpi(self._lib, "Alltoall", [call.x, m], [call.out, m])

    def ride(self, call):
        return call.x

    def land(self, call, rows, table, go) -> None:
        k, me = call.x.size // self.size, self.rank
        go.local(copy_pairs, [(dst, row[me * k:(me + 1) * k]) for dst, row in zip(call.out.reshape(self.size, -1), rows)])


class _AllToAllVBase(Operation):
    """The shared plan rules and MPI call of AllToAllV and AllToAllVV2."""

    PAIR_NAMES = ("send_counts[{j}]", "recv_counts[{i}]")

    def _counts(self, sc, sd, rc, rd) -> tuple[list[int], list[int], list[int], list[int], bool]:
        """The plan's local rules that do not depend on x; the plan, and whether its receive side
        is packed in rank order."""
        op, r, n = self.NAME, self.rank, self.size
        sc = V.counts(op, "send_counts", sc, n, r)
        sd = V.counts(op, "sdispls", sd, n, r)
        rc = V.counts(op, "recv_counts", rc, n, r)
        rd = V.counts(op, "rdispls", rd, n, r)
        packed = V.check_layout(op, "recv_counts", rc, "rdispls", rd, sum(rc), "sum(recv_counts)", r, receive=True)
        return sc, sd, rc, rd, packed

    def _v_call(self, x, plan, infer_shape, out) -> Call:
        x, dt, src = self._data(x)
        sc, sd, rc, rd, recv_packed = plan
        total = sum(rc)
        send_packed = V.check_layout(self.NAME, "send_counts", sc, "sdispls", sd, x.size, "x.size", self.rank)
        if infer_shape is not None and np.size(infer_shape) != total:
            raise V.arg_error(self.NAME, "infer_shape.size", int(np.size(infer_shape)), self.rank,
                              f"must equal sum(recv_counts)={total}")
        out = self._out(out, (1, total), x.dtype, x if src is None else src)
        packed = send_packed and recv_packed
        call = Call(dt, x, out)
        call.src, call.send, call.recv, call.args = src, sc, rc, plan
        call.info = V.BIT_PACKED if packed else 0
        return call

    def issue(self, call, table, go) -> None:
        x, out, m, (sc, sd, rc, rd, _) = call.x, call.out, call.dt.mpi, call.args
        # Every rank sending the same count to every rank, packed on every rank (a fact of the agreed
        # table, so every rank makes this choice): MPICH's Alltoall, ~2x faster than its Alltoallv.
        # Not agreed (validation off): the Alltoallv the call describes, as raw code makes it.
        if self._uniform(table):
            go.mpi(self._lib, "Alltoall", [x.reshape(-1)[:out.size], m], [out, m])
        else:
            go.mpi(self._lib, "Alltoallv", [x, (sc, sd), m], [out, (rc, rd), m])

    def _uniform(self, table: np.ndarray | None) -> bool:
        """Whether this call's counts are uniform and packed on every rank (:func:`~._agree.uniform`;
        not agreed: unknown)."""
        return table is not None and uniform(table)

    def ride(self, call):
        sc, sd = call.args[0], call.args[1]
        if call.info & V.BIT_PACKED or V.packed(sc, sd):
            return call.x.reshape(-1)[:sum(sc)]
        return None                                 # (a gapped send: Alltoallv)

    def land(self, call, rows, table, go) -> None:
        flat, (_, _, rc, rd, _), me, unit = call.out.reshape(-1), call.args, self.rank, call.unit
        sent = V.sent(table).tolist()               # (what each rank sends each rank: its block for me within)
        go.local(copy_pairs, [(flat[d:d + c], row[sum(s[:me]) * unit:sum(s[:me]) * unit + c])
                              for c, d, row, s in zip(rc, rd, rows, sent)])


class AllToAllVOperation(_AllToAllVBase):
    """All-to-all with per-peer counts and displacements fixed in the Param.

    For every source i, ``x_i.flat[sdispls_i[me] : sdispls_i[me] + send_counts_i[me]]`` lands at
    ``out.flat[rdispls[i] : rdispls[i] + recv_counts[i]]``. ``recv_counts[i]`` must equal rank i's
    ``send_counts[me]``. With validation on (and in plans) uniform packed counts run MPI's
    ``Alltoall``.

    Example: see :class:`AllToAllVV2Operation` (the same plan, given in the Param).
    """

    NAME = "AllToAllV"
    PARAM = AllToAllVParam
    #: whether its Param's counts are uniform and packed on every rank: read from its first call's
    #: table (an operation's first call always agrees), kept for the calls that do not agree
    _uniform_plan: bool | None = None

    def execute(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Exchange the blocks of the Param's plan.

        Args:
            x: this rank's input (its blocks at ``sdispls``).
            out: a preallocated output of shape ``[1, sum(recv_counts)]``.

        Returns:
            ``out``, or a new array of shape ``[1, sum(recv_counts)]``.
        """
        return self._call((x, out), RUN)

    def prepare(self, x: np.ndarray, out: np.ndarray | None = None) -> Plan:
        """A :class:`~mpicoll.Plan` of ``execute(x, out)``."""
        return self._call((x, out), PREPARE)

    def _bind_param(self) -> None:
        p = self.param
        missing = [k for k in _PLAN if getattr(p, k) is None]
        if missing:
            raise CollectiveArgumentError(f"{self.NAME}: {missing[0]}=None on rank {self.rank}: the plan "
                                          "(send_counts, sdispls, recv_counts, rdispls) is required",
                                          op=self.NAME, param=missing[0], rank=self.rank)
        self._plan = self._counts(*(getattr(p, k) for k in _PLAN))

    def describe(self, x, out=None) -> Call:
        return self._v_call(x, self._plan, None, out)

    def _uniform(self, table: np.ndarray | None) -> bool:
        if self._uniform_plan is None and table is not None:
            self._uniform_plan = uniform(table)
        return bool(self._uniform_plan)

    def land(self, call, rows, table, go) -> None:
        self._uniform(table)                        # (the fact of an agreed table, kept: _uniform_plan)
        super().land(call, rows, table, go)


_PLAN = ("send_counts", "sdispls", "recv_counts", "rdispls")


class AllToAllVV2Operation(_AllToAllVBase):
    """All-to-all with the per-peer plan given at execute time (ATB's AllToAllVV2).

    The same exchange as :class:`AllToAllVOperation`, the plan passed to ``execute``.

    Example (the 2-rank case of the ATB documentation)::

        rank 0: x=[[0,1,2,3],[4,5,6,7]], send_counts=[2,4], sdispls=[0,2], recv_counts=[2,2], rdispls=[0,2]
        rank 1: x=[[0,1,2],[3,4,6]],     send_counts=[2,1], sdispls=[0,2], recv_counts=[4,1], rdispls=[0,4]
        -> rank 0: [[0, 1, 0, 1]]          rank 1: [[2, 3, 4, 5, 2]]
    """

    NAME = "AllToAllVV2"
    PARAM = AllToAllVV2Param
    VALUES = SLOTS = ("send_counts", "sdispls", "recv_counts", "rdispls")

    def execute(self, x: np.ndarray, send_counts, sdispls, recv_counts, rdispls, infer_shape=None,
                out: np.ndarray | None = None) -> np.ndarray:
        """Exchange blocks by the given plan.

        Args:
            x: this rank's input.
            send_counts, sdispls, recv_counts, rdispls: ``rank_size`` integers each (lists, tuples,
                integer arrays or any iterable, read once), in elements of the flattened arrays.
            infer_shape: optional; must hold ``sum(recv_counts)`` elements (ATB's shape input).
            out: a preallocated output of shape ``[1, sum(recv_counts)]``.

        Returns:
            ``out``, or a new array of shape ``[1, sum(recv_counts)]``.
        """
        return self._call((x, send_counts, sdispls, recv_counts, rdispls, infer_shape, out), RUN)

    def prepare(self, x: np.ndarray, send_counts, sdispls, recv_counts, rdispls, infer_shape=None,
                out: np.ndarray | None = None) -> Plan:
        """A :class:`~mpicoll.Plan` of ``execute(x, send_counts, sdispls, recv_counts, rdispls, infer_shape, out)``."""
        return self._call((x, send_counts, sdispls, recv_counts, rdispls, infer_shape, out), PREPARE)

    def describe(self, x, send_counts, sdispls, recv_counts, rdispls, infer_shape=None, out=None) -> Call:
        return self._v_call(x, self._counts(send_counts, sdispls, recv_counts, rdispls), infer_shape, out)
