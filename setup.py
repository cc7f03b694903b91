"""Metadata lives in setup.cfg; this file only adds the optional C accelerator (mpicoll/_half.c).

``optional=True``: where it does not compile (no C compiler, no _Float16, no numpy headers), the
install goes on and mpicoll uses its Python and numpy paths instead (same results, slower).
pyproject.toml puts numpy in the build environment for its C API headers.
"""
from setuptools import Extension, setup

try:
    import numpy
    include = [numpy.get_include()]
except ImportError:           # (then the extension does not compile: optional)
    include = []

setup(ext_modules=[Extension("mpicoll._half", ["mpicoll/_half.c"], optional=True, include_dirs=include,
                             extra_compile_args=["-O3"])])
