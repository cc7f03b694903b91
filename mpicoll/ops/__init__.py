"""One module per operator family. Importing this package imports each of them, which registers
their operators (``OPERATIONS``) and collects their public names: adding an operator is adding a
module here (with its checks module, mpicoll/checks/<family>.py, its tests and a docs section)."""
import importlib
import pkgutil

from ._base import OPERATIONS, Operation

__all__ = ["OPERATIONS", "Operation"]
for _info in pkgutil.iter_modules(__path__):
    if not _info.name.startswith("_"):
        _module = importlib.import_module(f"{__name__}.{_info.name}")
        for _name in _module.__all__:
            globals()[_name] = getattr(_module, _name)
            __all__.append(_name)
