"""`relay changes`' JSON lines (relay/binlog/changelines.py has their form).

Over binlog files and relay logs the lines come from the `change_lines` kernel: it walks
a file's bytes (mapped, not read into Python objects event by event), takes every
transaction of the common form whole (a GTID, table maps, rows events, the XID) and
writes its lines itself, asking Python only for a table map it has not seen and for a
rows event its plan does not write (that one goes through the row codec). Whatever
else it meets (the FORMAT_DESCRIPTION, DDL, a transaction of another form, a checksum
that does not match) it leaves where it is, and the general path (`ChangeStream`) takes
that transaction, raising its errors with file and offset, then hands the stream back.
Both write the same bytes (tests hold them so). A live primary, a GTID filter or the
pure-Python kernels take the general path alone.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Iterator
from typing import Any, BinaryIO

import msgspec

from relay import kernels
from relay.binlog.changelines import ChangeLines
from relay.binlog.changes import (
    ChangeStream,
    QueryStatement,
    RowsStatement,
    SourceEvent,
    Transaction,
    row_images,
)
from relay.binlog.file import TornTail, iter_events
from relay.binlog.plans import PlanCache, json_plan
from relay.binlog.position import Position
from relay.binlog.tablemap import TypeHints
from relay.errors import MalformedEvent, SourceError
from relay.relaylog.series import BinlogSeries, Region, map_region
from relay.sources.filters import TableFilter

SPILL = 1 << 20  # lines are written out once this many bytes are waiting
Entry = tuple[Any, ...]


class LineWriter:
    """Writes the lines of transactions to a binary file."""

    def __init__(self, out: BinaryIO, tables: TableFilter, *, queries: bool = False,
                 flush_each: bool = False) -> None:
        self.out = out
        self.tables = tables
        self.queries = queries
        self.flush_each = flush_each  # (following a growing log: each transaction at once)
        self.lines = ChangeLines()
        self.buffer = bytearray()
        self._encode = msgspec.json.Encoder().encode

    def spill(self) -> None:
        self.out.write(self.buffer)
        self.buffer.clear()
        if self.flush_each:
            self.out.flush()

    def transaction(self, tx: Transaction) -> None:
        """The lines of one transaction (the general path)."""
        head = self.lines.head(tx.gtid, tx.server_id, tx.timestamp.isoformat())
        for st in tx.statements():
            if isinstance(st, QueryStatement):
                if self.queries and (not self.tables.patterns or self.tables(st.schema, "")):
                    line = {"file": st.position.file, "pos": st.position.offset,
                            "op": "query", "schema": st.schema, "query": st.text}
                    self.buffer += head + b"," + self._encode(line)[1:] + b"\n"
                continue
            assert isinstance(st, RowsStatement)
            if self.tables(st.table.schema, st.table.table):
                self.lines.add(head, st, self.buffer, self.spill)
        self.spill()


def file_lines(series: BinlogSeries, hints: TypeHints, writer: LineWriter) -> None:
    """Every line of a series of binlog files (see the module docstring)."""
    _FileLines(hints, writer, series.verify_crc).run(series.regions())


class _FileLines:
    def __init__(self, hints: TypeHints, writer: LineWriter, verify_crc: bool) -> None:
        self.writer = writer
        self.verify_crc = verify_crc
        self.stream = ChangeStream((), hints=hints)
        self.plans = PlanCache(json_plan)
        # the kernel's: where to resume, the transaction's end and fields, the table
        # entries by id, where the transaction's lines begin in the buffer
        self.state: list[Any] = [0, 0, b"", {}, 0]
        self.encode = msgspec.json.Encoder().encode

    def run(self, regions: Iterator[Region]) -> None:
        for region in regions:
            mapped = map_region(region)
            data = memoryview(mapped)
            try:
                self._region(region, data)
            finally:
                data.release()
                if isinstance(mapped, mmap.mmap):
                    with contextlib.suppress(BufferError):  # (a slice in a traceback:
                        mapped.close()                      # unmapped when collected)

    def _region(self, region: Region, data: memoryview) -> None:
        writer, state = self.writer, self.state
        at = b',"file":' + self.encode(region.name) + b',"pos":'
        pos, end = region.start, region.end
        decoder = self.stream.decoder
        crc_len = 0

        def table_map(p: int, size: int) -> Entry | None:
            # remembered, as the general path does: a rows event it reads later may
            # belong to this map
            table = decoder.table(decoder.remember_table_map(bytes(data[p : p + size]),
                                                             checksum=bool(crc_len)))
            names = None
            if writer.tables(table.schema, table.table):
                names = b',"schema":' + self.encode(table.schema) + b',"table":' + \
                    self.encode(table.table) + b',"before":'
            plan = self.plans.get(table)
            body = bytes(data[p + 19 : p + size - crc_len])
            if plan is None:
                return (table.table_id, len(table.columns), None, (), (), names, body, table)
            return (table.table_id, len(table.columns), *plan, names, body, table)

        def images(p: int, size: int, entry: Entry) -> list[tuple[bytes | None,
                                                                 bytes | None]]:
            rev = decoder.rows_event(bytes(data[p : p + size]), checksum=bool(crc_len))
            table = entry[7]
            rows = row_images(rev, table, decoder.codecs, Position(region.name, p))
            return writer.lines.write_images(table, rows)

        while pos < end:
            crc_len = 4 if self._checksum(region) else 0
            try:
                pos = kernels.change_lines(data, pos, end, crc_len, state, table_map,
                                           images, writer.buffer, at, SPILL)
            except BaseException:
                del writer.buffer[state[4]:]  # the lines of whole transactions go out
                writer.spill()
                raise
            writer.spill()
            if pos < end and not state[0]:
                pos = self._general(region, data, pos)
                state[3].clear()  # (the general path may have mapped the ids anew)
            elif not state[0] and len(state[3]) > 4096:
                state[3].clear()  # (a long follow: bounded)

    def _checksum(self, region: Region) -> bool:
        """The CRC mode of the last FORMAT_DESCRIPTION read (the kernel stops at one: the
        general path reads it), else the file's first."""
        decoder = self.stream.decoder
        return decoder.checksum if decoder.fde is not None else region.checksum

    def _general(self, region: Region, data: memoryview, pos: int) -> int:
        """Transactions from `pos` by the general path, until the kernel can go on."""
        stream = self.stream
        stream.resume(SourceEvent(region.name, raw.offset, raw.data) for raw in iter_events(
            data, start=pos, verify_crc=self.verify_crc, checksum=self._checksum(region),
            where=region.path))
        try:
            for tx in stream.transactions():
                self.writer.transaction(tx)
                tx.finish()
                if tx.end is not None and not stream.pending:
                    return tx.end.offset
        except TornTail as exc:  # (the file shrank under the reader)
            raise SourceError(f"{region.path} ends inside an event at offset "
                              f"{exc.offset}") from exc
        except MalformedEvent as exc:
            raise SourceError(str(exc)) from exc
        return region.end


def use_kernel(source_reader: object, gtid_filter: bool) -> bool:
    """Whether `relay changes` takes the kernel's path for this source (the pure twin of
    change_lines is its specification, slower than the general path: compiled only).
    RELAY_LINE_KERNEL=1 forces it, =0 forbids it: the tests compare the two paths."""
    choice = os.environ.get("RELAY_LINE_KERNEL", "")
    return isinstance(source_reader, BinlogSeries) and not gtid_filter and choice != "0" and (
        choice == "1" or kernels.IMPLEMENTATION is kernels.Implementation.COMPILED)


__all__ = ["LineWriter", "file_lines", "use_kernel"]
