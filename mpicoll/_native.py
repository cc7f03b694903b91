"""The optional C kernels (``mpicoll/_half.c``): loaded once, here, for every module that uses them."""
from __future__ import annotations

import os


def load_half():
    """The ``_half`` extension, or None when it is not built or ``MPICOLL_HALF_KERNELS=0``."""
    if os.environ.get("MPICOLL_HALF_KERNELS", "1").strip().lower() in ("0", "false", "off", "no"):
        return None
    try:
        from . import _half
    except ImportError:
        return None
    return _half


#: float16 <-> float32 conversions and row reductions, the entry tests of the validation-off
#: closures and the header-table tests of the validated path, in C; None = the Python twins.
HALF = load_half()
