"""The optional numeric kernels (``mpicoll/_kernels.c``): loaded once, here, for every module that uses them."""
from __future__ import annotations

import os


def load_kernels():
    """The ``_kernels`` extension, or None when it is not built or ``MPICOLL_KERNELS=0``."""
    if os.environ.get("MPICOLL_KERNELS", "1").strip().lower() in ("0", "false", "off", "no", ""):
        return None
    try:
        from . import _kernels
    except ImportError:
        return None
    return _kernels


#: float16/bfloat16 conversions and row reductions, int8 quantization, in C; None = numpy (same bits).
KERNELS = load_kernels()
