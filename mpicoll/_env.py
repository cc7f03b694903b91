"""How the library reads its environment: its settings (``MPICOLL_*``, listed in docs/index.md: one
rule for on/off flags, one for seconds) and what MPI launchers put there."""
from __future__ import annotations

import os

from ._errors import CollectiveArgumentError


def flag(name: str, default: str) -> bool:
    """An on/off setting: 0/false/off/no (any case, or empty) is off, anything else on."""
    return os.environ.get(name, default).strip().lower() not in ("0", "false", "off", "no", "")


def seconds(name: str, default: str = "") -> float | None:
    """A number of seconds; unset, empty or <= 0: None (no limit).

    Raises:
        CollectiveArgumentError: not a number, naming the variable.
    """
    raw = os.environ.get(name, default).strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise CollectiveArgumentError(f"environment {name}={raw!r}: must be a number of seconds", param=name) from None
    return value if value > 0 else None


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
