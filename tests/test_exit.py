"""How a job ends when something goes wrong: one traceback per job for an agreed error, Ctrl-C
stops the whole job, a call after ``MPI.Finalize()`` is a ``CollectiveError``, and none of these
leaves MPICH's shared-memory files (``/dev/shm/mpich_shm_*``) behind. Each case is a job of its
own, launched once from the 1-rank run."""
from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from mpi4py import MPI

from _mpi import OPEN_MPI, await_word, launch_env, left_behind, mpirun, remove, run_job, within

pytestmark = [pytest.mark.mpi(min_size=1),
              pytest.mark.skipif(MPI.COMM_WORLD.Get_size() != 1, reason="runs its own mpirun jobs once")]


def test_an_agreed_error_prints_one_traceback_per_job_and_leaves_nothing(tmp_path):
    """The same rule broken on every rank, uncaught, under ``python -m mpi4py``: one traceback (the
    lowest rank's), one line for each other rank, the message grouped by rank list, the class
    shown as ``mpicoll.X``; the job ends non-zero and leaves no shared-memory file."""
    res, _, left = run_job(tmp_path, """
        import numpy as np, mpicoll
        mpicoll.AllReduceOperation().execute(np.ones((4, 3), np.float32), out=np.empty((3, 4), np.float32))
    """, np_=3)
    remove(left)
    err = res.stderr
    assert res.returncode != 0
    assert err.count("Traceback (most recent call last)") == 1, err
    assert ("mpicoll.CollectiveArgumentError: AllReduce: out='float32[3, 4]' on ranks [0, 1, 2]: must be "
            "float32[4, 3]\n") in err, err
    for r in (1, 2):
        assert f"world rank {r}: the same mpicoll.CollectiveArgumentError as world rank 0, whose traceback is " \
               "printed" in err, err
    assert "(also:" not in err and "mpicoll._errors." not in err
    assert left == [], f"left behind: {left}"
    # (MPICOLL_TRACEBACK_FILTERING: the user's line and the message, no frame of mpicoll's or the runner's)
    trace = err[err.index("Traceback"):err.index("\n", err.index("mpicoll.CollectiveArgumentError: "))]
    assert trace.count('  File "') == 1 and "job.py" in trace and ".execute(np.ones((4, 3)" in trace, trace
    assert "(hidden from this traceback: " in err and "MPICOLL_TRACEBACK_FILTERING=0 shows every frame" in err, err


def test_under_plain_python_one_traceback_whole_and_a_misspelt_setting_warned_once_per_rank(tmp_path):
    """Plain ``python`` (no ``-m mpi4py``), 2 ranks, a misspelt setting in the environment: each rank
    warns once of it, naming the closest setting; the agreed error prints one traceback, in one
    piece (the other rank's line is before or after it, not inside), without mpicoll's frames;
    ``MPICOLL_TRACEBACK_FILTERING=0`` would show them (the setting is read, not refused)."""
    body = """
        import numpy as np
        from mpi4py import MPI
        import mpicoll
        op = mpicoll.AllReduceOperation()
        op.execute(np.ones(4 + MPI.COMM_WORLD.Get_rank(), np.float32))
    """
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(body))
    env = launch_env(settings=False, MPICOLL_TIMOUT="5")
    res = subprocess.run(mpirun(2, sys.executable, str(script)), capture_output=True, text=True, timeout=60, env=env)
    err = res.stderr
    assert res.returncode != 0, err
    warned = [ln for ln in err.splitlines() if "UserWarning" in ln]
    assert len(warned) == 2 and all("MPICOLL_TIMOUT is no mpicoll setting (the closest: MPICOLL_TIMEOUT)" in w
                                    for w in warned), err
    start = err.index("Traceback (most recent call last):")
    end = err.index("\n", err.index("shows every frame", start)) + 1
    trace = err[start:end].splitlines()
    assert trace[1:3] == ['  File "' + str(script) + '", line 6, in <module>',
                          "    op.execute(np.ones(4 + MPI.COMM_WORLD.Get_rank(), np.float32))"], err
    assert trace[3] == ("mpicoll.CollectiveMismatchError: AllReduce: x.shape differs across ranks: (4,) on rank 0; "
                        "(5,) on rank 1"), err
    assert len(trace) == 5 and trace[4].startswith("(hidden from this traceback: "), err
    assert "world rank 1: the same mpicoll.CollectiveMismatchError as world rank 0" in err.replace(err[start:end], ""), err


def test_an_error_on_one_rank_still_prints_its_own_traceback(tmp_path):
    """An error only one rank has (validation off: nothing agreed) keeps Python's usual output on
    that rank, and the job still leaves nothing behind."""
    res, _, left = run_job(tmp_path, """
        from mpi4py import MPI
        import numpy as np, mpicoll
        mpicoll.init()
        if MPI.COMM_WORLD.Get_rank() == 1:
            raise RuntimeError("only here")
        MPI.COMM_WORLD.Barrier()
    """, np_=3)
    remove(left)
    assert res.returncode != 0
    assert "RuntimeError: only here" in res.stderr and "the same" not in res.stderr, res.stderr
    assert left == [], f"left behind: {left}"


LOOP = """
import numpy as np, mpicoll
x = np.ones(1 << 14, np.float32)
plan = mpicoll.AllReduceOperation().prepare(x, out=np.empty_like(x))
print("running", flush=True)
while True:
    plan.run()
"""


@pytest.mark.timeout_s(90)
@pytest.mark.parametrize("runner", [[], ["-m", "mpi4py"]], ids=["python", "python-m-mpi4py"])
def test_ctrl_c_in_a_plan_loop_ends_the_job_and_leaves_nothing(tmp_path, runner):
    """Ctrl-C (SIGINT to the job's process group, as a terminal sends it) while every rank loops
    on ``plan.run()``: the job ends at once, under plain ``python`` too (a rank's uncaught
    KeyboardInterrupt aborts the job: its peers are inside a collective that would never
    return), and no shared-memory file is left."""
    if OPEN_MPI:
        pytest.skip("MPICH's shared-memory files; Open MPI's launcher handles Ctrl-C itself")
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    before = set(glob.glob("/dev/shm/mpich_shm_*"))
    job = subprocess.Popen(mpirun(3, sys.executable, *runner, str(script)), env=launch_env(), text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        await_word(job.stdout, "running", 3)
        time.sleep(0.5)
        t0 = time.monotonic()
        os.killpg(job.pid, signal.SIGINT)
        _, err = job.communicate(timeout=30)
        seconds = time.monotonic() - t0
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate()
    left = left_behind(before)
    remove(left)
    assert job.returncode != 0 and seconds < within(10), (job.returncode, seconds, err[-2000:])
    assert "KeyboardInterrupt" in err
    assert left == [], f"left behind: {left}"


def test_calls_after_finalize_raise_a_collective_error(tmp_path):
    """After ``MPI.Finalize()`` every entry point raises a ``CollectiveError`` naming the operation
    and saying MPI is finalized (MPI would otherwise end the process from C)."""
    res, _, left = run_job(tmp_path, """
        import numpy as np
        from mpi4py import MPI
        import mpicoll, mpicoll.functional as F
        x = np.ones(4, np.float32)
        op = mpicoll.AllReduceOperation()
        plan = op.prepare(x, out=np.empty_like(x))
        handle = plan.start()
        handle.wait()
        handle = plan.start()
        rank = MPI.COMM_WORLD.Get_rank()
        MPI.Finalize()
        for name, fn in [("execute", lambda: op.execute(x)), ("new", lambda: mpicoll.AllGatherOperation().execute(x)),
                         ("run", plan.run), ("wait", handle.wait), ("test", handle.test),
                         ("functional", lambda: F.all_reduce(x)), ("group", lambda: F.all_reduce(x, group=[0])),
                         ("domain", lambda: mpicoll.domain("d", 1)), ("mesh", lambda: mpicoll.mesh(1, 1)),
                         ("hccl", lambda: mpicoll.Hccl().init("other"))]:
            try:
                fn()
                said = "no error"
            except mpicoll.CollectiveError as exc:
                said = str(exc)
            if rank == 0:                         # (two ranks' lines may run together)
                print(f"@@{name}|{said}@@", flush=True)
    """, np_=2)
    remove(left)
    assert res.returncode == 0, res.stderr[-3000:]
    got = dict(re.findall(r"@@(\w+)\|(.*?)@@", res.stdout))
    assert len(got) == 10, res.stdout
    for name, text in got.items():
        assert "after MPI is finalized (MPI.Finalize() was called" in text, (name, text)
    assert got["execute"].startswith("AllReduce: a call") and got["run"].startswith("AllReduce: run()")
    assert got["wait"].startswith("AllReduce: wait()") and got["functional"].startswith("all_reduce: a call")
    assert got["domain"].startswith("comm domain 'd'") and got["mesh"].startswith("mesh:")


ENTRY = {
    "domain": 'mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm_domain="d", rank_size=2)).execute(x)',
    "user-comm": "mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=MPI.COMM_WORLD.Dup())).execute(x)",
    "node-buffer": 'mpicoll.declare_domains({"nb": [0, 1]}); mpicoll.node_buffer(16, comm_domain="nb")',
}
ENDING = {
    "error": 'raise RuntimeError("the end")',
    "kill-9": 'print(f"@@ready {MPI.COMM_WORLD.Get_rank()} {os.getpid()}@@", flush=True); time.sleep(60)',
}
NO_WORLD = """
import os, time
import numpy as np
from mpi4py import MPI
import mpicoll
from mpicoll._watchdog import own_shm_segments
print("".join(f"@@{{p}}@@" for p in own_shm_segments()), flush=True)
x = np.ones(4, np.float32)
{entry}
{ending}
"""


@pytest.mark.timeout_s(90)
@pytest.mark.parametrize("ending", list(ENDING))
@pytest.mark.parametrize("entry", list(ENTRY))
def test_a_program_that_never_uses_the_world_leaves_nothing(tmp_path, entry, ending):
    """A program whose only mpicoll communicator is a domain, a user comm or a node buffer's
    (never the world), ended by an uncaught error under ``python -m mpi4py`` or by ``kill -9`` of
    one rank: the MPICH shared-memory files its ranks mapped are gone (each rank prints the files
    it maps, so files of other jobs running on the machine do not count)."""
    if OPEN_MPI:
        pytest.skip("MPICH's shared-memory files")
    script = tmp_path / "job.py"
    script.write_text(NO_WORLD.format(entry=ENTRY[entry], ending=ENDING[ending]))
    job = subprocess.Popen(mpirun(2, sys.executable, "-m", "mpi4py", str(script)), env=launch_env(), text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    out = ""
    try:
        if ending == "kill-9":
            while out.count("@@ready") < 2:
                line = job.stdout.readline()
                assert line, f"the job ended before both ranks were ready: {out}"
                out += line
            pid = int(re.findall(r"@@ready 1 (\d+)@@", out)[0])
            os.kill(pid, signal.SIGKILL)
        rest, err = job.communicate(timeout=60)
        out += rest
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate()
    mapped = set(re.findall(r"@@(/dev/shm/mpich_shm_[^@\s]+)@@", out))
    deadline = time.monotonic() + 0.5                     # (the ended processes' mappings go a moment later)
    while (left := sorted(p for p in mapped if os.path.exists(p))) and time.monotonic() < deadline:
        time.sleep(0.02)
    remove(left)
    assert job.returncode != 0, (out, err[-3000:])
    if ending == "error":
        assert "RuntimeError: the end" in err, err[-3000:]
    assert mapped, f"no rank reported a shared-memory file: {out}"
    assert left == [], f"left behind: {left}"
