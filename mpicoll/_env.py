"""How the library reads its environment settings (``MPICOLL_*``, listed in docs/index.md): one
rule for on/off flags, one for seconds."""
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
