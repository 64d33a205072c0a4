"""Where an event is: a binlog file (or relay log segment) and a byte offset, by name
(`Position`, what clients and errors see) or, inside one relay log, by segment number
(`LogPosition`, ordered as the log is)."""

from __future__ import annotations

from typing import NamedTuple


class Position(NamedTuple):
    """Where an event starts: a binlog file (or relay log segment) and a byte offset."""

    file: str
    offset: int

    def __str__(self) -> str:
        return f"{self.file}:{self.offset}"


# (segment number, byte offset) in one relay log: tuples compare in the log's order.
LogPosition = tuple[int, int]
