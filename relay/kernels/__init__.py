"""Kernels: the few loops that touch every byte of a stream, each a function over buffers
with a compiled twin (Cython, `compiled.pyx`) and a pure-Python one (`pure.py`, the
specification). Which runs is chosen once, here, at import: the compiled module when it
was built and `RELAY_PURE_PYTHON` is unset (or 0), the pure one otherwise. Callers import
the kernels from this package and never know which runs; `/status`, `relay --version` and
the `relay_kernels_info` metric say which does, and why.

Modelled on aiokafka's record codec (`record/_crecords` beside `record/default_records.py`)
and msgpack's `fallback.py`: a compiled module is a speed-up, never a requirement, so an
installation without a compiler still runs, with one warning at start-up.
"""

from __future__ import annotations

import os
from enum import StrEnum

from relay.kernels import pure
from relay.kernels.protocol import Kernels


class Implementation(StrEnum):
    COMPILED = "compiled"
    PURE = "pure-python"


def _choose() -> tuple[Kernels, Implementation, str]:
    if os.environ.get("RELAY_PURE_PYTHON", "") not in ("", "0"):
        return pure, Implementation.PURE, "RELAY_PURE_PYTHON is set"
    try:
        from relay.kernels import compiled
    except ImportError as exc:
        return pure, Implementation.PURE, f"the compiled kernels are not built ({exc})"
    return compiled, Implementation.COMPILED, "built with Cython"


_PURE: Kernels = pure  # (mypy holds the pure twins to the one signature here)
KERNELS, IMPLEMENTATION, REASON = _choose()
# Pure Python not by choice: the installation lacked a compiler or Cython.
UNEXPECTED = IMPLEMENTATION is Implementation.PURE and not REASON.startswith("RELAY_")

frame_stored = KERNELS.frame_stored
read_dump = KERNELS.read_dump
scan_ingest = KERNELS.scan_ingest


def compiled_kernels() -> Kernels | None:
    """The compiled module itself, whatever was chosen (None when not built): the tests
    that hold the twins to each other call both."""
    try:
        from relay.kernels import compiled
    except ImportError:
        return None
    checked: Kernels = compiled  # (and the compiled twins, through compiled.pyi)
    return checked
