"""Synthesized MariaDB-shaped events for tests that need no server."""

from __future__ import annotations

import struct

from relay.binlog import build
from relay.binlog.constants import EventType
from relay.binlog.file import RawEvent, check_magic, iter_events
from relay.binlog.gtid import Gtid
from relay.relaylog.appender import Appender

# Post-header lengths of a MariaDB 10.11 FDE (replication-protocol.md 6.3).
_POST = {1: 56, 2: 13, 4: 8, 6: 18, 8: 4, 9: 4, 10: 4, 11: 4, 12: 18, 15: 228, 17: 4, 18: 26,
         19: 8, 23: 8, 24: 8, 25: 8, 26: 2, 30: 10, 31: 10, 32: 10, 39: 10, 40: 10, 41: 10,
         161: 4, 162: 19, 163: 4, 165: 13, 166: 8, 167: 8, 168: 8, 169: 10, 170: 10, 171: 10}


def fde(checksum: bool = True, server_id: int = 1, log_pos: int = 256) -> bytes:
    post = bytes(_POST.get(i, 0) for i in range(1, 172))
    body = (struct.pack("<H", 4) + b"10.11.19-MariaDB-log".ljust(50, b"\0")
            + struct.pack("<I", 0) + b"\x13" + post + bytes((1 if checksum else 0,)))
    # The FDE always has a CRC slot on checksum-aware servers.
    return build.build_event(EventType.FORMAT_DESCRIPTION, body, server_id=server_id,
                             log_pos=log_pos, checksum=True)


def gtid_event(g: Gtid, *, checksum: bool = True, flags2: int = 0x0C) -> bytes:
    body = struct.pack("<QIB", g.seq, g.domain, flags2) + b"\0" * 6
    return build.build_event(EventType.GTID, body, server_id=g.server_id, log_pos=0,
                             checksum=checksum)


def rows_event(payload: bytes = b"x" * 40, *, checksum: bool = True) -> bytes:
    body = b"\x12\x00\x00\x00\x00\x00\x01\x00" + payload
    return build.build_event(EventType.WRITE_ROWS_V1, body, server_id=1, log_pos=0,
                             checksum=checksum)


def xid_event(xid: int = 1, *, checksum: bool = True) -> bytes:
    return build.build_event(EventType.XID, struct.pack("<Q", xid), server_id=1, log_pos=0,
                             checksum=checksum)


def transaction(g: Gtid, *, checksum: bool = True, payload: bytes = b"x" * 40) -> list[bytes]:
    return [gtid_event(g, checksum=checksum), rows_event(payload, checksum=checksum),
            xid_event(g.seq, checksum=checksum)]


def read_file_events(path: str, *, verify_crc: bool = True) -> list[RawEvent]:
    """Every event of a binlog file (loads the file)."""
    with open(path, "rb") as f:
        data = f.read()
    check_magic(data, path)
    return list(iter_events(data, verify_crc=verify_crc, where=path))


def write_transactions(appender: Appender, seqs: range, *, payload: bytes = b"x" * 40,
                       rotate: bool = False, one_batch: bool = False) -> None:
    """Transactions 0-1-<seq> through a relay log's appender, a batch each (all in one
    with `one_batch`: published at once; rotating past the segment size with `rotate`),
    after a first segment if there is none."""
    if appender.needs_segment and appender.fde is None:
        appender.new_segment(fde())
    for seq in seqs:
        appender.begin_group()
        for ev in transaction(Gtid(0, 1, seq), payload=payload):
            appender.append(ev, 0, len(ev))
        appender.commit(Gtid(0, 1, seq))
        if rotate:
            appender.rotate_if_full()
        if not one_batch:
            appender.finish()
    if one_batch:
        appender.finish()
