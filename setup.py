"""Metadata lives in setup.cfg; this file only adds the optional float16 accelerator.

``optional=True``: where it does not compile (no C compiler, no _Float16), the install goes on and
mpicoll uses numpy's (slower) float16 conversions instead.
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("mpicoll._half", ["mpicoll/_half.c"], optional=True, extra_compile_args=["-O3"])])
