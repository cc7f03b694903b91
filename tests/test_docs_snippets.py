"""Every ```python block of README.md and docs/*.md runs as a script under ``mpirun``, or is skipped
with a reason written next to it in the page.

A block runs as it stands, under ``mpirun -np 2 python -m mpi4py``, in a namespace of its own. An
HTML comment directly above its fence (invisible on the rendered page) can say more:

    <!-- snippet: skip (a signature, not code) -->    not run; pytest reports the reason (-rs)
    <!-- snippet: np=4 -->                           run under mpirun -np 4 instead of 2
    <!-- snippet: needs torch -->                    skipped, with the reason, where torch is not installed
    <!-- snippet: setup
    import numpy as np                               lines run first, in the block's namespace
    x = np.ones(4, np.float32)                       (for a fragment: its inputs, imports, helpers)
    -->

Several such comments may stand one above the other.

What a block prints is shown by an output block right after it, whose first line is the command that
runs it (``$ mpirun -np 2 python -m mpi4py example.py``, the block saved as example.py: its rank count
is the block's); the lines every rank printed are compared with the lines shown, in any order (the
ranks' lines reach a terminal in any order), ``...`` inside a line standing for any text. Every block
that runs on its own (no setup, not skipped) says on its first line how many ranks it needs (``#
mpirun -np N ...``, or ``# any rank count``) and prints what shows it worked.

A reader sees the block, not the setup, so every block either runs as pasted (its own imports and
inputs; an example's first line shows its launch: ``# mpirun -np 2 python -m mpi4py example.py``) or
is a fragment of an earlier example that says so: a block with a setup must start with a visible line
``# continues from <which example>: <the names it uses>`` (``# continues from the AllGather example:
np, rank, n``), and the setup holds what that example defines. A block with a setup that does not
start so fails, naming the page and line.

A block written as a doctest (``>>>``, after the ``# continues from`` line of a fragment) runs as a
doctest, its printed results compared. The blocks of one page at one rank count run in one job, one
after the other, from a temporary folder; each test below is one block, and its id names the page
and the line of its fence. A failure is reported with the traceback, whose file and line numbers are
those of the page. After a block fails, the page's later blocks of that job are reported as not run.

The file is also the runner inside each job: ``python -m mpi4py tests/test_docs_snippets.py PAGE
NP RESULTS``.
"""
from __future__ import annotations

import contextlib
import doctest
import io
import os
import re
import signal
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DEFAULT_NP = 2
JOB_TIMEOUT = 60
_DIRECTIVE = re.compile(r"<!--\s*snippet:\s*(\w+)\s*(.*)$")
CONTINUES = "# continues from"        # the visible first line of a block with a hidden setup


@dataclass
class Snippet:
    page: str                  # relative to the repository: "docs/hccl.md"
    line: int                  # the line of its ```python fence (1-based)
    code: str
    np: int = DEFAULT_NP
    skip: str = ""             # the reason, if skipped
    needs: str = ""            # a module it imports that an optional extra brings
    setup: str = ""
    setup_line: int = 0        # the page's line of the setup's first line
    output: list[str] | None = None   # what every rank prints, all ranks' lines (the output block after it)
    output_line: int = 0              # the line of that block's ``$`` line

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    def unannounced_setup(self) -> str:
        """Why the block breaks the rule for a hidden setup, or "" if it keeps it: a reader sees
        the block but not its setup, so the block's first line says what it continues from."""
        if not self.setup:
            return ""
        first = self.code.split("\n", 1)[0]
        if first.startswith(CONTINUES):
            return ""
        return (f"{self.page}:{self.line + 1}: this block runs after a hidden setup "
                f"({self.page}:{self.setup_line - 1}), so pasted alone it fails; its first line must say what it "
                f"continues from, '{CONTINUES} <which example>: <the names it uses>' (found {first!r}), "
                "or make it run as pasted: its setup in the block, the setup comment gone")


def parse(path: Path) -> list[Snippet]:
    """The ```python blocks of a page, with the snippet comments directly above each. Raises
    ValueError for a snippet comment that is malformed or stands above no ```python block."""
    page = str(path.relative_to(ROOT))
    lines = path.read_text().splitlines()
    found, pending = [], []            # pending: the directives waiting for their block
    i = 0
    while i < len(lines):
        text = lines[i].strip()
        m = _DIRECTIVE.match(text)
        if m:
            start = i
            rest = m.group(2)
            if rest.endswith("-->"):
                body = []
                rest = rest[:-3].strip()
            else:                       # a multi-line comment: its lines up to the one holding -->
                j = i + 1
                while j < len(lines) and lines[j].strip() != "-->":
                    j += 1
                if j == len(lines):
                    raise ValueError(f"{page}:{start + 1}: snippet comment without a closing '-->' line")
                body, i = lines[i + 1:j], j
            pending.append((start + 1, m.group(1), rest.strip(), body))
            i += 1
            continue
        if text == "```python":
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            snip = Snippet(page, i + 1, "\n".join(lines[i + 1:j]))
            for where, word, rest, body in pending:
                if word == "skip":
                    if not (rest.startswith("(") and rest.endswith(")") and len(rest) > 2):
                        raise ValueError(f"{page}:{where}: write 'snippet: skip (reason)'")
                    snip.skip = rest[1:-1]
                elif word == "setup" and not rest:
                    snip.setup, snip.setup_line = "\n".join(body), where + 1
                elif word == "needs" and re.fullmatch(r"[A-Za-z_][\w.]*", rest):
                    snip.needs = rest
                elif word == "np" and re.fullmatch(r"=\s*[1-9]\d*", rest):
                    snip.np = int(rest[1:])
                else:
                    raise ValueError(f"{page}:{where}: unknown snippet comment {word!r} {rest!r} "
                                     "(skip (reason), np=N, needs MODULE, setup)")
            pending = []
            found.append(snip)
            i = j + 1
            k = i
            while k < len(lines) and not lines[k].strip():
                k += 1
            shown = re.match(r"\$ mpirun -np (\d+) python -m mpi4py example\.py$", lines[k + 1].strip()) \
                if k + 1 < len(lines) and lines[k].strip() == "```" else None
            if shown:
                if int(shown.group(1)) != snip.np:
                    raise ValueError(f"{page}:{k + 2}: the output is shown for {shown.group(1)} ranks, the block runs "
                                     f"at {snip.np} (its snippet comment: np={shown.group(1)})")
                end = k + 2
                while end < len(lines) and lines[end].strip() != "```":
                    end += 1
                snip.output, snip.output_line = lines[k + 2:end], k + 2
                i = end + 1
            continue
        if pending and text:
            where = pending[0][0]
            raise ValueError(f"{page}:{where}: a snippet comment must stand directly above a ```python block")
        i += 1
    if pending:
        raise ValueError(f"{page}:{pending[0][0]}: a snippet comment with no ```python block after it")
    return found


# ----------------------------------------------------------------------------- inside a job

def _compiled(code: str, page: str, first_line: int):
    """``code`` compiled so that tracebacks name the page and its own line numbers."""
    return compile("\n" * (first_line - 1) + code, page, "exec")


def _is_doctest(code: str) -> bool:
    """A block written as a doctest: its first line, after a ``# continues from`` line, is ``>>>``."""
    lines = code.lstrip().split("\n", 1)
    if lines[0].startswith(CONTINUES):
        lines = lines[1:]
    return bool(lines) and lines[0].lstrip().startswith(">>>")


def untold(snip: Snippet) -> str:
    """Why a block that runs on its own breaks the rule for examples (says its ranks on its first line,
    prints what shows it worked), or ""."""
    if snip.skip or snip.setup or snip.code.lstrip().startswith(CONTINUES) or _is_doctest(snip.code):
        return ""                       # (a doctest shows what it prints; it runs at any rank count)
    first = snip.code.strip().split("\n", 1)[0]
    problems = []
    said = re.match(r"#.*(mpirun -np (\d+) |any rank count)", first)
    if not said:
        problems.append(f"its first line does not say how many ranks it needs ('# mpirun -np {snip.np} python -m "
                        "mpi4py example.py', or '# any rank count'): found " + repr(first[:60]))
    elif said.group(2) and int(said.group(2)) != snip.np:
        problems.append(f"its first line says {said.group(2)} ranks, but it is run at {snip.np} (a snippet comment "
                        f"np={said.group(2)} above it runs it so)")
    if "print(" not in snip.code and not _is_doctest(snip.code):
        problems.append("it prints nothing that shows it worked")
    return f"{snip.page}:{snip.line + 1}: " + "; ".join(problems) if problems else ""


def _run_one(snip: Snippet) -> None:
    ns = {"__name__": "__main__"}
    if snip.setup:
        exec(_compiled(snip.setup, snip.page, snip.setup_line), ns)  # noqa: S102 - the page's own code
    if _is_doctest(snip.code):
        test = doctest.DocTestParser().get_doctest(snip.code, ns, snip.id, snip.page, snip.line)
        report: list[str] = []
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
        result = runner.run(test, out=report.append)
        if result.failed:
            raise AssertionError("doctest failed:\n" + "".join(report))
    else:
        exec(_compiled(snip.code, snip.page, snip.line + 1), ns)  # noqa: S102 - the page's own code


def _importable(module: str) -> bool:
    import importlib.util
    try:
        return not module or importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:          # (a dotted name whose package is missing)
        return False


def run_page(page: str, np_: int, results: Path) -> None:
    """Run the page's blocks for ``np_`` ranks, in order; rank 0 appends ``ok LINE`` to
    ``results/done`` after each block has passed on every rank. A failing rank writes the
    traceback to ``results/failed.RANK`` and raises (``python -m mpi4py`` then ends the job)."""
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    for snip in parse(ROOT / page):
        if snip.skip or snip.np != np_ or not _importable(snip.needs):
            continue
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                _run_one(snip)
        except BaseException:
            (results / f"failed.{rank}").write_text(f"{snip.line}\n{traceback.format_exc()}")
            raise
        every = world.gather(printed.getvalue())   # (every rank is done with this block before it counts)
        if rank == 0:
            (results / f"out.{snip.line}").write_text("".join(every))
            with open(results / "done", "a") as f:
                f.write(f"ok {snip.line}\n")


if __name__ == "__main__":
    run_page(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))
    sys.exit(0)


# ----------------------------------------------------------------------------- the tests

import pytest  # noqa: E402 - the runner above does without it
from mpi4py import MPI  # noqa: E402

from _mpi import launch_env, mpirun  # noqa: E402

pytestmark = [pytest.mark.mpi(min_size=1),
              pytest.mark.skipif(MPI.COMM_WORLD.Get_size() != 1, reason="runs its own mpirun jobs once")]

SNIPPETS = [s for p in PAGES for s in parse(p)]
_JOBS: dict[tuple[str, int], dict] = {}


def _job(page: str, np_: int, tmp_path_factory) -> dict:
    """The result of the page's job at ``np_`` ranks (run once): the lines that passed, the failure
    (line, traceback) if any, and the job's command, status and output."""
    key = (page, np_)
    if key not in _JOBS:
        work = tmp_path_factory.mktemp(re.sub(r"\W", "_", f"{page}_np{np_}"))
        cmd = mpirun(np_, sys.executable, "-m", "mpi4py", str(Path(__file__).resolve()), page, str(np_), str(work))
        # A session of its own, so that a hung job can be killed whole (mpirun and its ranks).
        proc = subprocess.Popen(cmd, cwd=work, env=launch_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=JOB_TIMEOUT)
            status = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            status = f"timed out after {JOB_TIMEOUT} s"
        done = work / "done"
        passed = {int(t.split()[1]) for t in done.read_text().splitlines()} if done.exists() else set()
        failed = None
        for f in sorted(work.glob("failed.*")):
            line, _, tb = f.read_text().partition("\n")
            failed = failed or (int(line), f"rank {f.suffix[1:]}: {tb}")
        printed = {int(f.suffix[1:]): f.read_text() for f in work.glob("out.*")}
        _JOBS[key] = dict(cmd=" ".join(cmd), status=status, out=out, err=err, passed=passed, failed=failed,
                          printed=printed)
    return _JOBS[key]


def test_snippets_found():
    assert len(SNIPPETS) >= 40, f"only {len(SNIPPETS)} ```python blocks found in README.md and docs/*.md"


def test_continues_rule():
    """The rule for a hidden setup, on blocks made up here: the page and line are named."""
    plain = Snippet("docs/x.md", 10, "print(1)")
    assert plain.unannounced_setup() == ""
    fragment = Snippet("docs/x.md", 10, "y = x + 1", setup="x = 1", setup_line=8)
    assert fragment.unannounced_setup().startswith("docs/x.md:11: ")
    assert "'y = x + 1'" in fragment.unannounced_setup()
    announced = Snippet("docs/x.md", 10, "# continues from the first example: x\ny = x + 1", setup="x = 1",
                        setup_line=8)
    assert announced.unannounced_setup() == ""
    assert _is_doctest("# continues from the first example: x\n>>> x\n1") and not _is_doctest("# x\n>>> x")


@pytest.mark.parametrize("snip", SNIPPETS, ids=[s.id for s in SNIPPETS])
def test_snippet(snip: Snippet, tmp_path_factory):
    if snip.unannounced_setup():
        pytest.fail(snip.unannounced_setup(), pytrace=False)
    if snip.skip:
        pytest.skip(f"{snip.id}: {snip.skip}")
    if not _importable(snip.needs):
        pytest.skip(f"{snip.id}: needs {snip.needs}, which is not installed (an optional extra)")
    job = _job(snip.page, snip.np, tmp_path_factory)
    if snip.line in job["passed"]:
        if untold(snip):
            pytest.fail(untold(snip), pytrace=False)
        if snip.output is not None:
            got = sorted(ln.rstrip() for ln in job["printed"].get(snip.line, "").splitlines())
            want = sorted(ln.rstrip() for ln in snip.output if ln.strip())
            if len(got) != len(want) or not all(re.fullmatch(".*?".join(map(re.escape, w.split("..."))), g)
                                                for w, g in zip(want, got)):
                pytest.fail(f"{snip.page}:{snip.output_line}: the output shown is not what the block above prints at "
                            f"{snip.np} ranks (every rank's lines, in any order).\n--- the page shows:\n" +
                            "\n".join(snip.output) + "\n--- the block printed:\n" +
                            job["printed"].get(snip.line, ""), pytrace=False)
        return
    where = f"{snip.id} (mpirun -np {snip.np})"
    if job["failed"] and job["failed"][0] == snip.line:
        pytest.fail(f"{where} failed on {job['failed'][1]}\njob stderr (tail):\n{job['err'][-1500:]}", pytrace=False)
    if job["failed"]:
        pytest.fail(f"{where} not run: {snip.page}:{job['failed'][0]} failed before it", pytrace=False)
    pytest.fail(f"{where} not run: {job['cmd']}: exit status {job['status']}\nstdout:\n{job['out'][-3000:]}\n"
                f"stderr:\n{job['err'][-3000:]}", pytrace=False)
