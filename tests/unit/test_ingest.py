"""The ingest's mirroring logic, driven with a synthesized primary binlog (no server)."""

from __future__ import annotations

import asyncio
import os
import pathlib
import struct

from relay.binlog import build
from relay.binlog.constants import EventType
from relay.binlog.gtid import Gtid
from relay.config import SyncMode, SyncPolicy
from relay.relaylog.log import RelayLog
from relay.relaylog.naming import read_index
from relay.upstream.ingest import Ingest
from relay.upstream.protocol import StreamStart
from tests.conftest import gtids_in, read_binlog
from tests.helpers import fde, transaction


def primary_file(name: str, gtids: list[Gtid], start_state: list[Gtid],
                 next_file: str | None = None) -> tuple[bytes, list[bytes]]:
    """A primary's binlog file: (file bytes, its events with real log_pos)."""
    events: list[bytes] = []
    pos = 4

    def add(ev: bytes) -> None:
        nonlocal pos
        ev = build.reframe(ev, True, log_pos=pos + len(ev))
        events.append(ev)
        pos += len(ev)

    add(fde())
    add(build.gtid_list(start_state, server_id=1, log_pos=0))
    add(build.binlog_checkpoint(name, server_id=1, log_pos=0))
    for g in gtids:
        for ev in transaction(g):
            add(ev)
    if next_file:
        add(build.rotate(next_file, server_id=1, log_pos=0))
    return b"\xfebin" + b"".join(events), events


def artificial_rotate(name: str, position: int = 4) -> bytes:
    return build.rotate(name, position=position, server_id=1, log_pos=0, artificial=True)


class _NoLink:
    """A connection no one pauses, fails or answers (the ingest never does)."""

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def fail(self, exc: Exception) -> None:
        raise exc

    def reply(self, payload: bytes) -> None: ...


def new_log(tmp_path: pathlib.Path) -> RelayLog:
    log = RelayLog(str(tmp_path), sync=SyncPolicy(SyncMode.OFF))
    log.open()
    return log


def test_clean_start_mirrors_the_file_byte_for_byte(tmp_path: pathlib.Path) -> None:
    data, events = primary_file("mariadb-bin.000001", [Gtid(0, 1, s) for s in range(1, 30)], [])
    log = new_log(tmp_path)
    ingest = Ingest(log)
    ingest.on_stream(StreamStart(True, _NoLink()))
    ingest.feed([artificial_rotate("mariadb-bin.000001"), *events])
    log.close()
    with open(os.path.join(str(tmp_path), "relay-bin.000001"), "rb") as f:
        assert f.read() == data
    assert log.stats.events_rewritten == 0
    assert str(log.state) == "0-1-29"


def test_reconnect_mid_transaction_continues_the_segment(tmp_path: pathlib.Path) -> None:
    gtids = [Gtid(0, 1, s) for s in range(1, 21)]
    _, events = primary_file("mariadb-bin.000001", gtids, [])
    log = new_log(tmp_path)
    ingest = Ingest(log)
    ingest.on_stream(StreamStart(True, _NoLink()))
    # The connection dies after two events of the 11th transaction.
    cut = 3 + 10 * 3 + 2
    ingest.feed([artificial_rotate("mariadb-bin.000001"), *events[:cut]])
    asyncio.run(ingest.on_end())
    assert str(log.state) == "0-1-10"
    # Reconnect by GTID: the primary replays its header, then an artificial GTID_LIST
    # marking where it resumes, then the 11th transaction again.
    resume = struct.unpack_from("<I", events[3 + 10 * 3 - 1], 13)[0]
    fde_again = build.copy_fde(events[0], log_pos=struct.unpack_from("<I", events[0], 13)[0],
                               created=0)
    marker = build.gtid_list([Gtid(0, 1, 10)], server_id=1, log_pos=resume, artificial=True)
    ingest.feed([artificial_rotate("mariadb-bin.000001"), fde_again, events[1], events[2],
                 marker, *events[3 + 10 * 3 :]])
    log.close()
    seg = os.path.join(str(tmp_path), "relay-bin.000001")
    assert read_index(str(tmp_path), "relay-bin") == ["relay-bin.000001"]
    assert gtids_in([seg]) == gtids  # nothing lost, nothing twice
    types = [ev[4] for ev in read_binlog(seg)]
    assert types.count(EventType.FORMAT_DESCRIPTION) == 1  # no header replayed into it
    assert types.count(EventType.GTID_LIST) == 1
    assert log.stats.events_rewritten == 0  # still aligned with the primary's file


def test_primary_rotation_seals_and_mirrors_the_next_file(tmp_path: pathlib.Path) -> None:
    first = [Gtid(0, 1, s) for s in range(1, 6)]
    second = [Gtid(0, 1, s) for s in range(6, 11)]
    _, ev1 = primary_file("mariadb-bin.000001", first, [], next_file="mariadb-bin.000002")
    data2, ev2 = primary_file("mariadb-bin.000002", second, [Gtid(0, 1, 5)])
    log = new_log(tmp_path)
    ingest = Ingest(log)
    ingest.on_stream(StreamStart(True, _NoLink()))
    ingest.feed([artificial_rotate("mariadb-bin.000001"), *ev1,
                 artificial_rotate("mariadb-bin.000002"), *ev2])
    log.close()
    names = read_index(str(tmp_path), "relay-bin")
    assert names == ["relay-bin.000001", "relay-bin.000002"]
    last = read_binlog(os.path.join(str(tmp_path), names[0]))[-1]
    assert last[4] == EventType.ROTATE and b"relay-bin.000002" in last
    with open(os.path.join(str(tmp_path), names[1]), "rb") as f:
        assert f.read() == data2  # the second segment mirrors the second file exactly
    assert gtids_in([os.path.join(str(tmp_path), n) for n in names]) == first + second
