"""AllToAll, AllToAllV and AllToAllVV2: every rank sends a (possibly different) block to every rank."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import _validate as V
from .._dtypes import DTYPES, MPI_BY_NUM
from .._errors import CollectiveArgumentError
from .._golden import (PLAN_FAMILIES, BenchRun, BenchSpec, CheckSpec, bench_data, counts_matrix, displs, rank_data,
                       register_bench, register_check, torch_view)
from .._params import CommParam
from ._base import Operation, check_out, mpi_of_c, x_out


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

    ``execute(x, out=None)``: ``x.shape[0]`` divisible by rank_size; returns x's shape.

    Example (2 ranks, rank r has ``x = [10r, 10r + 1]``)::

        AllToAllOperation(AllToAllParam()).execute(x)   # rank 0: [0, 10], rank 1: [1, 11]
    """

    NAME = "AllToAll"
    PARAM = AllToAllParam

    def _check(self, args, kwargs, h):
        x, out = x_out(*args, **kwargs)
        x = self._check_x(x, h)
        V.check_dim0(self.NAME, x, self.size, self.rank)
        check_out(self.NAME, out, x.shape, x.dtype, self.rank, x)
        return (x,), {"out": out}

    def _checked(self):
        n = self.size
        return self._checked_x_out(lambda x: x.shape if x.ndim and not x.shape[0] % n else None)

    def _fast(self):
        call, slow, mpi_of, table, empty_like = self.comm.Alltoall, self._run, mpi_of_c(), MPI_BY_NUM, np.empty_like

        def execute(x, out=None):
            m = mpi_of(x, table)
            if m is not None:
                if out is None:
                    out = empty_like(x)
                call([x, m], [out, m])
                return out
            return slow(x, out)
        return execute

    def _run(self, x, out=None):
        x, dt = self._data(x)
        if out is None:
            out = np.empty_like(x)
        self.comm.Alltoall([x, dt.mpi], [out, dt.mpi])
        return out


class _AllToAllVBase(Operation):
    """The shared plan checks and MPI call of AllToAllV and AllToAllVV2."""

    SAME_SHAPE = False

    def _check_plan(self, x, sc, sd, rc, rd, infer_shape, out, h):
        """Local rules on the plan; fill the header; return the normalised plan."""
        x = self._check_x(x, h)
        op, r, n = self.NAME, self.rank, self.size
        sc = V.counts(op, "send_counts", sc, n, r)
        sd = V.counts(op, "sdispls", sd, n, r)
        rc = V.counts(op, "recv_counts", rc, n, r)
        rd = V.counts(op, "rdispls", rd, n, r)
        V.check_regions(op, "send_counts", sc, "sdispls", sd, x.size, "x.size", r)
        total = sum(rc)
        V.check_regions(op, "recv_counts", rc, "rdispls", rd, total, "sum(recv_counts)", r)
        V.check_no_overlap(op, "recv_counts", rc, "rdispls", rd, r)
        if infer_shape is not None and np.size(infer_shape) != total:
            raise V.arg_error(op, "infer_shape.size", int(np.size(infer_shape)), r,
                              f"must equal sum(recv_counts)={total}")
        check_out(op, out, (1, total), x.dtype, r, x)
        V.vec_a(h, n)[:] = sc
        V.vec_b(h, n)[:] = rc
        h[V.H_BITS] = V.BIT_CONTIGUOUS if V.packed_layout(sc, sd)[0] >= 0 and V.packed_layout(rc, rd)[0] >= 0 else 0
        return x, sc, sd, rc, rd

    def _cross(self, args, kwargs, table):
        n = self.size
        V.check_pairs(self.NAME, table, (V.H_LEN, 1), "send_counts[{j}]", (V.H_LEN + n, 1), "recv_counts[{i}]")
        sent = table[:, V.H_LEN:V.H_LEN + n]
        # Every rank sees the same table, so every rank takes the same (faster) Alltoall path.
        flat = sent.ravel().tolist()
        if flat and flat.count(flat[0]) == len(flat) and all(
                b & V.BIT_CONTIGUOUS for b in table[:, V.H_BITS].tolist()):
            return {**kwargs, "_uniform": True}
        return kwargs

    def _alltoallv(self, x, sc, sd, rc, rd, out, uniform):
        x, dt = self._data(x)
        if out is None:
            out = np.empty((1, V.total(rc)), dtype=x.dtype)
        if uniform:
            self.comm.Alltoall([x.reshape(-1)[:out.size], dt.mpi], [out, dt.mpi])
        else:
            self.comm.Alltoallv([x, (sc, sd), dt.mpi], [out, (rc, rd), dt.mpi])
        return out


class AllToAllVOperation(_AllToAllVBase):
    """All-to-all with per-peer counts and displacements fixed in the Param.

    ``execute(x, out=None)`` -> ``[1, sum(recv_counts)]``: for every source i, ``x_i.flat[sdispls_i[me] :
    sdispls_i[me] + send_counts_i[me]]`` lands at ``out.flat[rdispls[i] : rdispls[i] + recv_counts[i]]``.
    ``recv_counts[i]`` here must equal rank i's ``send_counts[me]``.

    Example: see :class:`AllToAllVV2Operation` (the same plan, given in the Param).
    """

    NAME = "AllToAllV"
    PARAM = AllToAllVParam

    def _bind_param(self):
        p = self.param
        missing = [k for k in _PLAN if getattr(p, k) is None]
        if missing:
            raise CollectiveArgumentError(f"{self.NAME}: {missing[0]}=None on rank {self.rank}: the plan "
                                          "(send_counts, sdispls, recv_counts, rdispls) is required",
                                          op=self.NAME, param=missing[0], rank=self.rank)
        self._plan = tuple(np.asarray(getattr(p, k)) for k in _PLAN)

    def _check(self, args, kwargs, h):
        x, out = x_out(*args, **kwargs)
        plan = self._check_plan(x, *self._plan, None, out, h)
        return (plan[0],), {"out": out}

    def _fast(self):
        call, slow, mpi_of, table, empty = self.comm.Alltoallv, self._run, mpi_of_c(), MPI_BY_NUM, np.empty
        sc, sd, rc, rd = (a.tolist() for a in self._plan)     # plain lists: mpi4py reads them fastest
        send, recv, shape = (sc, sd), (rc, rd), (1, sum(rc))

        def execute(x, out=None):
            m = mpi_of(x, table)
            if m is not None:
                if out is None:
                    out = empty(shape, dtype=x.dtype)
                call([x, send, m], [out, recv, m])
                return out
            return slow(x, out)
        return execute

    def _run(self, x, out=None, _uniform=False):
        return self._alltoallv(x, *self._plan, out, _uniform)


_PLAN = ("send_counts", "sdispls", "recv_counts", "rdispls")


class AllToAllVV2Operation(_AllToAllVBase):
    """All-to-all with the per-peer plan given at execute time (ATB's AllToAllVV2).

    ``execute(x, send_counts, sdispls, recv_counts, rdispls, infer_shape=None, out=None)`` ->
    ``[1, sum(recv_counts)]``; ``infer_shape`` (optional) must have ``sum(recv_counts)`` elements.

    Example (the 2-rank case of the ATB documentation)::

        rank 0: x=[[0,1,2,3],[4,5,6,7]], send_counts=[2,4], sdispls=[0,2], recv_counts=[2,2], rdispls=[0,2]
        rank 1: x=[[0,1,2],[3,4,6]],     send_counts=[2,1], sdispls=[0,2], recv_counts=[4,1], rdispls=[0,4]
        -> rank 0: [[0, 1, 0, 1]]          rank 1: [[2, 3, 4, 5, 2]]
    """

    NAME = "AllToAllVV2"
    PARAM = AllToAllVV2Param

    def _check(self, args, kwargs, h):
        x, sc, sd, rc, rd, infer_shape, out = _vv2_args(*args, **kwargs)
        x, sc, sd, rc, rd = self._check_plan(x, sc, sd, rc, rd, infer_shape, out, h)
        return (x, sc, sd, rc, rd), {"out": out}

    def _fast(self):
        call, slow, empty, total = self.comm.Alltoallv, self._run, np.empty, V.total
        mpi_of, table = mpi_of_c(), MPI_BY_NUM

        def execute(x, send_counts, sdispls, recv_counts, rdispls, infer_shape=None, out=None):
            m = mpi_of(x, table)
            if m is not None:
                if out is None:
                    out = empty((1, total(recv_counts)), dtype=x.dtype)
                call([x, (send_counts, sdispls), m], [out, (recv_counts, rdispls), m])
                return out
            return slow(x, send_counts, sdispls, recv_counts, rdispls, infer_shape, out)
        return execute

    def _run(self, x, send_counts, sdispls, recv_counts, rdispls, infer_shape=None, out=None, _uniform=False):
        return self._alltoallv(x, send_counts, sdispls, recv_counts, rdispls, out, _uniform)


def _vv2_args(x, send_counts, sdispls, recv_counts, rdispls, infer_shape=None, out=None):
    return x, send_counts, sdispls, recv_counts, rdispls, infer_shape, out


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


def _a2a_run(case, dtype, comm_domain, rank, n, seed, validate=True):
    dt = DTYPES[dtype]
    shape = {"even": (2 * n, 3), "zero": (0,), "large": (16_384 * n,)}[case]
    inputs = [rank_data(seed, f"AllToAll/{case}/{dtype}", r, shape, dt) for r in range(n)]
    expected = np.concatenate([np.split(x, n)[rank] for x in inputs]) if shape[0] else inputs[rank].copy()
    op = AllToAllOperation(AllToAllParam(comm_domain=comm_domain, rank_size=n), validate=validate)
    return op.execute(inputs[rank]), expected.reshape(shape), True


def _a2av_run(case, dtype, comm_domain, rank, n, seed, validate=True, v2=False):
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
        got = op.execute(inputs[rank], sc, sd, rc, rd, np.zeros(int(rc.sum()), np.int8))
    else:
        op = AllToAllVOperation(AllToAllVParam(comm_domain=comm_domain, rank_size=n, send_counts=sc.tolist(),
                                               sdispls=sd.tolist(), recv_counts=rc, rdispls=rd), validate=validate)
        got = op.execute(inputs[rank])
    return got, expected, True


def _v_cases(n):
    return list(PLAN_FAMILIES) + (["seed"] if n == 2 else [])


register_check(CheckSpec("AllToAll", lambda n: ["even", "zero", "large"], _a2a_run))
register_check(CheckSpec("AllToAllV", _v_cases, _a2av_run))
register_check(CheckSpec("AllToAllVV2", _v_cases, lambda *a, **k: _a2av_run(*a, **k, v2=True)))


def _a2a_bench(c, kind="AllToAll") -> BenchRun:
    per = c.count // c.n
    x = bench_data(c.rank, c.count, c.dtype)
    comm, t = c.comm, c.dtype.mpi         # locals in the raw calls, as a user's loop has them
    expected = np.concatenate([bench_data(r, c.count, c.dtype)[c.rank * per:(c.rank + 1) * per] for r in range(c.n)])
    cnt, dsp = np.full(c.n, per), np.arange(c.n) * per
    param = dict(comm_domain=c.comm_domain, rank_size=c.n)
    if kind == "AllToAll":
        out = np.empty_like(x)
        op = AllToAllOperation(AllToAllParam(**param), validate=c.validate)
        run = lambda: op.execute(x, out=out)  # noqa: E731
        raw = lambda: comm.Alltoall([x, t], [out, t])  # noqa: E731
    else:
        out = np.empty((1, c.count), dtype=x.dtype)
        if kind == "AllToAllV":
            op = AllToAllVOperation(AllToAllVParam(**param, send_counts=cnt, sdispls=dsp, recv_counts=cnt, rdispls=dsp),
                                    validate=c.validate)
            run = lambda: op.execute(x, out=out)  # noqa: E731
        else:
            op = AllToAllVV2Operation(AllToAllVV2Param(**param), validate=c.validate)
            run = lambda: op.execute(x, cnt, dsp, cnt, dsp, out=out)  # noqa: E731
        raw = lambda: comm.Alltoallv([x, (cnt, dsp), t], [out, (cnt, dsp), t])  # noqa: E731

    def torch_call(dist, torch, group):
        t, o = torch_view(torch, x), torch_view(torch, out.reshape(-1))
        if kind == "AllToAll":
            return lambda: dist.all_to_all_single(o, t, group=group)
        splits = [per] * c.n
        return lambda: dist.all_to_all_single(o, t, splits, splits, group=group)
    return BenchRun(run=run, result=lambda: out.reshape(-1), expected=expected, raw=raw, torch_call=torch_call)


for _kind in ("AllToAll", "AllToAllV", "AllToAllVV2"):
    register_bench(BenchSpec(_kind, lambda c, k=_kind: _a2a_bench(c, k), lambda n: (n - 1) / n if n else 0,
                             count_multiple=lambda n: n))
