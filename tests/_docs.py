"""The sample outputs of the docs: a fenced block (no language, or ``text``/``console``) whose first
line is ``$ COMMAND`` shows what COMMAND prints; tests/test_docs_outputs.py runs each command and
compares, so the docs show what the commands print today. A block may hold several commands, each
``$`` line followed by what it prints. (What a ```python block of a page prints, shown right after it
as ``$ mpirun -np N python -m mpi4py example.py``, is compared by tests/test_docs_snippets.py, in the
job that runs the block.)

How a sample is compared with the output (stdout and stderr together, as on a terminal):

* a line ``...`` stands for any number of lines (none included); without one at its start (end),
  the sample starts (ends) where the output does;
* ``...`` inside a line stands for any text (a path, a version: what differs between machines);
* blanks at the end of lines are ignored;
* an HTML comment directly above the fence, ``<!-- output: timings vary -->``, says that the
  command prints measured times: every decimal number (``0.02``) matches any decimal number.

Commands run under ``bash`` from a folder of their own that holds the repository's ``docs``,
``scripts``, ``benchmarks`` and ``tests`` (a command's files land there, not in the repository),
with this Python first on ``PATH``, no ``MPICOLL_*`` setting, and ``mpirun`` given the flags the MPI
in use needs (Open MPI: ``--map-by :OVERSUBSCRIBE``, and ``--allow-run-as-root`` as root). Each
distinct command runs once per session (tests/test_docs_examples.py shares the runs of
docs/examples).
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from _mpi import OPEN_MPI, launch_env, within

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\w*)\s*$")
_DIRECTIVE = re.compile(r"^<!--\s*output:\s*(.*?)\s*-->$")
MASKS = {"timings vary": re.compile(r"\d+\.\d+")}
#: seconds a command may take on a quiet machine (times MPICOLL_TEST_SLOWDOWN)
COMMAND_TIMEOUT = 120


@dataclass
class Sample:
    page: str                   # relative to the repository
    line: int                   # the line of its ``$`` (1-based)
    command: str
    expected: list[str] = field(default_factory=list)
    masks: tuple[str, ...] = ()
    block: tuple[str, ...] = ()  # the commands of its block, run one after the other in one shell
    index: int = 0              # its place among them

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def samples(pages=PAGES) -> list[Sample]:
    """Every sample output of the pages, in order."""
    found = []
    for path in pages:
        lines = path.read_text().splitlines()
        page = str(path.relative_to(ROOT))
        i = 0
        while i < len(lines):
            m = _FENCE.match(lines[i].strip())
            if not m:
                i += 1
                continue
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            body = lines[i + 1:j]
            shows_block = bool(body) and re.fullmatch(r"\$ mpirun -np \d+ python -m mpi4py example\.py", body[0].strip())
            if m.group(1) in ("", "text", "console") and body and body[0].startswith("$ ") and not shows_block:
                above = _DIRECTIVE.match(lines[i - 1].strip()) if i else None
                masks = tuple(w.strip() for w in above.group(1).split(",")) if above else ()
                for word in masks:
                    if word not in MASKS:
                        raise ValueError(f"{page}:{i}: unknown output directive {word!r} (known: {', '.join(MASKS)})")
                mine = []
                for k, text in enumerate(body):
                    if text.startswith("$ "):
                        mine.append(Sample(page, i + 2 + k, text[2:].strip(), [], masks))
                    else:
                        mine[-1].expected.append(text)
                block = tuple(s.command for s in mine)
                for k, s in enumerate(mine):
                    s.block, s.index = block, k
                found += mine
            i = j + 1
    return found


def _pattern(line: str, masks: tuple[str, ...]):
    """A sample line as a regular expression: ``...`` any text, a masked field any such field."""
    masked = re.compile("|".join(f"(?:{MASKS[w].pattern})" for w in masks)) if masks else None
    parts = []
    for piece in re.split(r"(\.\.\.)", line.rstrip()):
        if piece == "...":
            parts.append(".*?")
            continue
        at = 0
        for m in (masked.finditer(piece) if masked else ()):
            parts += [re.escape(piece[at:m.start()]), f"(?:{masked.pattern})"]
            at = m.end()
        parts.append(re.escape(piece[at:]))
    return re.compile("".join(parts) + r"\Z")


def matches(sample: Sample, output: str) -> bool:
    """Whether ``output`` is what ``sample`` shows (the rules in the module docstring)."""
    got = [ln.rstrip() for ln in output.rstrip("\n").split("\n")] if output.strip() else []
    want = list(sample.expected)
    while want and not want[-1].strip():
        want.pop()
    patterns = [None if w.strip() == "..." else _pattern(w, sample.masks) for w in want]
    return _match(patterns, got, 0, 0)


def _match(patterns: list, got: list[str], p: int, g: int) -> bool:
    while p < len(patterns):
        if patterns[p] is None:                       # "...": any number of lines
            return any(_match(patterns, got, p + 1, k) for k in range(g, len(got) + 1))
        if g >= len(got) or not patterns[p].match(got[g]):
            return False
        p, g = p + 1, g + 1
    return g == len(got)


_RUNS: dict[tuple[str, ...], list[tuple[int | str, str]]] = {}
_HOME: list[Path] = []
_MARK = "@@mpicoll-docs-command-ended@@"


def home() -> Path:
    """The folder commands run from: links to the repository's folders a command names."""
    if not _HOME:
        home = Path(tempfile.mkdtemp(prefix="mpicoll-docs-"))
        for name in ("docs", "scripts", "benchmarks", "tests"):
            (home / name).symlink_to(ROOT / name)
        _HOME.append(home)
    return _HOME[0]


def run(block: tuple[str, ...]) -> list[tuple[int | str, str]]:
    """For each command of ``block``, run one after the other in one shell as a user types them (the
    module docstring says where and how): ``(exit status, or "timed out after N s"; stdout and
    stderr together)``. Each block runs once per session."""
    if block not in _RUNS:
        flags = "--map-by :OVERSUBSCRIBE" + (" --allow-run-as-root" if os.geteuid() == 0 else "") if OPEN_MPI else ""
        script = f'mpirun() {{ command mpirun {flags} "$@"; }}\nexec 2>&1\n'
        for command in block:          # (each followed by its status and a mark; $? is the command's again)
            script += f'{command}\n__status=$?; echo "{_MARK} $__status"; ( exit $__status )\n'
        env = launch_env(settings=False)
        del env["MPICOLL_DUMP_DIR"]    # (a user's default: mpicoll-flight in the working directory, here the home)
        env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", PYTHONUNBUFFERED="1",
                   COLUMNS="80", PYTHONPATH=str(ROOT))
        # A session of its own, so that a hung command can be killed whole (mpirun and its ranks).
        proc = subprocess.Popen(["bash", "-c", script], cwd=home(), env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        limit = within(COMMAND_TIMEOUT * len(block))
        try:
            out, _ = proc.communicate(timeout=limit)
            late = None
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            late = (f"timed out after {limit:g} s ({COMMAND_TIMEOUT} s a command x MPICOLL_TEST_SLOWDOWN: raise "
                    "that to allow more)")
        statuses = re.findall(rf"(?m)^{_MARK} (\d+)$", out)
        pieces = re.split(rf"(?m)^{_MARK} \d+\n", out)
        _RUNS[block] = [(late or (int(statuses[k]) if k < len(statuses) else "did not run"),
                         pieces[k] if k < len(pieces) else "") for k in range(len(block))]
    return _RUNS[block]
