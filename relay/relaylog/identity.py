"""The relay log's epoch: a random id written when the log is created. A reader holding a
position in one log (a Spark checkpoint, a tap subscriber) can tell that the log was
rebuilt or replaced, and must refuse to go on, instead of reading other bytes at the same
numbers."""

from __future__ import annotations

import os
import uuid

from relay.relaylog.atomic import write_atomically


def epoch_path(directory: str, basename: str) -> str:
    return os.path.join(directory, f"{basename}.epoch")


def load_epoch(directory: str, basename: str, *, fresh: bool, sync: bool) -> str:
    """The epoch of the log in `directory`; a new one when the log is `fresh` (no segments)
    or has none yet (a log from before epochs: it gets one now and keeps it)."""
    path = epoch_path(directory, basename)
    if not fresh:
        try:
            with open(path, encoding="ascii") as f:
                value = f.read().strip()
            if value:
                return value
        except FileNotFoundError:
            pass
    value = uuid.uuid4().hex
    write_atomically(path, (value + "\n").encode("ascii"), sync=sync)
    return value
