"""AllToAll, AllToAllV and AllToAllVV2: every rank sends a (possibly different) block to every rank."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import _validate as V
from .._dtypes import DTYPES
from .._errors import CollectiveArgumentError
from .._golden import (PLAN_FAMILIES, BenchRun, BenchSpec, Case, CheckSpec, bench_data, counts_matrix, displs,
                       rank_data, register_bench, register_check, torch_view)
from .._params import CommParam
from .._plan import Call, Plan
from .._numeric import copy_pairs
from ._agree import uniform
from ._base import PREPARE, RUN, Operation


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


# ----------------------------------------------------------------------------- golden checks

def alltoallv_golden(inputs, plans, me):
    """SPEC's formula: block ``x_i.flat[sd_i[me] : sd_i[me] + sc_i[me]]`` lands at ``out[rd_me[i] ...]``."""
    _, _, rc, rd = plans[me]
    out = np.empty((1, int(rc.sum())), dtype=inputs[me].dtype)
    for i, x in enumerate(inputs):
        sc, sd = plans[i][0], plans[i][1]
        out[0, rd[i]:rd[i] + rc[i]] = x.reshape(-1)[sd[me]:sd[me] + sc[me]]
    return out


def _plans(family, n):
    m = counts_matrix(family, n)
    plans, lengths = [], []
    for r in range(n):
        gapped = family == "gapped"
        sd, length = displs(m[r], gapped)
        rd = displs(m[:, r], gapped)[0]
        if gapped:  # receive side: permuted, packed (gaps are impossible in sum(recv_counts) elements)
            order = np.arange(n)[::-1]
            rd = np.empty(n, dtype=np.int64)
            rd[order] = np.concatenate(([0], np.cumsum(m[order, r])[:-1]))
        plans.append((m[r], sd, m[:, r].copy(), rd))
        lengths.append(length)
    return plans, lengths


def _a2a_case(case, dtype, comm_domain, rank, n, seed, validate=True) -> Case:
    dt = DTYPES[dtype]
    shape = {"even": (2 * n, 3), "zero": (0,), "large": (16_384 * n,)}[case]
    inputs = [rank_data(seed, f"AllToAll/{case}/{dtype}", r, shape, dt) for r in range(n)]
    expected = np.concatenate([np.split(x, n)[rank] for x in inputs]) if shape[0] else inputs[rank].copy()
    op = AllToAllOperation(AllToAllParam(comm_domain=comm_domain, rank_size=n), validate=validate)
    return Case(op, (inputs[rank],), {}, expected.reshape(shape))


def _a2av_case(case, dtype, comm_domain, rank, n, seed, validate=True, v2=False) -> Case:
    dt = DTYPES[dtype]
    if case == "seed":
        if n != 2:
            raise ValueError("the seed case needs exactly 2 ranks")
        inputs = [np.array([[0, 1, 2, 3], [4, 5, 6, 7]]).astype(dt.np), np.array([[0, 1, 2], [3, 4, 6]]).astype(dt.np)]
        plans = [([2, 4], [0, 2], [2, 2], [0, 2]), ([2, 1], [0, 2], [4, 1], [0, 4])]
        plans = [tuple(np.array(v, dtype=np.int64) for v in p) for p in plans]
    else:
        plans, lengths = _plans(case, n)
        inputs = [rank_data(seed, f"AllToAllV/{case}/{dtype}", r, lengths[r], dt) for r in range(n)]
    expected = alltoallv_golden(inputs, plans, rank)
    sc, sd, rc, rd = plans[rank]
    if v2:
        op = AllToAllVV2Operation(AllToAllVV2Param(comm_domain=comm_domain, rank_size=n), validate=validate)
        return Case(op, (inputs[rank], sc, sd, rc, rd, np.zeros(int(rc.sum()), np.int8)), {}, expected)
    op = AllToAllVOperation(AllToAllVParam(comm_domain=comm_domain, rank_size=n, send_counts=sc.tolist(),
                                           sdispls=sd.tolist(), recv_counts=rc, rdispls=rd), validate=validate)
    return Case(op, (inputs[rank],), {}, expected)


def _v_cases(n):
    return list(PLAN_FAMILIES) + (["seed"] if n == 2 else [])


register_check(CheckSpec("AllToAll", lambda n: ["even", "zero", "large"], _a2a_case))
register_check(CheckSpec("AllToAllV", _v_cases, _a2av_case))
register_check(CheckSpec("AllToAllVV2", _v_cases, lambda *a, **k: _a2av_case(*a, **k, v2=True)))


def _a2a_bench(c, kind="AllToAll") -> BenchRun:
    per = c.count // c.n
    x = bench_data(c.rank, c.count, c.dtype)
    comm, t = c.comm, c.dtype.mpi         # locals in the raw calls, as a user's loop has them
    expected = np.concatenate([bench_data(r, c.count, c.dtype)[c.rank * per:(c.rank + 1) * per] for r in range(c.n)])
    cnt, dsp = np.full(c.n, per), np.arange(c.n) * per
    param = dict(comm_domain=c.comm_domain, rank_size=c.n)
    inplace = reset = None
    if kind == "AllToAll":
        out, work = np.empty_like(x), x.copy()
        op = AllToAllOperation(AllToAllParam(**param), validate=c.validate)
        args = (x,)
        raw = lambda: comm.Alltoall([x, t], [out, t])  # noqa: E731
        inplace, reset = ((work,), {"out": work}), lambda: np.copyto(work, x)      # nccl-tests: recv = send
    else:
        out = np.empty((1, c.count), dtype=x.dtype)
        expected = expected.reshape(1, -1)
        if kind == "AllToAllV":
            op = AllToAllVOperation(AllToAllVParam(**param, send_counts=cnt, sdispls=dsp, recv_counts=cnt, rdispls=dsp),
                                    validate=c.validate)
            args = (x,)
        else:
            op = AllToAllVV2Operation(AllToAllVV2Param(**param), validate=c.validate)
            args = (x, cnt, dsp, cnt, dsp)
        raw = lambda: comm.Alltoallv([x, (cnt, dsp), t], [out, (cnt, dsp), t])  # noqa: E731

    def torch_call(dist, torch, group):
        t, o = torch_view(torch, x), torch_view(torch, out.reshape(-1))
        if kind == "AllToAll":
            return lambda: dist.all_to_all_single(o, t, group=group)
        splits = [per] * c.n
        return lambda: dist.all_to_all_single(o, t, splits, splits, group=group)
    return BenchRun(op, args, expected, kwargs={"out": out}, raw=raw, inplace=inplace, reset=reset,
                    torch_call=torch_call)


for _kind in ("AllToAll", "AllToAllV", "AllToAllVV2"):
    register_bench(BenchSpec(_kind, lambda c, k=_kind: _a2a_bench(c, k), lambda n: (n - 1) / n if n else 0,
                             count_multiple=lambda n: n))
