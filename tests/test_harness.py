"""Tests of the MPI test harness itself (tests/conftest.py).

Each test writes a throwaway test file next to a copy of conftest.py and runs
it under ``mpirun -np 2`` in a subprocess.  They run only in a single-rank
invocation (a nested mpirun from every rank of a multi-rank job would
oversubscribe the machine and prove nothing more).
"""

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from _mpi import SLOWDOWN, launch_env, left_behind, mpirun, within

HERE = Path(__file__).resolve().parent
HARD_TIMEOUT_S = 60


def _world_size():
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    return MPI.COMM_WORLD.Get_size()


pytestmark = pytest.mark.skipif(
    _world_size() != 1, reason="harness subprocess tests run only in a single-rank invocation"
)


def _clean_env(**extra):
    """Environment for a nested mpirun (``_mpi.launch_env``), with hydra's own limit inside the
    hard subprocess timeout below."""
    env = launch_env(MPIEXEC_TIMEOUT=str(HARD_TIMEOUT_S - 10), PYTHONDONTWRITEBYTECODE="1")
    env.pop("MPICOLL_TEST_NO_ABORT", None)
    env.update(extra)
    return env


def _shm_segments():
    try:
        return {p for p in Path("/dev/shm").glob("mpich_shm_*") if p.is_file()}
    except OSError:
        return set()


def _mapped_paths():
    paths = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if "/dev/shm/mpich_shm_" in line:
                paths.add(line.split(None, 5)[-1].removesuffix(" (deleted)"))
    return paths


def _remove_leftover_shm(before):
    """An aborted MPICH job leaves /dev/shm/mpich_shm_* behind: remove the
    ones that appeared during our nested run, are ours and nobody maps."""
    new = _shm_segments() - before
    if not new:
        return
    mapped = _mapped_paths()
    uid = os.getuid()
    for path in new:
        try:
            if str(path) not in mapped and path.stat().st_uid == uid:
                path.unlink()
        except OSError:
            pass


def _run_inner(tmp_path, source, **env):
    """Run ``source`` as a test file under ``mpirun -np 2``.

    Returns (returncode, combined stdout+stderr, elapsed seconds)."""
    shutil.copy(HERE / "conftest.py", tmp_path / "conftest.py")
    # Own rootdir/inifile: do not pick up the project's configuration.
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    test_file = tmp_path / "test_inner.py"
    test_file.write_text(textwrap.dedent(source))
    cmd = mpirun(2, sys.executable, "-m", "mpi4py", "-m", "pytest") + [
        "--with-mpi", "-p", "no:cacheprovider", "-q", str(test_file)]
    shm_before = _shm_segments()
    start = time.monotonic()
    # Own session, so that on a hard timeout the whole job (mpirun, proxies,
    # ranks) can be killed, not just mpirun.
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=_clean_env(**env), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=HARD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(
            f"nested mpirun did not end within {HARD_TIMEOUT_S} s; output:\n"
            + out.decode(errors="replace")
        )
    finally:
        elapsed = time.monotonic() - start
        # (what the job left: new files that no process uses, so not another job's running meanwhile)
        LEFT_BEHIND[:] = left_behind({str(p) for p in shm_before})
        _remove_leftover_shm(shm_before)
    return proc.returncode, out.decode(errors="replace"), elapsed


LEFT_BEHIND: list = []        # the shared-memory files the last nested run left (before they are removed)


def _explain(rc, out, elapsed):
    return f"rc={rc} after {elapsed:.1f} s; output:\n{out}"


def test_failure_on_one_rank_aborts_the_job(tmp_path):
    rc, out, elapsed = _run_inner(tmp_path, """
        from mpi4py import MPI

        def test_fails_on_rank_one_only():
            comm = MPI.COMM_WORLD
            if comm.Get_rank() == 1:
                assert comm.Get_size() == 99, "HARNESS-SENTINEL-ASSERT"
            comm.Barrier()  # rank 0 waits here for a rank that never comes
        """)
    info = _explain(rc, out, elapsed)
    assert rc != 0, info
    assert elapsed < within(20), info
    assert "mpicoll test failure on rank 1 of 2: test_inner.py::test_fails_on_rank_one_only" in out, info
    assert "HARNESS-SENTINEL-ASSERT" in out, info


def test_deadlock_is_ended_by_the_watchdog(tmp_path):
    rc, out, elapsed = _run_inner(tmp_path, """
        from mpi4py import MPI

        def test_both_ranks_receive_first():
            comm = MPI.COMM_WORLD
            buf = bytearray(8)
            comm.Recv(buf, source=1 - comm.Get_rank(), tag=7)
        """, MPICOLL_TEST_TIMEOUT="3")
    info = _explain(rc, out, elapsed)
    assert rc != 0, info
    assert elapsed < within(30), info
    assert "Thread" in out or "File" in out, info
    assert "test_both_ranks_receive_first" in out, info
    assert "still running after 3 s, its limit (MPICOLL_TEST_TIMEOUT=3 s x MPICOLL_TEST_SLOWDOWN=1): ending this " \
           "process; raise MPICOLL_TEST_TIMEOUT or MPICOLL_TEST_SLOWDOWN to allow more" in out, info


def test_timeout_marker_overrides_the_default(tmp_path):
    rc, out, elapsed = _run_inner(tmp_path, """
        import pytest
        from mpi4py import MPI

        @pytest.mark.timeout_s(3)
        def test_both_ranks_receive_first():
            comm = MPI.COMM_WORLD
            buf = bytearray(8)
            comm.Recv(buf, source=1 - comm.Get_rank(), tag=7)
        """, MPICOLL_TEST_TIMEOUT="300")
    info = _explain(rc, out, elapsed)
    assert rc != 0, info
    assert elapsed < within(30), info
    assert "Thread" in out or "File" in out, info
    assert "(its @pytest.mark.timeout_s(3) x MPICOLL_TEST_SLOWDOWN=1)" in out and "raise the marker" in out, info


def test_no_abort_env_disables_the_abort(tmp_path):
    rc, out, elapsed = _run_inner(tmp_path, """
        import pytest
        from mpi4py import MPI

        @pytest.mark.timeout_s(3)
        def test_fails_on_rank_one_only():
            comm = MPI.COMM_WORLD
            if comm.Get_rank() == 1:
                assert comm.Get_size() == 99, "HARNESS-SENTINEL-ASSERT"
            comm.Barrier()
        """, MPICOLL_TEST_NO_ABORT="1")
    info = _explain(rc, out, elapsed)
    assert rc != 0, info
    assert elapsed < within(30), info
    assert "mpicoll test failure on rank" not in out, info


def test_passing_two_rank_test_exits_zero(tmp_path):
    rc, out, elapsed = _run_inner(tmp_path, """
        from mpi4py import MPI

        def test_allreduce_of_ones():
            comm = MPI.COMM_WORLD
            assert comm.allreduce(1) == comm.Get_size() == 2
            comm.Barrier()
        """)
    info = _explain(rc, out, elapsed)
    assert rc == 0, info
    assert "1 passed" in out, info


def test_a_failure_that_aborts_the_job_leaves_no_shared_memory_behind(tmp_path):
    code, out, _ = _run_inner(tmp_path, """
        from mpi4py import MPI

        def test_fails_on_rank_1():
            MPI.COMM_WORLD.Barrier()
            assert MPI.COMM_WORLD.Get_rank() != 1
    """)
    assert code != 0 and "aborting MPI job" in out
    assert LEFT_BEHIND == [], LEFT_BEHIND


def test_each_rank_has_its_own_temporary_folder(tmp_path):
    code, out, _ = _run_inner(tmp_path, """
        from mpi4py import MPI

        def test_tmp_paths_differ(tmp_path):
            paths = MPI.COMM_WORLD.allgather(str(tmp_path))
            assert len(set(paths)) == 2 and all(f"-rank{r}" in p for r, p in enumerate(paths)), paths
    """)
    assert code == 0, out


def test_scripts_test_prints_the_mpi_information_once(tmp_path):
    env = _clean_env(MPICOLL_TEST_NPS="1 2", MPICOLL_TEST_SLOWDOWN=f"{SLOWDOWN:.1f}")   # (this run's: not measured again)
    env.pop("MPICOLL_TEST_MPI_INFO", None)
    proc = subprocess.run([str(HERE.parent / "scripts" / "test"), "-q", "tests/test_bench.py", "-k", "parse_size"],
                          cwd=HERE.parent, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("MPI Information") == 1 and "scripts/test: 2 passed, 0 failed" in proc.stdout


def test_a_run_out_of_time_names_the_variables_and_leaves_nothing_running(tmp_path):
    """scripts/test's own limit for a rank count, when it fires, says which variables raise it, and
    what the run started is gone."""
    (tmp_path / "test_sleeps.py").write_text("import time\n\ndef test_sleeps():\n    time.sleep(120)\n")
    env = _clean_env(MPICOLL_TEST_NPS="1", MPICOLL_TEST_RUN_TIMEOUT="3", MPICOLL_TEST_SLOWDOWN="1")
    proc = subprocess.run([str(HERE.parent / "scripts" / "test"), "-q", str(tmp_path / "test_sleeps.py")],
                          cwd=HERE.parent, env=env, capture_output=True, text=True, timeout=within(120))
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "MPICOLL_TEST_RUN_TIMEOUT=3 s x MPICOLL_TEST_SLOWDOWN=1.0" in proc.stderr and \
        "raise MPICOLL_TEST_RUN_TIMEOUT to allow more" in proc.stderr, proc.stderr
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-f", str(tmp_path / "test_sleeps.py")], capture_output=True, text=True).stdout
    assert not left.strip(), f"still running: {left}"
