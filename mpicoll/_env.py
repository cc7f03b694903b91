"""THE settings table (every ``MPICOLL_*`` setting: one row each, listed in docs/index.md), how
a setting is read, and what MPI launchers put in the environment.

Each setting is read once, the first time mpicoll needs it, and kept: the library reads the kept
value, never the environment again (``MPICOLL_KERNELS`` at import; the others at the latest when
mpicoll makes its first library communicator, which needs every one). A value that cannot be read
(a flag neither on nor off, seconds that are negative, infinite, NaN or not a number, an unknown
choice) is not raised where it is read: the setting takes its default and the value is kept as
this rank's problem (:func:`error`), which every library communicator's members exchange when
they make it (``mpicoll._making.make``), so that every member raises the same error, even
when only one of them has the bad value, and none leaves before the others learn why.
"""
from __future__ import annotations

import difflib
import math
import os
import warnings
from dataclasses import dataclass
from typing import Any

from ._errors import CollectiveArgumentError
from ._traceback import user_stacklevel

FLAG, SECONDS, CHOICE, TEXT, COUNT = "flag", "seconds", "choice", "text", "count"
ON, OFF = ("1", "true", "on", "yes"), ("0", "false", "off", "no")
#: how the members of a library communicator agree a setting: ALIKE, every member must have the same
#: value (it decides which MPI calls a rank makes); ANY, set on any member it holds for all of them
#: (``MPICOLL_TIMEOUT``: then every member keeps arrival marks); OWN, each rank's own
ALIKE, ANY, OWN = "alike", "any", "own"


@dataclass(frozen=True)
class Setting:
    """One row of the table.

    Attributes:
        name: the environment variable.
        kind: FLAG (on/off), SECONDS (a finite number >= 0; 0: no limit), CHOICE (one of
            ``choices``), TEXT (any value), COUNT (a whole number >= 0).
        default: its value when unset or empty, as the environment spells it ("": none).
        agreed: ALIKE, ANY or OWN (above).
        summary: what it does, one line (``--help``, ``--info``).
        doc: where the docs say more.
        choices: a CHOICE's values.
    """

    name: str
    kind: str
    default: str
    agreed: str
    summary: str
    doc: str
    choices: tuple[str, ...] = ()

    @property
    def shown_default(self) -> str:
        """Its default, as messages and docs say it: ``on``, ``300 s``, ``no limit``, ``abort``, ``unset``."""
        if self.kind == FLAG:
            return "on" if self.default in ON else "off"
        if self.kind == SECONDS:
            return f"{self.default} s" if self.default else "no limit"
        return self.default or "unset"

    @property
    def accepted(self) -> str:
        """The values it accepts, as messages and docs say them."""
        rule = {FLAG: f"on: {', '.join(ON)}; off: {', '.join(OFF)} (any case)",
                SECONDS: "a finite number of seconds >= 0 (0: no limit)",
                CHOICE: f"{' or '.join(self.choices)} (any case)",
                TEXT: "any value", COUNT: "a whole number >= 0"}[self.kind]
        return f"{rule}; unset or empty: {self.shown_default}"

    def parse(self, raw: str) -> Any:
        """The value of ``raw`` (blanks around it ignored; empty: the default).

        Raises:
            ValueError: a value it cannot read, saying why.
        """
        text = raw.strip()
        if not text:
            text = self.default
        if self.kind == FLAG:
            if text.lower() in ON + OFF:
                return text.lower() in ON
            raise ValueError("neither on nor off")
        if self.kind == SECONDS:
            if not text:
                return None
            try:
                value = float(text)
            except ValueError:
                raise ValueError("not a number of seconds") from None
            if not math.isfinite(value):
                raise ValueError("not a finite number of seconds")
            if value < 0:
                raise ValueError("a negative number of seconds")
            return value if value > 0 else None
        if self.kind == CHOICE:
            if text.lower() in self.choices:
                return text.lower()
            raise ValueError("an unknown value")
        if self.kind == COUNT:
            if not text.isdigit():
                raise ValueError("not a whole number >= 0")
            return int(text)
        return text or None


#: THE table: every ``MPICOLL_*`` setting
SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting("MPICOLL_VALIDATE", FLAG, "1", ALIKE, "cross-rank argument checks (0: off)",
            "docs/errors.md#turning-validation-off"),
    Setting("MPICOLL_DEBUG", FLAG, "0", ALIKE, "every call checked, with sequence numbers (1: on)",
            "docs/errors.md#debug-mode-mpicoll_debug1"),
    Setting("MPICOLL_TIMEOUT", SECONDS, "", ANY, "seconds before a collective some rank never joins times out, "
            "naming the missing ranks (then MPICOLL_TIMEOUT_ACTION)", "docs/reliability.md"),
    Setting("MPICOLL_TIMEOUT_ACTION", CHOICE, "abort", OWN, "what a timeout does: abort (the job ends, status 1) "
            "or raise (CollectiveTimeout to catch; that communicator must not be used again)", "docs/reliability.md",
            choices=("abort", "raise")),
    Setting("MPICOLL_DOMAIN_TIMEOUT", SECONDS, "300", OWN, "seconds the members of a new comm domain wait for "
            "each other (0: for ever)", "docs/domains.md"),
    Setting("MPICOLL_KERNELS", FLAG, "1", OWN, "the C kernels of float16/bfloat16 and int8 quantization (0: numpy, "
            "the same results)", "docs/index.md"),
    Setting("MPICOLL_SHM", FLAG, "1", ALIKE, "reductions through a shared window on one node, AllReduce in tiers "
            "across nodes (0: off)", "docs/shm.md"),
    Setting("MPICOLL_EXACT", FLAG, "1", ALIKE, "float reductions in the tree order, the same bits on every path (0: "
            "MPI's order, which changes with the message size and the MPI)", "docs/reproducibility.md"),
    Setting("MPICOLL_WAIT", CHOICE, "auto", OWN, "how a rank waits for a point-to-point message: spin (MPI's own "
            "wait, polling without pause), sleep (polls between short sleeps: the core goes to the ranks that "
            "compute), auto (sleep where the node runs more ranks than it has cores)", "docs/reliability.md",
            ("auto", "spin", "sleep")),
    Setting("MPICOLL_TRACEBACK_FILTERING", FLAG, "1", OWN, "the traceback of an uncaught mpicoll error shows the "
            "user's frames and the message, not mpicoll's internal frames (0: every frame)",
            "docs/errors.md#tracebacks"),
    Setting("MPICOLL_TRACE", TEXT, "", OWN, "a directory: each rank writes a trace of every call there "
            "(trace.<rank>.json, Chrome's trace format; python -m mpicoll.run trace DIR reads them)", "docs/trace.md"),
    Setting("MPICOLL_FLIGHT", COUNT, "64", OWN, "the calls each communicator's flight recorder keeps, dumped when a "
            "call times out, the job aborts or on SIGUSR1 (0: none)", "docs/trace.md#the-flight-recorder"),
    Setting("MPICOLL_DUMP_DIR", TEXT, "", OWN, "where each rank writes its flight recorder (flight.<rank>.json; "
            "unset: mpicoll-flight in the working directory)", "docs/trace.md#the-flight-recorder"),
    Setting("MPICOLL_STORE_HOST", TEXT, "", OWN, "the torch backend's mpi://: the address of world rank 0 at which "
            "the other ranks reach its store (unset: its IPv4 addresses, tried in turn)", "docs/torch.md"),
)}


@dataclass(frozen=True)
class Reading:
    """A setting as read: ``raw`` (None: unset), the ``value`` in effect (the default's if the raw
    value was refused), and ``problem``: why it was refused, or None."""

    setting: Setting
    raw: str | None
    value: Any
    problem: str | None

    @property
    def source(self) -> str:
        """Where the value in effect came from: "environment" or "default"."""
        return "environment" if self.raw is not None and self.raw.strip() and self.problem is None else "default"


_READ: dict[str, Reading] = {}
#: whether this process has warned of the ``MPICOLL_*`` variables that are no setting (once per process)
_WARNED: list[bool] = []


def read(name: str) -> Reading:
    """Setting ``name`` as read (the first time: from the environment; then the kept reading). The
    first reading in a process warns of the ``MPICOLL_*`` variables that are no setting (:func:`warn_strangers`)."""
    got = _READ.get(name)
    if got is None:
        if not _WARNED:
            warn_strangers()
        setting = SETTINGS[name]
        raw = os.environ.get(name)
        try:
            got = Reading(setting, raw, setting.parse(raw or ""), None)
        except ValueError as exc:
            got = Reading(setting, raw, setting.parse(""), str(exc))
        _READ[name] = got
    return got


def value(name: str) -> Any:
    """The value in effect of setting ``name``: a flag's bool, seconds (None: no limit), a
    choice's value, a text (None: unset)."""
    return read(name).value


def readings() -> list[Reading]:
    """Every setting as read, in the table's order (reading those not read yet)."""
    return [read(name) for name in SETTINGS]


def error(world_rank: int) -> CollectiveArgumentError | None:
    """The error of this rank's refused values (reading every setting not read yet), or None:
    ``MPICOLL_TIMEOUT='abc' on world rank 1: not a number of seconds; accepted: ...``, naming the
    first refused setting (``param``), then any other refused here."""
    bad = [r for r in readings() if r.problem is not None]
    if not bad:
        return None
    texts = [f"{r.setting.name}={r.raw!r}{f' on world rank {world_rank}' if i == 0 else ' there'}: {r.problem}; "
             f"accepted: {r.setting.accepted}" for i, r in enumerate(bad)]
    return CollectiveArgumentError(f"environment {texts[0]}" + "".join(f" (and {t})" for t in texts[1:]),
                                   param=bad[0].setting.name, rank=world_rank)


#: ``MPICOLL_*`` variables that are not the library's: the test harness's (scripts/test, tests/, .ci/run)
RESERVED = ("MPICOLL_TEST_",)


def strangers() -> list[str]:
    """The ``MPICOLL_*`` variables in the environment that are no setting (a misspelt name: ignored),
    but the test harness's (``RESERVED``)."""
    return sorted(k for k in os.environ if k.startswith("MPICOLL_") and k not in SETTINGS and
                  not k.startswith(RESERVED))


def closest(name: str) -> str:
    """The setting whose name is closest to ``name`` (a misspelling's likely meaning)."""
    return difflib.get_close_matches(name, list(SETTINGS), n=1, cutoff=0.0)[0]


def warn_strangers() -> None:
    """Warn once per process (a ``UserWarning`` at the user's line) of each ``MPICOLL_*`` variable
    that is no setting, naming the closest setting: a misspelt setting is otherwise ignored in silence."""
    _WARNED.append(True)
    names = strangers()
    if names:
        said = "; ".join(f"{n} is no mpicoll setting (the closest: {closest(n)})" for n in names)
        warnings.warn(f"mpicoll: {said}: ignored. Every setting: python -m mpicoll.run --info, docs/index.md",
                      UserWarning, stacklevel=user_stacklevel())


def reread() -> None:
    """Forget what was read: the next need reads the environment again (for tests and benchmarks
    that switch a setting between communicators; every rank alike)."""
    _READ.clear()


#: variables an MPI launcher (MPICH's hydra, Open MPI/PRRTE, PMIx, Slurm) puts in a rank's
#: environment, by prefix: a job launched from inside a rank must not inherit them
LAUNCHER_PREFIXES = ("PMI_", "HYD", "MPI_LOCAL", "PMIX_", "PRTE_", "OMPI_")
#: variables naming the job, most specific first (a name server shared by several jobs)
JOB_VARS = ("PMIX_NAMESPACE", "SLURM_JOB_ID", "PMI_KVSNAME", "OMPI_MCA_ess_base_jobid")
#: variables that say a launcher started this process
_STARTED = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID")


def launched() -> bool:
    """Whether a launcher (``mpirun``, ``srun``) started this process, not a plain ``python``."""
    return any(v in os.environ for v in _STARTED)
