"""Kernels: the few loops that touch every byte of a stream, each a function over buffers
with a compiled twin (Cython, `compiled.pyx`) and a pure-Python one (`pure.py`, the
specification). Which runs is chosen once, here, at import: the compiled module when it
was built and `RELAY_PURE_PYTHON` is unset (or 0), the pure one otherwise. Callers import
the kernels from this package and never know which runs; `/status`, `relay --version` and
the `kernels` label of the `relay_build_info` metric say which does, and why.

Modelled on aiokafka's record codec (`record/_crecords` beside `record/default_records.py`)
and msgpack's `fallback.py`: a compiled module is a speed-up, never a requirement, so an
installation without a compiler still runs, with one warning at start-up.
"""

from __future__ import annotations

import importlib
import os
from enum import StrEnum
from typing import TYPE_CHECKING, cast

from relay.kernels import pure
from relay.kernels.protocol import ColumnStep, Kernels


class Implementation(StrEnum):
    COMPILED = "compiled"
    PURE = "pure-python"


# Every kernel of the one signature (relay/kernels/protocol.py).
_NAMES = tuple(name for name in vars(Kernels) if not name.startswith("_"))


def _load_compiled() -> tuple[Kernels | None, str]:
    try:
        module = importlib.import_module("relay.kernels.compiled")
    except ModuleNotFoundError:
        return None, "the compiled kernels are not built"
    except ImportError as exc:  # built for another Python or platform
        return None, f"the compiled kernels do not load here ({exc})"
    missing = [name for name in _NAMES if not hasattr(module, name)]
    if missing:  # built from an older checkout: rebuild (pip install -e .)
        return None, f"the compiled kernels are older than this code (no {', '.join(missing)})"
    known = getattr(module, "COLUMN_STEPS", 0)
    if known < max(ColumnStep):   # (a step it does not know would be decoded as another)
        return None, (f"the compiled kernels are older than this code (column steps up to "
                      f"{known}, not {int(max(ColumnStep))})")
    return cast(Kernels, module), "built with Cython"


def compiled_kernels() -> Kernels | None:
    """The compiled module itself, whatever was chosen (None when not built): the tests
    that hold the twins to each other call both."""
    return _load_compiled()[0]


def _choose() -> tuple[Kernels, Implementation, str]:
    if os.environ.get("RELAY_PURE_PYTHON", "") not in ("", "0"):
        return pure, Implementation.PURE, "RELAY_PURE_PYTHON is set"
    compiled, reason = _load_compiled()
    if compiled is None:
        return pure, Implementation.PURE, reason
    return compiled, Implementation.COMPILED, reason


# mypy holds both twins to the one signature here (the compiled one through compiled.pyi).
_PURE: Kernels = pure
if TYPE_CHECKING:
    from relay.kernels import compiled as _compiled_stub

    _COMPILED: Kernels = _compiled_stub
KERNELS, IMPLEMENTATION, REASON = _choose()
# Pure Python not by choice: the installation lacked a compiler or Cython.
UNEXPECTED = IMPLEMENTATION is Implementation.PURE and not REASON.startswith("RELAY_")

whole_events = KERNELS.whole_events
checked_events = KERNELS.checked_events
frame_stored = KERNELS.frame_stored
read_dump = KERNELS.read_dump
scan_ingest = KERNELS.scan_ingest
scan_clean = KERNELS.scan_clean
splice_rows = KERNELS.splice_rows
decode_columns = KERNELS.decode_columns
json_images = KERNELS.json_images
text_rows = KERNELS.text_rows
json_text_rows = KERNELS.json_text_rows
change_lines = KERNELS.change_lines
row_values = KERNELS.row_values
json_document = KERNELS.json_document
