"""Property-based fuzzing of count/displacement plans (AllToAllV/VV2, AllGatherV, ReduceScatterV).

Every valid plan (random counts with zeros and skew, gapped and permuted displacements, every
dtype) must match the numpy golden; every plan with one defect on one rank (a negative, non-integer,
short or out-of-range count or displacement, overlapping receive regions, a count mismatch in either
direction, a different dtype) must raise the same CollectiveError on every rank, naming the
operator and the rank. Hypothesis runs derandomized (the same examples on every rank), and every
property's verdict is agreed across ranks (``_mpi.agreed``), so that every rank shrinks in lockstep;
``MPICOLL_TEST_FUZZ_EXAMPLES`` sets the examples per property (CI: 25; ``scripts/fuzz``: thousands).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mpicoll
from mpicoll import CollectiveError
from mpicoll._dtypes import DTYPES
from mpicoll.checks._golden import count_wrong, golden_reduce
from mpicoll.checks.alltoall import alltoallv_golden

from _mpi import RANK, SIZE, WORLD, agreed, launch_env, mpirun

EXAMPLES = int(os.environ.get("MPICOLL_TEST_FUZZ_EXAMPLES", "25"))
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
                suppress_health_check=list(HealthCheck), print_blob=False)
TRIED = {"valid": 0, "invalid": 0}
mpi1 = pytest.mark.mpi(min_size=1)

counts_st = st.one_of(st.integers(0, 3), st.integers(0, 40), st.sampled_from([0, 0, 1, 257]))


@st.composite
def layouts(draw, counts):
    """Displacements for blocks of ``counts``: a random block order, random gaps; and the length."""
    order = draw(st.permutations(range(len(counts))))
    gaps = draw(st.lists(st.integers(0, 3), min_size=len(counts), max_size=len(counts)))
    d, pos = [0] * len(counts), 0
    for k in order:
        pos += gaps[k]
        d[k] = pos
        pos += counts[k]
    return d, pos + draw(st.integers(0, 2))


@st.composite
def packed_permuted(draw, counts):
    """Receive displacements: packed (no gaps fit in sum(counts)) in a random block order."""
    order = draw(st.permutations(range(len(counts))))
    d, pos = [0] * len(counts), 0
    for k in order:
        d[k] = pos
        pos += counts[k]
    return d


@st.composite
def a2a_plans(draw):
    m = [[draw(counts_st) for _ in range(SIZE)] for _ in range(SIZE)]
    plans, lengths = [], []
    for r in range(SIZE):
        sd, length = draw(layouts(m[r]))
        rc = [m[i][r] for i in range(SIZE)]
        plans.append((m[r], sd, rc, draw(packed_permuted(rc))))
        lengths.append(length)
    return draw(st.sampled_from(list(DTYPES))), plans, lengths


def _data(dtype, length, rank, salt):
    rng = np.random.default_rng([salt, rank, length])
    return rng.integers(-4, 5 if DTYPES[dtype].np.kind != "u" else 9, size=length).astype(DTYPES[dtype].np) \
        if DTYPES[dtype].np.kind != "u" else rng.integers(0, 9, size=length).astype(DTYPES[dtype].np)


def _expect(ok: bool, detail: object = "") -> None:
    if not ok:
        raise AssertionError(detail)


def _check_all_ranks_agree(fn, op, bad_rank):
    """Every rank raises the same CollectiveError, whose message names the operator and the rank
    that broke the plan. The verdict is the same on every rank (gathered: an unexpected exception
    on one rank is reported, not raised alone)."""
    try:
        fn()
        seen = None
    except CollectiveError as exc:
        seen = (type(exc).__name__, str(exc), exc.op, exc.param, exc.rank)
    except Exception as exc:  # noqa: BLE001 - a bug: gathered like any other outcome
        seen = ("unexpected " + type(exc).__name__, str(exc), None, None, None)
    everyone = WORLD.allgather(seen)
    ok = seen is not None and len(set(everyone)) == 1 and seen[1].startswith(f"{op}: ") and \
        f"rank {bad_rank}" in seen[1]
    _expect(WORLD.allreduce(int(not ok)) == 0, (bad_rank, everyone))


def _one_off(c):
    """A count that differs from ``c`` (one more, or one fewer)."""
    return c + 1 if c == 0 or c % 2 else c - 1


def _other_dtype(dtype):
    return "float32" if dtype == "float64" else "float64"


#: defects needing a peer to disagree with: replaced by "negative" at one rank
CROSS_ONLY = {"recv_more", "recv_fewer", "dtype_differs", "send_more", "send_differs"}

DEFECTS = ["negative", "recv_more", "recv_fewer", "send_out_of_range", "recv_overlap", "short_counts",
           "float_counts", "negative_displ", "recv_out_of_range", "dtype_differs"]


def _break(plan, defect, n):
    sc, sd, rc, rd = (list(v) for v in plan)
    if defect == "negative":
        sc[0] = -1
    elif defect == "recv_more":
        rc[n - 1] += 1
    elif defect == "recv_fewer":
        if rc[n - 1] == 0:
            rc[n - 1] = 1                 # still a mismatch: the peer sends 0
        else:
            rc[n - 1] -= 1
    elif defect == "send_out_of_range":
        sd[0] = 10 ** 6
    elif defect == "recv_overlap":
        rc = [max(c, 1) for c in rc]
        rd = [0] * n
    elif defect == "short_counts":
        sc = sc[:-1]
    elif defect == "float_counts":
        rc = np.asarray(rc, dtype=np.float64)
    elif defect == "negative_displ":
        sd[n - 1] = -1
    elif defect == "recv_out_of_range":
        rd[0] = sum(rc) + 1
    return sc, sd, rc, rd


@mpi1
@FUZZ
@given(a2a_plans(), st.booleans())
def test_alltoallv_valid_plans_match_the_golden(case, use_param):
    dtype, plans, lengths = case
    xs = [_data(dtype, lengths[r], r, 7) for r in range(SIZE)]
    sc, sd, rc, rd = plans[RANK]

    def check():
        if use_param:
            op = mpicoll.AllToAllVOperation(mpicoll.AllToAllVParam(send_counts=sc, sdispls=sd, recv_counts=rc,
                                                                   rdispls=rd))
            got = op.execute(xs[RANK])
        else:
            got = mpicoll.AllToAllVV2Operation().execute(xs[RANK], np.array(sc), sd, np.array(rc, np.int32), rd)
        assert count_wrong(got, alltoallv_golden(xs, [tuple(np.array(v) for v in p) for p in plans], RANK)) == 0
    agreed(check)
    TRIED["valid"] += 1


@mpi1
@FUZZ
@given(a2a_plans(), st.sampled_from(DEFECTS), st.integers(0, 63))
def test_alltoallv_invalid_plans_raise_everywhere(case, defect, who):
    dtype, plans, lengths = case
    bad_rank = who % SIZE
    if SIZE == 1 and defect in CROSS_ONLY | {"recv_overlap"}:
        defect = "negative"               # one rank alone: no peer to disagree with, no two regions
    x = _data(dtype, lengths[RANK], RANK, 8)
    plan = plans[RANK]
    if RANK == bad_rank:
        plan = _break(plan, defect, SIZE)
        if defect == "dtype_differs":
            x = x.astype(DTYPES[_other_dtype(dtype)].np)
    _check_all_ranks_agree(lambda: mpicoll.AllToAllVV2Operation().execute(x, *plan), "AllToAllVV2", bad_rank)
    TRIED["invalid"] += 1


AGV_DEFECTS = ["recv_more", "recv_fewer", "send_more", "negative", "negative_displ", "short_counts",
               "float_counts", "recv_out_of_range", "recv_overlap", "dtype_differs"]


@mpi1
@FUZZ
@given(st.lists(counts_st, min_size=SIZE, max_size=SIZE), st.data(), st.sampled_from(list(DTYPES)),
       st.sampled_from(AGV_DEFECTS))
def test_allgatherv_plans(send_counts, data, dtype, defect):
    rd = data.draw(packed_permuted(send_counts))
    extra = data.draw(st.integers(0, 3))
    xs = [_data(dtype, send_counts[r] + extra, r, 9) for r in range(SIZE)]
    expected = np.empty(sum(send_counts), DTYPES[dtype].np)
    for i in range(SIZE):
        expected[rd[i]:rd[i] + send_counts[i]] = xs[i][:send_counts[i]]
    op = mpicoll.AllGatherVOperation()
    agreed(lambda: _expect(count_wrong(op.execute(xs[RANK], send_counts[RANK], send_counts, rd), expected) == 0))
    TRIED["valid"] += 1
    # one defect on one rank
    bad_rank = data.draw(st.integers(0, SIZE - 1))
    k = data.draw(st.integers(0, SIZE - 1))
    if SIZE == 1 and defect in CROSS_ONLY | {"recv_overlap"}:
        defect = "negative"
    x, sc, rc, d = xs[RANK], send_counts[RANK], list(send_counts), list(rd)
    if RANK == bad_rank:
        if defect in ("recv_more", "recv_fewer"):
            rc[k] = send_counts[k] + 1 if defect == "recv_more" or send_counts[k] == 0 else send_counts[k] - 1
        elif defect == "send_more":
            sc += 1                       # the peers expect one fewer (or x is too short)
        elif defect == "negative":
            sc = -1
        elif defect == "negative_displ":
            d[k] = -1
        elif defect == "short_counts":
            rc = rc[:-1]
        elif defect == "float_counts":
            rc = np.asarray(rc, dtype=np.float32)
        elif defect == "recv_out_of_range":
            d[k] = sum(rc) + 1
        elif defect == "recv_overlap":
            rc = [max(c, 1) for c in rc]
            d = [0] * SIZE
        elif defect == "dtype_differs":
            x = x.astype(DTYPES[_other_dtype(dtype)].np)
    _check_all_ranks_agree(lambda: op.execute(x, sc, rc, d), "AllGatherV", bad_rank)
    TRIED["invalid"] += 1


RSV_DEFECTS = ["recv_more", "recv_fewer", "send_differs", "negative", "negative_displ", "send_out_of_range",
               "short_counts", "float_recv_count", "dtype_differs"]


@mpi1
@FUZZ
@given(st.lists(counts_st, min_size=SIZE, max_size=SIZE), st.data(), st.sampled_from(list(DTYPES)),
       st.sampled_from(["sum", "max", "min"]), st.sampled_from(RSV_DEFECTS))
def test_reduce_scatterv_plans(send_counts, data, dtype, rname, defect):
    layouts_ = [data.draw(layouts(send_counts)) for _ in range(SIZE)]
    xs = [_data(dtype, layouts_[r][1], r, 10) for r in range(SIZE)]
    blocks = [xs[r][layouts_[r][0][RANK]:layouts_[r][0][RANK] + send_counts[RANK]] for r in range(SIZE)]
    op = mpicoll.ReduceScatterVOperation(mpicoll.ReduceScatterVParam(reduce_type=rname))
    golden = golden_reduce(blocks, DTYPES[dtype], mpicoll._dtypes.REDUCE_OPS[rname])
    agreed(lambda: _expect(count_wrong(op.execute(xs[RANK], send_counts, layouts_[RANK][0], send_counts[RANK]),
                                       golden) == 0))
    TRIED["valid"] += 1
    # one defect on one rank
    bad_rank = data.draw(st.integers(0, SIZE - 1))
    k = data.draw(st.integers(0, SIZE - 1))
    if SIZE == 1 and defect in CROSS_ONLY:
        defect = "negative"
    x, sc, sd, recv = xs[RANK], list(send_counts), list(layouts_[RANK][0]), send_counts[RANK]
    if RANK == bad_rank:
        if defect in ("recv_more", "recv_fewer"):
            recv = recv + 1 if defect == "recv_more" or recv == 0 else recv - 1
        elif defect == "send_differs":
            sc[k] = _one_off(sc[k])
        elif defect == "negative":
            sc[k] = -1
        elif defect == "negative_displ":
            sd[k] = -1
        elif defect == "send_out_of_range":
            sd[k] = x.size + 1
        elif defect == "short_counts":
            sd = sd[:-1]
        elif defect == "float_recv_count":
            recv = float(recv)
        elif defect == "dtype_differs":
            x = x.astype(DTYPES[_other_dtype(dtype)].np)
    _check_all_ranks_agree(lambda: op.execute(x, sc, sd, recv), "ReduceScatterV", bad_rank)
    TRIED["invalid"] += 1


@mpi1
def test_report_plans_tried(capsys):
    """Runs last in this module: the properties above really tried plans, valid and invalid, on
    every rank (a strategy that filters everything out would pass them vacuously); reports how many."""
    total = WORLD.allreduce(TRIED["valid"] + TRIED["invalid"])
    if not total:
        pytest.skip("the properties were deselected")
    tried = WORLD.allgather((TRIED["valid"], TRIED["invalid"]))
    assert all(valid >= EXAMPLES and invalid >= EXAMPLES for valid, invalid in tried), tried
    with capsys.disabled():
        if RANK == 0:
            print(f"\nfuzz: {TRIED['valid']} valid and {TRIED['invalid']} invalid plans per rank "
                  f"({total} checks over {SIZE} rank(s), {EXAMPLES} examples per property)")


FAILING = textwrap.dedent("""
    import pytest
    from hypothesis import given, settings, strategies as st
    from mpi4py import MPI
    from _mpi import agreed

    @pytest.mark.mpi(min_size=1)
    @settings(max_examples=50, derandomize=True, database=None, deadline=None)
    @given(st.integers(0, 100))
    def test_fails_on_rank_one_only(v):
        def check():
            MPI.COMM_WORLD.Barrier()            # a collective in every example, as the real properties have
            assert not (MPI.COMM_WORLD.Get_rank() == 1 and v > 10), v
        agreed(check)
""")


@pytest.mark.mpi(min_size=1)
@pytest.mark.skipif(SIZE != 1, reason="runs its own 2-rank job once")
def test_a_failing_example_on_one_rank_never_hangs(tmp_path):
    """The property fails on rank 1 only: with the verdict agreed, both ranks fail every shrinking
    step together, and the run ends with hypothesis's falsifying example (not at the watchdog)."""
    (tmp_path / "test_failing.py").write_text(FAILING)
    here = os.path.dirname(os.path.abspath(__file__))
    env = launch_env()
    env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")
    env["MPICOLL_TEST_TIMEOUT"] = "40"
    t0 = time.monotonic()
    res = subprocess.run(mpirun(2, sys.executable, "-m", "mpi4py", "-m", "pytest", "--with-mpi", "-q",
                                "-p", "no:cacheprovider", "--rootdir", str(tmp_path), "-c", os.devnull,
                                str(tmp_path / "test_failing.py")),
                         capture_output=True, text=True, timeout=90, env=env, cwd=tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and time.monotonic() - t0 < 35, out[-3000:]
    assert "v=11" in out and "failed on rank 1: AssertionError: 11" in out, out[-3000:]
