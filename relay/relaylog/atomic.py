"""Replacing a small file atomically: write a temporary file, fsync it, rename it over the
old one, fsync the directory. The one way the relay log's side files (the index, the
epoch, readers' holds, a rewritten GTID index) change. Blocking: callers off the event
loop run it in the log's worker."""

from __future__ import annotations

import os


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: str, data: bytes, *, sync: bool) -> None:
    """After a crash, `path` holds either its old content or `data`, never a mix. With
    `sync` off (the log's sync policy is off) the file is renamed into place unsynced."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if sync:
        fsync_dir(os.path.dirname(os.path.abspath(path)))
