"""Reproducible reductions (docs/reproducibility.md): element i of a float SUM or PROD result is the
tree-order reduction of the n inputs of element i (16-bit floats in float32, rounded once), bit for
bit, whatever the message size, the offset of the element in it, the path (the node window in one or
two shots, the Allgather, the AllToAll path, pieces; each forced by its threshold), the communicator
(the world, a sub-domain, one made without the window: the paths several hosts take), the root,
validation, in place or not. MAX and MIN likewise. The golden (``_golden.golden_reduce``) is computed
per element in the tree order, so it cannot depend on the size: a result equal to it is invariant.

Hypothesis runs derandomized (the same examples on every rank) and each verdict is agreed across ranks
(``_mpi.agreed``), as in test_fuzz; ``MPICOLL_TEST_FUZZ_EXAMPLES`` sets the examples per property (here 60).
"""
from __future__ import annotations

import contextlib
import os
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mpicoll
from mpicoll import _env, _shm, functional as F, graph
from mpicoll._dtypes import DTYPES, reduce_op
from mpicoll.checks._golden import golden_reduce
from mpicoll._thresholds import VALUES

from _mpi import FLOATS, RANK, SIZE, WORLD, agreed, digest_job, reduce_ops

EXAMPLES = int(os.environ.get("MPICOLL_TEST_FUZZ_EXAMPLES", "60"))
PROPERTY = settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
                    suppress_health_check=list(HealthCheck), print_blob=False)
mpi1 = pytest.mark.mpi(min_size=1)
pytestmark = pytest.mark.skipif(not _env.value("MPICOLL_EXACT"), reason="MPICOLL_EXACT=0: float sums in MPI's order")

BIG = 1 << 40
#: path -> the thresholds that force it (mpicoll._thresholds, read when a call picks its MPI calls)
PATHS = {
    "chosen": {},
    "window": {"window.ordered": 0, "window.reduce_scatter": 0},
    "window-two-shots": {"window.ordered": 0, "window.reduce_scatter": 0, "window.one_shot": 0},
    "gather": {"window.ordered": BIG, "window.reduce_scatter": BIG, "gathered": BIG},
    "alltoall": {"window.ordered": BIG, "window.reduce_scatter": BIG, "gathered": 0},
    "pieces": {"window.ordered": BIG, "allreduce.pieces": (8192, 4096)},
    "pieces-alltoall": {"window.ordered": BIG, "allreduce.pieces": (8192, 4096),
                        "gathered": 0},
}
COMMS: dict = {}


@contextlib.contextmanager
def forced(path: str):
    old = {k: VALUES[k] for k in PATHS[path]}
    VALUES.update(PATHS[path])
    try:
        yield
    finally:
        VALUES.update(old)


def comm_param(kind: str) -> dict:
    """The Param fields of a communicator kind: the world; a sub-domain of the first ``SIZE - 1``
    ranks (its other rank sits the call out); a duplicate of the world made with ``MPICOLL_SHM=0``
    (no node window: MPI's collectives and mpicoll's own reductions, as across hosts)."""
    if kind == "world":
        return {}
    if kind == "sub":
        return {"comm_domain": "first" if RANK < SIZE - 1 else "last", "rank_size": max(SIZE - 1, 1)}
    if kind not in COMMS:
        COMMS[kind] = WORLD.Dup()
        os.environ["MPICOLL_SHM"] = "0"
        _env.reread()                     # (mpicoll keeps what it read: read it again, here and below)
        try:
            mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=COMMS[kind])).execute(np.zeros(1))   # (binds it)
        finally:
            del os.environ["MPICOLL_SHM"]
            _env.reread()
    return {"comm": COMMS[kind]}


def members(kind: str) -> list[int]:
    return list(range(SIZE - 1)) if kind == "sub" and SIZE > 1 else list(range(SIZE))


def inputs(seed: int, dtype: str, count: int, ranks: list[int], special: bool = False) -> list[np.ndarray]:
    """Every member's input: normal values over 8 decades (sums that round differently in another
    order), rebuilt alike on every rank from the seed; ``special``: some NaN, +-0 and +-inf too."""
    out = []
    for r in ranks:
        g = np.random.default_rng([seed, r, count])
        x = g.standard_normal(count) * 10.0 ** g.integers(-4, 4, count)
        if special:
            pick = g.integers(0, 40, count)
            x = np.where(pick == 0, np.nan, np.where(pick == 1, 0.0, np.where(pick == 2, -0.0, x)))
            x = np.where(pick == 3, np.inf, np.where(pick == 4, -np.inf, x))
        out.append(x.astype(DTYPES[dtype].np))
    return out


def bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).view(np.uint8).tobytes()


def same(wrong: list, what: str, got, want) -> None:
    """Note a result that is not ``want`` bit for bit, a NaN matching any NaN (which NaN, its sign
    and payload, is not covered: numpy's and the C kernels' vector adds may order their operands
    either way); ``want`` None: ``got`` must be None. Every call of a check runs whatever an earlier
    one gave, and the check asserts once at its end: a rank that stopped at a failed assert would
    leave its peers waiting in the next collective."""
    if (got is None) != (want is None):
        wrong.append(what)
    elif want is not None:
        nan = np.isnan(want.astype(np.float64))
        if got.shape != want.shape or got.dtype != want.dtype or not np.array_equal(
                np.isnan(got.astype(np.float64)), nan) or bits(got[~nan]) != bits(want[~nan]):
            wrong.append(what)


cases = st.fixed_dictionaries({
    "seed": st.integers(0, 2 ** 31),
    "rname": st.sampled_from(reduce_ops("float32")),
    "count": st.one_of(st.integers(0, 40), st.integers(41, 5000), st.sampled_from([1 << 14, 100_003])),
    "comm": st.sampled_from(["world", "sub", "no-window"]),
    "validate": st.booleans(),
    "in_place": st.booleans(),
    "special": st.booleans(),
    "root": st.integers(0, 63),
})
each_path = pytest.mark.parametrize("path", list(PATHS))
each_float = pytest.mark.parametrize("dtype", FLOATS)


@mpi1
@each_path
@each_float
@settings(PROPERTY, max_examples=max(EXAMPLES // 4, 5))
@given(cases)
def test_allreduce_and_reduce_give_the_tree_order_bits(path, dtype, c):
    ranks = members(c["comm"])
    xs = inputs(c["seed"], dtype, c["count"], ranks, c["special"])
    dt, rop = DTYPES[dtype], reduce_op(c["rname"])
    with np.errstate(all="ignore"):
        want = golden_reduce(xs, dt, rop)
    root = c["root"] % len(ranks)

    def check():
        if RANK not in ranks:
            return
        me, param, wrong = ranks.index(RANK), dict(comm_param(c["comm"]), reduce_type=c["rname"]), []
        with forced(path):
            x = xs[me].copy()
            same(wrong, "AllReduce", mpicoll.AllReduceOperation(mpicoll.AllReduceParam(**param),
                                                                validate=c["validate"]).execute(
                x, x if c["in_place"] else None), want)
            x = xs[me].copy()
            same(wrong, "Reduce", mpicoll.ReduceOperation(mpicoll.ReduceParam(rank_root=root, **param),
                                                          validate=c["validate"]).execute(
                x, x if c["in_place"] and me == root else None), want if me == root else None)
        assert not wrong, (wrong, path, dtype, c)
    agreed(check)


@mpi1
@each_path
@each_float
@settings(PROPERTY, max_examples=max(EXAMPLES // 4, 5))
@given(cases, st.lists(st.integers(0, 300), min_size=64, max_size=64))
def test_reduce_scatter_and_v_give_the_tree_order_bits(path, dtype, c, spread):
    ranks = members(c["comm"])
    n = len(ranks)
    per = c["count"] // max(n, 1)
    counts = spread[:n]                                   # ReduceScatterV's blocks (zeros included)
    xs = inputs(c["seed"], dtype, max(per * n, sum(counts)), ranks, c["special"])
    dt, rop = DTYPES[dtype], reduce_op(c["rname"])
    with np.errstate(all="ignore"):
        full = golden_reduce(xs, dt, rop)

    def check():
        if RANK not in ranks:
            return
        me, param, wrong = ranks.index(RANK), dict(comm_param(c["comm"]), reduce_type=c["rname"]), []
        with forced(path):
            x = xs[me][:per * n].copy()
            out = x[me * per:(me + 1) * per] if c["in_place"] else None
            same(wrong, "ReduceScatter", mpicoll.ReduceScatterOperation(
                mpicoll.ReduceScatterParam(**param), validate=c["validate"]).execute(x, out),
                full[me * per:(me + 1) * per])
            starts = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(int).tolist()
            same(wrong, "ReduceScatterV", mpicoll.ReduceScatterVOperation(
                mpicoll.ReduceScatterVParam(**param), validate=c["validate"]).execute(
                xs[me][:sum(counts)].copy(), counts, starts, counts[me]), full[starts[me]:starts[me] + counts[me]])
        assert not wrong, (wrong, path, dtype, c)
    agreed(check)


@mpi1
@PROPERTY
@given(st.integers(0, 2 ** 31), st.sampled_from(FLOATS),
       st.lists(st.one_of(st.integers(1, 30), st.integers(31, 3000)), min_size=2, max_size=12),
       st.sampled_from(reduce_ops("float32")), st.booleans())
def test_functional_calls_eager_and_merged_in_a_graph_give_the_same_bits(seed, dtype, sizes, rname, special):
    """A list of float all_reduce calls (a DDP-like bucket list): eager, and captured in a graph that
    merges them into one message, give the golden bits; so does one all_reduce of them packed."""
    dt = DTYPES[dtype]
    every = [inputs(seed + k, dtype, s, list(range(SIZE)), special) for k, s in enumerate(sizes)]
    with np.errstate(all="ignore"):
        want = [golden_reduce(xs, dt, reduce_op(rname)) for xs in every]

    def check():
        eager, wrong = [xs[RANK].copy() for xs in every], []
        for t in eager:
            F.all_reduce(t, rname)
        for a, b in zip(eager, want):
            same(wrong, "eager", a, b)
        ts = [xs[RANK].copy() for xs in every]
        with graph.capture() as g:
            for t in ts:
                F.all_reduce(t, rname)
        merged = "merged: all_reduce calls" in g.summary()
        for t, xs in zip(ts, every):
            t[...] = xs[RANK]
        g.replay()
        g.free()
        for a, b in zip(ts, want):
            same(wrong, "graph", a, b)
        packed = np.concatenate([xs[RANK] for xs in every])
        F.all_reduce(packed, rname)
        same(wrong, "packed", packed, np.concatenate(want))
        assert not wrong and (merged or len(sizes) < 2), (wrong, g.summary())
    agreed(check)


@pytest.mark.mpi(min_size=1)
@pytest.mark.timeout_s(600)
@pytest.mark.skipif(SIZE != 1, reason="launches its own jobs once (from the 1-rank run)")
@pytest.mark.skipif(not os.environ.get("MPICOLL_TEST_OTHER_MPI_PYTHON"),
                    reason="needs MPICOLL_TEST_OTHER_MPI_PYTHON: a python whose mpi4py runs on the other MPI wheel "
                           "(docs/reproducibility.md, 'Check it')")
def test_the_same_bits_on_mpich_and_open_mpi():
    """The same inputs give the same bits of every float reduction on this MPI and on the other one
    (MPICH and Open MPI wheels), each equal to the tree-order golden."""
    here, there = digest_job(sys.executable), digest_job(os.environ["MPICOLL_TEST_OTHER_MPI_PYTHON"])
    assert {here["mpi"].split()[0], there["mpi"].split()[0]} == {"MPICH", "Open"}, (here["mpi"], there["mpi"])
    assert here["wrong"] == there["wrong"] == 0, (here, there)
    assert here["sha256"] == there["sha256"], (here, there)


@mpi1
@PROPERTY
@given(st.integers(0, 2 ** 31), st.one_of(st.integers(0, 50), st.integers(51, 70_000)), st.sampled_from([0, 1, 7, 32]))
def test_quant_allreduce_sums_in_the_tree_order_at_any_size(seed, count, block):
    """QuantAllReduce (float16 gather): every element is float16(sum_r float32(q_r) * scale_r), summed
    in rank order, whatever the size and its chunks (the operator's numpy golden, bit for bit)."""
    from mpicoll.checks.quant import golden
    from mpicoll.ops.quant import QuantAllReduceOperation, QuantAllReduceParam
    rngs = [np.random.default_rng([seed, r, count, block]) for r in range(SIZE)]
    xs = [g.integers(-127, 128, count).astype(np.int8) for g in rngs]
    nscales = 1 if block == 0 else -(-count // block)
    scales = [(g.uniform(1e-4, 1e-1, nscales) * 10.0 ** g.integers(-3, 3, nscales)).astype(np.float32) for g in rngs]
    want = golden(xs, scales, block)

    def check():
        op = QuantAllReduceOperation(QuantAllReduceParam(block_size=block))
        got = op.execute(xs[RANK], scales[RANK] if block else float(scales[RANK][0]))
        assert bits(got) == bits(want), (seed, count, block)
    agreed(check)


@mpi1
@PROPERTY
@given(st.integers(0, 2 ** 31), st.sampled_from(FLOATS), st.integers(1, 3000), st.integers(1, 4),
       st.sampled_from(["sum", "max"]))
def test_hccl_rounds_give_the_tree_order_bits(seed, dtype, count, repeat, rname):
    """The Hccl client's AllReduce and strided ReduceScatter, ``repeat`` rounds of ``count``: every
    element the tree-order golden's, whatever the round size."""
    from mpicoll import Hccl, HcclReduceOp
    dt = DTYPES[dtype]
    kind, op = dt.hccl, HcclReduceOp[rname.upper()]
    xs = inputs(seed, dtype, count * repeat * SIZE, list(range(SIZE)))
    with np.errstate(all="ignore"):
        full = golden_reduce(xs, dt, reduce_op(rname))
    span = count * repeat

    def check():
        wrong, out = [], np.zeros(span * SIZE, dt.np)
        recv = np.zeros(span, dt.np)
        with Hccl().init() as hccl:
            hccl.wait(hccl.all_reduce(xs[RANK], out, span * SIZE, kind, op, commit=True))
            # rank r's block of round k: elements (r * repeat + k) * count .. + count (stride: a rank's span)
            hccl.wait(hccl.reduce_scatter(xs[RANK], recv, count, kind, op, stride_count=span, repeat=repeat,
                                          commit=True))
        same(wrong, "all_reduce", out, full)
        same(wrong, "reduce_scatter", recv, full[RANK * span:(RANK + 1) * span])
        assert not wrong, (wrong, seed, dtype, count, repeat, rname)
    agreed(check)
