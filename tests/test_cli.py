"""The command line, run as a user would: a subprocess ``mpirun`` with a time limit."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from mpi4py import MPI

from _mpi import OPEN_MPI, launch_env, mpirun

pytestmark = [pytest.mark.mpi(min_size=1),
              pytest.mark.skipif(MPI.COMM_WORLD.Get_size() != 1, reason="runs its own mpirun jobs once")]


def run(np_, *args, timeout=120):
    cmd = mpirun(np_, sys.executable, *args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=launch_env())


def test_check_subset_passes():
    res = run(3, "-m", "mpicoll.run", "--op", "AllReduce,AllToAllVV2", "--dtype", "float16,int8,bfloat16")
    assert res.returncode == 0, res.stderr
    assert "all checks passed" in res.stdout
    assert res.stdout.count("AllReduce") == 1 and "AllToAllVV2" in res.stdout and "AllGather " not in res.stdout


def test_demo_prints_the_documented_examples_in_rank_order():
    res = run(2, "-m", "mpicoll", "--demo")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "rank 0 -> [[0, 1, 0, 1]]" in out and "rank 1 -> [[2, 3, 4, 5, 2]]" in out
    assert out.index("rank 0 -> [[1.]]") < out.index("rank 1 -> [[1.]]")


def test_help_and_list():
    res = run(1, "-m", "mpicoll.run", "--help")
    assert res.returncode == 0 and "--log-dir" in res.stdout and "--demo" in res.stdout
    res = run(2, "-m", "mpicoll.run", "list")
    assert res.returncode == 0 and res.stdout.count("operators:") == 1 and "bfloat16" in res.stdout


def test_log_dir_one_file_per_rank(tmp_path):
    res = run(2, "-m", "mpicoll.run", "--op", "Broadcast", "--dtype", "int32", "--log-dir", str(tmp_path / "logs"))
    assert res.returncode == 0, res.stderr
    assert sorted(os.listdir(tmp_path / "logs")) == ["rank.0", "rank.1"]
    assert "Broadcast\tint32\tworld" in (tmp_path / "logs" / "rank.1").read_text()


def test_unknown_operator_is_a_usage_error():
    res = run(2, "-m", "mpicoll.run", "--op", "AllReduceX")
    assert res.returncode != 0 and "unknown operator" in res.stderr


SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    from mpi4py import MPI
    import mpicoll.run as run
    from mpicoll._golden import CHECKS, Case, CheckSpec, register_check

    mode = sys.argv[1]
    if mode == "raise":
        def boom(argv=None):
            if MPI.COMM_WORLD.Get_rank() == 1:
                raise RuntimeError("injected failure")
            MPI.COMM_WORLD.Barrier()
            return 0
        run.main = boom
        run.entry([])
    else:
        class Zeros:
            def execute(self):
                return np.zeros(4, np.int32)

        def broken(case, dtype, dom, rank, n, seed, validate=True):
            exp = np.zeros(4, np.int32)
            if rank == 0:
                exp[1] = 1
            return Case(Zeros(), (), {}, exp)
        register_check(CheckSpec("Broken", lambda n: ["one"], broken, dtypes=("int32",)))
        run.entry(["--op", "Broken"])
""")


def test_unhandled_error_on_one_rank_aborts_the_job(tmp_path):
    script = tmp_path / "inject.py"
    script.write_text(SCRIPT)
    res = run(3, str(script), "raise", timeout=60)
    assert res.returncode != 0
    assert "unhandled error on rank 1" in res.stderr and "injected failure" in res.stderr


def test_wrong_result_exits_1(tmp_path):
    script = tmp_path / "inject.py"
    script.write_text(SCRIPT)
    res = run(2, str(script), "wrong", timeout=60)
    assert res.returncode == 1, res.stderr
    assert "WRONG" in res.stdout and "3 wrong element(s)" in res.stdout


def test_help_lists_every_environment_variable_the_library_reads():
    import re
    from pathlib import Path
    package = Path(__file__).resolve().parent.parent / "mpicoll"
    read = set()
    for path in package.rglob("*.py"):
        read |= set(re.findall(r"MPICOLL_[A-Z_]+", path.read_text()))
    res = run(1, "-m", "mpicoll.run", "--help")
    assert res.returncode == 0
    assert read and {v for v in read if v not in res.stdout} == set()
    assert "docs/cli.md" in res.stdout


def test_demo_at_four_ranks_runs_the_two_rank_example_in_pairs():
    res = run(4, "-m", "mpicoll", "--demo")
    assert res.returncode == 0, res.stderr
    assert "skipped" not in res.stdout and "in pairs of ranks" in res.stdout
    assert res.stdout.count("-> [[2, 3, 4, 5, 2]]") == 2 and res.stdout.count("-> [[0, 1, 0, 1]]") == 2


def test_an_uncaught_error_under_plain_python_prints_only_the_error(tmp_path):
    """``mpirun -np 4 python script.py`` (not ``-m mpi4py``) whose ranks raise an uncaught
    CollectiveError after mpicoll made its communicators and the watchdog's windows: stderr holds
    the tracebacks and nothing from the MPI library (MPICH/UCX used to print dozens of 'UCX WARN
    ... was not returned to mpool' lines for the windows left behind)."""
    script = tmp_path / "fails.py"
    script.write_text(textwrap.dedent("""
        import numpy as np
        from mpi4py import MPI
        import mpicoll
        x = np.ones(4, np.float32)
        mpicoll.AllReduceOperation().execute(x)
        half = f"half{MPI.COMM_WORLD.Get_rank() // 2}"
        mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm_domain=half, rank_size=2)).execute(x)
        mpicoll.AllReduceOperation(mpicoll.AllReduceParam(rank_size=7)).execute(x)
    """))
    res = subprocess.run(mpirun(4, sys.executable, str(script)), capture_output=True, text=True, timeout=120,
                         env=launch_env(MPICOLL_TIMEOUT="60"))
    assert res.returncode != 0
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert sum("rank_size=7" in ln and "CollectiveArgumentError" in ln for ln in lines) == 4, res.stderr
    # (Open MPI prints one "OSC UCX component priority ... failed" line per rank when the watchdog's
    # window is made: its UCX one-sided component declining; docs/reliability.md)
    library = [ln for ln in lines if ("UCX" in ln or "mpool" in ln or "WARN" in ln) and not (OPEN_MPI and "osc_ucx" in ln)]
    assert library == [], library
    lines = [ln for ln in lines if "osc_ucx" not in ln]
    assert len(lines) <= 4 * 20, res.stderr           # four tracebacks of a few frames each
