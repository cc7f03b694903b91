"""The Hccl handle API: the seed's tiling example, tiled == untiled for every kind (fixed and random
tile plans, every dtype), the lifecycle (commit per round, query, re-commit, finalize), and its
errors, agreed where other ranks would otherwise wait. (The golden tile plans of every kind run
for every dtype on the world and on split domains in test_ops.py.)"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from mpicoll import _hccl_tasks
from mpicoll import CollectiveError, CollectiveMismatchError, Hccl, HcclDataType, HcclReduceOp
from mpicoll._dtypes import DTYPES, HCCL_DTYPES, reduce_op
from mpicoll.checks._golden import SEED, golden_reduce, rank_data
from mpicoll.checks.hccl import run_tiled, tiled_golden, tiled_layout

from _mpi import RANK, SIZE, WORLD, launch_env, mpirun, raises_everywhere, reduce_ops, setting

mpi1 = pytest.mark.mpi(min_size=1)
mpi2 = pytest.mark.mpi(min_size=2)


def _data(key, size, dtype="float16", rank=RANK):
    return rank_data(SEED, key, rank, size, DTYPES[dtype])


@mpi1
def test_seed_multi_round_all_gather_equals_untiled():
    """The Hccl API documentation's example: 300 float16 per rank as 2 tiles of 128 (repeat=2) and a tail of 44, stride 300.
    (The seed's tail call passes tileLen where it means tailLen: the tail moves 44 elements.)"""
    x = _data("seed", 300)
    y = np.zeros(300 * SIZE, np.float16)
    hccl = Hccl().init()
    h1 = hccl.all_gather(x, y, 128, HcclDataType.FP16, 300, repeat=2, commit=True)
    h2 = hccl.all_gather(x[256:], y[256:], 44, HcclDataType.FP16, 300, commit=True)
    assert h1 >= 0 and h2 >= 0 and h1 != h2
    assert hccl.wait(h1) == 2 and hccl.wait(h2) == 1
    hccl.finalize()
    untiled = np.concatenate([_data("seed", 300, rank=r) for r in range(SIZE)])    # numpy: every rank's x in order
    assert y.view(np.uint16).tolist() == untiled.view(np.uint16).tolist()


#: the Hccl client's block kinds: every task kind of its registry (``mpicoll._hccl_tasks.KINDS``) that moves
#: ``count`` elements per block (AllToAllV moves counts per peer: test_all_to_all_v_rounds_...)
KINDS = [k.NAME.removeprefix("Hccl.") for k in _hccl_tasks.KINDS if issubclass(k, _hccl_tasks.BlockTask)]
#: those that reduce (as their primitive operator: it has a reduce_type), and those whose blocks may
#: lie ``stride_count`` apart (their layout has room for a gap)
REDUCES = [k for k in KINDS if "reduce_type" in {f.name for f in dataclasses.fields(mpicoll.OPERATIONS[k].PARAM)}]
STRIDED = [k for k in KINDS if tiled_layout(k, 2, 1, 1)[1:] != tiled_layout(k, 2, 1, 0)[1:]]


@mpi1
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", ["now", "each", "later"])
def test_seed_tiling_equals_untiled_for_every_kind(kind, mode):
    dt, rop = DTYPES["float16"], "sum" if kind in REDUCES else None
    total, gap = 300, 0
    _, send_size, recv_size = tiled_layout(kind, SIZE, total, gap)
    inputs = [_data(f"tiles/{kind}", send_size, rank=r) for r in range(SIZE)]
    recv = np.zeros(recv_size, dt.np)
    with Hccl().init() as hccl:
        run_tiled(hccl, kind, inputs[RANK], recv, [(128, 2), (44, 1)], total, HcclDataType.FP16, rop, mode)
    golden = tiled_golden(kind, inputs, RANK, total, gap, dt, rop and reduce_op(rop))        # numpy, untiled
    assert recv.view(np.uint16).tolist() == golden.view(np.uint16).tolist()


def _random_plan(rng, total):
    """Tiles covering ``total``: some tasks of ``repeat`` equal tiles each."""
    tiles, left = [], total
    while left:
        t = int(rng.integers(1, left + 1))
        r = int(rng.integers(1, left // t + 1))
        tiles.append((t, r))
        left -= t * r
    return tiles


@mpi1
@pytest.mark.parametrize("dtype", HCCL_DTYPES)
def test_random_tile_plans_and_strides_equal_untiled(dtype):
    """Random tile plans, strides and commit modes of every block kind: the numpy golden of the
    untiled call (:func:`tiled_golden`, computed from every rank's seeded input)."""
    dt = DTYPES[dtype]
    rng = np.random.default_rng([SEED, HCCL_DTYPES.index(dtype)])     # the same plans on every rank
    for trial in range(max(6, len(KINDS))):
        kind = KINDS[trial % len(KINDS)]
        rops = reduce_ops(dtype)
        rname = rops[int(rng.integers(len(rops)))] if kind in REDUCES else None
        total, gap = int(rng.integers(1, 200)), int(rng.integers(0, 9))
        if kind not in STRIDED:
            gap = 0
        tiles = _random_plan(rng, total)
        mode = ("now", "each", "later")[int(rng.integers(3))]
        _, send_size, recv_size = tiled_layout(kind, SIZE, total, gap)
        inputs = [rank_data(SEED, f"random/{dtype}/{trial}", r, send_size, dt) for r in range(SIZE)]
        recv = np.zeros(recv_size, dt.np)
        with Hccl().init() as hccl:
            run_tiled(hccl, kind, inputs[RANK], recv, tiles, total + gap, dt.hccl, rname, mode)
        golden = tiled_golden(kind, inputs, RANK, total, gap, dt, rname and reduce_op(rname))
        where = (kind, rname, total, gap, tiles, mode)
        assert recv.tobytes() == golden.tobytes(), where


@mpi1
@pytest.mark.parametrize("repeat", [1, 3])
def test_all_to_all_v_rounds_equal_one_untiled_call(repeat):
    n = SIZE
    m = (np.arange(n)[:, None] * 3 + np.arange(n)[None, :] + 1) % 4         # m[i, j]: i sends to j, per round
    sc, rc = m[RANK], m[:, RANK]
    gap = 2                                   # each peer's region has 2 spare elements after it
    sd = np.concatenate(([0], np.cumsum(repeat * sc + gap)[:-1]))
    rd = np.concatenate(([0], np.cumsum(repeat * rc + gap)[:-1]))
    xs = [_data(f"a2av/{repeat}", int((repeat * m[r] + gap).sum()), "int32", r) for r in range(n)]
    x, y = xs[RANK], np.full(int((repeat * rc + gap).sum()), -1, np.int32)
    with Hccl().init() as hccl:
        h = hccl.all_to_all_v(x, sc, sd, y, rc, rd, HcclDataType.INT32, repeat=repeat)
        for _ in range(repeat):
            hccl.commit(h)
        assert hccl.wait(h) == repeat
    expected = np.full_like(y, -1)              # one exchange of repeat*counts: the untiled AllToAllV
    for j in range(n):
        sdj = np.concatenate(([0], np.cumsum(repeat * m[j] + gap)[:-1]))
        expected[rd[j]:rd[j] + repeat * rc[j]] = xs[j][sdj[RANK]:sdj[RANK] + repeat * m[j, RANK]]
    assert y.tolist() == expected.tolist()


@mpi1
def test_commit_round_by_round_query_and_recommit():
    x = _data("rounds", 8, "int64")
    y = np.zeros(8, np.int64)
    op = HcclReduceOp.SUM
    with Hccl().init() as hccl:
        h = hccl.all_reduce(x, y, 2, HcclDataType.INT64, op, repeat=4)
        assert hccl.query(h) == 0
        for k in range(4):
            hccl.commit(h)
            assert hccl.query(h) <= k + 1
        while hccl.query(h) < 4:                 # the Ascend example's polling loop
            pass
        expected = golden_reduce([_data("rounds", 8, "int64", r) for r in range(SIZE)], DTYPES["int64"],
                                 reduce_op("sum"))
        assert y.tolist() == expected.tolist()
        with pytest.raises(CollectiveError, match="more than repeat=4 times"):
            hccl.commit(h)                       # done, but not yet waited for
        assert hccl.wait(h) == 4
        x *= 2                                   # a new cycle re-reads the buffers
        for _ in range(4):
            hccl.commit(h)
        assert hccl.wait(h) == 4 and y.tolist() == (2 * expected).tolist()
        assert hccl.wait(h) == 4                 # waiting again: nothing left, returns at once


@mpi1
def test_in_place_all_reduce_and_user_comm_and_repeat_of_reduce_scatter():
    comm = WORLD.Split(0, RANK)
    x = np.arange(6, dtype=np.float32) + RANK
    expected = sum(np.arange(6, dtype=np.float32) + r for r in range(SIZE))
    with Hccl().init(comm) as hccl:
        hccl.wait(hccl.all_reduce(x, x, 3, "float32", "sum", repeat=2, commit=True))
    assert x.tolist() == expected.tolist()
    # ReduceScatter, 2 rounds of 2 elements, stride 4: rank r's blocks at r*4 and r*4 + 2
    send = np.arange(4 * SIZE, dtype=np.float64) * (RANK + 1)
    recv = np.zeros(4)
    with Hccl().init(comm) as hccl:
        hccl.wait(hccl.reduce_scatter(send, recv, 2, np.float64, HcclReduceOp.MAX, stride_count=4, repeat=2,
                                      commit=True))
    assert recv.tolist() == (np.arange(4 * SIZE, dtype=np.float64)[4 * RANK:4 * RANK + 4] * SIZE).tolist()
    comm.Free()


@mpi1
def test_a_client_takes_its_domains_own_timeout(monkeypatch):
    """No ``timeout=``: the client's tasks take the domain's own timeout (a torch group's
    ``timeout=``), as an operation does, even with ``MPICOLL_TIMEOUT`` set (they took that one
    then); a ``timeout=`` given wins. The tasks run right."""
    from mpicoll._domains import user_comm
    mpicoll.init()                                        # (made unwatched, as the other tests have it)
    setting(monkeypatch, "MPICOLL_TIMEOUT", "600")
    comm = WORLD.Dup()
    comm.Set_name("hccl timeout")
    try:
        user_comm(comm, 30.0)                             # (as mpicoll.torch makes a group's)
        for given, want in ((None, 30.0), (5, 5.0), (0, None)):
            x = np.ones(3, np.float32)
            assert Hccl(timeout=given).timeout == (600.0 if given is None else want)    # (before init)
            with Hccl(timeout=given).init(comm) as hccl:
                hccl.wait(hccl.all_reduce(x, x, 3, "float32", "sum", commit=True))
                assert hccl.timeout == want and {op.timeout for op in hccl._ops.values()} == {want}, given
            assert x.tolist() == [float(SIZE)] * 3
        with Hccl().init(WORLD) as hccl:                 # (a communicator without one: MPICOLL_TIMEOUT's)
            assert hccl.timeout == 600.0
    finally:
        comm.Free()


@mpi1
def test_finalize_waits_for_committed_rounds_and_ends_the_handles():
    x = np.full(4, RANK + 1, np.int32)
    y = np.zeros(4 * SIZE, np.int32)
    hccl = Hccl().init()
    h = hccl.all_gather(x, y, 4, HcclDataType.INT32, commit=True)
    untouched = hccl.all_gather(x, np.zeros(4 * SIZE, np.int32), 4, HcclDataType.INT32)   # never committed
    hccl.finalize()
    assert y.tolist() == [r + 1 for r in range(SIZE) for _ in range(4)]
    raises_everywhere(lambda: hccl.all_gather(x, y, 4, HcclDataType.INT32), CollectiveError,
                      "prepare after finalize(): call init() again")
    for handle in (h, untouched):                # (a committed one waited for by finalize, too)
        with pytest.raises(CollectiveError, match="not initialised"):
            hccl.wait(handle)
    hccl.finalize()                              # a second finalize does nothing
    hccl.init()                                  # a new cycle
    hccl.wait(hccl.all_gather(x, y, 4, HcclDataType.INT32, commit=True))
    hccl.finalize()


@mpi1
def test_prepare_limit_is_a_setting_and_agreed():
    x, y = np.zeros(1, np.int8), np.zeros(SIZE, np.int8)
    with Hccl(max_prepares=2).init() as hccl:
        hccl.all_gather(x, y, 1, HcclDataType.INT8)
        hccl.all_gather(x, y, 1, HcclDataType.INT8)
        raises_everywhere(lambda: hccl.all_gather(x, y, 1, HcclDataType.INT8), CollectiveError,
                          "more than max_prepares=2 prepares")
    with Hccl().init() as hccl:                  # the documented default: 32
        for _ in range(32):
            hccl.all_gather(x, y, 1, HcclDataType.INT8)
        raises_everywhere(lambda: hccl.all_gather(x, y, 1, HcclDataType.INT8), CollectiveError,
                          "more than max_prepares=32")


@mpi1
def test_local_misuse_is_refused():
    x, y = np.ones(2, np.float32), np.zeros(2 * SIZE, np.float32)
    with pytest.raises(CollectiveError, match="prepare before init"):
        Hccl().all_gather(x, y, 2, HcclDataType.FP32)
    a, b = Hccl().init(), Hccl().init()
    ha = a.all_gather(x, y, 2, HcclDataType.FP32, repeat=1)
    with pytest.raises(CollectiveError, match="never committed") as info:
        a.wait(ha)
    assert info.value.param == "handle" and f"rank {RANK}" in str(info.value)
    a.commit(ha)
    with pytest.raises(CollectiveError, match="more than repeat=1 times"):
        a.commit(ha)
    with pytest.raises(CollectiveError, match="belongs to another Hccl client"):
        b.wait(ha)
    with pytest.raises(CollectiveError, match="no task of this client"):
        a.query(12345678)
    with pytest.raises(CollectiveError, match="already initialised"):
        a.init()
    a.wait(ha)
    a.finalize()
    b.finalize()


@mpi1
def test_buffer_rules_are_agreed_when_one_rank_breaks_them():
    last = SIZE - 1
    x, y = np.ones(8, np.float16), np.zeros(8 * SIZE, np.float16)
    with Hccl().init() as hccl:
        small = y[:8 * SIZE - 1] if RANK == last else y
        raises_everywhere(lambda: hccl.all_gather(x, small, 8, HcclDataType.FP16), CollectiveError,
                          f"recv.size={8 * SIZE - 1} on rank {last}", "(repeat-1)*count + (rank_size-1)*stride + count")
        wrong = y.view(np.int16) if RANK == last else y
        raises_everywhere(lambda: hccl.all_gather(x, wrong, 8, HcclDataType.FP16), CollectiveError,
                          f"recv.dtype='int16' on rank {last}", "must be the dtype argument (float16)")
        raises_everywhere(lambda: hccl.all_gather(x, y, 4, HcclDataType.FP16, stride_count=4, repeat=2),
                          CollectiveError, "stride_count=4", "must be >= repeat*count = 8") if SIZE > 1 else None
        raises_everywhere(lambda: hccl.all_gather(x, y, 4, HcclDataType.FP16, stride_count=3), CollectiveError,
                          "stride_count=3", "must be 0 or >= the count (4)")
        raises_everywhere(lambda: hccl.all_gather(x, x, 1, HcclDataType.FP16), CollectiveError, "overlaps send")
        raises_everywhere(lambda: hccl.all_reduce(x, y, 4, HcclDataType.FP16, "sum", repeat=0), CollectiveError,
                          "repeat=0", "must be an integer >= 1")
        raises_everywhere(lambda: hccl.reduce_scatter(x, y, 1, HcclDataType.FP16, "median"), CollectiveError,
                          "op='median'")


@mpi2
def test_counts_that_differ_across_ranks_are_agreed():
    x, y = np.ones(8, np.int32), np.zeros(8 * SIZE, np.int32)
    with Hccl().init() as hccl:
        raises_everywhere(lambda: hccl.all_gather(x, y, 8 if RANK else 4, HcclDataType.INT32),
                          CollectiveMismatchError, "Hccl.AllGather")
        n = SIZE
        sc = [1] * n
        rc = [1] * n
        if RANK == 1:
            rc = [2] + [1] * (n - 1)
        raises_everywhere(lambda: hccl.all_to_all_v(x, sc, list(range(n)), y, rc, [2 * i for i in range(n)],
                                                    HcclDataType.INT32),
                          CollectiveMismatchError, "recv_counts[0]=2 on rank 1", "send_counts[1]=1")
        raises_everywhere(lambda: (hccl.all_gather(x, y, 8, HcclDataType.INT32) if RANK else
                                   hccl.all_to_all(x, y, 1, HcclDataType.INT32)),
                          CollectiveMismatchError, "Hccl.AllToAll vs Hccl.AllGather")


@mpi2
def test_tasks_on_two_domains_and_overlapping_rounds_in_flight():
    """Multi-step rounds (float16 AllReduce above 64 KiB: AllToAll, reduction, AllGather) and
    single-call tasks in flight together, committed in the same order on every rank."""
    big = _data("two/big", 40_000)
    out = np.zeros_like(big)
    xs = np.full(3, RANK, np.int16)
    ys = np.zeros(3 * SIZE, np.int16)
    sub = WORLD.Split(RANK % 2, RANK)
    zs = np.zeros(3 * sub.Get_size(), np.int16)
    with Hccl().init() as world_hccl, Hccl().init(sub) as sub_hccl:
        h1 = world_hccl.all_reduce(big, out, 20_000, HcclDataType.FP16, HcclReduceOp.SUM, repeat=2)
        h2 = world_hccl.all_gather(xs, ys, 3, HcclDataType.INT16)
        h3 = sub_hccl.all_gather(xs, zs, 3, HcclDataType.INT16, commit=True)
        world_hccl.commit(h1)
        world_hccl.commit(h2)
        world_hccl.commit(h1)
        assert sub_hccl.wait(h3) == 1 and world_hccl.wait(h2) == 1 and world_hccl.wait(h1) == 2
    dt = DTYPES["float16"]
    assert out.tobytes() == golden_reduce([_data("two/big", 40_000, rank=r) for r in range(SIZE)], dt,
                                          reduce_op("sum")).tobytes()
    assert ys.tolist() == [r for r in range(SIZE) for _ in range(3)]
    members = [r for r in range(SIZE) if r % 2 == RANK % 2]
    assert zs.tolist() == [r for r in members for _ in range(3)]
    sub.Free()


@mpi1
def test_exception_inside_the_with_block_leaves_no_collective_behind():
    x, y = np.ones(2, np.int8), np.zeros(2 * SIZE, np.int8)
    with pytest.raises(KeyError):
        with Hccl().init() as hccl:
            hccl.wait(hccl.all_gather(x, y, 2, HcclDataType.INT8, commit=True))
            raise KeyError("user code failed")
    assert y.tolist() == [1] * 2 * SIZE
    MPI.COMM_WORLD.Barrier()


@pytest.mark.mpi(min_size=1)
@pytest.mark.skipif(SIZE != 1, reason="runs its own mpirun job once")
def test_overlap_script_runs():
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(mpirun(2, sys.executable, "scripts/hccl_overlap.py", "--mib", "1", "--chunks", "2", "--dim",
                                 "32", "--reps", "2"), cwd=root, env=launch_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "hidden" in proc.stdout and "overlapped" in proc.stdout


@mpi1
@pytest.mark.parametrize("kind", STRIDED)
@pytest.mark.parametrize("dtype", ["int32", "float16"])
def test_each_rank_its_own_stride(kind, dtype):
    """Strides are each rank's own layout: rank 0 packed, the others with gaps, in one task (the
    MPI call is chosen from the agreed table, so every rank makes the same one)."""
    dt, total = DTYPES[dtype], 12
    gap = 0 if RANK == 0 else 1 + RANK
    _, send_size, recv_size = tiled_layout(kind, SIZE, total, gap)
    inputs = [rank_data(SEED, f"own-stride/{kind}/{dtype}", r, tiled_layout(kind, SIZE, total, 0 if r == 0 else 1 + r)[1],
                        dt) for r in range(SIZE)]
    recv = np.zeros(recv_size, dt.np)
    rname = "sum" if kind in REDUCES else None
    with Hccl().init() as hccl:
        run_tiled(hccl, kind, inputs[RANK], recv, [(4, 3)], total + gap, dt.hccl, rname, "each")
    s = total + gap
    if kind == "AllGather":
        expected = np.zeros(recv_size, dt.np)
        for j in range(SIZE):
            expected[j * s:j * s + total] = inputs[j]
    elif kind == "ReduceScatter":
        blocks = [inputs[j][RANK * (total + (0 if j == 0 else 1 + j)):][:total] for j in range(SIZE)]
        expected = golden_reduce(blocks, dt, reduce_op("sum"))
    else:
        assert kind == "AllToAll", f"no golden here for the strided kind {kind}: add one"
        expected = np.zeros(recv_size, dt.np)
        for j in range(SIZE):
            sj = total + (0 if j == 0 else 1 + j)
            expected[j * s:j * s + total] = inputs[j][RANK * sj:RANK * sj + total]
    assert recv.tobytes() == expected.tobytes()


SKIPPED_COMMIT = """
    import numpy as np, mpicoll
    from mpi4py import MPI
    r = MPI.COMM_WORLD.Get_rank()
    x, out = np.ones(8, np.float32), np.empty(8, np.float32)
    h = mpicoll.Hccl().init()
    a = h.all_reduce(x, out, 4, np.float32, "sum", repeat=2)
    h.commit(a)
    try:
        if r != 0:
            h.commit(a)                     # rank 0 skips its second commit
        h.wait(a)
        mpicoll.AllReduceOperation().execute(x, out=out)
        say("no error")
    except mpicoll.CollectiveError as e:
        say(f"{type(e).__name__}: {e}")
"""


@pytest.mark.skipif(SIZE != 1, reason="runs its own mpirun jobs once")
@pytest.mark.parametrize("env", [{"MPICOLL_DEBUG": "1"}, {"MPICOLL_TIMEOUT": "30"}], ids=["debug", "watchdog"])
def test_a_rank_that_skips_a_commit_gets_the_named_error_everywhere(tmp_path, env):
    """Each committed round of a task agrees its own sequence row: a rank that skipped a commit and
    made another call raises the same named mismatch as its peers, which wait for that round (it
    hung under MPICOLL_DEBUG; timed out saying 'every rank arrived' under the watchdog)."""
    from _mpi import said
    lines = said(tmp_path, SKIPPED_COMMIT, 3, env=env)
    assert len(lines) == 3 and len({line.split(": ", 1)[1] for line in lines}) == 1, lines
    assert "CollectiveMismatchError: AllReduce vs plan run: operation differs across ranks" in lines[0], lines
