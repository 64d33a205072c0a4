import contextlib
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay.errors import RemoteProtocolError, ServerError
from relay.wire import auth, handshake
from relay.wire.codec import lenenc_int, lenenc_str, read_lenenc_int, read_lenenc_str
from relay.wire.packets import PacketReader, frame
from relay.wire.replies import (
    build_err,
    parse_err,
    parse_ok,
    parse_text_row,
    text_result_set,
)


@pytest.mark.parametrize("value,encoded", [
    (0, b"\x00"), (250, b"\xfa"), (251, b"\xfc\xfb\x00"), (0xFFFF, b"\xfc\xff\xff"),
    (0x10000, b"\xfd\x00\x00\x01"), (1 << 24, b"\xfe\x00\x00\x00\x01\x00\x00\x00\x00"),
])
def test_lenenc_int_table(value: int, encoded: bytes) -> None:
    assert lenenc_int(value) == encoded
    assert read_lenenc_int(encoded, 0) == (value, len(encoded))


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_lenenc_int_roundtrip(value: int) -> None:
    enc = lenenc_int(value)
    assert read_lenenc_int(enc, 0) == (value, len(enc))


@given(st.binary(max_size=300))
def test_lenenc_str_roundtrip(value: bytes) -> None:
    enc = lenenc_str(value)
    assert read_lenenc_str(enc + b"tail", 0) == (value, len(enc))


def test_frame_small_and_reader() -> None:
    data, nxt = frame(b"hello", 3)
    assert data == b"\x05\x00\x00\x03hello" and nxt == 4
    r = PacketReader()
    r.next_seq = 3
    r.feed(data[:4])
    assert r.next_payload() is None
    r.feed(data[4:])
    assert r.next_payload() == b"hello"


@pytest.mark.parametrize("size", [0xFFFFFF - 1, 0xFFFFFF, 0xFFFFFF + 5, 2 * 0xFFFFFF])
def test_frame_splits_16mib_and_reader_joins(size: int) -> None:
    payload = os.urandom(64) * (size // 64) + b"x" * (size % 64)
    data, nxt = frame(payload, 250)
    expected_packets = size // 0xFFFFFF + 1
    assert nxt == (250 + expected_packets) % 256
    r = PacketReader()
    r.next_seq = 250
    for i in range(0, len(data), 1 << 20):  # trickle it in
        r.feed(data[i : i + (1 << 20)])
    assert r.next_payload() == payload
    assert r.next_payload() is None


def test_reader_rejects_out_of_order() -> None:
    r = PacketReader()
    r.feed(b"\x01\x00\x00\x05x")
    with pytest.raises(RemoteProtocolError, match="out of order"):
        r.next_payload()


def test_err_roundtrip() -> None:
    err = parse_err(build_err(1236, "Could not find first log file", "HY000"))
    assert (err.errno, err.sqlstate, err.message) == (1236, "HY000",
                                                     "Could not find first log file")


def test_ok_packet() -> None:
    ok = parse_ok(b"\x00\x00\x00\x02\x00\x00\x00")
    assert ok.status == 2 and ok.affected_rows == 0


def test_result_set_rows_parse() -> None:
    payloads = text_result_set(["Variable_name", "Value"], [["server_id", "4242"]])
    assert payloads[0] == b"\x02"
    assert payloads[3][0] == 0xFE  # EOF after the column definitions
    assert parse_text_row(payloads[4], 2) == [b"server_id", b"4242"]
    assert parse_text_row(text_result_set(["x"], [[None]])[3], 1) == [None]


def test_native_password_both_sides() -> None:
    salt = os.urandom(20)
    stored = auth.native_password_hash(b"secret")
    assert auth.native_verify(stored, salt, auth.native_scramble(b"secret", salt))
    assert not auth.native_verify(stored, salt, auth.native_scramble(b"wrong", salt))
    assert auth.native_verify(b"", salt, b"")
    assert not auth.native_verify(stored, salt, b"")


def test_greeting_roundtrip() -> None:
    scramble = bytes(range(1, 21))
    g = handshake.parse_greeting(handshake.build_greeting("10.11.19-MariaDB-log", 7, scramble))
    assert g.server_version == "10.11.19-MariaDB-log"
    assert g.connection_id == 7 and g.scramble == scramble
    assert g.auth_plugin == "mysql_native_password"
    assert not g.capabilities & 1  # MariaDB: extended capabilities present


def test_response_roundtrip() -> None:
    payload = handshake.build_response("repl", b"\x01" * 20, "mysql_native_password")
    r = handshake.parse_response(payload)
    assert r.user == "repl" and r.auth_response == b"\x01" * 20
    assert r.plugin == "mysql_native_password"


def test_observed_replica_response_parses() -> None:
    # caps 0x8038A205 as a 10.11 replica sends (protocol doc 2.2), with connect attributes.
    payload = (bytes.fromhex("05a23880") + b"\x00\x00\x00\x40" + b"\x08" + b"\x00" * 23
               + b"repl\x00" + b"\x14" + b"\xaa" * 20 + b"mysql_native_password\x00"
               + b"\x05\x04_pid\x011")
    r = handshake.parse_response(payload)
    assert r.user == "repl" and r.auth_response == b"\xaa" * 20


def test_greeting_error_packet_raises_server_error() -> None:
    with pytest.raises(ServerError) as info:
        handshake.parse_greeting(build_err(1129, "Host is blocked"))
    assert info.value.errno == 1129


@given(st.binary(max_size=200))
def test_handshake_parsers_never_crash(data: bytes) -> None:
    for fn in (handshake.parse_greeting, handshake.parse_response):
        with contextlib.suppress(RemoteProtocolError, ServerError):
            fn(data)


@given(st.binary(max_size=400))
def test_packet_reader_never_crashes(data: bytes) -> None:
    r = PacketReader(max_payload=1 << 16)
    r.feed(data)
    try:
        while r.next_payload() is not None:
            pass
    except RemoteProtocolError:
        pass
