"""Shared helpers for tests run under mpirun."""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from mpi4py import MPI

from mpicoll import _env
# what the outer job's launcher put in the environment (a nested launcher would take it for its own job)
from mpicoll._env import LAUNCHER_PREFIXES

from mpicoll._dtypes import ALL_DTYPES, DTYPES, HALF_FLOATS as _HALF_FLOATS, reduce_ops_for

from conftest import nested_token  # (the harness's: this process's mark on the jobs it launches)

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
#: the MPI in use is Open MPI (its launcher needs flags MPICH's does not; its messages differ)
OPEN_MPI = MPI.Get_library_version().startswith("Open MPI")


# Dtype and reduce-op lists by what a test is about, drawn from the tables (a new dtype or reduce op
# joins every list it belongs to; a hand-kept list would silently miss it).
#: the 16-bit floats (they travel as 16 bits and reduce in float32)
HALF_FLOATS = list(_HALF_FLOATS)
#: every floating dtype
FLOATS = [d for d in ALL_DTYPES if DTYPES[d].floating]
#: the floats MPI reduces itself (float32, float64; mpicoll's tree-order kernels for them too)
NATIVE_FLOATS = [d for d in FLOATS if DTYPES[d].reduce == "native"]
#: every integer dtype (bool is not one)
INTEGERS = [d for d in ALL_DTYPES if DTYPES[d].np.kind in "iu"]
#: the one-byte dtypes (MPI's byte loops, the 8-bit AllToAll path)
BYTES = [d for d in ALL_DTYPES if DTYPES[d].itemsize == 1]
#: one dtype of each way the table moves and reduces data (8-bit and wider integers, each 16-bit
#: float, native floats, bool): the sample a test takes where every dtype would cost too much
SAMPLE = list({(DTYPES[d].reduce, DTYPES[d].floating, DTYPES[d].itemsize == 1, DTYPES[d].np.kind in "iu",
                DTYPES[d].name if DTYPES[d].reduce == "float32" else ""): d for d in reversed(ALL_DTYPES)}.values())[::-1]


def reduce_ops(dtype: str) -> list[str]:
    """Every reduce op that reduces ``dtype`` (the reduce-op table's, AVG for floats only)."""
    return reduce_ops_for(DTYPES[dtype])


def mpirun(np_: int, *args: str, python: str = sys.executable, open_mpi: bool = OPEN_MPI) -> list[str]:
    """The command line of a nested job of ``np_`` ranks, with the launcher flags the MPI in use
    needs here: Open MPI refuses more ranks than cores without ``--map-by :OVERSUBSCRIBE`` and
    refuses root without ``--allow-run-as-root``; MPICH's hydra needs neither. ``python``,
    ``open_mpi``: another environment's interpreter (its ``mpirun`` beside it) and whether its MPI
    is Open MPI."""
    exe = Path(python).with_name("mpirun")
    cmd = [str(exe) if exe.exists() else "mpirun"]
    if open_mpi:
        cmd += ["--map-by", ":OVERSUBSCRIBE"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    return cmd + ["-np", str(np_), *args]


def await_word(stream, word: str, times: int) -> None:
    """Read a job's ``stream`` until ``word`` has appeared ``times`` times. The launcher forwards
    each rank's output as it comes, so two ranks' lines may arrive run together ("runningrunning"
    then a bare newline): count the word, never the lines. Fails if the job ends first."""
    seen = 0
    while seen < times:
        line = stream.readline()
        assert line, f"the job ended after {seen} of {times} '{word}'"
        seen += line.count(word)




def setting(monkeypatch, name: str, value: str | None) -> None:
    """Set (None: unset) the ``MPICOLL_*`` setting ``name`` for this test, as if the job had started
    with it: mpicoll reads each setting once and keeps it (mpicoll._env), so its kept readings are
    forgotten too; both come back after the test. The next communicator mpicoll makes checks it."""
    if value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(_env, "_READ", {})


#: Open MPI's settings that scripts/test chooses (its transports), which a nested job keeps: the other
#: ``OMPI_*`` variables are the outer launcher's
KEPT = ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_MCA_pml", "OMPI_MCA_btl", "OMPI_MCA_osc")


def launch_env(settings: bool = True, **extra: str) -> dict[str, str]:
    """The environment for a nested job (the one helper every test that launches a job uses): this
    one without the outer launcher's variables, the test harness' own (``MPICOLL_TEST_*``), the
    outer job's ``MPIEXEC_TIMEOUT`` and, without ``settings``, mpicoll's settings (``MPICOLL_*``),
    plus ``MPICOLL_TEST_NESTED`` (its processes are killed after the test if still running:
    tests/conftest.py), a flight recorder's dumps in the temporary directory (not the working one)
    and ``extra``."""
    dropped = LAUNCHER_PREFIXES + (("MPICOLL_TEST", "MPIEXEC_TIMEOUT") if settings else ("MPICOLL_", "MPIEXEC_TIMEOUT"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped) or k.startswith(KEPT)}
    env["MPICOLL_TEST_NESTED"] = nested_token()
    env.setdefault("MPICOLL_DUMP_DIR", os.path.join(tempfile.gettempdir(), "mpicoll-test-flight"))
    env.update(extra)
    return env


#: how much slower than a quiet machine this one is (``MPICOLL_TEST_SLOWDOWN``: scripts/test measures
#: the machine's other load before each rank count); the bounds of the tests scale with it
SLOWDOWN = float(os.environ.get("MPICOLL_TEST_SLOWDOWN") or 1)


def within(seconds: float) -> float:
    """A time bound of a test (a job that must end at once, a limit for a nested job) on this
    machine: ``seconds`` on a quiet one, times ``MPICOLL_TEST_SLOWDOWN``."""
    return seconds * SLOWDOWN


def run_job(tmp_path, body: str, np_: int = 3, env: dict | None = None, timeout: float = 60):
    """Run ``body`` as a script under ``mpirun -np np_ python -m mpi4py``, with no ``MPICOLL_*``
    setting but ``env`` (and a flight recorder's dumps in ``tmp_path``, not the working directory);
    returns (result, seconds, the shared-memory files it left behind)."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(body))
    clean = launch_env(settings=False, **{"MPICOLL_DUMP_DIR": str(tmp_path / "flight"), **(env or {})})
    before = set(glob.glob("/dev/shm/mpich_shm_*"))
    t0 = time.monotonic()
    try:
        res = subprocess.run(mpirun(np_, sys.executable, "-m", "mpi4py", str(script)),
                             capture_output=True, text=True, timeout=within(timeout), env=clean)
    except subprocess.TimeoutExpired as exc:
        said = "".join(x.decode(errors="replace") if isinstance(x, bytes) else x or "" for x in (exc.stdout, exc.stderr))
        raise AssertionError(f"the job did not end within {within(timeout):g} s (its limit, {timeout:g} s x "
                             f"MPICOLL_TEST_SLOWDOWN={SLOWDOWN:g}: raise that to allow more)\n{said[-3000:]}") from None
    seconds = time.monotonic() - t0
    return res, seconds, left_behind(before)


def left_behind(before: set[str]) -> list[str]:
    """The MPICH shared-memory files that appeared since ``before`` (a ``glob`` of them) and that no
    live process uses: what an ended job left. Its killed ranks' mappings go a moment after the job
    ends: asked again for up to half a second while any is seen."""
    from mpicoll._watchdog import stale_segments
    deadline = time.monotonic() + 0.5
    while True:
        left = stale_segments(set(glob.glob("/dev/shm/mpich_shm_*")) - before)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)


def said(tmp_path, body: str, np_: int, env: dict | None = None, timeout: float = 60) -> list[str]:
    """Run ``body`` as a fresh job (:func:`run_job`); what each rank said with ``say(text)``, as
    "rank R: text" lines, sorted (rank 0 prints them all: ranks' output would interleave mid-line).
    The job must succeed."""
    prologue = "from mpi4py import MPI as _MPI\n_said = []\nsay = _said.append\n"
    epilogue = ("\nfor _r, _texts in enumerate(_MPI.COMM_WORLD.gather(_said) or []):\n"
                "    for _t in _texts:\n        print(f'rank {_r}: {_t}')\n")
    res, _, left = run_job(tmp_path, prologue + textwrap.dedent(body) + epilogue, np_=np_, env=env, timeout=timeout)
    remove(left)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return sorted(line for line in res.stdout.splitlines() if line.startswith("rank "))


def remove(paths) -> None:
    for p in paths:
        try:
            os.unlink(p)
        except OSError:
            pass


def raises_everywhere(fn, cls, *fragments):
    """Run ``fn`` on every rank; every rank must raise ``cls`` with the same message containing
    every fragment. Returns the message."""
    return raises_on(WORLD, fn, cls, *fragments)


def raises_on(comm, fn, cls, *fragments):
    """Like :func:`raises_everywhere` over ``comm`` (a sub-communicator). Every rank must raise
    the same class with the same message and the same ``op``, ``param`` and ``rank`` attributes."""
    with pytest.raises(cls) as info:
        fn()
    exc = info.value
    message = str(exc)
    seen = comm.allgather((type(exc).__name__, message, getattr(exc, "op", None), getattr(exc, "param", None),
                           getattr(exc, "rank", None)))
    assert len(set(seen)) == 1, f"ranks raised different errors: {seen}"
    for f in fragments:
        assert f in message, f"{f!r} not in {message!r}"
    return message


def agreed(fn, comm=WORLD):
    """Run ``fn`` on every rank of ``comm``; if it fails on any rank, every rank raises the same
    AssertionError naming the failing ranks. Used inside hypothesis properties, so that every rank
    sees the same verdict for every example and shrinks in lockstep (a property failing on one
    rank alone would make that rank shrink alone, its collectives never joined: a hang)."""
    try:
        fn()
        mine = None
    except Exception as exc:  # noqa: BLE001 - reported on every rank below
        mine = f"{type(exc).__name__}: {exc}"
    everyone = comm.allgather(mine)
    failed = {r: e for r, e in enumerate(everyone) if e is not None}
    if failed:
        raise AssertionError("failed on " + "; ".join(f"rank {r}: {e}"[:2000] for r, e in failed.items()))


def on(ranks) -> str:
    """How an error names the ranks that broke one rule alike: ``on rank 2``, ``on ranks [0, 1, 2]``."""
    ranks = list(ranks)
    return f"on rank {ranks[0]}" if len(ranks) == 1 else f"on ranks {ranks}"


def digest_job(python: str, np_: int = 4) -> dict:
    """tests/multihost/digest.py (the bits of float reductions) as a job of ``np_`` ranks under the
    MPI of ``python``'s environment, which imports this tree's mpicoll; its JSON line."""
    import json
    root = Path(__file__).resolve().parent.parent
    version = subprocess.run([str(Path(python).with_name("mpirun")), "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    env = launch_env(settings=False, PYTHONPATH=str(root), OMPI_MCA_osc="^ucx")
    proc = subprocess.run(mpirun(np_, python, str(root / "tests" / "multihost" / "digest.py"), python=python,
                                 open_mpi="Open MPI" in version), capture_output=True, text=True, timeout=within(240),
                          env=env, cwd=root)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])

