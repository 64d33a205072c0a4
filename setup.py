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
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))
COMMIT_FILE = os.path.join("relay", "_commit.txt")

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


def built_commit() -> str:
    """The commit being built: $RELAY_COMMIT (the Dockerfile's build argument, where no
    .git is copied), else git's HEAD, else what the sdist this tree came from recorded
    (relay/_commit.txt in it), else ""."""
    commit = os.environ.get("RELAY_COMMIT", "").strip()
    if commit:
        return commit
    try:
        done = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=HERE,
                              capture_output=True, text=True, timeout=10)
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        with open(os.path.join(HERE, COMMIT_FILE)) as f:
            return f.read().strip()
    except OSError:
        return ""


class SdistWithCommit(sdist):
    """sdist that records the commit in the archive (relay/_commit.txt), so that a wheel
    built from it (pip's usual way) says which commit it is."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        commit = built_commit()
        if commit:
            with open(os.path.join(base_dir, COMMIT_FILE), "w") as f:
                f.write(commit + "\n")


class BuildPyWithCommit(build_py):
    """build_py that records the commit being built in the package (relay/_commit.txt,
    read by relay/buildinfo.py): built_commit()."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:   # a checkout: relay/buildinfo.py asks git itself
            return
        commit = built_commit()
        target = os.path.join(self.build_lib, COMMIT_FILE)
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
    if not os.path.exists(os.path.join(HERE, "relay", "kernels", "compiled.pyx")):
        print(NOTE.format(why="relay/kernels/compiled.pyx is not in this tree"),
              file=sys.stderr)
        return []
    return cythonize(
        [Extension("relay.kernels.compiled", ["relay/kernels/compiled.pyx"],
                   extra_compile_args=["-O2"], libraries=["z"])],
        compiler_directives={"language_level": 3}, quiet=True)


setup(ext_modules=extensions(),
      cmdclass={"build_ext": OptionalBuildExt, "build_py": BuildPyWithCommit,
                "sdist": SdistWithCommit})
