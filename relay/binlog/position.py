"""Where an event is: a binlog file (or relay log segment) and a byte offset."""

from __future__ import annotations

from typing import NamedTuple


class Position(NamedTuple):
    """Where an event starts: a binlog file (or relay log segment) and a byte offset."""

    file: str
    offset: int

    def __str__(self) -> str:
        return f"{self.file}:{self.offset}"
