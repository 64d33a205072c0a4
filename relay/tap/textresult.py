"""A text result set's rows read in blocks from the socket and parsed by the kernels
(`text_rows`, `json_text_rows`), for the snapshot's chunk reads: PyMySQL parses a row in
Python, one packet read and one call per value (226k rows/s per core on the tap's bench
table), where the kernels parse a block of rows in one call.

The connection stays PyMySQL's (login policy, TLS, the query and its column definitions);
only the rows after the column definitions are read here, to their EOF packet, so the
connection is ready for its next command afterwards. What the kernels leave (a row of
several packets, a row the JSON steps do not write, the end) is handled here, one row at a
time; a packet that is not a row of the result's columns is an error naming its offset.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from enum import Enum
from typing import Protocol

from relay import kernels
from relay.errors import RelayError
from relay.kernels import pure

Row = tuple[bytes | None, ...]
_MAX_PACKET = 0xFFFFFF
_BLOCK = 1 << 18  # bytes asked of the socket at a time


class _Stop(Enum):
    MORE = "more"  # the packet there is not all in yet
    END = "end"    # the EOF packet: the rows ended (taken)


class MalformedResult(RelayError):
    code = "malformed_result"


class JsonSink(Protocol):
    """Where JSON images go (relay/tap/json_images.py JsonImages)."""

    def kernel_sink(self) -> tuple[list[bytearray], int]: ...

    def kernel_took(self, rows: int) -> None: ...

    def add(self, text: str | None) -> None: ...


class TextResult:
    """The rows of one text result set of `ncols` columns; `read(n)` gives up to n bytes
    of the connection (at least one, or raises), `error(payload)` the exception of an
    error packet."""

    def __init__(self, read: Callable[[int], bytes], error: Callable[[bytes], Exception],
                 ncols: int, label: str) -> None:
        self._read = read
        self._error = error
        self.ncols = ncols
        self.label = label
        self._buf = bytearray()
        self._pos = 0
        self._offset = 0  # of _buf[0] in the result's rows
        self.done = False

    def _more(self) -> None:
        if self._pos:
            del self._buf[: self._pos]
            self._offset += self._pos
            self._pos = 0
        self._buf += self._read(_BLOCK)

    def _stopped(self) -> Row | _Stop:
        """Where a kernel stopped: the row there (taken), or why there is none. A row of
        several packets (payloads of 0xFFFFFF bytes, then a shorter one) is copied once,
        when all of it is in."""
        buf, pos = self._buf, self._pos
        spans = []
        p = pos
        while True:
            if len(buf) - p < 4:
                return _Stop.MORE
            n = int.from_bytes(buf[p : p + 3], "little")
            if len(buf) - p - 4 < n:
                return _Stop.MORE
            spans.append((p + 4, p + 4 + n))
            p += 4 + n
            if n < _MAX_PACKET:
                break
        first = buf[spans[0][0] : spans[0][0] + 1] if spans[0][1] > spans[0][0] else b""
        if len(spans) == 1 and first == b"\xff":
            raise self._error(bytes(buf[spans[0][0] : spans[0][1]]))
        self._pos = p
        if len(spans) == 1 and first == b"\xfe" and spans[0][1] - spans[0][0] < 9:
            self.done = True
            return _Stop.END
        payload = b"".join(bytes(buf[a:b]) for a, b in spans)
        values = pure.text_values(payload, 0, len(payload), self.ncols)
        if values is None:
            raise MalformedResult(f"{self.label}: a packet of {len(payload)} bytes at offset "
                                  f"{self._offset + pos} of the rows is not a row of "
                                  f"{self.ncols} columns")
        return tuple(None if v is None else payload[v[0] : v[1]] for v in values)

    def rows(self, limit: int = 4096) -> Iterator[list[Row]]:
        """The rows as their values' bytes (None: NULL), a list at a time."""
        while not self.done:
            out: list[Row] = []
            self._pos = kernels.text_rows(self._buf, self._pos, len(self._buf), self.ncols,
                                          out, limit)
            if len(out) < limit:
                row = self._stopped()
                if row is _Stop.MORE:
                    self._more()
                elif row is not _Stop.END:
                    out.append(row)
            if out:
                yield out

    def json_into(self, sink: JsonSink, plan: tuple[int, ...], keys: tuple[bytes, ...],
                  write: Callable[[Row], str], room: int) -> int:
        """Up to `room` rows' JSON images added to `sink` (the kernel's, and `write`'s for a
        row it leaves): how many, 0 only at the end of the rows."""
        while not self.done:
            buffers, rows = sink.kernel_sink()
            self._pos, taken = kernels.json_text_rows(self._buf, self._pos, len(self._buf),
                                                      plan, keys, buffers, rows, room)
            sink.kernel_took(taken)
            if taken:
                return taken
            row = self._stopped()
            if row is _Stop.MORE:
                self._more()
            elif row is not _Stop.END:
                sink.add(write(row))
                return 1
        return 0

    def drain(self) -> None:
        """Read to the end of the rows (a reader that stopped early), so the connection
        can take its next command."""
        for _ in self.rows():
            pass
