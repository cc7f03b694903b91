"""Every script in docs/examples runs as the docs say: ``mpirun -np 2`` and ``-np 4``, exit status 0.

The examples assert their own expected values, so a wrong result fails here. Each one is a
subprocess ``mpirun`` with a time limit, launched once, from a pytest world of size 1, as a user types
it (tests/_docs.py: the pages' sample outputs of the same commands are compared with these runs).
"""
from __future__ import annotations

import ast
import configparser
import importlib.metadata
import re
from pathlib import Path

import pytest
from mpi4py import MPI

import mpicoll

from _docs import run

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "docs" / "examples").glob("*.py"))
#: lines an example must print whole, one per line, at ``n`` ranks (lines printed by several ranks at
#: once used to run together: "rank 0: hccl example okrank 3: ..."; the hccl example is the one that
#: had the bug, and the one that prints a line per rank)
LINES = {"hccl": lambda n: [f"rank {r}: hccl example ok" for r in range(n)]}


def _usage(script: Path) -> str:
    """How the example's docstring says to run it."""
    return ast.get_docstring(ast.parse(script.read_text())) or ""


def _only(script: Path) -> int | None:
    """The one rank count the docstring asks for (``mpirun -np 4 ... (4 ranks: a 2 x 2 mesh)``), or
    None (``(any rank count works)``, ``(2 or 4 ranks ...)``)."""
    m = re.search(r"\((\d+) ranks\b", _usage(script))
    return int(m.group(1)) if m else None


def _extras(script: Path) -> list[str]:
    """The optional extras the docstring installs (``pip install ".[torch]"``)."""
    return [e for m in re.finditer(r"pip install \S*\[([\w,-]+)\]", _usage(script)) for e in m.group(1).split(",")]


def _missing(extra: str) -> list[str]:
    """The distributions of setup.cfg's ``extra`` that are not installed here."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    names = re.findall(r"^\s*([A-Za-z0-9_.-]+)", cfg["options.extras_require"][extra], re.MULTILINE)
    return [name for name in names if not _installed(name)]


def _installed(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


pytestmark = [pytest.mark.mpi(min_size=1),
              pytest.mark.skipif(MPI.COMM_WORLD.Get_size() != 1, reason="runs its own mpirun jobs once")]


def test_examples_exist():
    assert EXAMPLES, "no docs/examples/*.py found"


def test_every_operator_has_an_example():
    """Every registered operator is run by some docs/examples script (``XOperation`` named in it)."""
    texts = [p.read_text() for p in EXAMPLES]
    missing = [name for name, cls in mpicoll.OPERATIONS.items()
               if not any(re.search(rf"\b{cls.__name__}\b", t) for t in texts)]
    assert not missing, f"no docs/examples script runs {missing}"


@pytest.mark.parametrize("nprocs", [2, 4])
@pytest.mark.parametrize("script", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(script: Path, nprocs: int):
    for extra in _extras(script):
        if _missing(extra):
            pytest.skip(f"{script.name} needs {', '.join(_missing(extra))}: pip install '.[{extra}]'")
    if _only(script) not in (None, nprocs):
        pytest.skip(f"{script.name} needs {_only(script)} ranks")
    cmd = f"mpirun -np {nprocs} python {script.relative_to(ROOT)}"
    status, out = run((cmd,))[0]
    assert status == 0, f"{cmd}: exit status {status}\n{out}"
    assert out.strip(), f"{cmd}: printed nothing"
    printed = out.splitlines()
    for line in LINES.get(script.stem, lambda n: [])(nprocs):
        assert line in printed, f"{' '.join(cmd)}: no line {line!r} in\n{out}"
