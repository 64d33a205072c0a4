"""Segment file names and the index file (one name per line, like a server's .index)."""

from __future__ import annotations

import os
import re

_NAME_RE = re.compile(r"^(?P<base>.+)\.(?P<num>\d{6,})$")


def segment_name(basename: str, number: int) -> str:
    return f"{basename}.{number:06d}"


def segment_number(name: str) -> int:
    m = _NAME_RE.match(os.path.basename(name))
    if not m:
        raise ValueError(f"not a segment name: {name!r}")
    return int(m.group("num"))


def index_path(directory: str, basename: str) -> str:
    return os.path.join(directory, f"{basename}.index")


def read_index(directory: str, basename: str) -> list[str]:
    path = index_path(directory, basename)
    try:
        with open(path, encoding="utf-8") as f:
            return [os.path.basename(line.strip()) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def write_index(directory: str, basename: str, names: list[str], *, sync: bool) -> None:
    """Atomically replace the index: temp file, fsync, rename, fsync the directory."""
    path = index_path(directory, basename)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("".join(f"./{n}\n" for n in names))
        f.flush()
        if sync:
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if sync:
        fsync_dir(directory)


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_segment_files(directory: str, basename: str) -> list[str]:
    out = []
    for entry in os.listdir(directory):
        m = _NAME_RE.match(entry)
        if m and m.group("base") == basename:
            out.append(entry)
    return sorted(out, key=segment_number)
