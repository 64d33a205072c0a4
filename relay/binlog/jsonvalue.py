"""Decoded column values as JSON: what `relay changes` prints and the tap's JSON form uses.

    int, float, bool, None, str     as they are
    Decimal                         a string ("12.50"): no precision lost to a float
    datetime / date                 ISO 8601 ("2024-01-02T03:04:05.678000", TIMESTAMPs
                                    with "+00:00"); where the column is known (the
                                    tap's JSON images) with its precision's digits
    timedelta (TIME)                the server's text form ("-12:34:56.780000")
    bytes                           base64
    frozenset (SET)                 a sorted list of members
    UUID, IPv4/IPv6 address         their text form
    Geometry                        {"srid": n, "wkb": base64}
    InvalidTemporal (zero dates)    the server's text form ("0000-00-00 00:00:00")
    JSON documents                  nested JSON
"""

from __future__ import annotations

import base64
import ipaddress
import uuid
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from relay.binlog.jsonb import JSON_NULL, JsonDiff, JsonOpaque, JsonPartial
from relay.binlog.values import Geometry, InvalidTemporal

if TYPE_CHECKING:
    from relay.binlog.rowcodec import RowImage
    from relay.binlog.tablemap import TableMap


def time_text(value: timedelta, fsp: int | None = None) -> str:
    """The server's text of a TIME: with `fsp` fraction digits (the column's precision),
    or without it the fraction only when not zero."""
    neg = value < timedelta(0)
    t = -value if neg else value
    secs = t.days * 86400 + t.seconds
    h, rem = divmod(secs, 3600)
    text = f"{'-' if neg else ''}{h:02d}:{rem // 60:02d}:{rem % 60:02d}"
    if fsp is None:
        if t.microseconds:
            text += f".{t.microseconds:06d}"
    elif fsp:
        text += "." + f"{t.microseconds:06d}"[:fsp]
    return text


def datetime_text(value: datetime, fsp: int) -> str:
    """isoformat() with exactly `fsp` fraction digits (a DATETIME(3) keeps its ".000")."""
    if fsp in (0, 3, 6):
        return value.isoformat(timespec=("seconds", "", "", "milliseconds", "", "",
                                         "microseconds")[fsp])
    text = value.replace(tzinfo=None).isoformat(timespec="seconds") + "." + \
        f"{value.microsecond:06d}"[:fsp]
    return text if value.tzinfo is None else text + value.isoformat()[-6:]


def column_jsonable(value: Any, fsp: int | None) -> Any:
    """jsonable(value) for a value of a column whose temporals have `fsp` fraction
    digits: a DATETIME(3) at a whole second keeps its ".000". None: not a temporal
    column (a JSON document's DATETIME keeps the digits its value has)."""
    if fsp is None:
        return jsonable(value)
    if isinstance(value, datetime):
        return datetime_text(value, fsp)
    if isinstance(value, timedelta):
        return time_text(value, fsp)
    return jsonable(value)


def image_jsonable(table: TableMap, image: RowImage) -> dict[str, Any]:
    """A row image as a JSON object, temporals with their columns' precision."""
    fsp = table.fsp_by_name
    return {name: column_jsonable(value, fsp.get(name))
            for name, value in zip(image.columns, image, strict=True)}


def jsonable(value: Any) -> Any:
    """`value` in a form json.dumps takes, by the table in the module docstring."""
    if value is None or value is JSON_NULL:
        return None
    if isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, Geometry):
        return {"srid": value.srid, "wkb": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, timedelta):
        return time_text(value)
    if isinstance(value, InvalidTemporal):
        return str(value)
    if isinstance(value, frozenset | set):
        return sorted(value)
    if isinstance(value, (uuid.UUID, ipaddress.IPv4Address, ipaddress.IPv6Address)):
        return str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, JsonPartial):
        return {"json_diffs": [jsonable(d) for d in value.diffs]}
    if isinstance(value, JsonDiff):
        out = {"op": value.op, "path": value.path}
        if value.op != "remove":
            out["value"] = jsonable(value.value)
        return out
    if isinstance(value, JsonOpaque):
        return {"mysql_type": value.field_type,
                "base64": base64.b64encode(value.data).decode("ascii")}
    return str(value)
