"""Fuzz targets: one per surface that reads bytes from the network, each a function of
bytes that may only end in a clean error (a RelayError: ProtocolError, MalformedEvent,
TapError, ServerError, ...). Anything else it raises, a hang or unbounded memory is a bug.

Shared by the hypothesis tests in the suite (tests/unit/test_fuzz.py) and the long runs
in bench/fuzz.py (atheris, a million inputs and more per surface). Each target comes with
seeds: valid inputs that mutations start from, so the fuzzers reach past the first
length check.

Surfaces:
- handshake: a downstream client's packets before login (packet framing, the handshake
  response, a semi-sync acknowledgement);
- statements: a downstream client's SQL (the relay answers it itself, over a small relay
  log: SHOW BINLOG EVENTS and BINLOG_GTID_POS read it);
- tap: a tap client's frames (framing and msgpack);
- upstream: what a primary sends (greeting, auth switch, OK/ERR, the dump stream);
- binlog: events through the codec to decoded row changes;
- kernels: the compiled kernels against their pure-Python twins (relay/kernels): the same
  bytes through both must give the same output and the same errors; a difference raises
  AssertionError, which is not a clean error. (atheris instruments the twins' Python, not
  the compiled C: it steers by the specification's branches.)
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import shutil
import struct
import tempfile
import zlib
from collections.abc import Callable
from functools import cache
from typing import Any

from relay.binlog.changes import ChangeStream, SourceEvent
from relay.binlog.constants import BINLOG_MAGIC
from relay.binlog.decoder import StreamDecoder
from relay.binlog.file import iter_file_events
from relay.binlog.tablemap import TypeHints
from relay.downstream.answers import Answers
from relay.downstream.replies import Deferred
from relay.downstream.semisync import parse_ack
from relay.downstream.sessionvars import SessionVars
from relay.downstream.statements import split_statements
from relay.errors import RelayError
from relay.relaylog.log import RelayLog
from relay.tap import protocol
from relay.wire.auth import CACHING_SHA2, ClientAuth
from relay.wire.dumpstream import DumpReader
from relay.wire.handshake import (
    build_greeting,
    build_response,
    parse_auth_switch,
    parse_greeting,
    parse_response,
)
from relay.wire.login_policy import LoginPolicy
from relay.wire.packets import PacketReader, frame
from relay.wire.replies import build_ok, parse_ok, raise_if_err
from tests.helpers import write_transactions

HERE = os.path.dirname(os.path.abspath(__file__))
CAPTURE = os.path.join(HERE, "data", "mariadb", "types.000001")


def handshake(data: bytes) -> None:
    reader = PacketReader(max_payload=1 << 20)
    reader.next_seq = data[3] if len(data) > 3 else 0  # the response's or an ack's
    reader.feed(data)
    while (payload := reader.next_payload()) is not None:
        if payload[:1] == b"\xef":
            parse_ack(payload)
        else:
            parse_response(payload)


@cache
def _answers() -> Answers:
    """Answers over a relay log of a few transactions (made once per process)."""
    directory = tempfile.mkdtemp(prefix="relay-fuzz-")
    atexit.register(shutil.rmtree, directory, ignore_errors=True)  # under hypothesis
    log = RelayLog(directory)
    log.open()
    write_transactions(log.appender(), range(1, 6))
    return Answers(log, server_id=4242)


def statements(data: bytes) -> None:
    answers = _answers()
    text = data.decode("utf-8", "replace")
    for sql in split_statements(text) or [text]:
        reply = answers.answer(sql, SessionVars())
        while isinstance(reply, Deferred):
            reply = reply.run()


def tap(data: bytes) -> None:
    decoder = protocol.FrameDecoder(max_frame=1 << 20)
    for i in range(0, len(data), 7):
        for request in decoder.feed(data[i : i + 7]):
            if isinstance(request, dict):
                at = request.get("at")
                if isinstance(at, int):
                    protocol.split_position(at)


def upstream(data: bytes) -> None:
    """The first byte picks what the rest is: a greeting, an auth switch, an OK/ERR
    reply, (2 and 3) the dump stream (3: with semi-sync headers), or (4) the packets of an
    authentication exchange, split on NUL bytes, into the client's side of it."""
    kind, rest = data[:1], data[1:]
    if kind == b"\x00":
        parse_greeting(rest)
    elif kind == b"\x01":
        if rest[:1] == b"\xfe":
            parse_auth_switch(rest)
        elif rest[:1] == b"\x00":
            parse_ok(rest)
        else:
            raise_if_err(rest)
    elif kind in (b"\x02", b"\x03"):
        reader = DumpReader(semi_sync=kind == b"\x03", max_event=1 << 20)
        cut = len(rest) // 2
        for part in (rest[:cut], rest[cut:]):
            reader.feed(part)
    elif kind == b"\x04":
        auth = ClientAuth(b"pw", tls=rest[:1] == b"t", policy=LoginPolicy(allow_key_request=True))
        auth.first_response(CACHING_SHA2, b"0123456789abcdefghij")
        for packet in rest[1:].split(b"\0\0"):
            if packet[:1] in (b"\x00", b"\xff"):
                return
            auth.answer(packet)


@cache
def _capture_events() -> list[bytes]:
    """The events of a real MariaDB binlog with every column type."""
    with open(CAPTURE, "rb") as f:
        raw = f.read()
    out, pos = [], 4
    while pos + 19 <= len(raw):
        size = struct.unpack_from("<I", raw, pos + 9)[0]
        if size < 19 or pos + size > len(raw):
            break
        out.append(raw[pos : pos + size])
        pos += size
    return out


def binlog(data: bytes) -> None:
    """`data` is the rest of a binlog file whose FORMAT_DESCRIPTION and TABLE_MAPs are the
    capture's: read as `relay changes` reads a file, its row changes decoded completely."""
    events = _capture_events()
    head = b"".join(e for e in events if e[4] in (15, 19))  # FDE, TABLE_MAP
    f = io.BytesIO(BINLOG_MAGIC + head + data)
    source = (SourceEvent("fuzz", raw.offset, raw.data)
              for raw in iter_file_events(f, where="fuzz", verify_crc=False))
    stream = ChangeStream(source, hints=_hints())
    # One decoder for every input: its table maps (the same bodies each time) keep their
    # compiled row codecs, which cost 2 ms each to build and would be all the run's time.
    stream.decoder = _decoder()
    for change in stream.changes():
        _ = (change.before, change.after)


@cache
def _decoder() -> StreamDecoder:
    return StreamDecoder(_hints())


@cache
def _hints() -> TypeHints:
    with open(os.path.join(HERE, "data", "mariadb", "hints.json")) as f:
        return TypeHints.parse(f"{k}={v}" for k, v in json.load(f).items())


_TEXT = 9
# decode_columns' steps (relay/kernels/protocol.py ColumnStep): one of each kind and width.
_COLUMN_STEPS = [(1, 1, 1, 1), (1, 1, 0, 2), (1, 2, 1, 2), (1, 3, 1, 4), (1, 4, 0, 8),
                 (1, 8, 1, 8), (1, 8, 0, 16), (2, 0, 0, 0), (3, 0, 0, 0), (4, 0, 0, 0),
                 (5, 10, 2, 5), (5, 38, 10, 18), (6, 0, 0, 0), (7, 0, 0, 0), (7, 6, 0, 0),
                 (8, 3, 0, 0), (_TEXT, 1, 0, 0), (_TEXT, 2, 1, 0), (_TEXT, 1, 0, 8),
                 (_TEXT, 4, 2, 0)]
_CHARMAPS = (b"".join(bytes((len(c.encode()),)) + c.encode().ljust(3, b"\0")
                      for c in bytes(range(256)).decode("cp1252", "replace")),)
# row_values' own steps: TIME(0), TIME(4), an ENUM of three names, an ENUM without names,
# BIT(12), a SET of three names, a SET without names.
_VALUE_STEPS = [(10, 0, 0, 0), (10, 4, 0, 0), (11, 1, 1, 0), (11, 2, 0, 0), (12, 2, 0, 0),
                (13, 1, 1, 0), (13, 8, 0, 0)]
_MEMBERS = (("a", "bb", "ccc"),)


def kernels(data: bytes) -> None:
    """The first byte picks the kernel (its low two bits, and bit 2 for the last two) and a
    sequence id (the rest); the rest of the input is the kernel's buffer: dump packets for
    read_dump, stored events for frame_stored (with whole_events and checked_events) and
    the ingest's and the rules' scans, a
    column layout then rows for splice_rows, a plan then rows for decode_columns and
    json_images."""
    import relay.kernels as k
    from relay.kernels import pure
    from relay.kernels.protocol import CleanKind, EventKind

    compiled = k.compiled_kernels()
    if compiled is None or not data:
        return
    pick, buf = data[0], data[1:]
    kinds = bytes(EventKind.PLAIN if t in (19, 23, 30, 31, 32, 160) else EventKind.GTID
                  if t == 162 else EventKind.XID if t == 16 else EventKind.OTHER
                  for t in range(256))
    clean_kinds = bytes(CleanKind.GTID if t == 162 else CleanKind.MYSQL_GTID if t in (33, 34)
                        else CleanKind.QUERY if t == 2 else CleanKind.TABLE_MAP if t == 19
                        else CleanKind.ROWS if t in (23, 30, 31, 32) else CleanKind.ANNOTATION
                        if t == 160 else CleanKind.XID if t == 16 else CleanKind.OTHER
                        for t in range(256))
    outcomes = []
    for twin in (pure, compiled):
        out: bytearray = bytearray(b"x")
        asked: list[tuple[int, ...]] = []
        try:
            if pick & 3 == 1:
                got: object = (twin.frame_stored(out, buf, pick >> 2),
                               twin.whole_events(buf, pick >> 2, len(buf)),
                               twin.checked_events(buf, pick >> 2, len(buf),
                                                   4 if pick & 4 else 0))
            elif pick & 3 == 0:
                marks: list[int] = []
                tally = [0] * 256
                plain = bytes((t * 7 + pick) % 3 != 0 for t in range(256))
                got = (twin.read_dump(buf, pick % 3, pick >> 2, pick * 1000 - 1, plain, tally,
                                      out, marks), marks, tally)
            elif pick & 3 == 2:
                plan: list[tuple[int, ...]] = []
                got = (twin.scan_ingest(buf, 0, [len(buf) // 2, len(buf)] if pick & 4 else None,
                                        0, kinds, pick * 37, bool(pick & 8), bool(pick & 16),
                                        pick * 50, plan), plan)
            elif pick & 4 and pick & 32:  # decode_columns: a plan from the next bytes
                steps = [_COLUMN_STEPS[b % len(_COLUMN_STEPS)]
                         for b in buf[1 : 2 + buf[0] % 6]] if buf else []
                columns = [x for step in steps for x in step] or [1, 4, 1, 4]
                images = 1 + (pick >> 3 & 1)
                sinks = [[bytearray(4 if i % 3 == 1 and steps and
                                    steps[i // 3][0] == _TEXT else 0)
                          for i in range(len(columns) // 4 * 3)] for _ in range(images)]
                got = (twin.decode_columns(buf, min(len(buf), 7), len(buf), tuple(columns),
                                           _CHARMAPS, sinks, [pick >> 6] * images),
                       [bytes(b) for sink in sinks for b in sink])
                texts = [[bytearray(), bytearray(4), bytearray()] for _ in range(images)]
                keys = tuple(b',"c":' for _ in range(len(columns) // 4))
                got = (got, twin.json_images(buf, min(len(buf), 7), len(buf), tuple(columns),
                                             _CHARMAPS, keys, texts, [pick >> 6] * images),
                       [bytes(b) for sink in texts for b in sink])
            elif pick & 4:  # splice_rows: the next bytes are the layout, then rows
                widths = bytes((1, 2, 4, 8, 0x81, 0x82, 0x84, 3)[b % 8] for b in buf[:6])
                # (modes 0 to 2 from the byte's high bits; by value only with a length prefix)
                modes = bytes(1 if m == 2 and not w & 0x80 else m
                              for w, m in zip(widths, ((b >> 6) % 3 for b in buf[:6]),
                                              strict=True))
                layout = (widths or b"\x04", modes or b"\x01")
                images = 1 + (pick >> 3 & 1)

                def mask(image: int, column: int) -> Callable[[bytes], bytes | None]:
                    def replace(raw: bytes) -> bytes | None:
                        asked.append((image, column, len(raw)))  # noqa: B023
                        return None if (column + pick) % 3 == 0 else raw[: column % 4 + 1]
                    return replace

                got = twin.splice_rows(buf[6:], [layout] * images,
                                       [tuple(mask(k, i) if m else None
                                              for i, m in enumerate(layout[1]))
                                        for k in range(images)])
            else:
                def judge(start: int, end: int) -> int:
                    asked.append((start, end))  # noqa: B023
                    return -1 if (start + pick) % 5 == 0 else start % 7

                cuts: list[int] = []
                known = {buf[19:40]: pick % 3 - 1}  # (a map judged before, or again)
                got = (twin.scan_clean(buf, 0, clean_kinds, 6, 4 if pick & 8 else 0, judge,
                                       known, bool(pick & 16), cuts),
                       cuts, known)
        except RelayError as exc:
            got = ("error", type(exc), str(exc))
        outcomes.append((got, bytes(out), asked))
    if outcomes[0] != outcomes[1]:
        raise AssertionError(f"the kernels' twins disagree: {outcomes}")


def text_rows(data: bytes) -> None:
    """The snapshot's row reader on a text result set from the server: the first byte
    gives the columns (low 3 bits + 1) and the rows taken per call (the rest), the next
    ones each column's JSON step; the rest is the rows. The text-result kernels' twins must
    agree, and TextResult must end in rows or a clean error."""
    import relay.kernels as k
    from relay.kernels import pure
    from relay.kernels.protocol import TextStep
    from relay.tap.json_images import JsonImages
    from relay.tap.textresult import TextResult

    compiled = k.compiled_kernels()
    if compiled is None or len(data) < 2:
        return
    ncols, limit = (data[0] & 7) + 1, 1 + (data[0] >> 3)
    plan = tuple(1 + b % len(TextStep) for b in data[1 : 1 + ncols].ljust(ncols, b"\0"))
    keys = tuple(b',"c":' for _ in plan)
    buf = data[1 + ncols :]
    outcomes = []
    for twin in (pure, compiled):
        rows: list[tuple[bytes | None, ...]] = []
        sink = [bytearray(), bytearray(4), bytearray()]
        outcomes.append((twin.text_rows(buf, 0, len(buf), ncols, rows, limit), rows,
                         twin.json_text_rows(buf, 0, len(buf), plan, keys, sink, 0, limit),
                         [bytes(b) for b in sink]))
    if outcomes[0] != outcomes[1]:
        raise AssertionError(f"the text-result kernels' twins disagree: {outcomes}")
    at = 0

    def read(size: int) -> bytes:
        nonlocal at
        if at >= len(buf):
            raise RelayError("the result's bytes ended")
        at += min(size, limit)
        return buf[at - min(size, limit) : at]

    def error(payload: bytes) -> Exception:
        return ServerSaid(f"error packet {payload[:3]!r}")

    result = TextResult(read, error, ncols, "fuzz")
    images = JsonImages()
    with contextlib.suppress(ServerSaid):  # the server ended the rows with an error
        while result.json_into(images, plan, keys, lambda row: "{}", limit):
            pass


def change_lines(data: bytes) -> None:
    """`relay changes`' line kernel, both twins: `data` follows the capture's first 685
    bytes (its FORMAT_DESCRIPTION, GTID_LIST, checkpoint and two DDL transactions); each
    whole event's CRC is made right (else the kernel stops at the first), and the first
    byte picks the spill limit. Both must give the same lines, stops and callbacks, or
    the same error (a callback's own included: it is the kernel under test)."""
    from tests.unit.test_change_lines import run_kernel

    compiled = _kernels_compiled()
    if not data:
        return
    limit = (1, 200, 1 << 30)[data[0] % 3]
    blob = bytearray(_capture_head() + data[1:])
    pos = 685
    while pos + 19 <= len(blob):
        size = struct.unpack_from("<I", blob, pos + 9)[0]
        if size < 23 or pos + size > len(blob):
            break
        struct.pack_into("<I", blob, pos + size - 4, zlib.crc32(blob[pos : pos + size - 4]))
        pos += size
    from relay.kernels import pure

    outcomes = [run_kernel(twin, bytes(blob), limit, _decoder()) for twin in (pure, compiled)]
    if outcomes[0] != outcomes[1]:
        raise AssertionError(f"change_lines twins differ: {outcomes[0]!r:.300} / "
                             f"{outcomes[1]!r:.300}")


def row_values(data: bytes) -> None:
    """The row_values kernel, both twins: the first byte picks images per row (bit 0) and
    a plan of four of decode_columns' steps and its own (the rest); the rest of the input
    is rows.
    The same values (type and repr) and count, or -1 from both."""
    from relay.kernels import pure

    compiled = _kernels_compiled()
    if not data:
        return
    steps = [(_COLUMN_STEPS + _VALUE_STEPS)[((data[0] >> 1) + k * 5) % (len(_COLUMN_STEPS)
                                                                     + len(_VALUE_STEPS))]
             for k in range(4)]
    plan = tuple(x for step in steps for x in step)
    images = 1 + (data[0] & 1)
    outcomes = []
    for twin in (pure, compiled):
        out: list[tuple[Any, ...]] = []
        n = twin.row_values(data, 1, len(data), plan, _CHARMAPS, _MEMBERS, images, out)
        outcomes.append((n, [[(type(v), repr(v)) for v in row] for row in out]))
    if outcomes[0] != outcomes[1]:
        raise AssertionError(f"row_values twins differ: {outcomes[0]!r:.300} / "
                             f"{outcomes[1]!r:.300}")


def json_document(data: bytes) -> None:
    """The json_document kernel, both twins, on any bytes as a binary JSON document: the
    same value (type and repr, all the way down) or the same MalformedEvent."""
    from relay.binlog import jsonb
    from relay.errors import MalformedEvent
    from relay.kernels import pure

    compiled = _kernels_compiled()
    outcomes = []
    for twin in (pure, compiled):
        try:
            outcomes.append(("ok", _spelled(twin.json_document(data, jsonb.JsonUInt,
                                                               jsonb.decode_opaque,
                                                               jsonb.json_decimal))))
        except MalformedEvent as exc:
            outcomes.append(("error", str(exc)))
    if outcomes[0] != outcomes[1]:
        raise AssertionError(f"json_document twins differ: {outcomes[0]!r:.300} / "
                             f"{outcomes[1]!r:.300}")
    # the same bytes as a JSON column's document, written as JSON text by json_images
    from relay.kernels.protocol import ColumnStep

    row = b"\0" + len(data).to_bytes(4, "little") + data
    texts = []
    for twin in (pure, compiled):
        sinks = [[bytearray(b"\xff"), bytearray(4), bytearray()]]
        n = twin.json_images(row, 0, len(row), (ColumnStep.JSON, 4, 0, 0), (), (b'{"j":',),
                             sinks, [0])
        texts.append((n, bytes(sinks[0][2])))
    if texts[0] != texts[1]:
        raise AssertionError(f"json_images twins differ on a document: {texts[0]!r:.300} / "
                             f"{texts[1]!r:.300}")


def _spelled(value: Any) -> Any:
    if isinstance(value, dict):
        return [(k, _spelled(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [_spelled(v) for v in value]
    return type(value).__name__, repr(value)


@cache
def _capture_head() -> bytes:
    with open(CAPTURE, "rb") as f:
        return f.read(685)


@cache
def _kernels_compiled() -> Any:
    import relay.kernels as k

    compiled = k.compiled_kernels()
    assert compiled is not None, k.REASON
    return compiled


class ServerSaid(RelayError):
    code = "server_said"


TARGETS: dict[str, Callable[[bytes], None]] = {
    "handshake": handshake, "statements": statements, "tap": tap, "upstream": upstream,
    "binlog": binlog, "kernels": kernels, "text_rows": text_rows,
    "change_lines": change_lines, "row_values": row_values, "json_document": json_document,
}


def seeds(surface: str) -> list[bytes]:
    """Valid inputs of a surface."""
    if surface == "handshake":
        response = build_response("repl", b"\x01" * 20, "mysql_native_password")
        return [frame(response, 1)[0], frame(b"\xef" + b"\0" * 8 + b"relay-bin.000001", 0)[0]]
    if surface == "statements":
        return [s.encode() for s in (
            "SELECT @@version, @@gtid_binlog_pos", "SHOW BINLOG EVENTS LIMIT 3",
            "SELECT BINLOG_GTID_POS('relay-bin.000001', 330)", "SHOW VARIABLES LIKE 'gtid%'",
            "SET @slave_connect_state = '0-1-3', @master_binlog_checksum = 'CRC32'",
            "SHOW BINARY LOGS", "SHOW MASTER STATUS", "KILL 7",
            "SELECT UNIX_TIMESTAMP(), CONNECTION_ID() AS id", "SHOW STATUS WHERE Value > 1")]
    if surface == "tap":
        return [protocol.encode({"cmd": "login", "user": "reader", "proof": b"\0" * 32}),
                protocol.encode({"cmd": "resolve", "at": "0-1-5", "epoch": "x"}),
                protocol.encode({"cmd": "fetch", "start": 1 << 32, "end": "latest"})]
    if surface == "upstream":
        greeting = build_greeting("10.11.9-MariaDB-log", 7, b"s" * 20)
        events = _capture_events()
        dump = b"".join(frame(b"\x00" + e, i + 1)[0] for i, e in enumerate(events[:6]))
        semi = b"".join(frame(b"\x00\xef" + bytes((i % 2,)) + e, i + 1)[0]
                        for i, e in enumerate(events[:6]))
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        pem = rsa.generate_private_key(public_exponent=65537, key_size=1024).public_key() \
            .public_bytes(serialization.Encoding.PEM,
                          serialization.PublicFormat.SubjectPublicKeyInfo)
        return [b"\x00" + greeting, b"\x01" + build_ok(), b"\x01" + b"\xfemysql_native_password\0"
                + b"s" * 20, b"\x02" + dump, b"\x03" + semi,
                b"\x04p\x01\x04\0\0\x01" + pem, b"\x04t\x01\x03\0\0\x00",
                b"\x04p\xfeclient_ed25519\0" + b"n" * 32]
    if surface == "binlog":
        return [e for e in _capture_events() if e[4] in (23, 24, 25, 30, 31, 32)][:20]
    if surface == "kernels":
        events = _capture_events()[:12]
        stored = b"".join(events)
        dump = b"".join(frame(b"\x00" + e, (i + 5) & 0xFF)[0] for i, e in enumerate(events))
        # frame_stored from seq 5; read_dump at offset 2 (20 % 3) expecting seq 5; the
        # ingest's scan; the rules' scan.
        return [bytes((5 << 2 | 1,)) + stored, bytes((5 << 2,)) + b"\xee\xee" + dump,
                b"\x1a" + stored, b"\x03" + stored,
                b"\x07\x02\x05\x00\x00\x00\x00" + b"\x00\x01\x02\x03abc" * 4,
                # decode_columns: a MEDIUMINT and a VARBINARY, rows from offset 7 (each:
                # its NULL bits, 3 bytes, a length byte and the bytes)
                b"\x27\x01\x03\x10\x00\x00\x00" + b"\x00\x01\x00\x00\x02hi" * 3]
    if surface == "text_rows":
        def row(*values: bytes | None) -> bytes:
            payload = b"".join(b"\xfb" if v is None else bytes((len(v),)) + v for v in values)
            return len(payload).to_bytes(3, "little") + b"\x01" + payload

        eof = b"\x05\x00\x00\x09\xfe\x00\x00\x02\x00"
        # an INT, a DECIMAL, a DATETIME and a text column; an error packet at the end
        return [b"\x13\x00\x03\x05\x01" + row(b"1", b"-2.50", b"2024-01-02 03:04:05", b"caf\xc3\xa9")
                + row(b"0042", None, b"0000-00-00 00:00:00", b"") + eof,
                b"\x08\x00" + row(b"7") + b"\x0d\x00\x00\x02\xff\x25\x05#70100stop"]
    if surface == "row_values":
        # steps 1-4 of _COLUMN_STEPS (byte 0x00): TINYINT, SMALLINT UNSIGNED, MEDIUMINT, INT
        ints = b"\x00" + b"\x01" + b"\x02\x00" + b"\x03\x00\x00" + b"\x04\x00\x00\x00"
        return [b"\x00" + ints * 3, b"\x01" + ints * 4, b"\x1e" + b"\x0f" * 3]
    if surface == "json_document":
        from decimal import Decimal

        from relay.binlog import jsonb

        return [jsonb.encode({"id": 7, "tags": ["a", "é", None, True], "n": -70000,
                              "u": jsonb.JsonUInt(2**63), "x": 2.5, "d": Decimal("1.50")}),
                jsonb.encode([{"k": "x" * 70000}, [1, [2, [3]]]]), jsonb.encode("plain")]
    if surface == "change_lines":
        with open(CAPTURE, "rb") as f:
            rest = f.read()[685:]
        return [b"\x02" + rest, b"\x00" + rest[:4000], b"\x01" + rest[-6000:]]
    raise KeyError(surface)
