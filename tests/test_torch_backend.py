"""The mpicoll torch backend as torch's C++ and Python callers see a backend: group names,
opts-less calls, subgroup destroy, the coalesced forms, monitored_barrier, sparse all_reduce,
init_process_group(timeout=...) through the watchdog, launchers that are not mpirun, a setting
refused on one process. Skipped, with the reason, where torch is not installed."""
from __future__ import annotations

from datetime import timedelta
import textwrap

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: pip install '.[torch]' (torch 2.13 or later, CPU)")
import torch.distributed as dist  # noqa: E402

import mpicoll  # noqa: E402
import mpicoll.torch  # noqa: E402, F401 - registers the backend and mpi://

from _mpi import RANK, SIZE, WORLD, launch_env, run_job, within  # noqa: E402
from _torch import world_group  # noqa: E402, F401 - the module's process group (autouse)

pytestmark = pytest.mark.mpi(min_size=1)
#: a test that launches its own mpirun job, once, from the 1-rank run
ONE_JOB = pytest.mark.skipif(SIZE != 1, reason="runs its own mpirun job once")



def test_torch_group_names_and_opts_less_calls():
    pg = dist.group.WORLD
    assert pg.group_name and dist.distributed_c10d._resolve_process_group(pg.group_name) is pg
    t = torch.full((3,), float(RANK))
    pg.allreduce([t]).wait()                               # no opts: torch's defaults (SUM)
    assert t.tolist() == [float(sum(range(SIZE)))] * 3
    t = torch.full((2,), float(RANK))
    pg.broadcast([t]).wait()                               # root 0
    assert t.tolist() == [0.0, 0.0]
    pg.barrier().wait()
    ts = [torch.ones(2), torch.ones(2)]
    if RANK == SIZE - 1:                                   # (two tensors on the last rank only: raised everywhere)
        said = rf"tensors='2 tensors' on rank {SIZE - 1}: .*one tensor per call"
        with pytest.raises(mpicoll.CollectiveArgumentError, match=said):
            pg.allreduce(ts).wait()
    else:
        with pytest.raises(mpicoll.CollectiveArgumentError, match=rf"rank {SIZE - 1}"):
            pg.allreduce(ts[:1]).wait()
    pg.allreduce((t,)).wait()                              # (a tuple of one tensor, from Python)
    assert t.tolist() == [0.0, 0.0]


@pytest.mark.mpi(min_size=2)
def test_torch_destroy_a_subgroup_and_make_another():
    for _ in range(2):
        g = dist.new_group([0, 1])
        if RANK < 2:
            assert g.group_name
            t = torch.ones(2)
            dist.all_reduce(t, group=g)
            assert t.tolist() == [2.0, 2.0]
        dist.destroy_process_group(g)
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == SIZE


def test_torch_coalesced_forms():
    ts = [torch.full((k + 1,), float(RANK + k)) for k in range(3)]
    dist.all_reduce_coalesced(ts)
    for k, t in enumerate(ts):
        assert t.tolist() == [float(sum(r + k for r in range(SIZE)))] * (k + 1)
    outs = [[torch.empty(k + 1) for k in range(2)] for _ in range(SIZE)]        # outs[rank][k], as torch's
    dist.all_gather_coalesced(outs, [torch.full((k + 1,), float(RANK * 10 + k)) for k in range(2)])
    assert [[o.tolist() for o in outs[r]] for r in range(SIZE)] == \
        [[[float(r * 10 + k)] * (k + 1) for k in range(2)] for r in range(SIZE)]
    from torch.distributed.distributed_c10d import _coalescing_manager
    gathered = [torch.empty(SIZE * 2) for _ in range(2)]
    scattered = [torch.empty(2) for _ in range(2)]
    with _coalescing_manager():
        for k in range(2):
            dist.all_gather_into_tensor(gathered[k], torch.full((2,), float(RANK + k)))
    with _coalescing_manager():
        for k in range(2):
            dist.reduce_scatter_tensor(scattered[k], torch.arange(2.0 * SIZE) + k)
    for k in range(2):
        assert gathered[k].tolist() == [float(r + k) for r in range(SIZE) for _ in range(2)]
        assert scattered[k].tolist() == [SIZE * (2.0 * RANK + j + k) for j in range(2)]


def test_torch_sparse_all_reduce_sums_like_gloo():
    # rank r holds 1s at (r, r) and (0, 1), value r + 1 at (2, 0): the sum is exact
    i = torch.tensor([[RANK, 0, 2], [RANK, 1, 0]])
    v = torch.tensor([1.0, 1.0, RANK + 1.0])
    t = torch.sparse_coo_tensor(i, v, (SIZE + 2, SIZE + 2))
    dist.all_reduce(t)
    want = torch.zeros(SIZE + 2, SIZE + 2)
    for r in range(SIZE):
        want[r, r] += 1
        want[0, 1] += 1
        want[2, 0] += r + 1
    assert t.is_sparse and torch.equal(t.to_dense(), want)


def test_torch_sparse_all_reduce_with_another_op_on_one_rank_raises_everywhere():
    """A reduce op a sparse tensor cannot take, on the last rank only: every rank raises the same
    error (through the first gather's agreement), none waits."""
    t = torch.sparse_coo_tensor(torch.tensor([[0]]), torch.tensor([1.0]), (4,))
    op = dist.ReduceOp.MAX if RANK == SIZE - 1 else dist.ReduceOp.SUM
    with pytest.raises(mpicoll.CollectiveError) as info:
        dist.all_reduce(t, op)
    assert len(set(WORLD.allgather(str(info.value)))) == 1
    assert f"on rank {SIZE - 1}: a sparse tensor is reduced with SUM only" in str(info.value)


def test_torch_async_gather_gives_a_work_on_every_rank():
    outs = [torch.empty(2) for _ in range(SIZE)] if RANK == 0 else None
    work = dist.gather(torch.full((2,), float(RANK)), outs, dst=0, async_op=True)
    assert work is not None and work.wait()
    if RANK == 0:
        assert [o.tolist() for o in outs] == [[float(r)] * 2 for r in range(SIZE)]


@pytest.mark.mpi(min_size=2)
def test_torch_monitored_barrier_on_the_group():
    pg = dist.group.WORLD
    pg.monitored_barrier(timedelta(seconds=30))            # everyone comes
    pg.monitored_barrier(timedelta(seconds=30), wait_all_ranks=True)
    # (torch >= 2.14: any CPU backend, routed to the group's; 2.13's refused every backend but gloo by
    # name: mpicoll.torch makes it do as 2.14's for an mpicoll group)
    dist.monitored_barrier(timeout=timedelta(seconds=30))
    dist.monitored_barrier(wait_all_ranks=True)


MONITORED = """
    import sys, time
    from datetime import timedelta
    import torch, torch.distributed as dist
    import mpicoll.torch
    dist.init_process_group("mpicoll", init_method="mpi://")
    rank = dist.get_rank()
    pg = dist.group.WORLD
    if rank != 1:                           # rank 1 skips the first barrier
        try:
            pg.monitored_barrier(timedelta(seconds=2), wait_all_ranks=True)
        except RuntimeError as exc:
            print(f"rank {rank}: {exc}", flush=True)
    from mpi4py import MPI
    MPI.COMM_WORLD.Barrier()                # (every rank past the first: its token is rank 1's only one)
    try:                                    # every rank comes to the next: out of step
        pg.monitored_barrier(timedelta(seconds=0.5))
    except RuntimeError as exc:
        print(f"again, rank {rank}: {exc}", flush=True)
    if rank == 0:                           # no time at all: rank 0's own time is up first, as gloo says it
        try:
            dist.new_group(list(range(dist.get_world_size()))).monitored_barrier(timedelta(seconds=0))
        except RuntimeError as exc:
            print(f"no time, rank {rank}: {exc}", flush=True)
    else:
        dist.new_group(list(range(dist.get_world_size())))
    time.sleep(3)
    sys.exit(0)
"""


@pytest.mark.mpi(min_size=2)
def test_torch_a_store_some_rank_cannot_reach_falls_back_to_a_local_one(monkeypatch):
    """``mpi://``'s store when a rank cannot reach world rank 0's TCPStore (here: every rank on a host
    of its own, ``MPICOLL_STORE_HOST`` an address nobody reaches): every rank gets the local store,
    which says why at the first key another rank would have set."""
    from mpicoll import _domains, _torch_store
    from _mpi import setting
    setting(monkeypatch, "MPICOLL_STORE_HOST", "0.0.0.1")
    monkeypatch.setattr(_torch_store.MPI, "Get_processor_name", lambda: f"host {RANK}")
    store, why = _torch_store.shared_store(_domains.world(), timedelta(seconds=20))
    assert store is None and why.startswith(f"world ranks {list(range(1, SIZE))} could not reach world rank 0's "
                                            "TCPStore at ['0.0.0.1'] port "), why
    local = _torch_store.LocalStore(why)
    local.set("mine", b"1")
    assert local.get("mine") == b"1" and local.add("n", 2) == 2
    with pytest.raises(RuntimeError, match="has no store shared between the ranks .* could not reach .* set "
                                           "MPICOLL_STORE_HOST"):
        local.get("theirs")


@ONE_JOB
def test_torch_monitored_barrier_names_the_rank_that_did_not_come(tmp_path):
    """Rank 0 names the rank that did not come, in mpicoll's words and then in gloo's (which programs
    written for gloo look for), the durations as given (0.5 s: 500 ms); a rank that came says it
    reached the barrier but heard nothing from rank 0; with no time at all, rank 0's own time is up."""
    res, seconds, _ = run_job(tmp_path, MONITORED, np_=3, timeout=60)
    assert ("rank 0: monitored_barrier: rank 1 (world rank 1) did not reach it within 2 s; in gloo's words: "
            "[Rank 0]: Rank 1 failed to pass monitoredBarrier in 2000 ms") in res.stdout, res.stdout + res.stderr[-2000:]
    assert ("rank 2: monitored_barrier: rank 2 waited 2 s for rank 0 to answer: some rank did not reach "
            "monitored_barrier; in gloo's words: Rank 2 successfully reached monitoredBarrier, but received errors "
            "while waiting for send/recv from rank 0") in res.stdout, res.stdout
    assert ("again, rank 0: monitored_barrier: rank 1 (world rank 1) did not reach it within 0.5 s (rank 1 is behind: "
            "it sent the token of its monitored_barrier call 1, this is call 2 on rank 0; if a rank skipped a call, "
            "the ranks are out of step: use a new group); in gloo's words: [Rank 0]: Rank 1 failed to pass "
            "monitoredBarrier in 500 ms") in res.stdout, res.stdout
    assert ("no time, rank 0: monitored_barrier: rank 0's 0 s ran out before it saw ranks [1, 2] (world ranks "
            "[1, 2]); in gloo's words: Rank 0 timed out in monitoredBarrier after 0 ms.") in res.stdout, res.stdout


AGAIN = """
    import time
    from datetime import timedelta
    import torch, torch.distributed as dist
    import mpicoll.torch
    dist.init_process_group("mpicoll", init_method="mpi://")
    rank, pg = dist.get_rank(), dist.group.WORLD
    if rank == 1:
        time.sleep(3)                        # late for the first barrier
    try:
        pg.monitored_barrier(timedelta(seconds=1))
    except RuntimeError:
        pass
    time.sleep(0 if rank == 1 else 4)
    pg.monitored_barrier(timedelta(seconds=10))
    print(f"rank {rank}: second barrier ok", flush=True)
"""


@ONE_JOB
def test_torch_monitored_barrier_after_a_failed_one(tmp_path):
    """A late rank's token of a failed barrier, and the receives the failed barrier posted, do not
    spill into the next one: every rank passes it."""
    res, seconds, _ = run_job(tmp_path, AGAIN, np_=3, timeout=60)
    assert res.returncode == 0 and res.stdout.count("second barrier ok") == 3, res.stdout + res.stderr[-2000:]


RANK_ARG = """
    import torch.distributed as dist
    import mpicoll.torch
    try:
        dist.init_process_group("mpicoll", init_method="mpi://", rank=0, world_size=2)
    except ValueError as exc:
        print(f"raised: {exc}", flush=True)
"""


@ONE_JOB
def test_torch_a_wrong_rank_on_one_process_raises_on_every_one(tmp_path):
    """``rank=0`` given on every process is wrong on rank 1 only: both raise its ValueError, none
    waits in the store's set-up."""
    res, seconds, _ = run_job(tmp_path, RANK_ARG, np_=2, timeout=60)
    assert res.stdout.count("raised: init_process_group(init_method='mpi://', rank=0): MPI says 1 on world "
                            "rank 1") == 2, res.stdout + res.stderr[-2000:]


REFUSED = """
    import os
    from mpi4py import MPI
    if MPI.COMM_WORLD.Get_rank() == 1:
        os.environ["MPICOLL_TIMEOUT"] = "bogus"
    import torch.distributed as dist
    import mpicoll, mpicoll.torch
    try:
        dist.init_process_group("mpicoll", init_method="mpi://")
    except mpicoll.CollectiveArgumentError as exc:
        print(f"raised: {exc}", flush=True)
"""


@ONE_JOB
def test_torch_a_refused_setting_on_one_process_raises_on_every_one(tmp_path):
    """``MPICOLL_TIMEOUT=bogus`` on rank 1 only: ``init_process_group`` raises its error on every
    process (the others waited in the group's set-up), and nothing is left in /dev/shm."""
    res, seconds, left = run_job(tmp_path, REFUSED, np_=3, env={"MPICOLL_TIMEOUT": "5"}, timeout=60)
    assert res.stdout.count("raised: environment MPICOLL_TIMEOUT='bogus' on world rank 1: not a number of "
                            "seconds") == 3, res.stdout + res.stderr[-2000:]
    assert res.returncode == 0 and seconds < within(30) and left == [], (seconds, left)


TIMEOUT = """
    import sys, time
    from datetime import timedelta
    import torch, torch.distributed as dist
    import mpicoll, mpicoll.torch
    dist.init_process_group("mpicoll", init_method="mpi://", timeout=timedelta(seconds=2))
    rank = dist.get_rank()
    dist.all_reduce(torch.ones(4))
    if rank == 1:
        time.sleep(12)                                  # never joins the next collective
        sys.exit(0)
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4))
    except mpicoll.CollectiveTimeout as exc:
        print(f"rank {rank} after {time.monotonic() - t0:.1f} s: {exc}", flush=True)
        sys.exit(3)
"""


@ONE_JOB
def test_torch_init_timeout_raises_the_named_timeout(tmp_path):
    res, seconds, left = run_job(tmp_path, TIMEOUT, np_=3, timeout=60)
    assert res.returncode == 3, res.stdout + res.stderr[-3000:]
    assert "all_reduce: timed out after 2 s" in res.stdout and "ranks that did not arrive: [1]" in res.stdout, \
        res.stdout


GROUP_TIMEOUT = """
    import time
    from datetime import timedelta
    import numpy as np
    import torch, torch.distributed as dist
    import mpicoll, mpicoll.torch
    from mpicoll import functional as F
    F.all_reduce(np.ones(1))                            # an mpicoll call before init: never timed
    dist.init_process_group("mpicoll", init_method="mpi://")        # torch's default: no watchdog
    rank = dist.get_rank()
    g = dist.new_group([0, 1, 2], timeout=timedelta(seconds=2))
    if rank == 0:
        t0 = time.monotonic()
        try:
            dist.barrier(group=g)                       # ranks 1 and 2 never come
        except mpicoll.CollectiveTimeout as exc:
            print(f"rank 0 after {time.monotonic() - t0:.1f} s: {exc}", flush=True)
    else:
        time.sleep(3)
    t = torch.ones(2)
    dist.all_reduce(t)                                  # the world group: untouched, untimed
    F.all_reduce(np.ones(1))
    try:
        dist.new_group([0, 1, 2], timeout=timedelta(seconds=2 + rank))
    except ValueError as exc:
        print(f"rank {rank}: {exc}", flush=True)
    print(f"rank {rank}: world {t.tolist()}", flush=True)
"""


@ONE_JOB
def test_torch_new_group_timeout_is_the_groups_own(tmp_path):
    """``new_group(timeout=)``: that group's calls raise the named CollectiveTimeout after it (never
    abort), the world group and mpicoll calls outside torch stay untimed; a timeout that differs
    across the group's ranks is a ValueError on each of them."""
    res, seconds, _ = run_job(tmp_path, GROUP_TIMEOUT, np_=3, timeout=60)
    out = res.stdout
    assert res.returncode == 0, out + res.stderr[-3000:]
    assert "rank 0 after 2." in out and "barrier: timed out after 2 s on rank 0 of user comm 'torch group 1'" in out \
        and "ranks that did not arrive: [1, 2]" in out, out
    assert out.count("world [3.0, 3.0]") == 3, out
    assert out.count("timeout=...) differs across its ranks: [2.0, 3.0, 4.0] s on world ranks [0, 1, 2]") == 3, out


RECV_TIMEOUT = """
    import sys, time
    from datetime import timedelta
    import torch, torch.distributed as dist
    import mpicoll, mpicoll.torch
    dist.init_process_group("mpicoll", init_method="mpi://", timeout=timedelta(seconds=2))
    if dist.get_rank() == 1:
        time.sleep(8)                                   # never sends
        sys.exit(0)
    try:
        dist.recv(torch.empty(2), src=1, tag=4)
    except mpicoll.CollectiveTimeout as exc:
        print(f"rank 0: {exc}", flush=True)
        sys.exit(3)
"""


@ONE_JOB
def test_torch_a_message_that_never_comes_times_out(tmp_path):
    res, seconds, _ = run_job(tmp_path, RECV_TIMEOUT, np_=2, timeout=60)
    assert res.returncode == 3, res.stdout + res.stderr[-3000:]
    assert "rank 0: irecv: timed out after 2 s on rank 0 of user comm 'torch group 0', waiting for the message " \
           "from rank 1 (world rank 1) (tag 4)" in res.stdout, res.stdout


@pytest.mark.skipif(SIZE != 1, reason="runs its own torchrun job once")
def test_torch_torchrun_is_refused_at_init(tmp_path):
    """torchrun starts MPI singletons: every process must refuse at init (never N worlds of 1)."""
    import socket
    import subprocess
    import sys
    script = tmp_path / "train.py"
    # Each process records its refusal and waits for the other's before it fails: torchrun stops the
    # other workers as soon as one fails, so stderr alone would show one refusal or two by chance.
    script.write_text(textwrap.dedent("""
        import os, sys, time, pathlib
        import torch.distributed as dist, mpicoll.torch
        here = pathlib.Path(sys.argv[2])
        try:
            dist.init_process_group('mpicoll', init_method=sys.argv[1])
            print('TRAINED', dist.get_world_size(), flush=True)
        except Exception as e:
            (here / (sys.argv[1][:3] + os.environ['LOCAL_RANK'])).write_text(str(e))
            end = time.monotonic() + 60
            while len(list(here.glob(sys.argv[1][:3] + '*'))) < 2 and time.monotonic() < end:
                time.sleep(0.05)
            raise
        """))
    for method in ("mpi://", "env://"):
        with socket.socket() as s:                      # (a free port for torchrun's store)
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                              "--master_addr", "127.0.0.1", "--master_port", str(port),
                              str(script), method, str(tmp_path)], capture_output=True, text=True, timeout=120,
                             env=launch_env(settings=False))
        assert res.returncode != 0 and "TRAINED" not in res.stdout, (method, res.stdout, res.stderr[-3000:])
        refusals = [p.read_text() for p in tmp_path.glob(method[:3] + "*")]
        assert len(refusals) == 2 and all("Launch with `mpirun -np 2 python ...` instead" in r
                                          for r in refusals), (method, refusals, res.stderr[-3000:])


DETAIL = """
    import torch, torch.distributed as dist
    import mpicoll, mpicoll.torch
    dist.init_process_group("mpicoll", init_method="mpi://")
    rank = dist.get_rank()
    t = torch.ones(4)
    dist.all_reduce(t)
    try:
        dist.all_reduce(torch.ones(4 + rank))             # a different shape on every rank
    except (RuntimeError, mpicoll.CollectiveError) as exc:
        print(f"rank {rank} (sum {t.sum().item():g}): {type(exc).__name__}: {exc}", flush=True)
"""


@ONE_JOB
def test_torch_debug_detail(tmp_path):
    """``TORCH_DISTRIBUTED_DEBUG=DETAIL``: torch wraps no Python ProcessGroup in its checking wrapper
    (2.13 and 2.14); mpicoll's own agreement names the mismatch, on every rank."""
    res, seconds, _ = run_job(tmp_path, DETAIL, np_=2, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, timeout=60)
    # (the ranks' lines may run together in mpirun's output: counted, not split)
    expected = "CollectiveMismatchError: all_reduce: tensor.shape differs"
    for rank in (0, 1):
        assert f"rank {rank} (sum 8): {expected}" in res.stdout, res.stdout + res.stderr[-3000:]


LATE = """
    import sys, time
    from datetime import timedelta
    import torch, torch.distributed as dist
    import mpicoll, mpicoll.torch
    from mpi4py import MPI
    rank = MPI.COMM_WORLD.Get_rank()
    t0 = time.monotonic()
    try:
        if "STEP" == "init":
            if rank == 2:
                time.sleep(6)                           # comes after the others' timeout
            dist.init_process_group("mpicoll", init_method="mpi://", timeout=timedelta(seconds=2))
        else:
            dist.init_process_group("mpicoll", init_method="mpi://")
            t0 = time.monotonic()
            if rank == 2:
                time.sleep(6)                           # never makes the group
            else:
                dist.new_group([0, 1, 2], timeout=timedelta(seconds=2))
        print(f"rank {rank}: done", flush=True)
    except mpicoll.CollectiveTimeout as exc:
        print(f"rank {rank} after {time.monotonic() - t0:.0f} s: {exc}", flush=True)
"""


@ONE_JOB
@pytest.mark.parametrize("step", ["init", "new_group"])
def test_torch_set_up_is_bounded_by_the_groups_timeout(tmp_path, step):
    """``init_process_group(timeout=2)`` with a rank that comes late, ``new_group(timeout=2)`` with a
    member that never calls it: the ranks that came raise the named CollectiveTimeout after the
    timeout (they used to wait for ever, or for the late rank)."""
    res, _, _ = run_job(tmp_path, LATE.replace("STEP", step), np_=3, timeout=90)
    out = res.stdout
    if step == "init":
        for r in (0, 1):
            assert f"rank {r} after 2 s: init_process_group(timeout=2 s): duplicating the world: timed out after 2 s: " \
                   "some rank has not reached it" in out, out + res.stderr[-3000:]
    else:
        for r in (0, 1):
            assert f"rank {r} after 2 s: comm domain 'torch group 1': timed out after 2 s (new_group(ranks=[0, 1, 2], " \
                   "timeout=2 s)) waiting for" in out, out + res.stderr[-3000:]
        assert "rank 2: done" in out, out
