"""torch's own distributed test suite (``DistributedTest._DistTestBase`` of the installed torch) on
the mpicoll backend at 3 ranks, one MPI rank per torch rank (tests/torch_suite.py, which lists the
tests that do not apply and why): every test that torch runs for gloo on CPU passes. Skipped, with
the reason, where torch or expecttest (torch's testing helpers import it) is not installed."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: pip install '.[torch]' (torch 2.13 or later, CPU)")
pytest.importorskip("expecttest", reason="torch's testing helpers need expecttest: pip install expecttest")

from _mpi import SIZE, launch_env, mpirun  # noqa: E402

pytestmark = [pytest.mark.mpi(min_size=1), pytest.mark.skipif(SIZE != 1, reason="runs its own mpirun job once")]
SUITE = Path(__file__).resolve().parent / "torch_suite.py"


@pytest.mark.timeout_s(900)
def test_torch_own_suite_at_three_ranks():
    env = launch_env(settings=False)
    res = subprocess.run(mpirun(3, sys.executable, "-m", "mpi4py", str(SUITE)), capture_output=True, text=True,
                         timeout=840, env=env)
    summary = [ln for ln in res.stdout.splitlines() if ln.startswith("mpicoll, 3 ranks:")]
    failed = [ln for ln in res.stdout.splitlines() if ln.startswith("FAIL ")]
    assert res.returncode == 0 and summary, "\n".join(failed) or res.stdout[-3000:] + res.stderr[-3000:]
    passed = int(re.search(r"(\d+) passed", summary[0]).group(1))
    gloo_passes = 90                                 # (tests/torch_suite.py --backend gloo, torch 2.13 and 2.14)
    assert passed >= gloo_passes, summary[0]         # (every one gloo passes: none may be lost to a skip)
