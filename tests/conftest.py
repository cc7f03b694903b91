"""Generic pytest harness for running tests under MPI (see scripts/test).

Two safety nets, because a fault on one MPI rank otherwise hangs the job:

* Per-test watchdog: ``faulthandler.dump_traceback_later(T, exit=True)`` is
  armed around every test (setup, call and teardown) and cancelled after it.
  If it fires, a line names the test and the settings its limit comes from,
  the stacks of the stuck process are written to stderr and the process
  exits, which makes the MPI launcher kill the remaining ranks. ``T`` is
  ``$MPICOLL_TEST_TIMEOUT`` seconds (default 120; 0 disables it), or the value
  of ``@pytest.mark.timeout_s(seconds)`` on the test, times
  ``$MPICOLL_TEST_SLOWDOWN`` (default 1; scripts/test measures the machine's
  load and sets it).
* Nothing a test starts outlives it: the jobs a test launches carry
  ``MPICOLL_TEST_NESTED=<run>:<pid of this process>`` (tests/_mpi.launch_env);
  after a test that started processes, any of them still running (an mpirun
  killed on a timeout leaves its ranks behind) are killed, and a line says so.
* Abort on first failure: with more than one rank, the first failed report on
  any rank writes the rank and the traceback to stderr and calls
  ``MPI.COMM_WORLD.Abort(1)``, so a one-rank failure cannot leave the other
  ranks blocked in a collective (and later results, which could pair with the
  wrong peer, are never reported).  ``MPICOLL_TEST_NO_ABORT=1`` disables this.

This file deliberately does not import the package under test, and imports
mpi4py only lazily, so plain ``pytest`` without MPI still works.
"""

import faulthandler
import os
import re
import resource
import signal
import sys
import threading
import time

import pytest

DEFAULT_TIMEOUT_S = 120.0
#: how much slower than a quiet machine this one is (``MPICOLL_TEST_SLOWDOWN``): every limit times it
SLOWDOWN = 1.0

# Duplicate of the real stderr, taken in pytest_configure (during conftest
# import fd 2 is still redirected by pytest's capture).  Used for emergency
# output that must survive output capturing and ``-p no:terminal``.
_err = None
_default_timeout = DEFAULT_TIMEOUT_S
_aborting = False


def _parse_seconds(value, what):
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise pytest.UsageError(f"{what}: expected a number of seconds, got {value!r}")
    if not seconds >= 0:  # also rejects nan
        raise pytest.UsageError(f"{what}: expected seconds >= 0, got {value!r}")
    return seconds


def pytest_configure(config):
    global _err, _default_timeout, SLOWDOWN
    config.addinivalue_line(
        "markers",
        "timeout_s(seconds): per-test watchdog in seconds, overrides "
        "$MPICOLL_TEST_TIMEOUT (tests/conftest.py)",
    )
    _default_timeout = _parse_seconds(
        os.environ.get("MPICOLL_TEST_TIMEOUT", DEFAULT_TIMEOUT_S), "MPICOLL_TEST_TIMEOUT"
    )
    SLOWDOWN = _parse_seconds(os.environ.get("MPICOLL_TEST_SLOWDOWN", "1") or "1", "MPICOLL_TEST_SLOWDOWN")
    if not SLOWDOWN > 0:
        raise pytest.UsageError(f"MPICOLL_TEST_SLOWDOWN: expected a factor > 0, got {SLOWDOWN!r}")
    # (the run's id: scripts/test's, else this process's own; the jobs a test launches carry it)
    os.environ.setdefault("MPICOLL_TEST_RUN_ID", f"{os.getpid()}-{time.time_ns()}")
    if _err is None:
        _err = os.fdopen(os.dup(2), "w", buffering=1, errors="backslashreplace")
    # The mpirun jobs that some tests start must run the mpicoll these tests import (the source
    # tree, when pytest runs from the repository), not another copy in site-packages.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.isfile(os.path.join(root, "mpicoll", "__init__.py")):
        path = os.environ.get("PYTHONPATH", "")
        if root not in path.split(os.pathsep):
            os.environ["PYTHONPATH"] = root + (os.pathsep + path if path else "")
    # Each rank its own pytest temporary folder: ranks sharing one race to clean it up (pytest's
    # "rm_rf ... Directory not empty" warning). Named by the job and the rank, so that two jobs at
    # once never share one either; removed at the end of a passing session (kept after a failure).
    rank = _launcher_rank()
    if rank is not None and not config.option.basetemp:
        import tempfile
        parent = os.path.join(tempfile.gettempdir(), f"pytest-of-{os.environ.get('USER') or os.getuid()}")
        os.makedirs(parent, mode=0o700, exist_ok=True)
        job = "".join(c if c.isalnum() else "-" for c in _launcher_job())[-40:]
        config.option.basetemp = os.path.join(parent, f"mpicoll-{job}-np{_launcher_size()}-rank{rank}")
        config._mpicoll_basetemp = config.option.basetemp


def _launcher_rank():
    """This process's rank from the launcher's environment (MPICH/hydra, Open MPI, Slurm), if any."""
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return None


def _launcher_job():
    """A token naming this MPI job (the launcher's), or this process's parent."""
    for var in ("PMI_KVSNAME", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "SLURM_JOB_ID"):
        if os.environ.get(var):
            return os.environ[var] + os.environ.get("SLURM_STEP_ID", "")
    return f"ppid{os.getppid()}"


def _launcher_size():
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def pytest_sessionstart(session):
    # scripts/test runs the suite once per rank count: pytest-mpi's "MPI Information" block is
    # printed with the first one only (MPICOLL_TEST_MPI_INFO=0 for the others)
    if os.environ.get("MPICOLL_TEST_MPI_INFO", "1") == "0":
        for plugin in session.config.pluginmanager.get_plugins():
            if type(plugin).__name__ == "MPIPlugin":
                plugin._is_testing_mpi = False


def pytest_sessionfinish(session, exitstatus):
    mine = getattr(session.config, "_mpicoll_basetemp", None)
    if mine and exitstatus == 0:
        import shutil
        shutil.rmtree(mine, ignore_errors=True)


def pytest_unconfigure(config):
    global _err
    faulthandler.cancel_dump_traceback_later()
    if _err is not None:
        try:
            _err.close()
        except OSError:
            pass
        _err = None


def _timeout_for(item):
    """The test's limit on a quiet machine, and where it comes from (to name it when it fires)."""
    marker = item.get_closest_marker("timeout_s")
    if marker is None:
        return _default_timeout, f"MPICOLL_TEST_TIMEOUT={_default_timeout:g} s"
    if marker.args:
        value = marker.args[0]
    elif "seconds" in marker.kwargs:
        value = marker.kwargs["seconds"]
    else:
        raise pytest.UsageError(f"{item.nodeid}: timeout_s marker needs a number of seconds")
    seconds = _parse_seconds(value, f"{item.nodeid}: timeout_s")
    return seconds, f"its @pytest.mark.timeout_s({seconds:g})"


def pytest_collection_modifyitems(session, config, items):
    # Validate the markers up front: every rank fails the same way, no hang.
    for item in items:
        _timeout_for(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    base, source = _timeout_for(item)
    timeout = base * SLOWDOWN
    said = None
    if timeout > 0 and _err is not None:
        # The line naming the limit first (a thread: it runs unless the test holds the interpreter),
        # then, a moment later, the stacks and the exit (faulthandler's own thread: it always runs).
        text = (f"\nmpicoll test watchdog: {item.nodeid} still running after {timeout:g} s, its limit "
                f"({source} x MPICOLL_TEST_SLOWDOWN={SLOWDOWN:g}): ending this process; raise "
                f"{'MPICOLL_TEST_TIMEOUT' if source.startswith('MPICOLL') else 'the marker'} or "
                "MPICOLL_TEST_SLOWDOWN to allow more\n")
        said = threading.Timer(timeout, _say, (text,))
        said.daemon = True
        said.start()
        faulthandler.dump_traceback_later(timeout + 0.2, exit=True, file=_err)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        if said is not None:
            said.cancel()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if (after.ru_utime, after.ru_stime) != (before.ru_utime, before.ru_stime):
            _end_strays(item.nodeid)


def _say(text: str) -> None:
    try:
        _err.write(text)
        _err.flush()
    except Exception:  # noqa: BLE001 - the watchdog's exit follows anyway
        pass


def nested_token() -> str:
    """What the jobs this process launches carry in ``MPICOLL_TEST_NESTED`` (tests/_mpi.launch_env)."""
    return f"{os.environ.get('MPICOLL_TEST_RUN_ID', '')}:{os.getpid()}"


def _end_strays(nodeid: str) -> None:
    """Kill the processes of the jobs this process launched that are still running after the test
    (found by ``MPICOLL_TEST_NESTED`` in their environment: ranks whose mpirun was killed are no
    longer its children), and say so. Ranks that are ending (an aborted job's, a moment after its
    mpirun returned) get up to a second first."""
    mark = f"MPICOLL_TEST_NESTED={nested_token()}".encode()
    deadline = time.monotonic() + 1.0
    while True:
        left = _marked(mark)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if left:
        _say(f"\ntests/conftest.py: {len(left)} process(es) started by {nodeid} still running after it: killed "
             f"({'; '.join(f'{pid} {cmd[:80]}' for pid, cmd in left)})\n")


def _marked(mark: bytes) -> list[tuple[int, str]]:
    """The live processes whose environment holds ``mark``: ``(pid, command line)``."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if mark not in fh.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/stat", "rb") as fh:
                if fh.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue                        # (a zombie: it has ended, its parent not yet told)
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                command = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, IndexError):
            continue
        found.append((int(pid), command))
    return found


def _mpi_world():
    """COMM_WORLD if mpi4py is usable and MPI is running, else None."""
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return None
    return MPI.COMM_WORLD


def _abort_on_failure(report):
    global _aborting
    if _aborting or not report.failed or hasattr(report, "wasxfail"):
        return
    if os.environ.get("MPICOLL_TEST_NO_ABORT", "") not in ("", "0"):
        return
    comm = _mpi_world()
    if comm is None or comm.Get_size() <= 1:
        return
    _aborting = True
    faulthandler.cancel_dump_traceback_later()
    out = _err if _err is not None else sys.__stderr__
    rank, size = comm.Get_rank(), comm.Get_size()
    when = getattr(report, "when", "collect")
    # Leading newline: rank 0's progress line may be unfinished.
    lines = ["", f"mpicoll test failure on rank {rank} of {size}: {report.nodeid}"]
    lines.append(report.longreprtext)
    for title, content in report.sections:
        lines.append(f"----- {title} (rank {rank}) -----")
        lines.append(content.rstrip("\n"))
    lines.append(f"----- end of rank {rank} failure ({when}); aborting MPI job -----")
    try:
        out.write("\n".join(lines) + "\n")
        out.flush()
    except Exception:  # never let reporting prevent the abort
        pass
    _unlink_own_shm()
    comm.Abort(1)


def _unlink_own_shm():
    """An aborted MPICH job leaves its /dev/shm/mpich_shm_* files behind: unlink the ones this
    process maps (the mapping stays valid; the other ranks' are theirs to unlink, or already gone)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            paths = {line.split(None, 5)[5].strip() for line in fh if len(line.split(None, 5)) == 6}
        for path in paths:
            if path.startswith("/dev/shm/mpich_shm_") and not path.endswith(" (deleted)"):
                os.unlink(path)
    except OSError:
        pass


def pytest_runtest_logreport(report):
    _abort_on_failure(report)


def pytest_collectreport(report):
    # A collection error on one rank only would otherwise leave its peers
    # running collectives alone.
    _abort_on_failure(report)


def pytest_terminal_summary(terminalreporter):
    """One line: how many tests were skipped, by reason (most first), so that a run says what it
    did not test and why (e.g. "needs torch", "runs its own mpirun jobs once")."""
    reasons = {}
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = getattr(report, "longrepr", None)
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        reason = re.sub(r"^\S+:\d+: ", "", reason)              # (a docs block's place: one reason for all)
        reason = re.sub(r"^Test requires (\d+) MPI processes.*", r"needs \1+ ranks", reason)   # (pytest-mpi's)
        reasons[reason] = reasons.get(reason, 0) + 1
    if reasons:
        size = _launcher_size() or 1
        terminalreporter.write_line(
            f"skipped at {size} rank(s), by reason: "
            + "; ".join(f"{n} {why}" for why, n in sorted(reasons.items(), key=lambda kv: -kv[1])))
