"""The GTID index: for each segment a side file `<segment>.gtidx` of fixed 32-byte records
(domain, server_id, seq, group start, group end), appended as groups commit. Finding a
GTID reads that file only, never the events."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from relay.binlog.gtid import Gtid

RECORD = struct.Struct("<IIQQQ")


@dataclass(frozen=True)
class IndexEntry:
    gtid: Gtid
    start: int
    end: int


def index_file(segment_path: str) -> str:
    return segment_path + ".gtidx"


def pack(gtid: Gtid, start: int, end: int) -> bytes:
    return RECORD.pack(gtid.domain, gtid.server_id, gtid.seq, start, end)


def read_entries(segment_path: str) -> Iterator[IndexEntry]:
    try:
        with open(index_file(segment_path), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return
    usable = len(data) - len(data) % RECORD.size
    for d, s, q, start, end in RECORD.iter_unpack(data[:usable]):
        yield IndexEntry(Gtid(d, s, q), start, end)


def find(segment_path: str, gtid: Gtid) -> IndexEntry | None:
    for entry in read_entries(segment_path):
        if entry.gtid == gtid:
            return entry
    return None


def rewrite(segment_path: str, entries: list[IndexEntry]) -> None:
    tmp = index_file(segment_path) + ".tmp"
    with open(tmp, "wb") as f:
        f.write(b"".join(pack(e.gtid, e.start, e.end) for e in entries))
    os.replace(tmp, index_file(segment_path))
