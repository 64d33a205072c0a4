"""The tap's JSON form (images as JSON object text) built from rows events by the
`json_images` kernel, with no Python object per value: what relay/tap/typed_images.py is
for the typed form. An event of a table whose columns are all of the types the kernel
writes (integers, FLOAT, DOUBLE, DECIMAL, DATE, DATETIME, TIMESTAMP, YEAR, binary strings
as base64, text in UTF-8 or a single-byte character set), with full images, goes through
it; other events, and an event with a value it gives back (a zero date), are written by
the generated writer (relay/binlog/jsonwriter.py `json_writer`) from the row codec's
values, which stays the definition: tests require the same text from both.

A batch column is a run of segments (texts from the writer, a kernel's string buffers,
images that are NULL) concatenated at flush.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from relay import kernels
from relay.binlog.plans import PlanCache, json_plan
from relay.binlog.rows import RowsEvent, full_images
from relay.binlog.tablemap import TableMap
from relay.tap.typed_images import take_event

Write = Callable[[bytes, int, int, tuple[int, ...], tuple[bytes, ...], tuple[bytes, ...],
                  list[list[bytearray]], list[int]], int]


class JsonImages:
    """The images of one batch column (before or after) of the JSON form."""

    def __init__(self) -> None:
        self._sealed: list[pa.Array] = []
        self._texts: list[str | None] = []       # the writer's segment
        self._null_run = 0                        # images that are NULL
        self._buffers: list[bytearray] | None = None  # the kernel's: validity, offsets, text
        self._kernel_rows = 0
        self.plans = PlanCache(json_plan)

    def __len__(self) -> int:
        return sum(map(len, self._sealed)) + len(self._texts) + self._null_run + \
            self._kernel_rows

    def _seal(self) -> None:
        if self._texts:
            self._sealed.append(pa.array(self._texts, pa.string()))
            self._texts = []
        elif self._null_run:
            self._sealed.append(pa.nulls(self._null_run, pa.string()))
            self._null_run = 0
        elif self._kernel_rows:
            assert self._buffers is not None
            self._sealed.append(pa.Array.from_buffers(
                pa.string(), self._kernel_rows, [pa.py_buffer(b) for b in self._buffers]))
            self._buffers = None
            self._kernel_rows = 0

    def add(self, text: str | None) -> None:
        """One image's text (None: no image) from the writer."""
        if self._null_run or self._kernel_rows:
            self._seal()
        self._texts.append(text)

    def add_nulls(self, rows: int) -> None:
        if self._texts or self._kernel_rows:
            self._seal()
        self._null_run += rows

    def kernel_sink(self) -> tuple[list[bytearray], int]:
        if self._texts or self._null_run:
            self._seal()
        if self._buffers is None:
            self._buffers = [bytearray(), bytearray(4), bytearray()]
        return self._buffers, self._kernel_rows

    def kernel_took(self, rows: int) -> None:
        self._kernel_rows += rows

    def array(self) -> pa.Array:
        """The images since the last call, as one string array (and clear)."""
        self._seal()
        sealed, self._sealed = self._sealed, []
        if not sealed:
            return pa.array([], pa.string())
        return sealed[0] if len(sealed) == 1 else pa.concat_arrays(sealed)

    def clear(self) -> None:
        self._sealed = []
        self._texts = []
        self._null_run = 0
        self._buffers = None
        self._kernel_rows = 0


def json_event(rev: RowsEvent, table: TableMap, before: JsonImages, after: JsonImages,
               write: Write = kernels.json_images) -> int:
    """The images of one rows event of `table` as JSON text by the kernel: the rows
    taken, or -1 (nothing added) for an event the writer must write."""
    plan = after.plans.get(table) if full_images(rev, table) else None
    if plan is None:
        return -1
    data = rev.data
    return take_event(rev, before, after, lambda sinks, rows: write(
        data, rev.rows_start, len(data), *plan, sinks, rows))
