"""Row changes -> Arrow record batches in the tap's Spark schema. Needs pyarrow only.

Columns, in order:

    gtid STRING, commit_ts TIMESTAMP, server_id BIGINT, schema STRING, table STRING,
    op STRING, before <image>, after <image>, position BIGINT, change INT
    [, schema_version STRING: the typed form, see relay/tap/evolution.py]

`position` is the tap position just after the row's transaction (where a reader resumes)
and `change` the row's ordinal in its transaction: (position, change) is unique.

Image forms: "json" (a JSON object as text, values as relay/binlog/jsonvalue.py writes
them), "map" (MAP<STRING, STRING>: strings as they are, other values as JSON text), or
"typed" (a STRUCT of the one table's columns with Spark types: relay/tap/sparktypes.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any

import pyarrow as pa

from relay import kernels
from relay.binlog.changes import RowsStatement
from relay.binlog.jsonvalue import (
    column_jsonable,
    image_jsonable,
)
from relay.binlog.jsonwriter import JsonWriters
from relay.binlog.rows import RowsEvent
from relay.binlog.tablemap import TableMap
from relay.binlog.values import InvalidTemporal
from relay.tap.evolution import RESCUED, SchemaEvolution, Shape, ShapeCheck
from relay.tap.frames import TapTransaction
from relay.tap.json_images import JsonImages, json_event
from relay.tap.sparktypes import (
    INVALID_TEMPORALS,
    UTC_TS,
    has_temporals,
    image_ddl,
    image_struct,
    is_json,
    json_text,
    spark_type,
    typed_value,
)
from relay.tap.typed_images import TypedImages, decode_event

SNAPSHOT_OP = "snapshot"   # the op of the rows a snapshot read (relay/tap/snapshot.py)
FORMS = ("json", "map", "typed")


def schema_ddl(form: str, table: TableMap | None = None,
               evolution: SchemaEvolution = SchemaEvolution.FAIL) -> str:
    version = ""
    if form == "typed":
        assert table is not None
        image = image_ddl(table, evolution)
        version = ", schema_version STRING"
    elif form == "map":
        image = "MAP<STRING, STRING>"
    else:
        image = "STRING"
    return (f"gtid STRING, commit_ts TIMESTAMP, server_id BIGINT, `schema` STRING, "
            f"`table` STRING, op STRING, before {image}, after {image}, position BIGINT, "
            f"change INT{version}")


def arrow_schema(form: str, table: TableMap | None = None,
                 evolution: SchemaEvolution = SchemaEvolution.FAIL) -> pa.Schema:
    version = []
    if form == "typed":
        assert table is not None
        image: pa.DataType = image_struct(table, evolution)
        version = [("schema_version", pa.string())]
    elif form == "map":
        image = pa.map_(pa.string(), pa.string())
    else:
        image = pa.string()
    return pa.schema([
        ("gtid", pa.string()), ("commit_ts", UTC_TS), ("server_id", pa.int64()),
        ("schema", pa.string()), ("table", pa.string()), ("op", pa.string()),
        ("before", image), ("after", image), ("position", pa.int64()), ("change", pa.int32()),
        *version,
    ])


# --- values ------------------------------------------------------------------------------------


def json_image(table: TableMap, image: Any) -> str | None:
    """The JSON form of an image (json_writer writes the same text, faster)."""
    if image is None:
        return None
    return json.dumps(image_jsonable(table, image), ensure_ascii=False,
                      separators=(",", ":"))


def map_image(table: TableMap, image: Any) -> list[tuple[str, str | None]] | None:
    if image is None:
        return None
    fsp = table.fsp_by_name
    return [(n, _text(v, fsp.get(n))) for n, v in zip(image.columns, image, strict=True)]


def _text(value: Any, fsp: int | None = None) -> str | None:
    """A value as map text: strings (and what JSON writes as a string: decimals, dates,
    temporals with their column's `fsp` digits) as they are, the rest as JSON."""
    j = column_jsonable(value, fsp)
    if j is None or isinstance(j, str):
        return j
    return json.dumps(j, ensure_ascii=False, separators=(",", ":"))


# The typed and JSON forms take rows events through the decode_columns and json_images
# kernels when they are compiled (their pure twins are slower than the row codec's
# generated code).
COLUMNAR = kernels.IMPLEMENTATION is kernels.Implementation.COMPILED


class BatchBuilder:
    """Collects row changes and cuts them into record batches of `batch_rows` rows (a rows
    event the typed form decodes whole can take a batch past it)."""

    def __init__(self, form: str, table: TableMap | None = None,
                 batch_rows: int = 8192,
                 evolution: SchemaEvolution = SchemaEvolution.FAIL,
                 columnar: bool = COLUMNAR) -> None:
        if form not in FORMS:
            raise ValueError(f"images: one of {', '.join(FORMS)}, not {form!r}")
        self.form = form
        self.table = table
        self.schema = arrow_schema(form, table, evolution)
        # typed: judges each version of the table a row was written (or read) under
        self.check = ShapeCheck(table, evolution, spark_type) if table is not None else None
        self._width = 11 if form == "typed" else 10  # the typed form's schema_version
        self.batch_rows = batch_rows
        self._typed = [spark_type(c) for c in table.columns] if table is not None else []
        self._json = [is_json(c) for c in table.columns] if table is not None else []
        self._names = [c.name for c in table.columns] if table is not None else []
        self._temporals = table is not None and has_temporals(table)
        # typed: the before and after images, built column by column
        self._images: tuple[TypedImages, TypedImages] | None = None
        self._columnar = columnar
        if form == "typed":
            assert table is not None
            self._images = (TypedImages(table, evolution), TypedImages(table, evolution))
        # json: the before and after texts (from rows events by the json_images kernel)
        self._texts = (JsonImages(), JsonImages()) if form == "json" else None
        self._writers = JsonWriters()
        self.cols: list[list[Any]] = [[] for _ in range(self._width)]

    def _clear(self) -> None:  # in place: callers hold the lists
        for col in self.cols:
            col.clear()
        if self._images is not None:
            for images in self._images:
                images.clear()
        if self._texts is not None:
            for texts in self._texts:
                texts.clear()

    def __len__(self) -> int:
        return len(self.cols[0])

    def add_transaction(self, item: TapTransaction) -> Iterator[pa.RecordBatch]:
        """The transaction's row changes; yields batches as they fill."""
        tx = item.tx
        gtid, server_id, pos = tx.gtid, tx.server_id, item.position
        ts = int(tx.timestamp.timestamp()) * 1_000_000
        only = self.table
        c = self.cols
        record = self._record
        n = 0
        for st in tx.statements():
            if not isinstance(st, RowsStatement):
                continue
            table = st.table
            if only is not None and (table.schema != only.schema or table.table != only.table):
                continue
            schema, name = table.schema, table.table
            shape = None  # typed: how this version of the table fits the query's
            if self.check is not None and self._images is not None:
                shape = self.check.shape(table, f"in the transaction ending at position "
                                                f"{item.position}")
            version = shape.version if shape is not None else None
            take, add = self._statement_images(table, shape)
            for ev, rev in st.events():
                taken = take(rev) if take is not None else -1
                if taken >= 0:  # a kernel's: the event's images in one call
                    self._records(taken, gtid, ts, server_id, schema, name, rev.kind, pos, n)
                    if version is not None:
                        c[10] += [version] * taken
                    n += taken
                    if len(c[0]) >= self.batch_rows:
                        yield self.flush()
                    continue
                for ch in st.changes_of(ev, rev):
                    add(ch.before, ch.after)
                    if version is not None:
                        c[10].append(version)
                    record(gtid, ts, server_id, schema, name, ch.op, pos, n)
                    n += 1
                    if len(c[0]) >= self.batch_rows:
                        yield self.flush()

    def _statement_images(self, table: TableMap, shape: Shape | None,
                          ) -> tuple[Callable[[RowsEvent], int] | None,
                                     Callable[[Any, Any], None]]:
        """For the rows events of one version of a table: a kernel taking a whole event
        (None: none for this form), and what adds one change's images from the row codec."""
        if self._images is not None:  # typed
            assert shape is not None
            before_images, after_images = self._images
            add_before, add_after = (partial(images.add, rescued=shape.rescued,
                                             fsp=table.fsp_by_name)
                                     for images in self._images)

            def add_typed(before: Any, after: Any) -> None:
                add_before(before, before.columns if before is not None else ())
                add_after(after, after.columns if after is not None else ())

            if not self._columnar or shape.rescued:
                return None, add_typed
            return partial(decode_event, table=table, before=before_images,
                           after=after_images), add_typed
        if self._texts is not None:  # json
            before_json, after_json = self._texts

            def add_json(before: Any, after: Any) -> None:
                # the writer follows the image's kind (row or dict)
                write = self._json_writer(table, before if before is not None else after)
                before_json.add(None if before is None else write(before))
                if after is not None and before is not None and \
                        type(after) is not type(before):
                    write = self._json_writer(table, after)
                after_json.add(None if after is None else write(after))

            if not self._columnar:
                return None, add_json
            return partial(json_event, table=table, before=before_json,
                           after=after_json), add_json
        image = partial(map_image, table)
        c = self.cols

        def add_map(before: Any, after: Any) -> None:
            c[6].append(None if before is None else image(before))
            c[7].append(None if after is None else image(after))

        return None, add_map

    def add_snapshot_rows(self, schema: str, table: str, names: Sequence[str],
                          rows: Iterable[Sequence[Any]], pos: int, change: int,
                          fsp: Sequence[int | None] = (), shape: Shape | None = None,
                          ) -> Iterator[pa.RecordBatch]:
        """Rows a snapshot read (relay/tap/snapshot.py), as op "snapshot" records with
        no GTID, commit time or server id, the row as the after image, at `pos`; `fsp`:
        the columns' fraction digits (temporals' text shows them, as for changes). A typed
        builder needs `shape`: its check of the table as the snapshot read it."""
        names = list(names)
        form = self.form
        digits = list(fsp) or [None] * len(names)
        if self.check is not None and shape is None:
            raise ValueError("a typed snapshot row needs the shape of the table it was read "
                             "under (BatchBuilder.check.shape)")
        if self._images is not None:
            assert shape is not None
            before, after = self._images
            columns = tuple(names)
            fraction_digits = {n: f for n, f in zip(names, digits, strict=True) if f}
            for row in rows:
                before.add(None, ())
                after.add(row, columns, shape.rescued, fraction_digits)
                self._snapshot_record(schema, table, pos, change, shape.version)
                if len(self.cols[0]) >= self.batch_rows:
                    yield self.flush()
            return

        def image(values: Sequence[Any]) -> Any:
            if form == "json":
                return json.dumps({n: column_jsonable(v, f) for n, v, f in zip(
                    names, values, digits, strict=True)}, ensure_ascii=False,
                    separators=(",", ":"))
            return [(n, _text(v, f)) for n, v, f in zip(names, values, digits, strict=True)]

        yield from self.add_snapshot_images(schema, table, map(image, rows), pos, change)

    def add_snapshot_images(self, schema: str, table: str, images: Iterable[Any], pos: int,
                            change: int) -> Iterator[pa.RecordBatch]:
        """Like add_snapshot_rows, with each row's image already made (the json and map
        forms: its text or its entries)."""
        if self._images is not None:
            raise ValueError("a typed builder takes a snapshot's rows (add_snapshot_rows), "
                             "not images")
        c = self.cols
        for image in images:
            if self._texts is not None:
                self._texts[0].add(None)
                self._texts[1].add(image)
            else:
                c[6].append(None)
                c[7].append(image)
            self._snapshot_record(schema, table, pos, change, None)
            if len(c[0]) >= self.batch_rows:
                yield self.flush()

    def _record(self, gtid: str | None, ts: int | None, server_id: int | None, schema: str,
                table: str, op: str, pos: int, change: int) -> None:
        """The columns of a record but its images (and the typed form's version)."""
        c = self.cols
        c[0].append(gtid)
        c[1].append(ts)
        c[2].append(server_id)
        c[3].append(schema)
        c[4].append(table)
        c[5].append(op)
        c[8].append(pos)
        c[9].append(change)

    def _records(self, rows: int, gtid: str | None, ts: int, server_id: int, schema: str,
                 table: str, op: str, pos: int, first: int) -> None:
        """The columns but the images of `rows` records of one rows event decoded whole."""
        c = self.cols
        for col, value in ((0, gtid), (1, ts), (2, server_id), (3, schema), (4, table),
                           (5, op), (8, pos)):
            c[col] += [value] * rows
        c[9] += range(first, first + rows)

    def add_snapshot_json(self, schema: str, table: str, pos: int, change: int,
                          take: Callable[[JsonImages, int], int],
                          ) -> Generator[pa.RecordBatch, None, int]:
        """Like add_snapshot_images, with the images added by `take(images, room)` (up to
        `room` at a time, returning how many, 0 at the end: a snapshot read's kernel) to
        the after images of the json form. Returns the rows added."""
        if self._texts is None:
            raise ValueError("only the json form takes a snapshot's JSON images")
        before, after = self._texts
        total = 0
        while n := take(after, max(1, self.batch_rows - len(self))):
            before.add_nulls(n)
            self._snapshot_records(n, schema, table, pos, change, None)
            total += n
            if len(self) >= self.batch_rows:
                yield self.flush()
        return total

    def add_snapshot_text(self, schema: str, table: str, names: Sequence[str],
                          rows: Sequence[Sequence[bytes | None]], pos: int, change: int,
                          fsp: Sequence[int | None], shape: Shape,
                          convert: Callable[[Sequence[bytes | None]], tuple[Any, ...]],
                          ) -> Iterator[pa.RecordBatch]:
        """Rows a snapshot read, as the server's text, into the typed form: cast by Arrow
        (TypedImages.add_text_rows) when the table's columns and these values allow,
        else `convert`ed to the row codec's values and added as add_snapshot_rows does."""
        if self._images is None:
            raise ValueError("only the typed form takes a snapshot's rows as text")
        before, after = self._images
        if tuple(names) == after.names and not shape.rescued:
            while rows:
                room = max(1, self.batch_rows - len(self))
                if not after.add_text_rows(rows[:room]):
                    break
                n = min(room, len(rows))
                rows = rows[room:]
                before.add_nulls(n)
                self._snapshot_records(n, schema, table, pos, change, shape.version)
                if len(self) >= self.batch_rows:
                    yield self.flush()
        if rows:
            yield from self.add_snapshot_rows(schema, table, names, map(convert, rows), pos,
                                              change, fsp, shape)

    def _snapshot_records(self, n: int, schema: str, table: str, pos: int, change: int,
                          version: str | None) -> None:
        """The columns but the images of `n` records of snapshot rows."""
        c = self.cols
        for col, value in ((0, None), (1, None), (2, None), (3, schema), (4, table),
                           (5, SNAPSHOT_OP), (8, pos), (9, change)):
            c[col] += [value] * n
        if self._width == 11:
            c[10] += [version] * n

    def _snapshot_record(self, schema: str, table: str, pos: int, change: int,
                         version: str | None, op: str = SNAPSHOT_OP) -> None:
        """A record with no GTID, commit time or server id (a snapshot's row, a marker)."""
        self._record(None, None, None, schema, table, op, pos, change)
        if self._width == 11:
            self.cols[10].append(version)

    def add_marker(self, schema: str, table: str, op: str, pos: int,
                   ) -> Iterator[pa.RecordBatch]:
        """A record about a table, not a row (op "snapshot_end"): no images."""
        if self._images is not None:
            for images in self._images:
                images.add(None, ())
        elif self._texts is not None:
            for texts in self._texts:
                texts.add(None)
        else:
            self.cols[6].append(None)
            self.cols[7].append(None)
        self._snapshot_record(schema, table, pos, 0, None, op)
        if len(self.cols[0]) >= self.batch_rows:
            yield self.flush()

    def _json_writer(self, table: TableMap, image: Any) -> Callable[[Any], str]:
        return self._writers.get(table, tuple(image.columns))

    def typed_values(self, values: dict[str, Any], rescued: frozenset[str] = frozenset(),
                     fsp: Mapping[str, int] | None = None) -> dict[str, Any]:
        """One typed image, as a dict (the definition TypedImages' column-wise build must
        equal, which tests check): a column the row lacks (dropped, or written before it
        was added) is NULL; `rescued` columns (schemaEvolution=json) are not converted to a
        type they no longer have but kept as JSON in __rescued (temporals with their `fsp`
        digits, as the JSON form writes them)."""
        out = {name: None if name in rescued else
               json_text(values.get(name)) if js else typed_value(ddl, values.get(name))
               for name, ddl, js in zip(self._names, self._typed, self._json, strict=True)}
        if self._temporals:
            invalid = [(n, str(v)) for n, v in values.items() if isinstance(v, InvalidTemporal)]
            out[INVALID_TEMPORALS] = invalid or None
        if self.check is not None and self.check.mode is SchemaEvolution.JSON:
            digits = fsp or {}
            out[RESCUED] = json.dumps({n: column_jsonable(values[n], digits.get(n))
                                       for n in sorted(rescued) if n in values},
                                      ensure_ascii=False, separators=(",", ":")) \
                if rescued else None
        return out

    def flush(self) -> pa.RecordBatch:
        c = self.cols
        s = self.schema
        if self._images is not None:
            before, after = (images.array() for images in self._images)
        elif self._texts is not None:
            before, after = (texts.array() for texts in self._texts)
        else:
            before = pa.array(c[6], s.field("before").type)
            after = pa.array(c[7], s.field("after").type)
        arrays = [
            pa.array(c[0], pa.string()),
            pa.array(c[1], pa.int64()).cast(UTC_TS),
            pa.array(c[2], pa.int64()),
            pa.array(c[3], pa.string()),
            pa.array(c[4], pa.string()),
            pa.array(c[5], pa.string()),
            before,
            after,
            pa.array(c[8], pa.int64()),
            pa.array(c[9], pa.int32()),
            *([pa.array(c[10], pa.string())] if self._width == 11 else []),
        ]
        self._clear()
        return pa.RecordBatch.from_arrays(arrays, schema=s)
