"""The ``MPICOLL_*`` settings (mpicoll/_env.py, THE table): the spellings each accepts, read once,
and a value mpicoll cannot read raised as the same named error on every rank, including when
only one rank has it, from the first communicator on (fresh jobs), leaving nothing in /dev/shm."""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

import mpicoll
from mpicoll import CollectiveArgumentError, CollectiveError
from mpicoll import _env
from mpicoll._domains import user_comm

from _mpi import RANK, SIZE, WORLD, raises_everywhere, run_job, setting, within

mpi1 = pytest.mark.mpi(min_size=1)
mpi2 = pytest.mark.mpi(min_size=2)
ONE_JOB = pytest.mark.skipif(SIZE != 1, reason="runs its own mpirun job once")
ONCE = pytest.mark.skipif(SIZE != 1, reason="pure function: check it once")
ROOT = Path(__file__).resolve().parent.parent

#: values a setting of each kind refuses
BAD = {_env.FLAG: ("maybe", "2", "of"), _env.SECONDS: ("-5", "inf", "nan", "abc"), _env.CHOICE: ("explode",),
       _env.TEXT: (), _env.COUNT: ("-1", "2.5", "many")}
REFUSED = [(name, v) for name, s in _env.SETTINGS.items() for v in BAD[s.kind]]


def _on_a_fresh_comm(caught: list):
    """An AllReduce on a fresh duplicate of the world: mpicoll makes its library communicator
    there (and checks the settings); the error raised is kept in ``caught``."""
    comm = WORLD.Dup()
    try:
        mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=comm)).execute(np.ones(2))
    except CollectiveError as exc:
        caught.append(exc)
        raise
    finally:
        comm.Free()


@ONCE
def test_the_accepted_spellings():
    """Flags: exactly the documented spellings, any case, blanks around ignored, empty the default;
    seconds: a finite number >= 0 (0: no limit); a choice: one of its values, any case."""
    flag = _env.SETTINGS["MPICOLL_VALIDATE"]
    for on_ in ("1", "true", "TRUE", " on ", "Yes"):
        assert flag.parse(on_) is True, on_
    for off in ("0", "false", "Off", " no\t", "NO"):
        assert flag.parse(off) is False, off
    assert flag.parse("") is True and flag.parse("  ") is True and _env.SETTINGS["MPICOLL_DEBUG"].parse("") is False
    timeout, domain = _env.SETTINGS["MPICOLL_TIMEOUT"], _env.SETTINGS["MPICOLL_DOMAIN_TIMEOUT"]
    assert [timeout.parse(v) for v in ("", "0", "1.5", " 2 ", "1e1")] == [None, None, 1.5, 2.0, 10.0]
    assert [domain.parse(v) for v in ("", "0", "7")] == [300.0, None, 7.0]
    assert _env.SETTINGS["MPICOLL_TIMEOUT_ACTION"].parse(" RAISE ") == "raise"
    assert _env.SETTINGS["MPICOLL_STORE_HOST"].parse(" 10.0.0.1 ") == "10.0.0.1"
    for name, bad in REFUSED:
        with pytest.raises(ValueError):
            _env.SETTINGS[name].parse(bad)


@ONCE
def test_a_timeout_argument_that_is_not_finite_is_refused():
    """``timeout=inf`` (or nan) is refused by name, as the setting ``MPICOLL_TIMEOUT='inf'`` is (inf
    once killed the watchdog's thread with an OverflowError, the rank running on unwatched); 0 or
    less: no watchdog. (On one rank only: agreed, tests/test_graph.py.)"""
    from mpicoll._watchdog import timeout_seconds
    assert [timeout_seconds(t) for t in (0, -1, 2)] == [None, None, 2.0]
    for bad in (math.inf, math.nan):
        with pytest.raises(CollectiveArgumentError, match="must be a finite number of seconds"):
            timeout_seconds(bad)


@mpi1
@pytest.mark.parametrize("name, bad", REFUSED)
def test_a_refused_value_on_the_last_rank_is_every_rank_s_error(monkeypatch, name, bad):
    """Only the last rank has it: every rank raises the same CollectiveArgumentError when mpicoll
    makes a communicator, naming the variable, the value, the rank and the accepted values."""
    last = SIZE - 1
    mpicoll.init()                        # (the world made before: it stays usable after)
    if RANK == last:
        setting(monkeypatch, name, bad)
    caught: list = []
    raises_everywhere(lambda: _on_a_fresh_comm(caught), CollectiveArgumentError,
                      f"environment {name}={bad!r} on world rank {last}: ",
                      f"; accepted: {_env.SETTINGS[name].accepted}")
    assert (caught[0].param, caught[0].rank) == (name, last)
    assert mpicoll.AllReduceOperation().execute(np.ones(2)).tolist() == [SIZE] * 2     # still in step


@mpi2
def test_refused_values_on_several_ranks():
    """The same value refused on every rank is one message naming them all; other values on other
    ranks follow the lowest failing rank's; several on one rank are named together."""
    def run(monkeypatch_values):
        with pytest.MonkeyPatch.context() as mp:
            for name, value in monkeypatch_values.get(RANK, {}).items():
                setting(mp, name, value)
            return raises_everywhere(lambda: _on_a_fresh_comm([]), CollectiveArgumentError)
    everywhere = run({r: {"MPICOLL_TIMEOUT": "abc"} for r in range(SIZE)})
    assert everywhere.startswith(f"environment MPICOLL_TIMEOUT='abc' on world ranks {list(range(SIZE))}: not a "
                                 "number of seconds"), everywhere
    mixed = run({0: {"MPICOLL_VALIDATE": "maybe", "MPICOLL_DOMAIN_TIMEOUT": "nan"},
                 SIZE - 1: {"MPICOLL_TIMEOUT_ACTION": "explode"}})
    assert mixed.startswith("environment MPICOLL_VALIDATE='maybe' on world rank 0: neither on nor off; accepted: "), mixed
    assert " (and MPICOLL_DOMAIN_TIMEOUT='nan' there: not a finite number of seconds; accepted: " in mixed, mixed
    assert f" (also: environment MPICOLL_TIMEOUT_ACTION='explode' on world rank {SIZE - 1}: an unknown value; " \
           "accepted: abort or raise (any case); unset or empty: abort)" in mixed, mixed


@mpi1
def test_a_setting_is_read_once(monkeypatch):
    """Read once and kept: a change of the environment afterwards changes nothing, not even on a
    communicator made later (a refused value there is not read either)."""
    setting(monkeypatch, "MPICOLL_VALIDATE", "1")
    assert [r.value for r in _env.readings()][0] is True
    monkeypatch.setenv("MPICOLL_VALIDATE", "0")
    monkeypatch.setenv("MPICOLL_TIMEOUT", "abc")
    comm = WORLD.Dup()
    try:
        lib = user_comm(comm)
        assert lib.validate and _env.value("MPICOLL_TIMEOUT") is None and not lib.watched
    finally:
        comm.Free()


@ONCE
def test_the_table_is_the_one_list_of_settings():
    """Every ``MPICOLL_*`` name the package speaks of is a row of the table; no module but _env reads
    one from the environment; docs/index.md has a row for each, with its default, its accepted
    values and how the ranks agree it; ``--help`` lists each (tests/test_cli.py)."""
    named, readers = set(), []
    for path in (ROOT / "mpicoll").rglob("*.py"):
        text = path.read_text()
        named |= set(re.findall(r"MPICOLL_[A-Z_]*[A-Z]", text))
        if path.name != "_env.py" and re.search(r"environ[^\n]*MPICOLL_", text):
            readers.append(path.name)
    named = {n for n in named if not (n + "_").startswith(_env.RESERVED)}     # (the test harness's)
    assert named == set(_env.SETTINGS), named ^ set(_env.SETTINGS)
    assert readers == []
    index = (ROOT / "docs" / "index.md").read_text()
    for name, s in _env.SETTINGS.items():
        row = next((ln for ln in index.splitlines() if ln.startswith(f"| `{name}` |")), None)
        assert row is not None, name
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1] == s.shown_default and cells[3].split()[0] == s.agreed, (name, cells)
        for spelling in {_env.FLAG: _env.ON + _env.OFF, _env.CHOICE: s.choices}.get(s.kind, ()):
            assert f"`{spelling}`" in cells[2], (name, spelling, cells)


# ----------------------------------------------------------------------------- from the start

JOB = """
    import os, sys
    from mpi4py import MPI
    rank = MPI.COMM_WORLD.Get_rank()
    if rank == 1:
        os.environ[NAME] = VALUE                   # (before mpicoll is imported: MPICOLL_KERNELS is read then)
    import numpy as np
    import mpicoll
    try:
        if ENTRY == "world":
            mpicoll.AllReduceOperation().execute(np.ones(2))
        elif ENTRY == "user comm":
            mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm=MPI.COMM_WORLD.Dup())).execute(np.ones(2))
        elif ENTRY == "domain":
            if rank < 2:                           # (rank 2 never joins: a domain is its members' alone)
                mpicoll.AllReduceOperation(mpicoll.AllReduceParam(comm_domain="d", rank_size=2)).execute(np.ones(2))
        else:
            mpicoll.node_buffer(4, "float32")
    except mpicoll.CollectiveError as exc:
        if not CAUGHT:
            raise
        print(f"[{rank}] {type(exc).__name__}: {exc}", flush=True)
        sys.exit(0)
    print(f"[{rank}] no error", flush=True)
"""


def _job(tmp_path, entry, name, value, caught=True, others=None):
    body = JOB.replace("NAME", repr(name)).replace("VALUE", repr(value)).replace("ENTRY", repr(entry))
    return run_job(tmp_path, body.replace("CAUGHT", str(caught)), np_=3, env=others, timeout=60)


@ONE_JOB
@pytest.mark.parametrize("entry, name, value, others", [
    ("world", "MPICOLL_TIMEOUT", "bogus", {"MPICOLL_TIMEOUT": "5"}),    # (the others hung, or timed out unnamed)
    ("world", "MPICOLL_TIMEOUT", "inf", None),                         # (killed the watchdog's thread)
    ("world", "MPICOLL_TIMEOUT_ACTION", "explode", None),              # (refused only when a timeout fired)
    ("world", "MPICOLL_KERNELS", "maybe", None),                       # (read at import)
    ("world", "MPICOLL_VALIDATE", "of", None),                         # (a typo of off, taken as on)
    ("user comm", "MPICOLL_TIMEOUT", "bogus", None),
    ("domain", "MPICOLL_TIMEOUT", "-5", {"MPICOLL_TIMEOUT": "5"}),
    ("node buffer", "MPICOLL_EXACT", "2", None),
])
def test_a_refused_value_on_one_rank_from_the_start(tmp_path, entry, name, value, others):
    """A fresh job whose rank 1 alone has the bad value: its first communicator, whichever it is,
    raises the same error on every rank it involves, at once, and nothing is left in /dev/shm."""
    res, seconds, left = _job(tmp_path, entry, name, value, others=others)
    # (split at each "[R] ": the launcher may run two ranks' lines together)
    lines = sorted(part.strip() for part in re.split(r"(?=\[\d\] )", res.stdout) if part.strip())
    says = f"CollectiveArgumentError: environment {name}={value!r} on world rank 1: "
    if entry == "domain":                 # (rank 2, outside the domain, never meets it)
        assert lines[-1:] == ["[2] no error"], res.stdout + res.stderr[-3000:]
        lines = lines[:-1]
    assert res.returncode == 0 and [ln.split()[0] for ln in lines] == [f"[{r}]" for r in range(len(lines))] and \
        len(lines) >= 2, res.stdout + res.stderr[-3000:]
    assert len({ln.split(" ", 1)[1] for ln in lines}) == 1 and says in lines[0], lines
    assert seconds < within(30) and left == [], (seconds, left)


@ONE_JOB
def test_an_uncaught_refused_value_ends_the_job_at_once_and_leaves_nothing(tmp_path):
    """Uncaught under ``python -m mpi4py``: every rank raised it, one traceback is printed, the job
    ends at once (it hung), and nothing is left in /dev/shm."""
    res, seconds, left = _job(tmp_path, "world", "MPICOLL_TIMEOUT", "bogus", caught=False,
                              others={"MPICOLL_TIMEOUT": "5"})
    assert res.returncode != 0 and seconds < within(30), (seconds, res.stderr[-3000:])
    assert "mpicoll.CollectiveArgumentError: environment MPICOLL_TIMEOUT='bogus' on world rank 1" in res.stderr
    assert res.stderr.count("Traceback") == 1 and "timed out" not in res.stderr, res.stderr[-3000:]
    assert left == [], left
