"""AllToAll, AllToAllV and AllToAllVV2 (mpicoll/ops/alltoall.py): golden cases and bench specs."""
from __future__ import annotations

import numpy as np

from .._dtypes import DTYPES
from ..ops.alltoall import (AllToAllOperation, AllToAllParam, AllToAllVOperation, AllToAllVParam, AllToAllVV2Operation,
                           AllToAllVV2Param)
from ._golden import PLAN_FAMILIES, bench_data, counts_matrix, displs, rank_data, torch_view
from ._spec import BenchRun, BenchSpec, Case, CheckSpec


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


CHECKS = (
    CheckSpec("AllToAll", lambda n: ["even", "zero", "large"], _a2a_case),
    CheckSpec("AllToAllV", _v_cases, _a2av_case),
    CheckSpec("AllToAllVV2", _v_cases, lambda *a, **k: _a2av_case(*a, **k, v2=True)),
)


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


BENCHES = tuple(BenchSpec(kind, lambda c, k=kind: _a2a_bench(c, k), lambda n: (n - 1) / n if n else 0,
                          count_multiple=lambda n: n) for kind in ("AllToAll", "AllToAllV", "AllToAllVV2"))
