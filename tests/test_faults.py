"""Faults, each in its own ``mpirun`` with a time limit: a killed rank, a rank that never arrives
(watchdog), an exception in the CLI; none may hang, and none may leave its shared memory behind."""
from __future__ import annotations

import glob
import re
import subprocess
import sys
import time

import pytest
from mpi4py import MPI

import mpicoll
from mpicoll.checks import CHECKS
from mpicoll._watchdog import stale_segments

from _mpi import launch_env, left_behind, mpirun, remove as _remove, run_job as _job, within

pytestmark = [pytest.mark.mpi(min_size=1),
              pytest.mark.skipif(MPI.COMM_WORLD.Get_size() != 1, reason="runs its own mpirun jobs once")]


LOOP = """
    import os, signal
    import numpy as np
    import mpicoll
    from mpi4py import MPI
    rank = MPI.COMM_WORLD.Get_rank()
    op = mpicoll.AllReduceOperation()
    x = np.ones(1 << 16, np.float32)
    for i in range(10_000):
        if rank == 1 and i == 50:
            os.kill(os.getpid(), signal.SIGKILL)       # dies mid-collective
        op.execute(x)
"""


def test_a_killed_rank_ends_the_job_in_seconds(tmp_path):
    res, seconds, left = _job(tmp_path, LOOP)
    _remove(left)                                         # nobody in a SIGKILLed job can clean up
    assert res.returncode != 0 and seconds < within(20), (seconds, res.stderr[-2000:])
    assert not stale_segments(set(left)), "cleanup of the killed job's segments failed"


NEVER = """
    import sys, time
    import numpy as np
    import mpicoll
    from mpi4py import MPI
    rank = MPI.COMM_WORLD.Get_rank()
    op = mpicoll.AllReduceOperation()
    op.execute(np.ones(4))
    if rank == 1:
        time.sleep(30)                                  # never joins the next collective
        sys.exit(0)
    try:
        op.execute(np.ones(4))
    except mpicoll.CollectiveTimeout as exc:
        print(f"rank {rank}: {exc}", flush=True)
        sys.exit(3)
"""


def test_watchdog_aborts_and_names_the_missing_rank(tmp_path):
    res, seconds, left = _job(tmp_path, NEVER, env={"MPICOLL_TIMEOUT": "2"})
    assert res.returncode != 0 and seconds < within(15), (seconds, res.stderr[-2000:])
    assert "mpicoll watchdog: AllReduce: timed out after 2 s" in res.stderr
    assert "ranks that did not arrive: [1]" in res.stderr and "mpicoll.world" in res.stderr
    assert not left, f"the aborted job left {left}"


def test_watchdog_raise_mode(tmp_path):
    res, seconds, left = _job(tmp_path, NEVER, env={"MPICOLL_TIMEOUT": "1.5", "MPICOLL_TIMEOUT_ACTION": "raise"})
    _remove(left)
    assert res.returncode == 3, res.stderr[-2000:]
    # the first rank to exit(3) aborts the job (python -m mpi4py), so at least one of them reports
    assert any(f"rank {r}: AllReduce: timed out after 1.5 s on rank {r}" in res.stdout for r in (0, 2))
    assert "ranks that did not arrive: [1]" in res.stdout and "in its 2nd AllReduce call there, waiting in its " \
        "header agreement" in res.stdout
    # (gloo's words too, the duration as given: what programs written for gloo look for)
    assert "; in gloo's words: Timed out waiting 1500ms for AllReduce to complete" in res.stdout, res.stdout


def test_cli_exception_aborts_and_cleans_up(tmp_path):
    res, seconds, left = _job(tmp_path, """
        from mpi4py import MPI
        import mpicoll.run as run
        def boom(argv=None):
            import mpicoll
            mpicoll.init()
            if MPI.COMM_WORLD.Get_rank() == 2:
                raise RuntimeError("injected")
            MPI.COMM_WORLD.Barrier()
            return 0
        run.main = boom
        run.entry([])
    """)
    assert res.returncode != 0 and seconds < within(15)
    assert "unhandled error on rank 2 of 3" in res.stderr and "injected" in res.stderr
    assert not left, f"the aborted job left {left}"


ELSEWHERE = """
    import sys, time
    import numpy as np
    import mpicoll
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    sub = world.Split(0 if rank < 2 else 1, rank)           # ranks {0, 1} and {2}
    op_w = mpicoll.AllReduceOperation(timeout=2)            # per-operation timeouts (MPICOLL_TIMEOUT=60)
    op_s = mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=sub), timeout=2)
    op_s.execute(np.ones(2))
    op_w.execute(np.ones(2))
    wall, cpu = time.monotonic(), time.process_time()
    try:
        if rank == 1:
            op_s.execute(np.ones(2))                        # rank 0 never joins this one...
        else:
            op_w.execute(np.ones(2))                        # ...and rank 1 never joins this one
    except mpicoll.CollectiveTimeout as exc:
        wall, cpu = time.monotonic() - wall, time.process_time() - cpu
        print(f"rank {rank}: {exc} | op={exc.op} param={exc.param} rank={exc.rank} | wall={wall:.2f} cpu={cpu:.2f}",
              flush=True)
        world.Barrier()
        sys.exit(3)
"""


def test_watchdog_per_operation_names_ranks_on_another_communicator(tmp_path):
    """Per-operation timeouts, raise mode: rank 1 waits on a sub-communicator for rank 0, which
    waits on the world for rank 1; each names the other as missing, and where it last was on that
    communicator. The waiting ranks poll with back-off: far less CPU than wall-clock time."""
    res, seconds, left = _job(tmp_path, ELSEWHERE, env={"MPICOLL_TIMEOUT_ACTION": "raise", "MPICOLL_TIMEOUT": "60"})
    _remove(left)
    out = res.stdout
    assert res.returncode == 3 and seconds < within(20), (seconds, out, res.stderr[-2000:])
    # (the ranks print at the same moment: their lines can run together, so split on the pattern)
    lines = {int(m[1]): m[0] for m in re.finditer(r"rank (\d): .*?cpu=\d+\.\d+", out)}
    assert sorted(lines) == [0, 1, 2], out
    assert "rank 0: AllReduce: timed out after 2 s on rank 0 of the world (mpicoll.world), in its 2nd AllReduce " \
           "call there, waiting in its header agreement (an internal MPI Allgather); ranks that did not arrive: [1] " \
           "(rank 1 is in or after its 1st AllReduce call there)" in lines[0], out
    assert "ranks that did not arrive: [1]" in lines[2], out
    assert "rank 1: AllReduce: timed out after 2 s on rank 1 of user comm 'comm', in its 2nd AllReduce call " \
           "there" in lines[1] and "ranks that did not arrive: [0]" in lines[1], out
    assert all("op=AllReduce param=timeout rank=" in line for line in lines.values()), out
    for line in lines.values():
        wall, cpu = (float(v.split("=")[1]) for v in line.split()[-2:])
        assert 1.9 < wall < 10 and cpu < 0.5 * wall, line   # a 0.2 s yielding spin, then sleeps


def test_cli_error_on_one_rank_aborts_the_job(tmp_path):
    """A real failure inside ``python -m mpicoll.run`` on rank 2 only while the ranks are checking
    (its log is /dev/full: it opens, and its first flush fails, mid-run): the job aborts, names the
    rank and leaves no shared memory behind. (A log that cannot be opened is a usage error on every
    rank, before any check: test_cli.)"""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank.2").symlink_to("/dev/full")
    clean = launch_env(settings=False)
    before = set(glob.glob("/dev/shm/mpich_shm_*"))
    t0 = time.monotonic()
    res = subprocess.run(mpirun(3, sys.executable, "-m", "mpicoll.run", "--op", "AllReduce",
                                "--log-dir", str(tmp_path / "logs")),
                         capture_output=True, text=True, timeout=60, env=clean)
    seconds = time.monotonic() - t0
    left = left_behind(before)
    assert res.returncode != 0 and seconds < within(15), (seconds, res.stderr[-2000:])
    assert "mpicoll.run: unhandled error on rank 2 of 3; aborting the job" in res.stderr, res.stderr[-2000:]
    assert "No space left on device" in res.stderr
    assert not left, f"the aborted job left {left}"


TIMED = """
    import numpy as np
    import mpicoll
    from mpi4py import MPI
    from mpicoll.checks import CHECKS
    from mpicoll.checks._golden import SEED, count_wrong
    rank, n = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    ran = []
    for name, cls in mpicoll.OPERATIONS.items():
        spec = CHECKS[name]
        for case in spec.cases(n)[:1]:
            c = spec.make(case, "float32" if "float32" in spec.dtypes else spec.dtypes[0], "", rank, n, SEED)
            op = cls(c.op.param, timeout=30)            # the case's operation, with a timeout of its own
            wrong = count_wrong(op.execute(*c.args, **c.kwargs), c.expected, exact=c.exact, n=n)
            assert wrong == 0 and op.timeout == 30, (name, case, wrong, op.timeout)
            ran.append(name)
    print(f"done; ran {','.join(ran)};" if rank == 0 else "done;", flush=True)
"""


def test_timeout_per_operation_and_cost_free_when_fine(tmp_path):
    """Every registered operator with ``timeout=30`` (no MPICOLL_TIMEOUT): its first golden case
    gives the golden, and nothing times out."""
    res, _, left = _job(tmp_path, TIMED, np_=3)
    _remove(left)
    ran = ",".join(name for name in mpicoll.OPERATIONS if CHECKS[name].cases(3))    # (the fused ones need 4 ranks)
    assert res.returncode == 0 and res.stdout.count("done;") == 3, res.stdout[-2000:] + res.stderr[-2000:]
    assert f"ran {ran};" in res.stdout, res.stdout


def test_allgatherv_bad_shape_on_one_rank_is_agreed(tmp_path):
    res, _, left = _job(tmp_path, """
        import numpy as np
        import mpicoll
        from mpi4py import MPI
        rank = MPI.COMM_WORLD.Get_rank()
        shape = (-1, -4) if rank == 1 else None            # prod(shape) == sum(recv_counts) == 4
        try:
            mpicoll.AllGatherVOperation().execute(np.arange(2.0), 2, [2, 2], [0, 2], shape=shape)
        except Exception as exc:
            print(f"rank {rank}: {type(exc).__name__}: {exc}", flush=True)
    """, np_=2, env={"MPICOLL_TIMEOUT": "1", "MPICOLL_TIMEOUT_ACTION": "raise"})
    _remove(left)
    # (counted, not split into lines: the two ranks' prints can interleave mid-line through mpirun)
    out = res.stdout
    assert out.count("CollectiveArgumentError: AllGatherV: shape=") == 2 and "rank 0:" in out and "rank 1:" in out, out


PLANS = """
    import sys
    import numpy as np
    import mpicoll
    from mpi4py import MPI
    rank = MPI.COMM_WORLD.Get_rank()
    op = mpicoll.AllReduceOperation()
    x = np.ones(1 << 18, np.float16)          # 512 KiB of float16: three steps
    plan = op.prepare(x)
    plan.run()
    if rank == 1:
        MPI.COMM_WORLD.Barrier()              # never starts the plan
        sys.exit(0)
    try:
        plan.start().wait()
    except mpicoll.CollectiveTimeout as exc:
        print(f"rank {rank}: {exc}", flush=True)
        sys.exit(3)
"""


def test_watchdog_covers_started_plans(tmp_path):
    """A plan started on every rank but one: the waiting ranks time out naming the plan's call
    (its 3rd AllReduce: the prepare, the run, the start) and where it waits (under a watchdog a
    plan's start first agrees its sequence: tests/test_dispatch.py)."""
    res, seconds, left = _job(tmp_path, PLANS, env={"MPICOLL_TIMEOUT": "2", "MPICOLL_TIMEOUT_ACTION": "raise"})
    _remove(left)
    assert res.returncode != 0 and seconds < within(20), (seconds, res.stdout, res.stderr[-2000:])
    assert "in its 3rd AllReduce call there, waiting in MPI Allgather (started by Plan.start)" in res.stdout, \
        res.stdout        # (under a watchdog a started plan first agrees its sequence: test_dispatch.py)
    assert "of the world (mpicoll.world)" in res.stdout and "ranks that did not arrive: [1]" in res.stdout, res.stdout
