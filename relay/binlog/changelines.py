"""`relay changes`' output: a JSON line per row change, {"gtid", "server_id", "timestamp",
"file", "pos", "row", "op", "schema", "table", "before", "after"} (and one per statement
with --queries, written by the command). The images are the tap's JSON form
(relay/binlog/jsonwriter.py): a rows event of a table the json_images kernel takes is
written by it from the event's bytes, with no Python value in between; any other event,
and one the kernel gives back (a zero date), by the generated writer from the row codec's
values. The bytes are the same either way (tests hold them so); the other fields are
msgspec's JSON.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Callable
from typing import Any

import msgspec

from relay import kernels
from relay.binlog.changes import RowsStatement
from relay.binlog.constants import RowKind
from relay.binlog.jsonwriter import JsonWriters
from relay.binlog.plans import PlanCache, json_plan
from relay.binlog.rowcodec import RowImage
from relay.binlog.rows import RowsEvent, full_images
from relay.binlog.tablemap import TableMap

_OPS = {kind: b',"op":"' + kind.value.encode() + b'"' for kind in RowKind}
_BIG_ENDIAN = sys.byteorder == "big"
Images = list[tuple[bytes | None, bytes | None]]


class ChangeLines:
    """Writes the lines of rows statements; keeps each table map's plan and writers."""

    def __init__(self, kernel: bool = kernels.IMPLEMENTATION is
                 kernels.Implementation.COMPILED) -> None:
        # (the pure json_images is slower than the codec's generated code: compiled only)
        self.kernel = kernel
        self.kernel_rows = 0  # rows the kernel wrote (a test reads it)
        self._encode = msgspec.json.Encoder().encode
        self._plans = PlanCache(json_plan)
        self._writers = JsonWriters()

    def head(self, gtid: str | None, server_id: int, timestamp: str) -> bytes:
        """A transaction's fields, the start of each of its lines."""
        return self._encode({"gtid": gtid, "server_id": server_id,
                             "timestamp": timestamp})[:-1]

    def add(self, head: bytes, st: RowsStatement, out: bytearray,
            spill: Callable[[], None]) -> None:
        """The lines of the statement's row changes, appended to `out`; `spill` is called
        when it holds a MiB or more after an event (bounded memory for a large statement)."""
        table = st.table
        encode = self._encode
        names = b',"schema":' + encode(table.schema) + b',"table":' + encode(table.table) + \
            b',"before":'
        for ev, rev in st.events():
            at = head + b',"file":' + encode(ev.position.file) + b',"pos":' + \
                str(ev.position.offset).encode() + b',"row":'
            op = _OPS[rev.kind] + names
            images = self._by_kernel(rev, table) if self.kernel else None
            if images is None:
                images = self._by_codec(st, ev, rev)
            for i, (before, after) in enumerate(images):
                out += at
                out += str(i).encode()
                out += op
                out += b"null" if before is None else before
                out += b',"after":'
                out += b"null" if after is None else after
                out += b"}\n"
            if len(out) >= 1 << 20:
                spill()

    def _by_kernel(self, rev: RowsEvent, table: TableMap) -> Images | None:
        plan = self._plans.get(table)
        if plan is None or not full_images(rev, table):
            return None
        kind = rev.kind
        sides = 2 if kind is RowKind.UPDATE else 1
        sinks = [[bytearray(), bytearray(4), bytearray()] for _ in range(sides)]
        data = rev.data
        rows = kernels.json_images(data, rev.rows_start, len(data), *plan, sinks, [0] * sides)
        if rows < 0:
            return None
        self.kernel_rows += rows
        texts = [_texts(sink, rows) for sink in sinks]
        if kind is RowKind.UPDATE:
            return list(zip(texts[0], texts[1], strict=True))
        if kind is RowKind.INSERT:
            return [(None, t) for t in texts[0]]
        return [(t, None) for t in texts[0]]

    def _by_codec(self, st: RowsStatement, ev: Any, rev: RowsEvent) -> Images:
        return self.write_images(st.table, [(ch.before, ch.after)
                                            for ch in st.changes_of(ev, rev)])

    def write_images(self, table: TableMap,
                     rows: list[tuple[RowImage | None, RowImage | None]]) -> Images:
        """Decoded (before, after) images as the tap's JSON text."""
        return [(None if before is None else self._write(table, before),
                 None if after is None else self._write(table, after))
                for before, after in rows]

    def _write(self, table: TableMap, image: Any) -> bytes:
        return self._writers.get(table, tuple(image.columns))(image).encode("utf-8")


def _texts(sink: list[bytearray], rows: int) -> list[bytes]:
    """The `rows` texts of a kernel's string column (validity, int32 offsets, text)."""
    offsets = array("i")
    offsets.frombytes(bytes(sink[1]))
    if _BIG_ENDIAN:
        offsets.byteswap()
    text = bytes(sink[2])
    return [text[offsets[i] : offsets[i + 1]] for i in range(rows)]
