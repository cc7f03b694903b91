"""The operators' golden checks and benchmark specs, apart from the operators themselves (as
nccl-tests keeps its per-operator tests apart from NCCL): ``checks/<family>.py`` mirrors
``ops/<family>.py`` (and ``hccl.py``), and declares ``CHECKS`` (:class:`CheckSpec`: case families,
and the numpy golden of each case) and ``BENCHES`` (:class:`BenchSpec`).

Importing this package imports every module in it and collects those into the registries
:data:`CHECKS` and :data:`BENCHES`, which ``python -m mpicoll.run check``, ``bench`` and the tests
iterate (they never name an operator). ``import mpicoll`` does not import it.
"""
from __future__ import annotations

import importlib
import pkgutil

from ._spec import BenchCase, BenchRun, BenchSpec, Case, CheckSpec

__all__ = ["BENCHES", "CHECKS", "BenchCase", "BenchRun", "BenchSpec", "Case", "CheckSpec"]

#: operator name -> its check spec, in module order (then declaration order)
CHECKS: dict[str, CheckSpec] = {}
#: operator name -> its benchmark spec
BENCHES: dict[str, BenchSpec] = {}


def _collect() -> None:
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for registry, specs in ((CHECKS, module.CHECKS), (BENCHES, module.BENCHES)):
            for spec in specs:
                if spec.name in registry:
                    raise RuntimeError(f"mpicoll.checks.{info.name}: {spec.name} is declared twice")
                registry[spec.name] = spec


_collect()
