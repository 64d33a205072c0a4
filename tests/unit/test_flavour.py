"""The flavour object (relay/binlog/flavour.py) and what both position types answer alike."""

from __future__ import annotations

import pytest

from relay.binlog import build
from relay.binlog.constants import EventType
from relay.binlog.flavour import Flavour, header_position
from relay.binlog.gtid import GtidSet, GtidState, MysqlGtid

UUID_A = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
UUID_B = "4e11fa47-71ca-11e1-9e33-c80aa9429562"


def test_a_flavour_is_known_by_its_version_position_and_header() -> None:
    assert Flavour.of_version("10.11.9-MariaDB-log") is Flavour.MARIADB
    assert Flavour.of_version("11.8.9-MariaDB-0+deb13u1 from Debian-log") is Flavour.MARIADB
    assert Flavour.of_version("9.7.4-2") is Flavour.MYSQL
    assert Flavour.of_position(GtidState()) is Flavour.MARIADB
    assert Flavour.of_position(GtidSet()) is Flavour.MYSQL
    assert Flavour.MARIADB.header_event is EventType.GTID_LIST
    assert Flavour.MYSQL.header_event is EventType.PREVIOUS_GTIDS
    assert Flavour.MYSQL.executed_variable == "gtid_executed"


@pytest.mark.parametrize(("flavour", "text"), [
    (Flavour.MARIADB, "0-1-100,1-2-5"), (Flavour.MYSQL, f"{UUID_A}:1-100:200,{UUID_B}:7")])
def test_positions_round_trip_through_their_header_event(flavour: Flavour, text: str) -> None:
    position = flavour.parse(text)
    for checksum in (False, True):
        event = build.position_event(position, server_id=1, log_pos=0, checksum=checksum)
        assert event[4] == flavour.header_event
        assert header_position(event, checksum) == position
        assert str(flavour.decode_header(event, checksum)) == str(position)
    with pytest.raises(ValueError):
        flavour.parse("not a position")
    assert len(flavour.empty()) == 0


def test_first_missing_sees_gaps_only_where_the_position_has_been() -> None:
    log = GtidSet.parse(f"{UUID_A}:1-5:8-10")
    assert log.first_missing(GtidSet.parse(f"{UUID_A}:2-3:7,{UUID_B}:1")) == \
        MysqlGtid.parse(f"{UUID_A}:7")
    assert log.first_missing(GtidSet.parse(f"{UUID_A}:1-5,{UUID_B}:1-9")) is None
    state = GtidState.parse("0-1-5")
    assert str(state.first_missing(GtidState.parse("0-1-7,1-1-3"))) == "0-1-7"
    assert state.first_missing(GtidState.parse("0-1-5,2-1-9")) is None


def test_a_mismatch_names_both_flavours() -> None:
    words = Flavour.MYSQL.mismatch(Flavour.MARIADB, "the position 0-1-5")
    assert "MySQL" in words and "MariaDB" in words and "0-1-5" in words


# --- tagged GTIDs (MySQL 8.3+) -------------------------------------------------------------

# A GTID_TAGGED_LOG_EVENT body (after the common header, checksum cut) and the
# PREVIOUS_GTIDS body of the next file, both as MySQL 9.7.4 wrote them after
# `SET gtid_next = 'AUTOMATIC:nightly'` (and `:Alpha`) on a fresh server.
TAGGED_BODY = bytes.fromhex(
    "02760000000 2a60a2102f502c5036622c503e5022604f1030000000204040 60e6e696768746c79"
    "08080a0c0c7f23092f20f0610610950412 83120b".replace(" ", ""))
TAGGED_SOURCE = "530588bd-f133-11f1-b913-02fc00000001"
PREVIOUS_TAGGED = bytes.fromhex(
    "01030000000000017e0c5fb1f13311f18cf002fc0000000100010000000000000001000000000000"
    "0004000000000000007e0c5fb1f13311f18cf002fc000000010a616c706861010000000000000001"
    "0000000000000002000000000000007e0c5fb1f13311f18cf002fc000000010e6e696768746c7901"
    "0000000000000001000000000000000200000000000000")
PREVIOUS_TEXT = "7e0c5fb1-f133-11f1-8cf0-02fc00000001:1-3:alpha:1:nightly:1"


def test_a_tagged_gtid_event_names_its_source_tag_and_number() -> None:
    from relay.binlog.group import txn_of
    from relay.binlog.serialization import decode_tagged_gtid

    fields = decode_tagged_gtid(TAGGED_BODY)
    assert (fields.gno, fields.tag, fields.last_committed, fields.sequence_number) == \
        (1, "nightly", 2, 3)
    assert fields.transaction_length == 293
    assert fields.immediate_commit_ts == fields.original_commit_ts == 1796533820262691
    event = bytes(4) + bytes([EventType.GTID_TAGGED]) + bytes(14) + TAGGED_BODY + bytes(4)
    assert txn_of(event) == MysqlGtid.parse(f"{TAGGED_SOURCE}:nightly:1")
    assert str(txn_of(event)) == f"{TAGGED_SOURCE}:nightly:1"


def test_tagged_gtid_sets_read_and_write_as_mysql_does() -> None:
    position = GtidSet.decode(PREVIOUS_TAGGED)
    assert str(position) == PREVIOUS_TEXT
    assert position.encode() == PREVIOUS_TAGGED  # byte for byte what MySQL wrote
    assert GtidSet.parse(PREVIOUS_TEXT.replace("alpha", "Alpha")) == position
    assert position.contains(MysqlGtid.parse("7e0c5fb1-f133-11f1-8cf0-02fc00000001:alpha:1"))
    assert not position.contains(
        MysqlGtid.parse("7e0c5fb1-f133-11f1-8cf0-02fc00000001:alpha:2"))
    # the tag is its own sequence: gno 1 of `nightly` is not gno 1 of the untagged one
    untagged = GtidSet.parse("7e0c5fb1-f133-11f1-8cf0-02fc00000001:1-3")
    assert not untagged.covers(position) and position.covers(untagged)
    assert untagged.encode()[:8] == (1).to_bytes(8, "little")  # untagged form kept
    assert str(untagged.first_missing(position) or "") == ""  # unseen tags: no gap
    with pytest.raises(ValueError):
        GtidSet.parse(f"{UUID_A}:1-3:9tag:1")


def test_the_gtid_index_keeps_tags() -> None:
    from relay.relaylog import gtid_index

    txns = [MysqlGtid.parse(f"{UUID_A}:1"), MysqlGtid.parse(f"{UUID_A}:nightly:1"),
            MysqlGtid.parse(f"{UUID_B}:{'t' * 32}:9")]
    data = gtid_index.file_header(txns[0]) + b"".join(
        gtid_index.pack(t, 100 * n, 100 * n + 50) for n, t in enumerate(txns))
    assert [e.txn for e in gtid_index.parse(data + b"torn")] == txns
    old = gtid_index.MYSQL_V1_MAGIC + gtid_index.MYSQL_V1_RECORD.pack(
        txns[0].sid.bytes, 5, 4, 90)
    assert [(e.txn, e.start, e.end) for e in gtid_index.parse(old)] == \
        [(MysqlGtid(txns[0].sid, 5), 4, 90)]


def test_serialized_integers_round_trip() -> None:
    from relay.binlog.serialization import (
        read_signed,
        read_unsigned,
        write_signed,
        write_unsigned,
    )

    for value in (0, 1, 127, 128, 1 << 14, (1 << 56) - 1, 1 << 56, (1 << 64) - 1):
        encoded = write_unsigned(value)
        assert read_unsigned(encoded, 0) == (value, len(encoded))
    for value in (0, 1, -1, -(1 << 63), (1 << 63) - 1):
        assert read_signed(write_signed(value), 0)[0] == value


def test_a_mysql_dump_request_and_heartbeat_as_mysql_9_7_sends_them() -> None:
    import struct

    from relay.binlog.build import heartbeat_v2
    from relay.downstream.session import parse_dump_gtid
    from relay.errors import RemoteProtocolError

    wanted = GtidSet.parse(f"{UUID_A}:1-5:nightly:2,{UUID_B}:7")
    body = wanted.encode()
    payload = (b"\x1e" + struct.pack("<HII", 0x02, 77, 0) + struct.pack("<QI", 4, len(body))
               + body)
    request = parse_dump_gtid(payload)
    assert (request.flags, request.server_id, request.name, request.pos) == (2, 77, "", 4)
    assert request.gtid_set == wanted
    nuls = (b"\x1e" + struct.pack("<HII", 0x04, 77, 3) + b"\0\0\0"
            + struct.pack("<QI", 4, len(body)) + body)   # python-mysql-replication's
    assert parse_dump_gtid(nuls).name == "" and parse_dump_gtid(nuls).gtid_set == wanted
    with pytest.raises(RemoteProtocolError):
        parse_dump_gtid(payload[:-3])   # the set cut short
    with pytest.raises(RemoteProtocolError):
        parse_dump_gtid(payload[:9])
    # A HEARTBEAT_LOG_EVENT_V2 as a MySQL 9.7.4 primary sent it (header, body, CRC).
    seen = bytes.fromhex("0000000029010000002a0000009e00000000000"
                         "10d62696e6c6f672e3030303030310201 9e0056256a4a".replace(" ", ""))
    assert heartbeat_v2("binlog.000001", server_id=1, log_pos=158) == seen


def test_a_clients_gtid_set_is_held_to_mysqls_rules_and_costs_what_it_weighs() -> None:
    import struct
    import uuid

    from relay.errors import MalformedEvent

    sid = uuid.UUID(UUID_A)

    def encoded(intervals: list[tuple[int, int]]) -> bytes:
        return (struct.pack("<Q", 1) + sid.bytes + struct.pack("<Q", len(intervals))
                + b"".join(struct.pack("<QQ", s, e) for s, e in intervals))

    # What 1 MiB of command holds (it took minutes, a re-sort per interval, on the loop).
    many = [(2 * i + 1, 2 * i + 2) for i in range(65_536)]
    position = GtidSet.decode(encoded(many))
    assert len(next(iter(position.intervals()))[1]) == 65_536
    assert position.contains(MysqlGtid(sid, 131_071))
    assert not position.contains(MysqlGtid(sid, 131_072))
    for bad in ([(5, 6), (1, 2)], [(1, 3), (2, 5)], [(1, 3), (3, 5)], [(0, 2)],
                [(1, (1 << 63) + 1)]):
        with pytest.raises(MalformedEvent):
            GtidSet.decode(encoded(bad))
    tagged = bytearray(GtidSet.parse(f"{UUID_A}:t:1").encode())
    tagged[8 + 16 + 1] = 0xE9   # a tag byte outside ASCII
    with pytest.raises(MalformedEvent):
        GtidSet.decode(bytes(tagged))
