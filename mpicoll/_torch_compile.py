"""How the torch backend's group (mpicoll/torch.py) runs under ``torch.compile``: its methods that
torch calls are marked for dynamo to run as they are (:func:`eager_under_compile`), once dynamo is
imported (:class:`_AfterImport`), so that importing the backend does not import dynamo."""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import warnings
from typing import Callable

import torch


def eager_under_compile(cls: type) -> type:
    """Wrap the group's methods torch calls (``torch.compiler.disable``, ~0.2 us a call): torch's C++
    side (DDP's reducer, a compiled graph's collectives) calls them while torch.compile runs, and
    dynamo must run them as they are, not trace into a group it sees as an opaque object (a hard
    ``InternalTorchDynamoError`` for a compiled DDP model otherwise).

    ``torch.compiler.disable`` imports dynamo (2.4 s of every process's start here), and nothing can
    compile before dynamo is imported: so the methods are wrapped at once if it is, else right after
    its import (a one-shot import hook on ``torch._dynamo``)."""
    def wrap() -> None:
        for name, fn in list(vars(cls).items()):
            if callable(fn) and (not name.startswith("_") or name in ("_allgather_base", "_reduce_scatter_base")):
                setattr(cls, name, torch.compiler.disable(fn))

    if "torch._dynamo" in sys.modules:
        wrap()
    else:
        sys.meta_path.insert(0, _AfterImport("torch._dynamo", wrap))
    return cls


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``then()`` once, right after module ``name`` has been imported (wherever from). It stays
    in ``sys.meta_path`` (changing that list could trip another thread's import), disarmed once
    ``then`` has run; a lookup that imports nothing (``importlib.util.find_spec``) leaves it armed.
    An error in ``then`` is a warning: the module's own import must not fail for it."""

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name, self.then, self.done = name, then, False

    def find_spec(self, name, path, target=None):
        if name != self.name or self.done:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            if not self.done:
                self.done = True
                try:
                    self.then()
                except Exception as exc:     # (torch's own import goes on; the group then runs unwrapped)
                    warnings.warn(f"mpicoll.torch: could not mark the group's methods for torch.compile "
                                  f"({type(exc).__name__}: {exc}); a compiled DDP model may fail", stacklevel=2)
        spec.loader = _Loader(spec.loader, exec_module)
        return spec


class _Loader(importlib.abc.Loader):
    """``loader`` with its ``exec_module`` replaced (:class:`_AfterImport`)."""

    def __init__(self, loader, exec_module) -> None:
        self._loader, self.exec_module = loader, exec_module

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def __getattr__(self, name):
        return getattr(self._loader, name)
