"""The relay log's segment placement driven by a writer other than the ingest: a binlog
file's events read in order, as an importer of archived files reads them (no server, no
artificial ROTATE): the segment is the file, byte for byte up to its ROTATE, and the next
file's events go into a segment of their own; with SegmentNaming.SOURCE each segment
keeps its file's name and is the file byte for byte."""

from __future__ import annotations

import os
import pathlib
import struct

import pytest

from relay.binlog import walk
from relay.binlog.constants import EventType
from relay.binlog.gtid import Gtid
from relay.config import SyncMode, SyncPolicy
from relay.errors import SegmentOrder
from relay.relaylog.log import RelayLog
from relay.relaylog.placement import SegmentNaming, SegmentPlacement
from tests.unit.test_ingest import new_log, primary_file

_NON_TRANSACTION = frozenset(map(int, (EventType.FORMAT_DESCRIPTION, EventType.ROTATE,
                                       EventType.STOP, EventType.GTID_LIST,
                                       EventType.BINLOG_CHECKPOINT)))


def write_files(tmp_path: pathlib.Path, files: list[bytes],
                naming: SegmentNaming = SegmentNaming.OWN, basename: str = "relay-bin",
                first: str | None = None) -> None:
    if naming is SegmentNaming.OWN:
        log = new_log(tmp_path)
    else:
        log = RelayLog(str(tmp_path), basename=basename, sync=SyncPolicy(SyncMode.OFF))
        log.open()
    placement = SegmentPlacement(None, True, naming)
    placement.source_file = first  # (a dump's artificial ROTATE names it)
    txn = Gtid(0, 0, 0)
    for data in files:
        w = log.appender()
        for pos, size in walk.spans(data, 4):
            ev = data[pos : pos + size]
            if ev[4] in _NON_TRANSACTION:
                placement.file_event(w, ev, ev[4], True)
                continue
            if ev[4] == EventType.GTID:
                placement.before_transaction(w)
                w.begin_group()
                seq, domain = struct.unpack_from("<QI", ev, 19)
                txn = Gtid(domain, struct.unpack_from("<I", ev, 5)[0], seq)
            w.append(ev, struct.unpack_from("<I", ev, 13)[0], size)
            if ev[4] == EventType.XID:
                w.commit(txn)
        placement.end_of_batch(w)
        w.finish()
    log.close()


def test_a_file_read_in_order_becomes_its_segment(tmp_path: pathlib.Path) -> None:
    first, _ = primary_file("mariadb-bin.000001", [Gtid(0, 1, s) for s in range(1, 6)], [],
                            next_file="mariadb-bin.000002")
    second, _ = primary_file("mariadb-bin.000002", [Gtid(0, 1, s) for s in range(6, 9)],
                             [Gtid(0, 1, 5)])
    write_files(tmp_path, [first, second])
    with open(os.path.join(str(tmp_path), "relay-bin.000001"), "rb") as f:
        segment = f.read()
    # The file's events to its ROTATE, which the log writes itself, naming its own next
    # segment (segments do not keep a source's file names yet).
    rotate = max(pos for pos, _ in walk.spans(first, 4))
    assert first[rotate + 4] == EventType.ROTATE
    assert segment[:rotate] == first[:rotate]
    assert segment[rotate + 4] == EventType.ROTATE and b"relay-bin.000002" in segment[rotate:]
    with open(os.path.join(str(tmp_path), "relay-bin.000002"), "rb") as f:
        assert f.read() == second


def test_segments_keep_the_files_names_and_bytes(tmp_path: pathlib.Path) -> None:
    first, _ = primary_file("mysql-bin.000042", [Gtid(0, 1, s) for s in range(1, 6)], [],
                            next_file="mysql-bin.000043")
    second, _ = primary_file("mysql-bin.000043", [Gtid(0, 1, s) for s in range(6, 9)],
                             [Gtid(0, 1, 5)], next_file="mysql-bin.000044")
    write_files(tmp_path, [first, second], SegmentNaming.SOURCE, "mysql-bin",
                first="mysql-bin.000042")
    for name, data in (("mysql-bin.000042", first), ("mysql-bin.000043", second)):
        with open(os.path.join(str(tmp_path), name), "rb") as f:
            assert f.read() == data, name
    with open(os.path.join(str(tmp_path), "mysql-bin.index")) as f:
        assert f.read().split() == ["./mysql-bin.000042", "./mysql-bin.000043"]
    assert not os.path.exists(os.path.join(str(tmp_path), "mysql-bin.000044"))


def test_a_file_of_another_series_is_not_a_segment(tmp_path: pathlib.Path) -> None:
    other, _ = primary_file("binlog.000001", [Gtid(0, 1, 1)], [])
    with pytest.raises(SegmentOrder, match=r"binlog\.000001 cannot follow"):
        write_files(tmp_path, [other], SegmentNaming.SOURCE, "mysql-bin",
                    first="binlog.000001")
