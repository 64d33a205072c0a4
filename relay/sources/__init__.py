"""Binlog sources by URI, read as row changes.

    file:///path/to/binlog.000042        one binlog file
    file:///var/lib/mysql                a directory: its index file, or its numbered files
    file:///var/lib/mysql/binlog.index   an index file
    relay:///var/lib/relay               a relay log directory (one being written too)
    mysql://user:pw@host:port?start=GTID a live primary ("earliest", "current" or a
                                         GTID position; default earliest)

    with open_source("file:///var/lib/mysql") as src:
        for tx in src.transactions():
            for change in tx.changes():
                print(change.op, change.table, change.after)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Protocol
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

from relay.binlog.changes import ChangeStream, RowChange, SourceEvent, Transaction
from relay.binlog.tablemap import TypeHints
from relay.config import Source, redact, redact_url
from relay.errors import SourceError
from relay.relaylog.naming import list_index_files
from relay.relaylog.series import BinlogSeries, files_of, relay_log_files
from relay.sources.live import LiveSource

__all__ = ["BinlogSource", "SourceError", "open_source"]


class _Events(Protocol):
    def events(self) -> Iterator[SourceEvent]: ...


@dataclass
class BinlogSource:
    """A source opened by `open_source`: its events, and the layered views over them."""

    uri: str
    reader: _Events
    hints: TypeHints = field(default_factory=TypeHints)
    checksum: bool | None = None

    def events(self) -> Iterator[SourceEvent]:
        return self.reader.events()

    def stream(self) -> ChangeStream:
        return ChangeStream(self.events(), hints=self.hints, checksum=self.checksum)

    def transactions(self) -> Iterator[Transaction]:
        return self.stream().transactions()

    def changes(self) -> Iterator[RowChange]:
        return self.stream().changes()

    def __enter__(self) -> BinlogSource:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        return None


def open_source(uri: str, *, follow: bool = False, hints: TypeHints | None = None,
                verify_crc: bool = True) -> BinlogSource:
    """Open `uri` (see the module docstring). `hints` add column types the binlog does not
    carry; a live primary's own are fetched from its information_schema as well."""
    try:
        parts = urlsplit(uri)
    except ValueError as exc:  # an unclosed [IPv6] host, ...
        raise SourceError(f"{redact_url(uri)!r}: {exc}") from None
    scheme = parts.scheme.lower()
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    hints = hints or TypeHints()
    if scheme in ("", "file"):
        path = unquote(parts.path if scheme else uri)
        if not path:
            raise SourceError(f"{uri!r} names no file")
        return BinlogSource(uri, BinlogSeries(files_of(path), follow=follow,
                                              verify_crc=verify_crc), hints)
    if scheme == "relay":
        if parts.netloc:
            raise SourceError(f"{redact_url(uri)!r}: relay:// names the relay log's directory "
                              "on this host (relay:///var/lib/relay), no user or host; a "
                              "relay's clients read it with mysql://user:password@host:port")
        directory = unquote(parts.path)
        # The log's base name: as given, else the one log in the directory (an imported
        # log's segments keep their files' names), else relay-bin.
        found = list_index_files(directory) if os.path.isdir(directory) else []
        basename = query.get("basename") or (found[0] if len(found) == 1 else "relay-bin")
        try:
            segments = relay_log_files(directory, basename)
        except SourceError as exc:
            raise SourceError(f"{redact_url(uri)}: {exc}") from None
        return BinlogSource(uri, BinlogSeries(segments, follow=follow, verify_crc=verify_crc,
                                              always_scan=True), hints)
    if scheme in ("mysql", "mariadb"):
        try:
            tls = urlencode({k: v for k, v in query.items()
                             if k.startswith("ssl-") or k == "get-server-public-key"})
            source = Source.parse(uri.split("?", 1)[0] + (f"?{tls}" if tls else ""))
        except ValueError as exc:
            raise SourceError(str(exc)) from exc
        live = LiveSource(source, start=query.get("start", "earliest"), follow=follow,
                          fetch_hints=query.get("hints", "auto") != "off")
        merged = TypeHints(dict(live.type_hints()))
        for key, hint in hints.items():
            merged.add(*key, hint)
        return BinlogSource(redact(uri), live, merged)
    raise SourceError(f"{redact_url(uri)!r}: unknown scheme {parts.scheme!r}; use file://, "
                      "relay:// or mysql://")
