"""Every script in docs/examples runs as the docs say: ``mpirun -np 2`` and ``-np 4``, exit status 0.

The examples assert their own expected values, so a wrong result fails here. Each one is a
subprocess ``mpirun`` with a time limit, launched once, from a pytest world of size 1.
"""
from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from mpi4py import MPI

from _mpi import launch_env, mpirun

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "docs" / "examples").glob("*.py"))
#: examples that need a given rank count (the fused MoE layer: a 2 x 2 mesh)
ONLY = {"fused": 4}
#: examples that need an optional extra: skipped, with the reason, where it is not installed
NEEDS = {"torch_ddp": "torch"}
#: lines an example must print whole, one per line, at ``n`` ranks (lines printed by several ranks at
#: once used to run together: "rank 0: hccl example okrank 3: ...")
LINES = {"hccl": lambda n: [f"rank {r}: hccl example ok" for r in range(n)]}

pytestmark = [pytest.mark.mpi(min_size=1),
              pytest.mark.skipif(MPI.COMM_WORLD.Get_size() != 1, reason="runs its own mpirun jobs once")]


def test_examples_exist():
    assert EXAMPLES, "no docs/examples/*.py found"


@pytest.mark.parametrize("nprocs", [2, 4])
@pytest.mark.parametrize("script", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(script: Path, nprocs: int):
    extra = NEEDS.get(script.stem)
    if extra and importlib.util.find_spec(extra) is None:
        pytest.skip(f"{script.name} needs {extra}: pip install '.[{extra}]'")
    if ONLY.get(script.stem, nprocs) != nprocs:
        pytest.skip(f"{script.name} needs {ONLY[script.stem]} ranks")
    cmd = mpirun(nprocs, sys.executable, str(script.relative_to(ROOT)))
    # A session of its own, so that a hung job can be killed whole (mpirun and its ranks).
    proc = subprocess.Popen(cmd, cwd=ROOT, env=launch_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd)}: timed out after 60 s\nstdout:\n{out}\nstderr:\n{err}")
    assert proc.returncode == 0, f"{' '.join(cmd)}: exit status {proc.returncode}\n{out}\n{err}"
    assert out.strip(), f"{' '.join(cmd)}: printed nothing"
    printed = out.splitlines()
    for line in LINES.get(script.stem, lambda n: [])(nprocs):
        assert line in printed, f"{' '.join(cmd)}: no line {line!r} in\n{out}"
