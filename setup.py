"""Builds the compiled kernels (relay/kernels/compiled.pyx) with Cython and the machine's C
compiler. Everything else is in pyproject.toml. A machine without a compiler (or without
Cython) still installs relay: the kernels' pure-Python twins run instead, and both the
build and `relay run` say so once."""

from __future__ import annotations

import os
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

NOTE = ("relay: the compiled kernels were not built ({why}); relay runs on their "
        "pure-Python twins, slower. Install a C compiler and the Python headers "
        "(Debian: gcc python3-dev) and reinstall to build them.")


class OptionalBuildExt(build_ext):
    """build_ext that turns a failed compile into one warning instead of a failed install."""

    failed = False

    def warn_once(self, exc: Exception) -> None:
        if not self.failed:
            print(NOTE.format(why=exc), file=sys.stderr)
        self.failed = True

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 (a missing compiler raises several kinds)
            self.warn_once(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            self.warn_once(exc)

    def copy_extensions_to_source(self) -> None:
        if not self.failed:  # (an editable install copies what was built: nothing)
            super().copy_extensions_to_source()


class BuildPyWithCommit(build_py):
    """build_py that records the commit being built in the package (relay/_commit.txt,
    read by relay/buildinfo.py): $RELAY_COMMIT (the Dockerfile's build argument, where no
    .git is copied), else git's HEAD, else nothing."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:   # a checkout: relay/buildinfo.py asks git itself
            return
        commit = os.environ.get("RELAY_COMMIT", "").strip()
        if not commit:
            try:
                done = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"],
                                      capture_output=True, text=True, timeout=10,
                                      cwd=os.path.dirname(os.path.abspath(__file__)))
                commit = done.stdout.strip() if done.returncode == 0 else ""
            except (OSError, subprocess.SubprocessError):
                commit = ""
        target = os.path.join(self.build_lib, "relay", "_commit.txt")
        if commit:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "w") as f:
                f.write(commit + "\n")
        elif os.path.exists(target):   # an earlier build's, not this one's
            os.remove(target)


def extensions() -> list[Extension]:
    try:
        from Cython.Build import cythonize
    except ImportError as exc:
        print(NOTE.format(why=exc), file=sys.stderr)
        return []
    return cythonize(
        [Extension("relay.kernels.compiled", ["relay/kernels/compiled.pyx"],
                   extra_compile_args=["-O2"], libraries=["z"])],
        compiler_directives={"language_level": 3}, quiet=True)


setup(ext_modules=extensions(),
      cmdclass={"build_ext": OptionalBuildExt, "build_py": BuildPyWithCommit})
