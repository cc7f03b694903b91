"""Metadata lives in setup.cfg; this file only adds the optional numeric kernels (mpicoll/_kernels.c).

``optional=True``: where they do not compile (no C compiler, no _Float16), the install goes on and
mpicoll uses numpy instead (the same results, bit for bit, more slowly).

The built kernels also go beside the sources (what ``build_ext --inplace`` does): the README's
commands run from the repository root, where ``python -m mpicoll.run`` imports ``./mpicoll``, not
the installed copy, and would otherwise run without them.
"""
import os
import shutil
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SOURCE = Path(__file__).resolve().parent


class BuildKernels(build_ext):
    def run(self) -> None:
        super().run()
        for ext in self.extensions:
            built = Path(self.get_ext_fullpath(ext.name))
            beside = SOURCE.joinpath(*ext.name.split(".")[:-1], built.name)
            if built.exists() and built.resolve() != beside.resolve():
                try:                         # (a new file renamed over the old: a running job keeps its mapping)
                    shutil.copyfile(built, beside.with_name(beside.name + ".new"))
                    os.replace(beside.with_name(beside.name + ".new"), beside)
                except OSError:              # (a read-only source tree: the installed copy still has them)
                    pass


setup(ext_modules=[Extension("mpicoll._kernels", ["mpicoll/_kernels.c"], optional=True,
                             extra_compile_args=["-O3"])],
      cmdclass={"build_ext": BuildKernels})
