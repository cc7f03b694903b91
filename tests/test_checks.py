"""The checks package (mpicoll/checks/): every operator has its checks module, apart from the
operator; ``import mpicoll`` does not load it; its goldens use the library's dtype table and the
operators' public names only, never the code they check."""
from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import mpicoll
import mpicoll.checks
from mpicoll.checks import BENCHES, CHECKS

from _mpi import SIZE, launch_env, mpirun

pytestmark = pytest.mark.mpi(min_size=1)
#: pure facts about the package (no MPI traffic): checked once, in the 1-rank run
once = pytest.mark.skipif(SIZE != 1, reason="facts about the package: checked once, at 1 rank")

PACKAGE = Path(mpicoll.checks.__file__).parent
MODULES = [m.name for m in pkgutil.iter_modules([str(PACKAGE)]) if not m.name.startswith("_")]
#: what a checks module may take from the library besides its operator module's public names: the
#: dtype table, the settings (MPICOLL_EXACT decides whether a float golden is bit for bit)
SHARED = {"mpicoll._dtypes", "mpicoll._env"}


@once
def test_import_mpicoll_loads_no_checks():
    """A fresh ``import mpicoll`` imports no module of mpicoll.checks (goldens, cases, bench specs)."""
    code = "import sys, mpicoll; print(sorted(m for m in sys.modules if m.startswith('mpicoll.checks')))"
    res = subprocess.run(mpirun(1, sys.executable, "-c", code), capture_output=True, text=True, timeout=60,
                         env=launch_env())
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "[]", res.stdout


@once
def test_every_operator_has_checks_and_every_spec_an_operator():
    """Every registered operator has a check spec; every benchmark spec is an operator's; every
    check spec is an operator's or a task kind of the Hccl client (``Hccl.<operator>``)."""
    assert not sorted(set(mpicoll.OPERATIONS) - set(CHECKS)), "operators without a check spec"
    assert not sorted(set(BENCHES) - set(mpicoll.OPERATIONS)), "bench specs of no operator"
    others = [n for n in CHECKS if n not in mpicoll.OPERATIONS]
    assert all(n.startswith("Hccl.") and n.removeprefix("Hccl.") in mpicoll.OPERATIONS for n in others), others


@once
@pytest.mark.parametrize("name", MODULES)
def test_each_checks_module_mirrors_a_library_module(name):
    """checks/<name>.py checks ops/<name>.py or <name>.py (the Hccl client), and declares its specs."""
    assert (PACKAGE.parent / "ops" / f"{name}.py").exists() or (PACKAGE.parent / f"{name}.py").exists(), name
    module = importlib.import_module(f"mpicoll.checks.{name}")
    assert isinstance(module.CHECKS, tuple) and isinstance(module.BENCHES, tuple), name
    assert module.CHECKS or module.BENCHES, f"checks/{name}.py declares no spec"
    assert all(CHECKS[s.name] is s for s in module.CHECKS) and all(BENCHES[s.name] is s for s in module.BENCHES)


@once
@pytest.mark.parametrize("name", MODULES)
def test_goldens_take_only_public_names_from_the_library(name):
    """A checks module imports from the library only the dtype table, the settings, and its
    operator module's public names and constants: a golden never calls the code it checks (the
    kernels, the algorithms, an operator's private helpers)."""
    tree = ast.parse((PACKAGE / f"{name}.py").read_text())
    own = f"mpicoll.ops.{name}" if (PACKAGE.parent / "ops" / f"{name}.py").exists() else f"mpicoll.{name}"
    public = set(importlib.import_module(own).__all__)
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bad += [a.name for a in node.names if a.name.startswith("mpicoll")]
        elif isinstance(node, ast.ImportFrom) and node.level:
            base = "mpicoll.checks" if node.level == 1 else "mpicoll"
            where = ".".join(p for p in (base, node.module) if p)
            if where.startswith("mpicoll.checks"):
                continue
            if where == own:
                bad += [f"{where}.{a.name}" for a in node.names if a.name not in public and not a.name.isupper()]
            elif where == "mpicoll":
                bad += [f"mpicoll.{a.name}" for a in node.names if f"mpicoll.{a.name}" not in SHARED]
            elif where not in SHARED:
                bad.append(where)
    assert not bad, f"checks/{name}.py imports {bad}"

