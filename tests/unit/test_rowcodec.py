"""The row codec on captured bytes: MariaDB 10.11 (tests/data/mariadb, made by capture.py)
and the MySQL 8 vectors in tests/data/mysql8. Values, byte-exact re-encoding, property
tests of the value formats, and a fuzz over mutated real events."""

from __future__ import annotations

import json
import os
import struct
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from ipaddress import IPv4Address, IPv6Address
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay.binlog import jsonb
from relay.binlog import values as V
from relay.binlog.changes import ChangeStream, RowsStatement, SourceEvent
from relay.binlog.coltypes import ColumnType
from relay.binlog.constants import EventType
from relay.binlog.decoder import StreamDecoder
from relay.binlog.file import iter_file_events
from relay.binlog.rows import ROWS_TYPES, RowsEvent
from relay.binlog.tablemap import Column, TableMap, TypeHints
from relay.errors import MalformedEvent

DATA = os.path.join(os.path.dirname(__file__), "..", "data")
MARIADB = os.path.join(DATA, "mariadb", "types.000001")
MYSQL8 = os.path.join(DATA, "mysql8")


def _hints() -> TypeHints:
    with open(os.path.join(DATA, "mariadb", "hints.json")) as f:
        return TypeHints.parse(f"{k}={v}" for k, v in json.load(f).items())


def _file_events(path: str) -> Iterator[SourceEvent]:
    with open(path, "rb") as f:
        for raw in iter_file_events(f, verify_crc=False):
            yield SourceEvent(os.path.basename(path), raw.offset, raw.data)


def _mysql_files() -> list[str]:
    return sorted(os.path.join(MYSQL8, n) for n in os.listdir(MYSQL8)
                  if n.endswith(".bin") and "truncated" not in n)


def _changes(path: str, hints: TypeHints | None = None) -> list[Any]:
    return list(ChangeStream(_file_events(path), hints=hints or TypeHints()).changes())


# --- MariaDB 10.11 -----------------------------------------------------------------------

def test_mariadb_values_of_every_type() -> None:
    full = [c for c in _changes(MARIADB, _hints()) if c.schema == "full" and c.op == "insert"]
    row = full[0].after.asdict()
    assert (row["ti"], row["tiu"], row["mi"], row["miu"]) == (-128, 255, -8388608, 16777215)
    assert (row["bi"], row["biu"]) == (-2**63, 2**64 - 1)
    assert row["b9"] == 0b100000001 and row["y"] == 1901
    assert row["d5"] == Decimal("-999.99")
    assert row["d65"] == Decimal("-1.000000000000000000000000000001")
    assert row["f"] == -1.5 and row["db"] == 1e300
    assert row["dd"] == date(1000, 1, 1)
    assert row["dt3"] == datetime(2024, 2, 29, 12, 34, 56, 125000)
    assert row["dt6"] == datetime(9999, 12, 31, 23, 59, 59, 999999)
    assert row["ts"] == datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)
    assert row["ts2"] == datetime(2038, 1, 19, 3, 14, 7, 990000, tzinfo=UTC)
    assert row["t0"] == -timedelta(hours=838, minutes=59, seconds=59)
    assert row["t4"] == -timedelta(microseconds=100)
    assert row["c10"] == "abc" and row["c300"] == "😀" * 100
    assert row["vcu"] == "héllo wörld 中文 😀" and row["vb"] == b"\x00\xff"
    assert row["b4"] == b"a\0\0\0" and row["lb"] == b"L" * 3000
    assert row["e"] == "c" and row["s"] == frozenset({"x", "z"})
    assert row["j"] == {"a": [1, None, {"b": "é"}]}
    assert isinstance(row["g"], V.Geometry) and row["g"].srid == 0
    assert struct.unpack("<xIdd", bytes(row["g"])) == (1, 1.0, 2.0)
    assert row["u"] == uuid.UUID("01234567-89ab-4def-8123-456789abcdef")
    assert row["i4"] == IPv4Address("10.0.0.1") and row["i6"] == IPv6Address("2001:db8::1")
    nulls = full[1].after.asdict()
    assert set(nulls.values()) == {None, 2}
    zero = full[2].after.asdict()
    assert zero["dd"] == V.InvalidTemporal("date", 0, 0, 0)
    assert str(zero["dd"]) == "0000-00-00"
    assert str(zero["dt3"]) == "0000-00-00 00:00:00.000"
    assert str(zero["dt6"]) == "2024-00-01 00:00:00.000000"
    assert zero["g"].srid == 4326 and zero["i4"] == IPv4Address("0.0.0.0")
    assert zero["i6"] == IPv6Address("::") and zero["b4"] == b"\0\0\0\0"


def test_mariadb_minimal_and_noblob_images() -> None:
    changes = _changes(MARIADB, _hints())
    minimal = [c for c in changes if c.schema == "minimal" and c.op == "update"]
    assert minimal and all(c.before.columns == ("id",) for c in minimal)
    assert set(minimal[0].after.columns) <= {"vc", "i", "j", "ti", "lb"}
    noblob = [c for c in changes if c.schema == "noblob" and c.op == "update"]
    assert noblob and all("lb" not in c.before.columns for c in noblob)
    compressed = [c for c in changes if c.schema == "compressed"]
    plain = [c for c in changes if c.schema == "full"]
    assert [(c.op, c.before, c.after) for c in compressed] == [
        (c.op, c.before, c.after) for c in plain]


def test_mariadb_old_temporal_formats_need_hints() -> None:
    old = [c for c in _changes(MARIADB, _hints()) if c.schema == "old"]
    assert old[0].after.asdict() == {
        "id": 1, "dt": datetime(2024, 2, 29, 12, 34, 56),
        "dt3": datetime(2024, 2, 29, 12, 34, 56, 125000),
        "tm": -timedelta(hours=12, minutes=34, seconds=56),
        "tm2": -timedelta(hours=12, minutes=34, seconds=56, microseconds=780000),
        "ts6": datetime(2038, 1, 19, 3, 14, 7, 654321, tzinfo=UTC)}
    with pytest.raises(MalformedEvent, match="type hint") as info:
        _changes(MARIADB)
    assert info.value.where == "types.000001" and info.value.offset


def _round_trip(path: str, hints: TypeHints | None = None) -> dict[int, int]:
    decoder = StreamDecoder(hints or TypeHints())
    counts: dict[int, int] = {}

    def check(data: bytes, checksum: bool | None) -> None:
        typ = data[4]
        body = decoder.body(data, checksum=checksum)
        if typ == EventType.TABLE_MAP:
            assert decoder.table_map(data, checksum=checksum).encode() == body
        elif typ in ROWS_TYPES:
            rev = decoder.rows_event(data, checksum=checksum)
            table = decoder.table_for(rev)
            rows = list(rev.rows(table, decoder.codecs))
            assert rev.encode(table, rows, decoder.codecs) == body, (path, EventType(typ))
        else:
            return
        counts[typ] = counts.get(typ, 0) + 1

    for ev in _file_events(path):
        typ = ev.data[4]
        if typ == EventType.FORMAT_DESCRIPTION:
            decoder.format_description(ev.data)
        elif typ == EventType.TRANSACTION_PAYLOAD:
            for inner in decoder.payload_events(ev.data):
                check(inner, False)
        else:
            check(ev.data, None)
    return counts


def test_every_event_encodes_back_to_its_bytes() -> None:
    counts = _round_trip(MARIADB, _hints())
    assert counts[EventType.UPDATE_ROWS_COMPRESSED_V1] and counts[EventType.DELETE_ROWS_V1]
    total: dict[int, int] = {}
    for path in _mysql_files():
        for k, v in _round_trip(path).items():
            total[k] = total.get(k, 0) + v
    assert total[EventType.PARTIAL_UPDATE_ROWS] and total[EventType.UPDATE_ROWS_V2]
    assert sum(total.values()) > 100


# --- MySQL 8 vectors ---------------------------------------------------------------------

def _rows_of(name: str) -> list[tuple[str, dict[str, Any] | None, dict[str, Any] | None]]:
    return [(c.op, c.before and c.before.asdict(), c.after and c.after.asdict())
            for c in _changes(os.path.join(MYSQL8, name))]


def _image(image: dict[str, Any] | None) -> dict[str, Any]:
    assert image is not None
    return image


def test_mysql_vectors_decode() -> None:
    assert _rows_of("mysql-8.0.26-gtid-bit-type-in-use.bin") == [
        ("insert", None, {"a": 4, "b": "foo", "c": 32})]
    rows = _rows_of("mysql-8.0.28-gtid-enum-set-rows-in-use.bin")
    assert rows[-1][0] == "delete" and rows[-1][1] is not None
    assert rows[-1][1]["f3"] == "variant2" and rows[-1][1]["f4"] == frozenset({"two", "four"})
    assert _rows_of("mysql-8.0.40-minimal-row-metadata.bin")[0][2] == {
        "@1": 1, "@3": "a", "@5": 3230202323}
    opaque = [_image(r[2])["a"] for r in _rows_of("mysql-9.0.1-json-opaque-in-use.bin")]
    assert opaque[1] == {"b": date(2012, 3, 18)}
    assert opaque[4] == {"d": Decimal("123.456")} and opaque[6] == {"e": [0, 1, True, False]}
    vec = _rows_of("mysql-9.0.1-vector-type.bin")[1][2]
    assert vec == {"id": 2, "vector_column": [1.0, -1.0, 0.0]}
    zstd = _rows_of("mysql-8.0.31-gtid-transaction-payload-zstd-rows-query.bin")
    assert [r[0] for r in zstd] == ["insert", "update", "insert"]


def test_mysql_invisible_columns_and_gtids() -> None:
    stream = ChangeStream(_file_events(
        os.path.join(MYSQL8, "mysql-8.0.26-gtid-invisible-columns.bin")))
    txs = []
    for tx in stream.transactions():
        for st_ in tx.statements():
            if isinstance(st_, RowsStatement):
                cols = st_.table.columns
                assert [c.visible for c in cols][:2] == [False, False]
        txs.append((tx.gtid, tx.xid))
    assert txs[-1] == ("97c7af02-4c50-11ec-acd8-681842034964:5", 55)


def test_mysql_partial_json_update_diffs() -> None:
    rows = _rows_of("mysql-8.0.22-partial-update-rows-json-in-use.bin")
    partial = rows[-1][2]
    assert partial is not None
    diff = partial["@2"]
    assert isinstance(diff, jsonb.JsonPartial)  # MINIMAL before-image: nothing to apply to
    assert diff.diffs == (jsonb.JsonDiff("replace", "$.age", 42),)


def _vitess() -> dict[str, Any]:
    with open(os.path.join(MYSQL8, "vitess-8.0.40-partial-update-rows-events.json")) as f:
        vectors: dict[str, Any] = json.load(f)
    return vectors


def test_vitess_partial_update_events() -> None:
    vec = _vitess()
    tm = vec["table_map"]
    cols = tuple(Column(i, n, t, m, True) for i, (n, t, m) in enumerate(zip(
        ("customer_id", "email", "jd"), tm["column_types"], tm["column_meta"], strict=True)))
    applied = {}
    for ev in vec["events"]:
        raw = bytes.fromhex(ev["hex"])
        rev = RowsEvent.decode(raw[4], raw[19:], post_header_len=10)
        table = TableMap(rev.table_id, 1, "vt_commerce", "customer", cols, b"", b"", b"", b"",
                         mariadb=False)
        rows = list(rev.rows(table))
        assert len(rows) == ev["rows"]
        assert rev.encode(table, rows) == raw[19:]
        first = rows[0]
        if first.partial_json:
            assert first.before is not None and first.after is not None
            applied[ev["name"]] = jsonb.apply_diffs(first.before.get("jd"),
                                                    first.after.get("jd"))
    assert applied["REPLACE"]["role"] == "IC"
    assert "salary" not in applied["REMOVE"]
    combo = applied["INSERT and REMOVE and REPLACE"]
    assert combo["day"] == "tuesday" and combo["hobby"] == "skiing"
    assert "favorite_color" not in combo
    assert applied["REPLACE with null"]["salary"] is None


def test_mysql_commit_timestamp_and_zstd_payload() -> None:
    stream = ChangeStream(_file_events(
        os.path.join(MYSQL8, "mysql-8.0.32-transaction-payload-zstd.bin")))
    [tx] = list(stream.transactions())
    assert tx.timestamp.microsecond != 0  # from immediate_commit_timestamp, not the header
    with open(os.path.join(MYSQL8, "go-mysql-event-body-vectors.json")) as f:
        frame = next(v for v in json.load(f)["vectors"] if v["event_type"] == 40)
    from relay.binlog.compression import TransactionPayload

    payload = TransactionPayload(0, frame["expect"]["uncompressed_size"],
                                 bytes.fromhex(frame["hex"]), b"")
    assert [e[4] for e in payload.events()] == frame["expect"]["inner_event_types"]


# --- value formats ------------------------------------------------------------------------

@given(st.integers(1, 65).flatmap(lambda p: st.tuples(st.just(p), st.integers(0, min(p, 30)))),
       st.data())
def test_decimal_round_trip(ps: tuple[int, int], data: st.DataObject) -> None:
    precision, scale = ps
    digits = data.draw(st.integers(0, 10 ** precision - 1))
    negative = data.draw(st.booleans())
    value = Decimal((1 if negative and digits else 0,
                     tuple(int(c) for c in str(digits)), -scale))
    raw = V.encode_decimal(value, precision, scale)
    assert len(raw) == V.decimal_size(precision, scale)
    assert V.decimal_value(raw, 0, precision, scale, len(raw)) == value


_DATETIMES = st.datetimes(min_value=datetime(1000, 1, 1), max_value=datetime(9999, 12, 31))


def _cut(us: int, fsp: int) -> int:
    return us - us % int(10 ** (6 - fsp))


@given(_DATETIMES, st.integers(0, 6))
def test_datetime_formats_round_trip(dt: datetime, fsp: int) -> None:
    dt = dt.replace(microsecond=_cut(dt.microsecond, fsp))
    for enc, dec in ((V.encode_datetime2, V.datetime2_value),
                     (V.encode_datetime_hires, V.datetime_hires_value)):
        raw = enc(dt, fsp)
        assert dec(raw, 0, fsp) == dt
    if fsp == 0:
        assert V.datetime_old_value(V.encode_datetime_old(dt), 0) == dt


@given(st.integers(-(838 * 3600 + 59 * 60 + 59) * 10**6, (838 * 3600 + 59 * 60 + 59) * 10**6),
       st.integers(0, 6))
def test_time_formats_round_trip(us: int, fsp: int) -> None:
    sign = -1 if us < 0 else 1
    t = timedelta(microseconds=sign * _cut(abs(us), fsp))
    assert V.time2_value(V.encode_time2(t, fsp), 0, fsp) == t
    assert V.time_hires_value(V.encode_time_hires(t, fsp), 0, fsp) == t
    if fsp == 0:
        assert V.time_old_value(V.encode_time_old(t), 0) == t


@given(st.integers(1, 2**31 - 1), st.integers(0, 999999), st.integers(0, 6))
def test_timestamp_formats_round_trip(sec: int, us: int, fsp: int) -> None:
    ts = datetime.fromtimestamp(sec, UTC).replace(microsecond=_cut(us, fsp))
    assert V.timestamp2_value(V.encode_timestamp2(ts, fsp), 0, fsp) == ts
    assert V.timestamp_hires_value(V.encode_timestamp_hires(ts, fsp), 0, fsp) == ts


def test_invalid_temporals_round_trip() -> None:
    zero = V.InvalidTemporal("datetime", 0, 0, 0, fsp=3)
    assert V.datetime2_value(V.encode_datetime2(zero, 3), 0, 3) == zero
    feb30 = V.InvalidTemporal("date", 2024, 2, 30)
    assert V.date_value(V.encode_date(feb30), 0) == feb30 and str(feb30) == "2024-02-30"
    assert V.timestamp2_value(V.encode_timestamp2(
        V.InvalidTemporal("timestamp", 0, 0, 0), 0), 0, 0) == V.InvalidTemporal(
        "timestamp", 0, 0, 0)


_JSON_SCALARS = (st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
                 | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30))
_JSON = st.recursive(_JSON_SCALARS, lambda inner: st.lists(inner, max_size=6)
                     | st.dictionaries(st.text(max_size=10), inner, max_size=6), max_leaves=40)


@given(_JSON)
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_binary_json_round_trip(value: Any) -> None:
    raw = jsonb.encode(value)
    back = jsonb.decode(raw)
    assert back == (jsonb.JSON_NULL if value is None else value)  # not SQL NULL
    assert jsonb.encode(back) == raw


def test_binary_json_large_layout() -> None:
    value = {"k": "x" * 70000, "n": [1, 2**40, -3]}
    raw = jsonb.encode(value)
    assert raw[0] == jsonb.LARGE_OBJECT
    assert jsonb.decode(raw) == value


# --- fuzz: mutated real events raise MalformedEvent or decode --------------------------------

def _real_events() -> list[tuple[StreamDecoder, bytes, bool]]:
    """(decoder holding its table maps, event, checksum) for every rows event captured."""
    out = []
    for path in [MARIADB, *_mysql_files()]:
        decoder = StreamDecoder(_hints() if path == MARIADB else TypeHints())
        for ev in _file_events(path):
            typ = ev.data[4]
            if typ == EventType.FORMAT_DESCRIPTION:
                decoder.format_description(ev.data)
            elif typ == EventType.TABLE_MAP:
                decoder.table_map(ev.data)
            elif typ in ROWS_TYPES:
                out.append((decoder, ev.data, decoder.checksum))
    return out


_EVENTS = _real_events()


@given(st.data())
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
def test_fuzz_mutated_rows_events(data: st.DataObject) -> None:
    decoder, event, checksum = data.draw(st.sampled_from(_EVENTS))
    body = bytearray(decoder.body(event, checksum=checksum))
    for _ in range(data.draw(st.integers(1, 4))):
        action = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        pos = data.draw(st.integers(0, max(len(body) - 1, 0)))
        if action == "flip" and body:
            body[pos] ^= data.draw(st.integers(1, 255))
        elif action == "cut":
            del body[pos:]
        else:
            body[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
    try:
        rev = RowsEvent.decode(event[4], bytes(body),
                               post_header_len=decoder.post_header_len(event[4]))
        table = decoder.table_for(rev)
        for row in rev.rows(table, decoder.codecs):
            for image in (row.before, row.after):
                if image is not None:
                    image.asdict()
    except MalformedEvent:
        pass


@given(st.data())
@settings(max_examples=200)
def test_fuzz_mutated_table_maps(data: st.DataObject) -> None:
    tables = [bytes.fromhex(h) for h in _TABLE_MAP_BODIES]
    body = bytearray(data.draw(st.sampled_from(tables)))
    pos = data.draw(st.integers(0, len(body) - 1))
    body[pos] ^= data.draw(st.integers(1, 255))
    if data.draw(st.booleans()):
        del body[data.draw(st.integers(0, len(body))):]
    try:
        tm = TableMap.decode(bytes(body))
        assert len(tm.columns) == len(tm.column_types)
    except MalformedEvent:
        pass


def _table_map_bodies() -> list[str]:
    decoder = StreamDecoder()
    out = []
    for ev in _file_events(MARIADB):
        if ev.data[4] == EventType.FORMAT_DESCRIPTION:
            decoder.format_description(ev.data)
        elif ev.data[4] == EventType.TABLE_MAP:
            out.append(decoder.body(ev.data).hex())
    return out[:8]


_TABLE_MAP_BODIES = _table_map_bodies()


def test_column_type_names() -> None:
    tm = TableMap.decode(bytes.fromhex(_TABLE_MAP_BODIES[0]))
    assert tm.columns[0].type_name == ColumnType(tm.columns[0].type).name


@given(_DATETIMES, st.integers(0, 6), st.integers(-(838 * 3600) * 10**6, 838 * 3600 * 10**6))
def test_generated_temporal_decoders_agree_with_the_reference(dt: datetime, fsp: int,
                                                              us: int) -> None:
    dt = dt.replace(microsecond=_cut(dt.microsecond, fsp))
    raw = V.encode_datetime2(dt, fsp)
    assert V.temporal_decoder("datetime2", fsp)(raw, 0) == V.datetime2_value(raw, 0, fsp)
    ts = datetime.fromtimestamp(abs(us) // 10**6 % 2**31, UTC).replace(microsecond=_cut(
        dt.microsecond, fsp))
    raw = V.encode_timestamp2(ts, fsp)
    assert V.temporal_decoder("timestamp2", fsp)(raw, 0) == V.timestamp2_value(raw, 0, fsp)
    t = timedelta(microseconds=(-1 if us < 0 else 1) * _cut(abs(us), fsp))
    raw = V.encode_time2(t, fsp)
    assert V.temporal_decoder("time2", fsp)(raw, 0) == V.time2_value(raw, 0, fsp) == t


@given(st.integers(1, 65).flatmap(lambda p: st.tuples(st.just(p), st.integers(0, min(p, 30)))),
       st.data())
def test_generated_decimal_decoders_agree_with_the_reference(ps: tuple[int, int],
                                                             data: st.DataObject) -> None:
    precision, scale = ps
    digits = data.draw(st.integers(0, 10 ** precision - 1))
    value = Decimal((int(data.draw(st.booleans()) and digits > 0),
                     tuple(int(c) for c in str(digits)), -scale))
    raw = V.encode_decimal(value, precision, scale)
    fast = V.decimal_decoder(precision, scale)(raw, 0)
    assert fast == V.decimal_value(raw, 0, precision, scale, len(raw)) == value
    assert str(fast) == str(value)


def test_mariadb_uca_14_collations_decode_as_their_character_set() -> None:
    from relay.binlog import charsets
    from relay.binlog.describe import ColumnDescription

    # 11.8's default utf8mb4_uca1400_ai_ci, its utf8mb3 and utf32 kin, and the ends
    assert charsets.charset_name(2304) == "utf8mb4"
    assert charsets.charset_name(2048) == "utf8mb3" and charsets.charset_name(3271) == "utf32"
    assert charsets.codec_of(2304) == ("utf-8", "strict")
    assert charsets.charset_name(3328) is None
    # information_schema.COLLATIONS gives such a collation no id: its character set decides
    row = ("v", "varchar", "varchar(10)", "YES", None, None, None, 40, None, "utf8mb4",
           "utf8mb4_uca1400_ai_ci")
    assert ColumnDescription.of_row(row).collation == 2304
    # by full name, as MariaDB 11.8 numbers them (all 920 were checked against it)
    assert charsets.uca1400_collation_id("utf8mb4_uca1400_swedish_nopad_as_cs") == \
        2048 + (1 << 8) + (8 << 3) + 7
    assert charsets.uca1400_collation_id("utf8mb3_uca1400_croatian_ai_ci") == 2048 + (24 << 3)
    assert charsets.uca1400_collation_id("utf8mb4_general_ci") is None
    # a name it does not know: one of the character set's, which decodes alike
    unknown = (*row[:10], "utf8mb4_uca1400_klingon_ai_ci")
    assert ColumnDescription.of_row(unknown).collation == 45
    assert ColumnDescription.of_row(row[:9]).collation is None
