"""The command line, run as a user would: a subprocess ``mpirun`` with a time limit."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest
from mpi4py import MPI

from _docs import home as docs_home, run as docs_run
from _mpi import OPEN_MPI, launch_env, mpirun

pytestmark = [pytest.mark.mpi(min_size=1),
              pytest.mark.skipif(MPI.COMM_WORLD.Get_size() != 1, reason="runs its own mpirun jobs once")]


def run(np_, *args, timeout=120):
    cmd = mpirun(np_, sys.executable, *args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=launch_env())


def test_check_subset_passes():
    """The operators asked for; one that cannot run at 3 ranks (the fused one: an ep x 2 mesh) is
    skipped, saying why, never "ok"."""
    from mpicoll.checks import CHECKS
    fused = "AlltoAllAllGatherBatchMatMul"
    res = run(3, "-m", "mpicoll.run", "--op", f"AllReduce,AllToAllVV2,{fused}", "--dtype", "float16,int8,bfloat16")
    assert res.returncode == 0, res.stderr
    assert "all checks passed" in res.stdout and "1 skipped at 3 rank(s)" in res.stdout
    assert res.stdout.count("AllReduce") == 1 and "AllToAllVV2" in res.stdout and "AllGather " not in res.stdout
    row = next(line for line in res.stdout.splitlines() if line.startswith(fused))
    assert row.split()[1:5] == ["2", "0", "0", "0"] and row.endswith(f"  skipped: {CHECKS[fused].skip_at(3)}"), row


def test_check_table_says_skipped_and_nothing_checked():
    """An operator with nothing checked is "skipped: <why>", and a table without a check says so."""
    from mpicoll.check import CheckRow, format_rows
    rows = [CheckRow("A", 2, 0, skipped="needs 4 ranks"), CheckRow("B", 0, 0, skipped="it takes int8 only")]
    table = format_rows(rows, 2)
    assert "  skipped: needs 4 ranks" in table and "  skipped: it takes int8 only" in table and " ok" not in table
    assert table.endswith("# nothing checked: 0 checks, 0 operator(s) wrong, 2 skipped at 2 rank(s)")
    table = format_rows([CheckRow("C", 1, 3, 6)] + rows[:1], 2)
    assert table.endswith("# all checks passed: 6 checks, 0 operator(s) wrong, 1 skipped at 2 rank(s)")


def test_demo_prints_the_documented_examples_in_rank_order():
    res = run(2, "-m", "mpicoll", "--demo")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "rank 0 -> [[0, 1, 0, 1]]" in out and "rank 1 -> [[2, 3, 4, 5, 2]]" in out
    assert out.index("rank 0 -> [[1.]]") < out.index("rank 1 -> [[1.]]")


def test_help_and_list():
    status, out = docs_run(("python -m mpicoll.run --help",))[0]      # (docs/cli.md's run of it)
    assert status == 0 and "--log-dir" in out and "--demo" in out
    from mpicoll._numeric import kernels_in_use
    assert f"numeric kernels: {kernels_in_use()}\nmore: docs/cli.md" in out and "--version" in out
    res = run(2, "-m", "mpicoll.run", "list")
    assert res.returncode == 0 and res.stdout.count("operators:") == 1 and "bfloat16" in res.stdout


def test_importing_mpicoll_and_its_torch_backend_needs_no_mpi():
    """A tool that parses a rank table before any job runs (scripts/ranktable2hosts) imports mpicoll
    with MPI left uninitialized: no module asks MPI anything at import."""
    code = ("import importlib.util, mpi4py; mpi4py.rc.initialize = False; import mpicoll, mpicoll.functional, "
            "mpicoll.tracing; importlib.util.find_spec('torch') and __import__('mpicoll.torch'); print('ok')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=launch_env())
    assert res.returncode == 0 and res.stdout == "ok\n", res.stderr


def test_log_dir_one_file_per_rank():
    """(docs/cli.md's run of it, in its own folder. An unknown operator's usage error: docs/cli.md's
    sample, tests/test_docs_outputs.py.)"""
    (status, out), _ = docs_run(("mpirun -np 2 python -m mpicoll.run --op Broadcast --dtype int32 --log-dir logs",
                                 "head -3 logs/rank.1"))
    assert status == 0, out
    assert sorted(os.listdir(docs_home() / "logs")) == ["rank.0", "rank.1"]
    assert "Broadcast\tint32\tworld" in (docs_home() / "logs" / "rank.1").read_text()


SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    from mpi4py import MPI
    import mpicoll.run as run
    from mpicoll.checks import CHECKS, Case, CheckSpec

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
        CHECKS["Broken"] = CheckSpec("Broken", lambda n: ["one"], broken, dtypes=("int32",))
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
    from mpicoll._env import RESERVED
    read = {v for v in read if not v.startswith(RESERVED)}          # (the test harness's: no setting)
    status, out = docs_run(("python -m mpicoll.run --help",))[0]      # (docs/cli.md's run of it)
    assert status == 0
    assert read and {v for v in read if v not in out} == set()
    assert "docs/cli.md" in out


def test_demo_at_four_ranks_runs_the_two_rank_example_in_pairs():
    res = run(4, "-m", "mpicoll", "--demo")
    assert res.returncode == 0, res.stderr
    assert "skipped" not in res.stdout and "in pairs of ranks" in res.stdout
    assert res.stdout.count("-> [[2, 3, 4, 5, 2]]") == 2 and res.stdout.count("-> [[0, 1, 0, 1]]") == 2


def test_an_uncaught_error_under_plain_python_prints_only_the_error(tmp_path):
    """``mpirun -np 4 python script.py`` (not ``-m mpi4py``) whose ranks raise an uncaught
    CollectiveError after mpicoll made its communicators and the watchdog's windows: stderr holds
    the error (one traceback, one line for each other rank: mpicoll's excepthook) and nothing from
    the MPI library (MPICH/UCX used to print dozens of 'UCX WARN ... was not returned to mpool'
    lines for the windows left behind)."""
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
    # (counted in the text, not by lines: the launcher may run two ranks' lines together)
    assert len(re.findall(r"CollectiveArgumentError: [^\n]*rank_size=7", res.stderr)) == 1, res.stderr
    assert res.stderr.count("the same mpicoll.CollectiveArgumentError as world rank 0") == 3, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    # (Open MPI prints one "OSC UCX component priority ... failed" line per rank when the watchdog's
    # window is made: its UCX one-sided component declining; docs/reliability.md)
    library = [ln for ln in lines if ("UCX" in ln or "mpool" in ln or "WARN" in ln) and not (OPEN_MPI and "osc_ucx" in ln)]
    assert library == [], library
    lines = [ln for ln in lines if "osc_ucx" not in ln]
    if OPEN_MPI and any(ln.startswith("-----") for ln in lines):     # (prterun's own note on the exit status)
        lines = lines[:next(i for i, ln in enumerate(lines) if ln.startswith("-----"))]
    assert len(lines) <= 20 + 3, res.stderr           # one traceback of a few frames, one line per other rank


def test_an_error_on_one_rank_while_the_others_end_prints_it_and_exits_as_raw_mpi4py(tmp_path):
    """``mpirun -np 2 python script.py``: rank 0 raises after a call while rank 1 ends cleanly. As
    raw mpi4py, the job prints rank 0's traceback and exits 1 (rank 0 asks its peers to dump their
    flight recorders with SIGUSR1: a rank already exiting ignores it; it used to end that rank by
    the signal, and mpirun the job before rank 0 had printed its error)."""
    script = tmp_path / "fails.py"
    script.write_text(textwrap.dedent("""
        import time
        import numpy as np
        from mpi4py import MPI
        import mpicoll
        mpicoll.AllReduceOperation().execute(np.ones(4, np.float32))
        if MPI.COMM_WORLD.Get_rank() == 0:
            time.sleep(0.5)
            raise ValueError("only on rank 0")
    """))
    res = subprocess.run(mpirun(2, sys.executable, str(script)), capture_output=True, text=True, timeout=120,
                         env=launch_env(MPICOLL_DUMP_DIR=str(tmp_path / "flight")))
    assert res.returncode == 1, (res.returncode, res.stdout, res.stderr)
    assert "ValueError: only on rank 0" in res.stderr and "signal" not in res.stdout + res.stderr, res.stderr


def test_bench_help_and_usage_errors_print_once_per_job():
    """``bench --help`` and a bench usage error print once per job (world rank 0), as the top-level
    ``--help`` does; every rank exits alike (0 for --help, 2 for a usage error)."""
    res = run(2, "-m", "mpicoll.run", "bench", "--help")
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("usage: python -m mpicoll.run bench") == 1, res.stdout
    assert res.stdout.count("--maxbytes") == 1 and "Ctrl-C" in res.stdout
    for bad, says in ((["--bogus"], "unrecognized arguments: --bogus"),                 # argparse's errors
                      (["--op", "AllReduceX"], "unknown operator: AllReduceX")):      # the harness' own
        res = run(2, "-m", "mpicoll.run", "bench", *bad)
        assert res.returncode == 2, (bad, res.stderr)
        assert res.stderr.count(says) == 1 and res.stderr.count("error:") == 1, (bad, res.stderr)
        assert res.stderr.count("usage:") == (1 if bad[0] == "--bogus" else 0), (bad, res.stderr)


def test_kernels_in_use_in_the_headers_help_and_version():
    """Which numeric kernels run (C, or numpy and why): in the check and bench headers (every rank's,
    grouped when they differ), in ``--help`` (test_help_and_list) and ``--version`` (once per job)."""
    import mpicoll
    from mpicoll._numeric import kernels_in_use
    here = kernels_in_use()           # (the jobs import the same mpicoll, with the same environment)
    status, out = docs_run(("mpirun -np 2 python -m mpicoll.run --version",))[0]     # (docs/cli.md's run of it)
    assert status == 0, out
    assert out.startswith(f"mpicoll {mpicoll.__version__} (mpi4py ") and out.count("mpicoll ") == 1
    assert out.rstrip().endswith(f"; numeric kernels: {here}"), out
    res = subprocess.run(mpirun(2, sys.executable, "-m", "mpicoll.run", "bench", "--op", "AllReduce", "-b", "8", "-e",
                                "8", "-n", "1", "-w", "0"), capture_output=True, text=True, timeout=120,
                         env=launch_env(MPICOLL_KERNELS="0"))
    assert res.returncode == 0, res.stderr
    first = res.stdout.splitlines()[0]
    assert first.startswith(f"# mpicoll {mpicoll.__version__} bench: 2 ranks on ") and \
        first.endswith("; numeric kernels: numpy (MPICOLL_KERNELS=0)"), res.stdout
    check = [sys.executable, "-m", "mpicoll.run", "--op", "Broadcast", "--dtype", "int32"]
    if OPEN_MPI:
        cmd, says = mpirun(2, *check), here
    else:                             # ranks that differ: MPICH's MPMD form, -env for one of them
        cmd = mpirun(1, "-env", "MPICOLL_KERNELS", "0", *check) + [":", "-np", "1", *check]
        says = here if here.startswith("numpy (MPICOLL_KERNELS=0)") else \
            f"numpy (MPICOLL_KERNELS=0) on ranks [0]; {here} on ranks [1]"
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=launch_env())
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[1] == f"# numeric kernels: {says}", res.stdout


def test_info_names_each_item_without_mpirun_and_once_per_job():
    """``--info``: plain ``python`` (no launcher: an MPI singleton) and under mpirun (rank 0 prints,
    once), each item named: versions, the MPI library and its thread level, the kernels, torch, ranks
    per node, the shared window, how messages are waited for, the packages, every setting with its
    default."""
    from mpicoll import _env
    plain = subprocess.run([sys.executable, "-m", "mpicoll.run", "--info"], capture_output=True, text=True,
                           timeout=120, env=launch_env(MPICOLL_TIMEOUT="30", MPICOLL_NOT_A_SETTING="1",
                                                       MPICOLL_WAIT="Sleep"))
    # (nothing of mpicoll's on stderr but the one warning of the variable that is no setting; an MPI may
    # print its own notes there: Open MPI's UCX in a singleton)
    warned = [ln for ln in plain.stderr.splitlines() if "mpicoll" in ln]
    assert plain.returncode == 0 and "Traceback" not in plain.stderr, plain.stderr
    assert len(warned) == 1 and "UserWarning: mpicoll: MPICOLL_NOT_A_SETTING is no mpicoll setting (the closest: " \
        "MPICOLL_" in warned[0], plain.stderr
    for item in ("mpicoll ", "python ", "numpy ", "ml_dtypes ", "mpi4py ", "MPI library ", "thread level MPI_THREAD_",
                 "C kernels ", "torch ", "ranks          1 on 1 node(s), 1 per node", "shared window ", "packages ",
                 "mpi4py 4.", "not settings (ignored): "):
        assert item in plain.stdout, (item, plain.stdout)
    ignored = next(ln for ln in plain.stdout.splitlines() if "not settings (ignored): " in ln)
    assert "MPICOLL_NOT_A_SETTING" in ignored.split(": ", 1)[1].split(", "), ignored   # (the job's own may be there)
    import importlib.util
    torch_says = "; the backend 'mpicoll' is a " if importlib.util.find_spec("torch") else "not installed"
    assert "\ntorch          " in plain.stdout and torch_says in plain.stdout, plain.stdout
    rows = {ln.split()[0]: ln for ln in plain.stdout.splitlines() if ln.startswith("  MPICOLL_")}
    assert list(rows) == list(_env.SETTINGS), plain.stdout
    for name, s in _env.SETTINGS.items():
        assert rows[name].split(None, 1)[1].startswith(s.shown_default), rows[name]
    assert rows["MPICOLL_TIMEOUT"].endswith("30 s, environment") and rows["MPICOLL_SHM"].endswith("on, default")
    assert "\nmessage waits  sleep between polls (MPICOLL_WAIT=sleep; no more ranks on this node than cores)\n" \
        in plain.stdout, plain.stdout
    res = subprocess.run(mpirun(3, sys.executable, "-m", "mpicoll.run", "--info"), capture_output=True, text=True,
                         timeout=120, env=launch_env(MPICOLL_WAIT="auto"))
    assert res.returncode == 0 and res.stdout.count("mpicoll ") == 1, res.stdout + res.stderr
    assert "ranks          3 on 1 node(s), 3 per node" in res.stdout and "shared window  used" in res.stdout
    crowded = 3 > len(os.sched_getaffinity(0))          # (auto: sleeps where the ranks outnumber their cores)
    how = "sleep between polls" if crowded else "MPI's own wait (spins)"
    assert (f"\nmessage waits  {how} (MPICOLL_WAIT=auto; {'more' if crowded else 'no more'} ranks on this node "
            "than cores)\n") in res.stdout, res.stdout


def test_info_says_which_setting_is_refused_and_exits_2():
    """A refused setting, on every rank or on one (MPICH's MPMD form, ``-env`` for one of them):
    ``--info`` marks it, prints the library's error once, and every rank exits 2 (no traceback)."""
    res = subprocess.run(mpirun(2, sys.executable, "-m", "mpicoll.run", "--info"), capture_output=True, text=True,
                         timeout=120, env=launch_env(MPICOLL_TIMEOUT="inf"))
    says = ("python -m mpicoll.run --info: error: environment MPICOLL_TIMEOUT='inf' on world ranks [0, 1]: not a "
            "finite number of seconds; accepted: a finite number of seconds >= 0")
    assert res.returncode == 2 and res.stderr.count(says) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "'inf' REFUSED (not a finite number of seconds)" in res.stdout, res.stdout
    if OPEN_MPI:
        return
    info = [sys.executable, "-m", "mpicoll.run", "--info"]
    res = subprocess.run(mpirun(1, *info) + [":", "-np", "1", "-env", "MPICOLL_TIMEOUT_ACTION", "explode", *info],
                         capture_output=True, text=True, timeout=120, env=launch_env())
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.count("error: environment MPICOLL_TIMEOUT_ACTION='explode' on world rank 1: an unknown "
                            "value; accepted: abort or raise") == 1, res.stderr
    assert "abort, default on ranks [0]; 'explode' REFUSED (an unknown value) on ranks [1]" in res.stdout, res.stdout


def test_a_refused_setting_is_a_usage_error_of_every_command():
    """``check``, ``demo`` and ``bench`` with a setting mpicoll refuses (on every rank) or that differs
    across ranks: the library's error once, status 2 on every rank, no traceback."""
    for args, env, says in (
            (["--op", "Broadcast", "--dtype", "int32"], {"MPICOLL_VALIDATE": "maybe"},
             "python -m mpicoll.run: error: environment MPICOLL_VALIDATE='maybe' on world ranks [0, 1]: neither on "
             "nor off; accepted: on: 1, true, on, yes; off: 0, false, off, no (any case); unset or empty: on"),
            (["--demo"], {"MPICOLL_DOMAIN_TIMEOUT": "-1"}, "python -m mpicoll.run: error: environment "
             "MPICOLL_DOMAIN_TIMEOUT='-1' on world ranks [0, 1]: a negative number of seconds"),
            (["bench", "--op", "AllReduce", "-b", "8", "-e", "8", "-n", "1", "-w", "0"], {"MPICOLL_DEBUG": "2"},
             "python -m mpicoll.run bench: error: environment MPICOLL_DEBUG='2' on world ranks [0, 1]")):
        res = subprocess.run(mpirun(2, sys.executable, "-m", "mpicoll.run", *args), capture_output=True, text=True,
                             timeout=120, env=launch_env(**env))
        assert res.returncode == 2 and res.stderr.count(says) == 1 and "Traceback" not in res.stderr, \
            (args, res.stderr)


@pytest.mark.parametrize("flags,fragment", [
    (["-n", "0"], "-n/--iters 0: must be >= 1"),
    (["-b", "64M", "-e", "8"], "-b/--minbytes 67108864 is larger than -e/--maxbytes 8"),
    (["-r", "7"], "-r/--root 7: must be a rank of every benchmarked group, in [0, 2)"),
    (["-r", "x"], "argument -r/--root: invalid int value: 'x'"),
    (["--json", "/proc/nowhere/rows.json"], "--json /proc/nowhere/rows.json: its folder /proc/nowhere does not exist"),
])
def test_bench_flags_that_make_no_sweep_are_usage_errors(flags, fragment):
    """A flag whose value makes no sweep (no iterations, no size, a root outside the groups, a JSON
    file that cannot be written) is a usage error before any timing: exit 2 on every rank, one
    message, no traceback, no table."""
    res = run(2, "-m", "mpicoll.run", "bench", "--op", "AllReduce,Broadcast", "-e", "64", *flags)
    assert res.returncode == 2, res.stdout + res.stderr
    assert fragment in res.stderr and "Traceback" not in res.stderr and "# Avg bus bandwidth" not in res.stdout


def test_an_unwritable_log_dir_is_a_usage_error_on_every_rank(tmp_path):
    """``--log-dir`` where a rank cannot write its log: exit 2 on every rank, naming the rank and the
    file, before any check runs."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    res = run(2, "-m", "mpicoll.run", "--op", "AllReduce", "--log-dir", str(blocker / "logs"))
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"--log-dir {blocker / 'logs'}: world rank 0 cannot write" in res.stderr and "Traceback" not in res.stderr
    assert "all checks passed" not in res.stdout
