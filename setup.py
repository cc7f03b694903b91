"""Metadata lives in setup.cfg; this file only adds the optional numeric kernels (mpicoll/_kernels.c).

``optional=True``: where they do not compile (no C compiler, no _Float16), the install goes on and
mpicoll uses numpy instead (the same results, bit for bit, more slowly).
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("mpicoll._kernels", ["mpicoll/_kernels.c"], optional=True,
                             extra_compile_args=["-O3"])])
