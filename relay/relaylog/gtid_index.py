"""The GTID index: for each segment a side file `<segment>.gtidx` of fixed-size records
(transaction id, group start, group end), appended as groups commit. Finding a
transaction reads that file only, never the events.

Records by flavour: a MariaDB GTID is 32 bytes (domain, server_id, seq, start, end; the
file has no header, as logs written before MySQL support have it). A segment of MySQL
transactions opens with the 8-byte magic `RLYGTIS2`, then 72-byte records (source UUID,
tag padded with NULs to MySQL's 32 bytes at most, gno, start, end). Files of the first
MySQL form (`RLYGTIS1`, 40-byte records without a tag) are read; recovery rewrites the
last segment's file, so new records never go after old ones.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from relay.binlog.gtid import Gtid, MysqlGtid, TxnId
from relay.relaylog.atomic import write_atomically

MARIADB_RECORD = struct.Struct("<IIQQQ")
MYSQL_RECORD = struct.Struct("<16s32sQQQ")
MYSQL_MAGIC = b"RLYGTIS2"
MYSQL_V1_RECORD = struct.Struct("<16sQQQ")
MYSQL_V1_MAGIC = b"RLYGTIS1"


@dataclass(frozen=True)
class IndexEntry:
    txn: TxnId
    start: int
    end: int


def index_file(segment_path: str) -> str:
    return segment_path + ".gtidx"


def file_header(txn: TxnId) -> bytes:
    """What an index file of this flavour starts with (before its first record)."""
    return MYSQL_MAGIC if isinstance(txn, MysqlGtid) else b""


def pack(txn: TxnId, start: int, end: int) -> bytes:
    if isinstance(txn, MysqlGtid):
        return MYSQL_RECORD.pack(txn.sid.bytes, txn.tag.encode("ascii"), txn.gno, start, end)
    return MARIADB_RECORD.pack(txn.domain, txn.server_id, txn.seq, start, end)


def parse(data: bytes) -> Iterator[IndexEntry]:
    """The records of an index file's bytes; a torn last record is left out."""
    if data.startswith(MYSQL_MAGIC):
        body = data[len(MYSQL_MAGIC):]
        usable = len(body) - len(body) % MYSQL_RECORD.size
        for sid, tag, gno, start, end in MYSQL_RECORD.iter_unpack(body[:usable]):
            name = tag.rstrip(b"\0").decode("ascii", "replace")
            yield IndexEntry(MysqlGtid(uuid.UUID(bytes=sid), gno, name), start, end)
        return
    if data.startswith(MYSQL_V1_MAGIC):
        body = data[len(MYSQL_V1_MAGIC):]
        usable = len(body) - len(body) % MYSQL_V1_RECORD.size
        for sid, gno, start, end in MYSQL_V1_RECORD.iter_unpack(body[:usable]):
            yield IndexEntry(MysqlGtid(uuid.UUID(bytes=sid), gno), start, end)
        return
    usable = len(data) - len(data) % MARIADB_RECORD.size
    for d, s, q, start, end in MARIADB_RECORD.iter_unpack(data[:usable]):
        yield IndexEntry(Gtid(d, s, q), start, end)


def read_entries(segment_path: str) -> Iterator[IndexEntry]:
    try:
        with open(index_file(segment_path), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return
    yield from parse(data)


def find(segment_path: str, txn: TxnId) -> IndexEntry | None:
    for entry in read_entries(segment_path):
        if entry.txn == txn:
            return entry
    return None


def rewrite(segment_path: str, entries: list[IndexEntry], *, sync: bool) -> None:
    head = file_header(entries[0].txn) if entries else b""
    write_atomically(index_file(segment_path),
                     head + b"".join(pack(e.txn, e.start, e.end) for e in entries), sync=sync)
