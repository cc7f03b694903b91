"""The node's shared window (mpicoll._shm): AllReduce and ReduceScatter(V) through it, bit for bit
against the rank-order numpy golden in every dtype and reduce op; sizes around the threshold and
the round boundaries; in place; plans, the Hccl client, graph replays, the functional API; two
communicators with windows at once; the settings; a rank that never arrives; nothing left behind.

Most tests run on a fresh duplicate of the world whose window has SLOT bytes per rank per round and
thresholds of THRESHOLD bytes, so that small arrays take many rounds (the module's constants are
the same on every rank, as they must be).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import mpicoll
from mpicoll import _env, _shm
from mpicoll._domains import user_comm
from mpicoll._thresholds import VALUES
from mpicoll._dtypes import DTYPES, REDUCE_OPS, reduce_ops_for
from mpicoll.checks._golden import SEED, count_wrong, golden_reduce, rank_data

from _mpi import OPEN_MPI, RANK, SAMPLE, SIZE, WORLD, launch_env, mpirun, raises_everywhere, setting, within

mpi1 = pytest.mark.mpi(min_size=1)
mpi2 = pytest.mark.mpi(min_size=2)

SLOT = 4096
THRESHOLD = 1024


@pytest.fixture(params=["two-shot", "one-shot"])
def comm(monkeypatch, request):
    """A fresh duplicate of the world with a small window (freed after the test); AllReduce in one
    shot up to the slot size, or always in two. No call rides its agreement (the slot is empty on
    every rank alike): the small sizes here reach the window."""
    monkeypatch.setitem(VALUES, "ride", 0)
    monkeypatch.setitem(VALUES, "window.one_shot", SLOT * SIZE * SIZE if request.param == "one-shot" else 0)
    monkeypatch.setitem(VALUES, "window.slot", SLOT)
    monkeypatch.setitem(VALUES, "window.allreduce", THRESHOLD)
    monkeypatch.setitem(VALUES, "window.allreduce.16bit", THRESHOLD)
    monkeypatch.setitem(VALUES, "window.ordered", THRESHOLD)
    monkeypatch.setitem(VALUES, "window.reduce_scatter", THRESHOLD)
    c = WORLD.Dup()
    yield c
    c.Free()


def sizes(itemsize: int) -> list[int]:
    """Element counts around the threshold and the round boundaries (one round: SLOT bytes)."""
    t, r = THRESHOLD // itemsize, SLOT // itemsize
    return [t - 1, t, t + 1, r - 1, r, r + 1, 3 * r + 7 * SIZE + 1]


def used_window(comm) -> bool:
    return bool(user_comm(comm)._node)


@mpi1
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_allreduce_every_op_and_size_bit_for_bit(comm, dtype):
    dt = DTYPES[dtype]
    for rname in reduce_ops_for(dt):
        rop = REDUCE_OPS[rname]
        op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=comm, reduce_type=rname))
        for size in sizes(dt.itemsize):
            kind = "random" if dt.np.kind == "f" and size * dt.itemsize >= THRESHOLD and SIZE > 1 else "int"
            xs = [rank_data(SEED, f"shm/ar/{dtype}/{rname}/{size}", r, size, dt, kind) for r in range(SIZE)]
            golden = golden_reduce(xs, dt, rop)
            assert count_wrong(op.execute(xs[RANK]), golden) == 0, (rname, size)
            x = xs[RANK].copy()
            assert op.execute(x, out=x) is x and count_wrong(x, golden) == 0, (rname, size, "in place")
    assert used_window(comm) == (SIZE > 1)


@mpi1
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_reduce_scatter_every_op_and_size_bit_for_bit(comm, dtype):
    dt = DTYPES[dtype]
    for rname in reduce_ops_for(dt):
        rop = REDUCE_OPS[rname]
        op = mpicoll.ReduceScatterOperation(mpicoll.ReduceScatterParam(comm=comm, reduce_type=rname))
        for block in sorted({max(s // SIZE, 1) for s in sizes(dt.itemsize)}):
            kind = "random" if dt.np.kind == "f" and SIZE > 1 else "int"
            xs = [rank_data(SEED, f"shm/rs/{dtype}/{rname}/{block}", r, (SIZE * block, 2), dt, kind)
                  for r in range(SIZE)]
            golden = golden_reduce(xs, dt, rop)[RANK * block:(RANK + 1) * block]
            assert count_wrong(op.execute(xs[RANK]), golden) == 0, (rname, block)
            x = xs[RANK].copy()
            mine = x[RANK * block:(RANK + 1) * block]
            assert op.execute(x, out=mine) is mine and count_wrong(mine, golden) == 0, (rname, block, "in place")
    assert used_window(comm) == (SIZE > 1)


def count_patterns(total: int) -> dict[str, list[int]]:
    n = SIZE
    return {"even": [total // n] * n,
            "uneven": [total // n + k for k in range(n)],
            "one rank only": [0] * (n - 1) + [total],
            "first rank only": [total] + [0] * (n - 1),
            "half zero": [total if k % 2 else 0 for k in range(n)],
            "all zero": [0] * n}


@mpi1
@pytest.mark.parametrize("dtype", SAMPLE)
def test_reduce_scatter_v_uneven_and_zero_counts(comm, dtype):
    dt, rop = DTYPES[dtype], REDUCE_OPS["sum"]
    op = mpicoll.ReduceScatterVOperation(mpicoll.ReduceScatterVParam(comm=comm, reduce_type="sum"))
    for total in (THRESHOLD // dt.itemsize, 3 * SLOT // dt.itemsize + 5):
        for name, counts in count_patterns(total).items():
            displs = np.concatenate(([0], np.cumsum(counts)[:-1])).tolist()
            xs = [rank_data(SEED, f"shm/rsv/{dtype}/{total}/{name}", r, sum(counts), dt,
                            "random" if dt.np.kind == "f" else "int") for r in range(SIZE)]
            full = golden_reduce(xs, dt, rop)
            golden = full[displs[RANK]:displs[RANK] + counts[RANK]]
            got = op.execute(xs[RANK], counts, displs, counts[RANK])
            assert count_wrong(got, golden) == 0, (total, name)
            # a permuted layout with gaps: packed first, then the same path
            gap = 3
            perm = list(reversed(range(SIZE)))
            sd, pos = [0] * SIZE, 0
            for j in perm:
                sd[j], pos = pos, pos + counts[j] + gap
            x = np.full(pos, 99, dtype=dt.np)
            for j in range(SIZE):
                x[sd[j]:sd[j] + counts[j]] = xs[RANK][displs[j]:displs[j] + counts[j]]
            assert count_wrong(op.execute(x, counts, sd, counts[RANK]), golden) == 0, (total, name, "gapped")


@mpi1
def test_plans_hccl_graph_and_functional_take_the_window(comm):
    dt = DTYPES["float32"]
    n = 3 * SLOT // 4 + 5
    xs = [rank_data(SEED, "shm/plans", r, n, dt, "random") for r in range(SIZE)]
    golden = golden_reduce(xs, dt, REDUCE_OPS["sum"])
    x = xs[RANK].copy()
    ar = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=comm, reduce_type="sum"))
    rs = mpicoll.ReduceScatterOperation(mpicoll.ReduceScatterParam(comm=comm, reduce_type="sum"))
    k = n // SIZE
    with ar.prepare(x) as p1, ar.prepare(x[:n - 1]) as p2, rs.prepare(x[:k * SIZE]) as p3:
        for it in range(5):          # plans, one-shot calls and started plans interleaved on one window
            assert count_wrong(p1.run(), golden) == 0, it
            assert count_wrong(p2.start().wait(), golden[:n - 1]) == 0, it
            assert count_wrong(ar.execute(x), golden) == 0, it
            assert count_wrong(p3.run(), golden_reduce([a[:k * SIZE] for a in xs], dt, REDUCE_OPS["sum"])
                               [RANK * k:(RANK + 1) * k]) == 0, it
    assert used_window(comm) == (SIZE > 1)

    from mpicoll import functional as F, graph
    t = x.copy()
    F.all_reduce(t, group=comm)
    assert count_wrong(t, golden) == 0
    with graph.capture() as g:
        y = x.copy()
        F.all_reduce(y, group=comm)
    for _ in range(3):
        np.copyto(y, x)
        g.replay()
        assert count_wrong(y, golden) == 0

    from mpicoll.hccl import Hccl, HcclDataType, HcclReduceOp
    out = np.empty_like(x)
    with Hccl().init(comm) as hccl:            # two rounds of n // 2 and the rest through the window
        c = n // 2
        h = hccl.all_reduce(x, out, c, HcclDataType.FP32, HcclReduceOp.SUM, repeat=2, commit=True)
        assert hccl.wait(h) == 2
    assert count_wrong(out[:2 * c], golden[:2 * c]) == 0


@mpi2
def test_two_communicators_with_windows_at_once(comm, monkeypatch):
    other = WORLD.Split(0, SIZE - 1 - RANK)               # the ranks reversed: another window, another order
    try:
        dt, rop = DTYPES["bfloat16"], REDUCE_OPS["sum"]
        n = 2 * SLOT // 2 + 3
        xs = [rank_data(SEED, "shm/two", r, n, dt, "random") for r in range(SIZE)]
        a = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=comm, reduce_type="sum"))
        b = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=other, reduce_type="sum"))
        for _ in range(3):
            assert count_wrong(a.execute(xs[RANK]), golden_reduce(xs, dt, rop)) == 0
            assert count_wrong(b.execute(xs[RANK]), golden_reduce(xs[::-1], dt, rop)) == 0
        assert used_window(comm) and used_window(other)
    finally:
        other.Free()


@mpi1
def test_mpicoll_shm_off_keeps_mpi_paths(monkeypatch):
    setting(monkeypatch, "MPICOLL_SHM", "0")
    monkeypatch.setitem(VALUES, "window.allreduce", THRESHOLD)
    monkeypatch.setitem(VALUES, "window.allreduce.16bit", THRESHOLD)
    c = WORLD.Dup()
    try:
        x = np.ones(4096, np.float32)
        got = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=c)).execute(x)
        assert got.tolist() == [SIZE] * 4096
        assert not user_comm(c).local and not used_window(c)
    finally:
        c.Free()


@mpi1
def test_the_world_is_one_node_here():
    assert mpicoll._domains.world().local == _env.value("MPICOLL_SHM")


# ----------------------------------------------------------------------------- jobs of their own

def run(tmp_path, body: str, np_: int = 2, env: dict | None = None, timeout: float = 60):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(body))
    clean = launch_env(settings=False)
    clean.update(env or {})
    return subprocess.run(mpirun(np_, sys.executable, "-m", "mpi4py", str(script)), capture_output=True, text=True,
                          timeout=timeout, env=clean)


def shm_files() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def mapped(names: set[str]) -> set[str]:
    """Those of ``names`` that a live process still maps."""
    found = set()
    for maps in (f"/proc/{p}/maps" for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(maps, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError:
            continue
        found |= {n for n in names if f"/dev/shm/{n}" in text}
    return found


JOB = """
    import os, signal, sys, time
    import numpy as np
    from mpi4py import MPI
    import mpicoll
    r = MPI.COMM_WORLD.Get_rank()
    op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(reduce_type="sum"))
    x = mpicoll.node_buffer(1 << 20, np.float32)       # (a node buffer too: its own shared window)
    x[:] = 1
    assert op.execute(x)[0] == MPI.COMM_WORLD.Get_size()
    print("WINDOW_ON" if mpicoll._domains.world()._node else "WINDOW_OFF", flush=True)
    how = {how!r}
    if how == "raise":
        raise RuntimeError("boom on every rank")
    if how == "kill" and r == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "kill":
        time.sleep(30)
"""


@pytest.mark.skipif(RANK != 0, reason="one job, launched from rank 0")
@pytest.mark.parametrize("how", ["exit", "raise", "kill"])
def test_nothing_left_in_dev_shm(tmp_path, how):
    before = shm_files()
    res = run(tmp_path, JOB.format(how=how), timeout=60)
    assert res.stdout.count("WINDOW_ON") >= (2 if how != "kill" else 1), res.stdout + res.stderr
    assert (res.returncode == 0) == (how == "exit"), res.stderr
    left = shm_files() - before
    assert not (left - mapped(left)), f"left in /dev/shm after '{how}': {sorted(left)}"


@pytest.mark.skipif(RANK != 0, reason="one job, launched from rank 0")
def test_a_rank_that_never_arrives_times_out_naming_the_operator(tmp_path):
    res = run(tmp_path, """
        import numpy as np
        from mpi4py import MPI
        import mpicoll
        op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(reduce_type="sum"), validate=False)
        x = np.ones(1 << 18, np.float32)
        op.execute(x)                                   # the window exists from here on
        if MPI.COMM_WORLD.Get_rank() == 0:
            op.execute(x)                               # the watchdog ends the job
        else:
            import time; time.sleep(30)
    """, env={"MPICOLL_TIMEOUT": "2"}, timeout=60)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    assert "AllReduce: timed out after 2 s on rank 0" in out and "waiting in MPI Barrier" in out, out
    assert "ranks that did not arrive: [1]" in out, out


SMALL_SHM_JOB = """
    import warnings
    import numpy as np
    from mpi4py import MPI
    import mpicoll
    from mpicoll import _shm
    from mpicoll._thresholds import VALUES
    n = MPI.COMM_WORLD.Get_size()
    if {margin!r}:                                  # (a window that /dev/shm holds, but not with Open MPI's 5% more)
        room = MPI.COMM_WORLD.bcast(_shm._room())
        VALUES["window.slot"] = int(room / 1.025) // (2 * n) // 64 * 64
        window = 2 * VALUES["window.slot"] * n
        assert window <= room < 1.05 * window, (window, room)     # (Open MPI's own rule: 5% more)
    else:
        VALUES["window.slot"] = 8 << 20                   # (a window of 16 MiB per rank: more than /dev/shm holds)
    if {pages!r}:
        _shm._room = lambda: float("inf")           # (past the check of room: the pages themselves fail)
    x = np.arange(1 << 18, dtype=np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(reduce_type="sum")).execute(x)
        z = mpicoll.ReduceScatterOperation(mpicoll.ReduceScatterParam(reduce_type="sum")).execute(x)
    assert np.array_equal(y, x * n) and np.array_equal(z, (x * n).reshape(n, -1)[MPI.COMM_WORLD.Get_rank()])
    said = f"shared window of {{2 * VALUES['window.slot']}} bytes per member"
    assert len(caught) == 1 and said in str(caught[0].message), [str(w.message) for w in caught]
    print(f"WARNED {{caught[0].message}}", flush=True)
    assert not {margin!r} or _shm._room() >= window, "the window came to exceed the room: not the margin's case"
    try:
        mpicoll.node_buffer(64 << 20, np.float32)
    except mpicoll.CollectiveError as exc:
        assert exc.param == "shape", exc
        print(f"RAISED {{exc}}", flush=True)
    b = mpicoll.node_buffer(1 << 16, np.float32)    # (a small one still fits; a ReduceScatter from it
    b[:] = 1                                        # needs no window)
    assert mpicoll.AllReduceOperation(mpicoll.AllReduceParam()).execute(b)[0] == n
    plan = mpicoll.ReduceScatterOperation(mpicoll.ReduceScatterParam()).prepare(b, out=np.empty(b.size // n, np.float32))
    assert (plan.run() == n).all()
"""


def small_dev_shm(cmd: list[str], size: str) -> list[str]:
    """``cmd`` in a mount namespace of its own whose /dev/shm is a tmpfs of ``size``."""
    return ["unshare", "-m", "sh", "-c", f'mount -t tmpfs -o size={size} tmpfs /dev/shm && exec "$@"', "sh", *cmd]


@pytest.mark.skipif(RANK != 0, reason="one job, launched from rank 0")
@pytest.mark.parametrize("case", ["no-room", "no-pages", "margin"])
def test_a_small_dev_shm_gives_mpis_path_and_node_buffers_raise(tmp_path, case):
    """Where /dev/shm cannot hold the window (a container's 64 MiB), the reductions take MPI's
    path with a warning on every rank, a node buffer too large raises on every rank: no SIGBUS,
    no hang. ``no-pages``: past the check of room, MPI maps the window and the pages themselves
    fail (MPICH's sparse file). ``margin``: /dev/shm holds the window's bytes (its size is taken from
    the room left once MPI runs) but not Open MPI's 5% more, where its Allocate_shared would fail on
    one rank alone."""
    if subprocess.run(small_dev_shm(["true"], "1m"), capture_output=True).returncode:
        pytest.skip("needs a mount namespace of its own (unshare -m, as root) for a small /dev/shm")
    pages = case == "no-pages"
    if pages and OPEN_MPI:
        pytest.skip("Open MPI's Allocate_shared fails on one rank and leaves the others in it: the room is "
                    "checked before (the no-room case)")
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(SMALL_SHM_JOB.format(pages=pages, margin=case == "margin")))
    env = launch_env(settings=False)
    res = subprocess.run(small_dev_shm(mpirun(2, sys.executable, "-m", "mpi4py", str(script)), "12m"),
                         capture_output=True, text=True, timeout=90, env=env)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    why = "no room for its pages" if pages else "No space left on device"
    assert out.count("WARNED") == 2 and why in out, out
    raised = "node_buffer on the world (mpicoll.world): the node's shared memory (/dev/shm) cannot hold a node buffer"
    assert out.count("RAISED") == 2 and raised in out, out


@mpi2
def test_no_room_on_one_rank_only_gives_mpis_path_everywhere(comm, monkeypatch):
    """Only the last rank finds /dev/shm too small: every rank warns alike, takes MPI's path with
    the right result, and raises alike for a node buffer; no rank waits for another."""
    if RANK == SIZE - 1:
        monkeypatch.setattr(_shm, "_room", lambda: 0)
    x = rank_data(SEED, "shm/no-room", RANK, SLOT, DTYPES["float32"], "int")
    golden = golden_reduce([rank_data(SEED, "shm/no-room", r, SLOT, DTYPES["float32"], "int") for r in range(SIZE)],
                           DTYPES["float32"], REDUCE_OPS["sum"])
    op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=comm, reduce_type="sum"))
    with pytest.warns(RuntimeWarning, match=r"cannot hold a shared window .*No space left on device"):
        assert count_wrong(op.execute(x), golden) == 0
    assert user_comm(comm)._node is False and count_wrong(op.execute(x), golden) == 0
    with pytest.raises(mpicoll.CollectiveError, match="node_buffer on .* cannot hold a node buffer") as err:
        mpicoll.node_buffer(16, np.float32, comm=comm)
    assert err.value.param == "shape" and not user_comm(comm).buffers


@mpi1
@pytest.mark.parametrize("dtype", SAMPLE)
def test_reduce_to_each_root_bit_for_bit(comm, dtype):
    dt, rop = DTYPES[dtype], REDUCE_OPS["max" if dtype == "int8" else "sum"]
    for root in range(SIZE):
        op = mpicoll.ReduceOperation(mpicoll.ReduceParam(comm=comm, rank_root=root, reduce_type=rop.name))
        for size in sizes(dt.itemsize)[1::2]:
            xs = [rank_data(SEED, f"shm/reduce/{dtype}/{root}/{size}", r, size, dt,
                            "random" if dt.np.kind == "f" and SIZE > 1 else "int") for r in range(SIZE)]
            golden = golden_reduce(xs, dt, rop)
            got = op.execute(xs[RANK])
            assert (count_wrong(got, golden) == 0) if RANK == root else got is None, (root, size)
            x = xs[RANK].copy()
            got = op.execute(x, out=x)
            assert (got is x and count_wrong(x, golden) == 0) if RANK == root else got is None, (root, size)
    assert used_window(comm) == (SIZE > 1)


@mpi1
def test_started_plans_in_flight_complete_at_start_and_keep_order(comm):
    """Runs share the window between their collectives: a started plan holding window steps
    completes at start (blocking), so later runs never overwrite what it still reads."""
    dt, rop = DTYPES["float16"], REDUCE_OPS["sum"]
    n = 3 * SLOT // 2 + 1
    xs = [[rank_data(SEED, f"shm/flight/{k}", r, n, dt, "random") for r in range(SIZE)] for k in range(3)]
    ar = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=comm, reduce_type="sum"))
    ag = mpicoll.AllGatherOperation(mpicoll.AllGatherParam(comm=comm))
    plans = [ar.prepare(x[RANK]) for x in xs]
    handles = [p.start() for p in plans]
    assert ag.execute(np.array([RANK])).reshape(-1).tolist() == list(range(SIZE))
    for k in (2, 0, 1):
        assert count_wrong(handles[k].wait(), golden_reduce(xs[k], dt, rop)) == 0, k
    for p in plans:
        p.free()


@mpi2
def test_a_plan_on_a_freed_communicator_raises_instead_of_touching_its_window(monkeypatch):
    monkeypatch.setitem(VALUES, "window.allreduce", THRESHOLD)
    monkeypatch.setitem(VALUES, "window.allreduce.16bit", THRESHOLD)
    c = WORLD.Dup()
    plan = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=c)).prepare(np.ones(4096, np.float32))
    assert plan.run()[0] == SIZE and used_window(c)
    c.Free()                                  # frees mpicoll's duplicate and its window
    with pytest.raises(mpicoll.CollectiveError, match="freed"):
        plan.run()


@mpi2
def test_float_overflow_is_inf_without_a_warning(comm):
    import warnings
    x = np.full(4096, 3e38, np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=comm)).execute(x)
    assert np.isinf(got).all()


# ----------------------------------------------------------------------------- node buffers (inputs read in place)

def counted_puts(monkeypatch) -> list:
    """Count the window's copies-in (NodeWindow.put) from now on."""
    seen: list = []
    put = _shm.NodeWindow.put
    monkeypatch.setattr(_shm.NodeWindow, "put", lambda self, pairs: (seen.append(1), put(self, pairs))[1])
    return seen


@mpi1
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_node_buffer_inputs_are_read_in_place_bit_for_bit(comm, dtype, monkeypatch):
    dt = DTYPES[dtype]
    puts = counted_puts(monkeypatch)
    for size in sizes(dt.itemsize):
        kind = "random" if dt.np.kind == "f" and size * dt.itemsize >= THRESHOLD and SIZE > 1 else "int"
        xs = [rank_data(SEED, f"shm/buf/{dtype}/{size}", r, size, dt, kind) for r in range(SIZE)]
        buf = mpicoll.node_buffer(size + 5, dt.np, comm=comm)[3:3 + size]     # (at the same place on every rank)
        for rname in ("sum", "max"):
            rop = REDUCE_OPS[rname]
            golden = golden_reduce(xs, dt, rop)
            ar = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=comm, reduce_type=rname))
            np.copyto(buf, xs[RANK])
            assert count_wrong(ar.execute(buf), golden) == 0, (size, rname)
            assert count_wrong(buf, xs[RANK]) == 0, (size, rname, "input untouched")
            before = len(puts)
            assert ar.execute(buf, out=buf) is buf and count_wrong(buf, golden) == 0, (size, rname, "in place")
            del puts[before:]                 # (in place in one shot copies in: the result overwrites the input)
            root = SIZE - 1
            red = mpicoll.ReduceOperation(mpicoll.ReduceParam(comm=comm, reduce_type=rname, rank_root=root))
            np.copyto(buf, xs[RANK])
            got = red.execute(buf)
            assert (got is None) == (RANK != root) and (got is None or count_wrong(got, golden) == 0), (size, rname)
            k = size // SIZE
            rs = mpicoll.ReduceScatterOperation(mpicoll.ReduceScatterParam(comm=comm, reduce_type=rname))
            got = rs.execute(buf[:k * SIZE])
            want = golden_reduce([a[:k * SIZE] for a in xs], dt, rop)[RANK * k:(RANK + 1) * k]
            assert count_wrong(got, want) == 0, (size, rname, "ReduceScatter")
            counts = [k + (j == SIZE - 1) * (size - k * SIZE) for j in range(SIZE)]
            rsv = mpicoll.ReduceScatterVOperation(mpicoll.ReduceScatterVParam(comm=comm, reduce_type=rname))
            got = rsv.execute(buf, counts, np.cumsum([0] + counts[:-1]), counts[RANK])
            a = sum(counts[:RANK])
            assert count_wrong(got, golden[a:a + counts[RANK]]) == 0, (size, rname, "ReduceScatterV")
    assert not puts, "a node buffer's input was copied into the window"
    assert used_window(comm) == (SIZE > 1)


@mpi1
def test_node_buffer_plans_run_again_on_new_content(comm, monkeypatch):
    dt, rop = DTYPES["bfloat16"], REDUCE_OPS["sum"]
    n = 3 * SLOT // 2 + 7
    buf = mpicoll.node_buffer((n,), dt.np, comm=comm)
    ar = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=comm, reduce_type="sum"))
    rs = mpicoll.ReduceScatterOperation(mpicoll.ReduceScatterParam(comm=comm, reduce_type="sum"))
    k = n // SIZE
    out = np.empty_like(buf)
    puts = counted_puts(monkeypatch)
    with ar.prepare(buf, out=out) as p1, rs.prepare(buf[:k * SIZE]) as p2:
        for it in range(4):
            xs = [rank_data(SEED, f"shm/bufplan/{it}", r, n, dt, "random") for r in range(SIZE)]
            golden = golden_reduce(xs, dt, rop)
            np.copyto(buf, xs[RANK])
            assert count_wrong(p1.run(), golden) == 0, it
            started = p1.start()                       # a started run, with other collectives in between
            other = ar.execute(np.ones(4, np.float32))
            assert count_wrong(started.wait(), golden) == 0 and other.tolist() == [SIZE] * 4, it
            want = golden_reduce([a[:k * SIZE] for a in xs], dt, rop)[RANK * k:(RANK + 1) * k]
            assert count_wrong(p2.run(), want) == 0, it
    assert not puts


@mpi2
def test_node_buffer_read_in_place_only_where_every_rank_agrees(comm, monkeypatch):
    """Rank 0 passes a private array, or a buffer at another place: every rank copies in (agreed
    from the header), and the results stay right. With validation off, where every rank's input
    is at one place of the buffer, the fact is agreed all the same: read in place, no copy in
    (``validate=False`` does not change the path)."""
    dt, rop = DTYPES["float32"], REDUCE_OPS["sum"]
    n = SLOT // 4 + 3
    xs = [rank_data(SEED, "shm/bufmix", r, n, dt, "random") for r in range(SIZE)]
    golden = golden_reduce(xs, dt, rop)
    buf = mpicoll.node_buffer(n + 1, np.float32, comm=comm)
    puts = counted_puts(monkeypatch)
    for mine in (xs[RANK].copy() if RANK == 0 else buf[:n], buf[1:] if RANK == 0 else buf[:n]):
        np.copyto(mine, xs[RANK])
        ar = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=comm, reduce_type="sum"))
        before = len(puts)
        assert count_wrong(ar.execute(mine), golden) == 0
        assert len(puts) > before
    off = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=comm, reduce_type="sum"), validate=False)
    np.copyto(buf[:n], xs[RANK])
    off.execute(buf[:n])                                 # (the first call agrees)
    before = len(puts)
    assert count_wrong(off.execute(buf[:n]), golden) == 0 and len(puts) == before


@mpi1
def test_node_buffer_where_there_is_no_window(monkeypatch):
    setting(monkeypatch, "MPICOLL_SHM", "0")
    c = WORLD.Dup()
    try:
        buf = mpicoll.node_buffer((3, 4), "int32", comm=c)
        assert buf.shape == (3, 4) and buf.dtype == np.int32 and not user_comm(c).buffers
    finally:
        c.Free()
    with pytest.raises(mpicoll.CollectiveArgumentError, match="node_buffer.*dtype"):
        mpicoll.node_buffer(4, object)


@mpi1
def test_a_plan_on_a_freed_node_buffer_raises():
    c = WORLD.Dup()
    buf = mpicoll.node_buffer(VALUES["window.allreduce"] // 4, np.float32, comm=c)      # (through the window)
    buf[:] = 1
    plan = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=c)).prepare(buf)
    assert plan.run()[0] == SIZE
    c.Free()
    if SIZE > 1:
        with pytest.raises(mpicoll.CollectiveError, match="freed"):
            plan.run()


@mpi2
@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "int8"])
def test_streamed_and_plain_copies_give_the_same_bits(comm, dtype, monkeypatch):
    """Copies into the window take the other kind for 8 of every 16 (PROBE_EVERY, PROBE_LEN), the
    warm ones timed; AllReduce outputs of a slot and more are copied out streamed
    (window.stream_out), smaller ones plainly: the results stay bit-identical, and both kinds were
    measured."""
    monkeypatch.setitem(VALUES, "window.stream_out", SLOT)
    monkeypatch.setattr(_shm, "PROBE_EVERY", 16)
    monkeypatch.setattr(_shm, "PROBE_LEN", 8)
    monkeypatch.setitem(VALUES, "window.probe", 1)
    kinds_out: set = set()
    get = _shm.NodeWindow.get
    monkeypatch.setattr(_shm.NodeWindow, "get",
                        lambda self, pairs, stream: (kinds_out.add(stream), get(self, pairs, stream))[1])
    dt = DTYPES[dtype]
    op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=comm, reduce_type="sum"))
    rs = mpicoll.ReduceScatterOperation(mpicoll.ReduceScatterParam(comm=comm, reduce_type="sum"))
    for size in sizes(dt.itemsize):
        xs = [rank_data(SEED, f"shm/copies/{dtype}/{size}", r, size * SIZE, dt,
                        "random" if dt.np.kind == "f" else "int") for r in range(SIZE)]
        golden = golden_reduce(xs, dt, REDUCE_OPS["sum"])
        for _ in range(2):
            assert count_wrong(op.execute(xs[RANK]), golden) == 0, size
            assert count_wrong(rs.execute(xs[RANK]), golden[RANK * size:(RANK + 1) * size]) == 0, size
    assert all(_shm.node_window(user_comm(comm))._cost)
    assert kinds_out == ({False, True} if VALUES["window.one_shot"] == 0 else {True}), kinds_out    # (one shot: no copy out)


@mpi2
def test_small_copies_take_the_kind_in_use_untimed(comm, monkeypatch):
    """Copies into the window of fewer than window.probe bytes take the kind in use (streamed, on a new
    window), are neither counted nor timed, and record their kind at their place; larger ones are
    counted, in one shot and in two (results exact either way)."""
    monkeypatch.setitem(VALUES, "window.probe", SLOT // 2)
    streamed: list = []
    copy = _shm.copy_pairs
    monkeypatch.setattr(_shm, "copy_pairs",
                        lambda pairs, stream=False: (streamed.append(stream), copy(pairs, stream))[1])
    dt, rop = DTYPES["float32"], REDUCE_OPS["sum"]
    op = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=comm, reduce_type="sum"))
    for count, counted in ((THRESHOLD // 4, False), (SLOT // 4, True), (SLOT // 4 * SIZE, True)):
        xs = [rank_data(SEED, f"shm/small-copies/{count}", r, count, dt, "random") for r in range(SIZE)]
        for _ in range(3):
            assert count_wrong(op.execute(xs[RANK]), golden_reduce(xs, dt, rop)) == 0, count
        node = _shm.node_window(user_comm(comm))
        assert (node._copies > 0) == counted and node._last, (count, node._copies)
        if not counted:
            assert node._cost == [0.0, 0.0] and True in streamed and not node.plain, (node._cost, streamed)


@mpi1
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_allgather_and_broadcast_copy_from_node_buffers(comm, dtype, monkeypatch):
    """From a node buffer (the same place on every rank), AllGather and Broadcast copy straight
    from the peers' buffers (``_shm.gather``) between nodebuf.gather / from nodebuf.broadcast, and
    through MPI otherwise; every dtype, every root, plans and started plans; bit for bit."""
    monkeypatch.setitem(VALUES, "nodebuf.gather", (THRESHOLD, 4 * SLOT))
    monkeypatch.setitem(VALUES, "nodebuf.broadcast", THRESHOLD)
    used: list = []
    gather = _shm.gather
    monkeypatch.setattr(_shm, "gather", lambda *a, **k: (used.append(1), gather(*a, **k))[1])
    dt = DTYPES[dtype]
    ag = mpicoll.AllGatherOperation(mpicoll.AllGatherParam(comm=comm))
    for size in (THRESHOLD // dt.itemsize // SIZE - 1, THRESHOLD // dt.itemsize, SLOT // dt.itemsize + 3,
                 4 * SLOT // dt.itemsize // SIZE + 1):
        xs = [rank_data(SEED, f"shm/ag/{dtype}/{size}", r, (size,), dt) for r in range(SIZE)]
        buf = mpicoll.node_buffer((size + 2,), dt.np, comm=comm)[1:1 + size]
        before = len(used)
        for it in range(2):
            np.copyto(buf, xs[RANK])
            assert count_wrong(ag.execute(buf), np.stack(xs)) == 0, (size, it)
        with ag.prepare(buf, out=np.empty((SIZE, size), dt.np)) as plan:
            for it in range(2):
                ys = [rank_data(SEED + it, f"shm/ag/{dtype}/{size}", r, (size,), dt) for r in range(SIZE)]
                np.copyto(buf, ys[RANK])
                assert count_wrong(plan.start().wait() if it else plan.run(), np.stack(ys)) == 0, (size, it)
        assert (len(used) > before) == (SIZE > 1 and THRESHOLD <= SIZE * size * dt.itemsize <= 4 * SLOT), size
        for root in range(SIZE):
            bc = mpicoll.BroadcastOperation(mpicoll.BroadcastParam(comm=comm, rank_root=root))
            before = len(used)
            np.copyto(buf, xs[RANK])
            assert bc.execute(buf) is buf and count_wrong(buf, xs[root]) == 0, (size, root)
            with bc.prepare(buf) as plan:
                np.copyto(buf, xs[RANK])
                plan.start().wait()
                assert count_wrong(buf, xs[root]) == 0, (size, root, "started")
            assert (len(used) > before) == (SIZE > 1 and size * dt.itemsize >= THRESHOLD), (size, root)


@mpi1
@pytest.mark.parametrize("dtype", SAMPLE)
def test_allgatherv_copies_from_node_buffers(comm, dtype, monkeypatch):
    """AllGatherV of node buffers (each rank's first send_count elements, at the same place on
    every rank): uneven, zero and one-rank-only counts, permuted rdispls, in plans."""
    monkeypatch.setitem(VALUES, "nodebuf.gather", (THRESHOLD, 4 * SLOT))
    used: list = []
    gather = _shm.gather
    monkeypatch.setattr(_shm, "gather", lambda *a, **k: (used.append(1), gather(*a, **k))[1])
    dt = DTYPES[dtype]
    op = mpicoll.AllGatherVOperation(mpicoll.AllGatherVParam(comm=comm))
    total = SLOT // dt.itemsize + 5
    for name, counts in count_patterns(total).items():
        xs = [rank_data(SEED, f"shm/agv/{dtype}/{name}", r, (max(counts[r], 1),), dt) for r in range(SIZE)]
        buf = mpicoll.node_buffer(max(counts) + 1, dt.np, comm=comm)
        np.copyto(buf[:xs[RANK].size], xs[RANK])
        rd, pos = [0] * SIZE, 0
        for j in reversed(range(SIZE)):                     # rank order reversed
            rd[j], pos = pos, pos + counts[j]
        want = np.zeros(pos, dt.np)
        for j in range(SIZE):
            want[rd[j]:rd[j] + counts[j]] = xs[j][:counts[j]]
        before = len(used)
        with op.prepare(buf, counts[RANK], counts, rd, out=np.zeros(pos, dt.np)) as plan:
            for _ in range(2):
                assert count_wrong(plan.run(), want) == 0, name
        assert (len(used) > before) == (SIZE > 1 and pos * dt.itemsize >= THRESHOLD), name


@mpi2
@pytest.mark.parametrize("nbytes", [THRESHOLD, 3 * SLOT + 12], ids=["one-shot", "two-shot"])
def test_node_buffer_in_place_on_some_ranks_only(comm, nbytes):
    """In place is each rank's own choice (not agreed): a Reduce in place on the root only (the
    functional API's form), an AllReduce in place on rank 0 only; every rank takes the same steps."""
    dt = DTYPES["float32"]
    size = nbytes // 4
    xs = [rank_data(SEED, f"shm/bufinplace/{size}", r, size, dt, "random") for r in range(SIZE)]
    golden = golden_reduce(xs, dt, REDUCE_OPS["sum"])
    buf = mpicoll.node_buffer(size, np.float32, comm=comm)
    for root in range(SIZE):
        red = mpicoll.ReduceOperation(mpicoll.ReduceParam(comm=comm, reduce_type="sum", rank_root=root))
        np.copyto(buf, xs[RANK])
        got = red.execute(buf, out=buf if RANK == root else None)
        assert (got is buf and count_wrong(buf, golden) == 0) if RANK == root else got is None, root
    ar = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=comm, reduce_type="sum"))
    for _ in range(2):
        np.copyto(buf, xs[RANK])
        got = ar.execute(buf, out=buf if RANK == 0 else None)
        assert count_wrong(got, golden) == 0
    from mpicoll import functional as F
    np.copyto(buf, xs[RANK])
    F.reduce(buf, dst=0, group=comm)
    assert count_wrong(buf, golden if RANK == 0 else xs[RANK]) == 0


@mpi2
def test_node_buffer_bad_argument_on_one_rank_raises_everywhere(comm):
    raises_everywhere(lambda: mpicoll.node_buffer(4, object if RANK == 1 else np.float32, comm=comm),
                      mpicoll.CollectiveArgumentError, "node_buffer", "rank 1")
    raises_everywhere(lambda: mpicoll.node_buffer((2, -1) if RANK == 0 else (2, 1), np.int8, comm=comm),
                      mpicoll.CollectiveArgumentError, "node_buffer: shape=(2, -1) on rank 0")


@pytest.mark.skipif(SIZE != 1, reason="runs its own 2-rank job once")
def test_the_crossover_script_measures_each_threshold_it_names():
    """benchmarks/crossover.py (how the window's thresholds were measured, for a user's own node):
    every threshold it sweeps at 2 ranks prints its rows and a measured crossover beside the table's."""
    script = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "crossover.py")
    res = subprocess.run(mpirun(2, sys.executable, script, "--reps", "1", "--span", "2"), capture_output=True,
                         text=True, timeout=within(120), env=launch_env(settings=False))
    assert res.returncode == 0, res.stderr
    for name in ("window.allreduce", "window.allreduce.16bit", "window.reduce_scatter", "nodebuf.broadcast"):
        assert f"# {name}: measured crossover " in res.stdout, res.stdout
    assert "# window.ordered: not at 2 ranks" in res.stdout, res.stdout
