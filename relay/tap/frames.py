"""Raw tap frames -> transactions and row changes, with their tap positions. Sans I/O:
Spark executors, the Python client and the server's decoded form all use it.

A raw range arrives as {"k": "fde", "seg", "data"} (the format of a segment) and
{"k": "raw", "seg", "data", "txs"} frames: whole events, where "txs" are the end offsets
of the transactions that start in the frame. A transaction may span frames (a huge one
arrives in parts), so events are handed to the codec one frame at a time and nothing
holds a whole transaction.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from relay.binlog import walk
from relay.binlog.changes import ChangeStream, RowsStatement, SourceEvent, Transaction
from relay.binlog.decoder import DecodedTables
from relay.binlog.jsonvalue import column_jsonable
from relay.binlog.tablemap import NO_HINTS, TableMap, TypeHints
from relay.binlog.values import Geometry
from relay.errors import MalformedEvent
from relay.tap.protocol import TapError, position


class TapTransaction(NamedTuple):
    tx: Transaction
    position: int        # the tap position just after the transaction (resume from here)


class RawFrames:
    """Iterate the transactions of a run of raw frames (ending at {"k": "end"})."""

    def __init__(self, frames: Iterable[dict[str, Any]], *, hints: TypeHints = NO_HINTS,
                 tables: DecodedTables | None = None) -> None:
        """`tables`: decoded maps and codecs kept from the reader's earlier ranges."""
        self._frames = iter(frames)
        self._ends: deque[int] = deque()
        self.end: dict[str, Any] | None = None
        self.stream = ChangeStream(self._events(), hints=hints, tables=tables)

    def _events(self) -> Iterator[SourceEvent]:
        offset = 0
        for frame in self._frames:
            kind = frame.get("k")
            if kind == "end":
                self.end = frame
                return
            if kind not in ("fde", "raw"):
                raise TapError("malformed", f"unexpected frame {kind!r} in a raw range")
            seg = frame["seg"]
            name = str(seg)
            data = frame["data"]
            if kind == "raw":
                self._ends.extend(position(seg, e) for e in frame["txs"])
            n = len(data)
            end = 0
            for pos, size in walk.spans(data, where=f"tap segment {seg}", base=offset):
                yield SourceEvent(name, offset + pos, data[pos : pos + size])
                end = pos + size
            if end != n:
                raise MalformedEvent("a tap frame ends inside an event",
                                     where=f"tap segment {seg}", offset=offset + end)
            offset += n
        raise TapError("internal", "the range ended before the server's end frame (the "
                                   "connection was cut)")

    def __iter__(self) -> Iterator[TapTransaction]:
        for tx in self.stream.transactions():
            if not self._ends:
                raise TapError("internal", f"transaction {tx.gtid} has no position in the "
                                           "frames (the server sent fewer than it read)")
            yield TapTransaction(tx, self._ends.popleft())


def packable(value: Any, fsp: int | None = None) -> Any:
    """A decoded value in a form msgpack takes: bytes stay bytes, the rest as JSON
    (temporals with `fsp`, their column's fraction digits)."""
    if isinstance(value, (bytes, bytearray)) and not isinstance(value, Geometry):
        return bytes(value)
    return column_jsonable(value, fsp)


def change_messages(txs: Iterable[TapTransaction], max_changes: int = 5000,
                    ) -> Iterator[dict[str, Any]]:
    """The decoded form: {"k": "tx", "gtid", "server_id", "ts", "pos", "part", "last",
    "changes": [[op, schema, table, before, after], ...]} with at most `max_changes`
    changes a message (a huge transaction comes in numbered parts; "last" marks its end).
    Images are maps of column name to value; an insert has no before, a delete no
    after (nil)."""
    for item in txs:
        tx = item.tx
        head = {"k": "tx", "gtid": tx.gtid, "server_id": tx.server_id,
                "ts": int(tx.timestamp.timestamp()), "pos": item.position}
        part = 0
        batch: list[list[Any]] = []
        for st in tx.statements():
            if not isinstance(st, RowsStatement):
                continue
            for ch in st.changes():
                if len(batch) >= max_changes:
                    yield {**head, "part": part, "last": False, "changes": batch}
                    part += 1
                    batch = []
                batch.append([ch.op, ch.schema, ch.table, _image(st.table, ch.before),
                              _image(st.table, ch.after)])
        yield {**head, "part": part, "last": True, "changes": batch}


def _image(table: TableMap, image: Any) -> dict[str, Any] | None:
    if image is None:
        return None
    fsp = table.fsp_by_name
    return {name: packable(v, fsp.get(name))
            for name, v in zip(image.columns, image, strict=True)}
