"""Segment file names and the index file (one name per line, like a server's .index)."""

from __future__ import annotations

import os
import re

from relay.relaylog.atomic import write_atomically

NAME_RE = re.compile(r"^(?P<base>.+)\.(?P<num>\d{6,})$")


def segment_name(basename: str, number: int) -> str:
    return f"{basename}.{number:06d}"


def segment_number(name: str) -> int:
    m = NAME_RE.match(os.path.basename(name))
    if not m:
        raise ValueError(f"not a segment name: {name!r}")
    return int(m.group("num"))


def index_path(directory: str, basename: str) -> str:
    return os.path.join(directory, f"{basename}.index")


def read_index_file(path: str) -> list[str]:
    """The files an index file lists, as written (a server's index names them relative
    to its own directory, as "./name" or a path)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return [line.strip() for line in f if line.strip()]


def read_index(directory: str, basename: str) -> list[str]:
    try:
        names = read_index_file(index_path(directory, basename))
    except FileNotFoundError:
        return []
    return [os.path.basename(n) for n in names]


def write_index(directory: str, basename: str, names: tuple[str, ...] | list[str], *,
                sync: bool) -> None:
    """Atomically replace the index (blocking: the log's worker runs it)."""
    write_atomically(index_path(directory, basename),
                     "".join(f"./{n}\n" for n in names).encode(), sync=sync)


def list_segment_files(directory: str, basename: str) -> list[str]:
    """Segment names in `directory` (a compressed one under its plain name)."""
    out = []
    for entry in os.listdir(directory):
        m = NAME_RE.match(entry.removesuffix(".zst"))
        if m and m.group("base") == basename:
            out.append(entry.removesuffix(".zst"))
    return sorted(set(out), key=segment_number)


def list_index_files(directory: str) -> list[str]:
    """The base names of the relay logs (or binlog series) whose index files `directory`
    holds."""
    return sorted(e.removesuffix(".index") for e in os.listdir(directory)
                  if e.endswith(".index"))
