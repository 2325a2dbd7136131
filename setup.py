"""Packaging hook: the repository's models.toml (the documented one) is the file a wheel installs.

It is copied into the built package at build time, so there is one models.toml by construction:
a source checkout (or an editable install) reads the repository's file, a wheel its copy of it.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        if not getattr(self, "editable_mode", False):
            self.copy_file("models.toml", str(Path(self.build_lib) / "localcos" / "models.toml"))


setup(cmdclass={"build_py": BuildPy})
