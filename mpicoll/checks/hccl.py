"""The Hccl client's task kinds (mpicoll/hccl.py): golden cases.

Tile plans of every task kind, the seed's 2 x 128 + 44 among them, each against the untiled result
computed in numpy (:func:`tiled_golden`), and AllToAllV in rounds. (No bench spec: the client's
tasks are the operators' calls, benchmarked there; benchmarks/hccl.py measures the client.)
"""
from __future__ import annotations

import numpy as np

from .._dtypes import DTYPES, HCCL_DTYPES, HcclReduceOp, reduce_op
from ..hccl import Hccl
from ._golden import counts_matrix, displs, golden_reduce, rank_data
from ._spec import Case, CheckSpec


#: tile plans: total elements per block T, tiles [(tile, repeat)], extra stride past T, how rounds
#: are committed ("now": commit=True; "each": one commit() per round, query between; "later":
#: every task prepared, then committed)
TILE_PLANS = {
    "untiled": (300, [(300, 1)], 0, "now"),
    "seed": (300, [(128, 2), (44, 1)], 0, "now"),         # the Hccl API documentation's: 2 tiles of 128 + a tail of 44
    "rounds": (90, [(30, 3)], 0, "each"),
    "gaps": (50, [(20, 2), (10, 1)], 7, "later"),         # stride 57: 7 untouched elements per block
    "zero": (0, [(0, 1)], 0, "now"),
    "big": (40_000, [(16_000, 2), (8_000, 1)], 0, "each"),   # 16-bit reductions take their AllToAll path
}

_PREPARE = {"AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter",
            "AllToAll": "all_to_all", "AllToAllV": "all_to_all_v"}


def tiled_layout(kind: str, n: int, total: int, gap: int) -> tuple[int, int, int]:
    """``(stride, send size, recv size)`` of a tiled ``kind`` over blocks of ``total`` elements."""
    s = total + gap
    span = (n - 1) * s + total if total else 0
    return s, *{"AllReduce": (total, total), "AllGather": (total, span), "ReduceScatter": (span, total),
                "AllToAll": (span, span)}[kind]


def tiled_golden(kind: str, inputs: list[np.ndarray], rank: int, total: int, gap: int, dt, rop) -> np.ndarray:
    """What an untiled ``kind`` gives rank ``rank`` (zeros where no block lands)."""
    n = len(inputs)
    s, _, recv_size = tiled_layout(kind, n, total, gap)
    if kind == "AllReduce":
        return golden_reduce(inputs, dt, rop)
    if kind == "ReduceScatter":
        return golden_reduce([x[rank * s:rank * s + total] for x in inputs], dt, rop)
    out = np.zeros(recv_size, dtype=dt.np)
    for j in range(n):
        out[j * s:j * s + total] = inputs[j] if kind == "AllGather" else inputs[j][rank * s:rank * s + total]
    return out


def run_tiled(hccl: Hccl, kind: str, send: np.ndarray, recv: np.ndarray, tiles, stride: int, dtype, op,
              mode: str) -> list[int]:
    """Prepare one task per ``(tile, repeat)`` over consecutive ranges (round k of a task moves its
    tile k), commit them as ``mode`` says, wait for every one; returns the handles."""
    handles, o = [], 0
    prepare = getattr(hccl, _PREPARE[kind])
    for t, r in tiles:
        extra = {"repeat": r, "commit": mode == "now"}
        if kind != "AllReduce":
            extra["stride_count"] = stride
        args = (send[o:], recv[o:], t, dtype) + ((op,) if kind in ("AllReduce", "ReduceScatter") else ())
        handles.append(prepare(*args, **extra))
        if mode == "each":
            for _ in range(r):
                hccl.commit(handles[-1])
                hccl.query(handles[-1])
        o += t * r
    if mode == "later":
        for h, (_, r) in zip(handles, tiles):
            for _ in range(r):
                hccl.commit(h)
    for h, (_, r) in zip(handles, tiles):
        hccl.wait(h)
    return handles


class _TiledCase:
    """A golden case's operation: ``execute()`` runs the tile plan in a fresh client."""

    def __init__(self, kind, domain, n, plan, dtype, op, send, recv) -> None:
        self.kind, self.domain, self.n, self.plan, self.dtype, self.op, self.send, self.recv = \
            kind, domain, n, plan, dtype, op, send, recv

    def execute(self) -> np.ndarray:
        total, tiles, gap, mode = self.plan
        stride = tiled_layout(self.kind, 1, total, gap)[0]
        self.recv[:] = 0
        with Hccl().init(self.domain, self.n) as hccl:
            run_tiled(hccl, self.kind, self.send, self.recv, tiles, stride, self.dtype, self.op, mode)
        return self.recv


def _tiled_case(kind: str):
    def make(case, dtype, comm_domain, rank, n, seed, validate=True) -> Case:
        plan_name, _, rname = case.partition(":")
        total, tiles, gap, mode = TILE_PLANS[plan_name]
        dt = DTYPES[dtype]
        rop = reduce_op(rname) if rname else None
        _, send_size, recv_size = tiled_layout(kind, n, total, gap)
        inputs = [rank_data(seed, f"Hccl.{kind}/{case}/{dtype}", r, send_size, dt) for r in range(n)]
        expected = tiled_golden(kind, inputs, rank, total, gap, dt, rop)
        op = _TiledCase(kind, comm_domain, n, TILE_PLANS[plan_name], dt.hccl, rname or None, inputs[rank],
                        np.zeros(recv_size, dtype=dt.np))
        return Case(op, (), {}, expected)
    return make


def _v_case(case, dtype, comm_domain, rank, n, seed, validate=True) -> Case:
    """AllToAllV in ``repeat`` rounds equals one AllToAllV of ``repeat`` times the counts."""
    family, repeat = case.split("x")
    r, m, dt = int(repeat), counts_matrix(family, n) * 1, DTYPES[dtype]
    sc, rc = m[rank], m[:, rank]
    sd, rd = displs(r * sc, False)[0], displs(r * rc, False)[0]
    inputs = [rank_data(seed, f"Hccl.AllToAllV/{case}/{dtype}", i, int(r * m[i].sum()), dt) for i in range(n)]
    starts = [np.concatenate(([0], np.cumsum(r * m[i])[:-1])) for i in range(n)]
    expected = np.concatenate([inputs[j][starts[j][rank]:starts[j][rank] + r * m[j, rank]] for j in range(n)])

    class _V:
        def execute(self) -> np.ndarray:
            recv = np.zeros(int(r * rc.sum()), dtype=dt.np)
            with Hccl().init(comm_domain, n) as hccl:
                hccl.wait(hccl.all_to_all_v(inputs[rank], sc, sd, recv, rc, rd, dt.hccl, repeat=r, commit=True))
            return recv
    return Case(_V(), (), {}, expected)


#: the reduce ops the client takes (``HcclReduceOp``'s)
_REDUCE_NAMES = tuple(op.name.lower() for op in HcclReduceOp)


def _reduce_cases(n: int) -> list[str]:
    return [f"{p}:{r}" for p in TILE_PLANS for r in _REDUCE_NAMES if p != "gaps" or r == "sum"]


CHECKS = (
    *(CheckSpec(f"Hccl.{kind}", lambda n: list(TILE_PLANS), _tiled_case(kind), HCCL_DTYPES)
      for kind in ("AllGather", "AllToAll")),
    *(CheckSpec(f"Hccl.{kind}", _reduce_cases, _tiled_case(kind), HCCL_DTYPES)
      for kind in ("AllReduce", "ReduceScatter")),
    CheckSpec("Hccl.AllToAllV", lambda n: ["uniformx1", "unevenx2", "zerox1", "skewx3"], _v_case, HCCL_DTYPES),
)
BENCHES = ()
