"""`relay import` over synthesized binlog files (no server): each file becomes the segment
of its name byte for byte, and what cannot be one server's history in order is refused
with the file (and offset) named; an interrupted import goes on where it stopped."""

from __future__ import annotations

import asyncio
import os
import pathlib

import pytest

from relay.binlog import walk
from relay.binlog.gtid import Gtid
from relay.config import SyncMode, SyncPolicy
from relay.importer import ImportProgress, import_files
from relay.relaylog import archive
from relay.relaylog.archive import ArchiveError
from relay.relaylog.log import RelayLog
from tests.unit.test_ingest import primary_file

OFF = SyncPolicy(SyncMode.OFF)


def write(folder: pathlib.Path, name: str, data: bytes) -> str:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_bytes(data)
    return str(path)


def series(folder: pathlib.Path, counts: list[int], base: str = "mysql-bin",
           first: int = 7) -> list[str]:
    """Files of one server in a row, `counts` transactions each, each closed by a ROTATE
    but the last (a file the server still writes)."""
    paths: list[str] = []
    seq, state = 1, list[Gtid]()
    for i, count in enumerate(counts):
        name = f"{base}.{first + i:06d}"
        closed = f"{base}.{first + i + 1:06d}" if i < len(counts) - 1 else None
        data, _ = primary_file(name, [Gtid(0, 1, s) for s in range(seq, seq + count)],
                               state, next_file=closed)
        seq += count
        state = [Gtid(0, 1, seq - 1)]
        paths.append(write(folder, name, data))
    return paths


def run(data_dir: str, paths: list[str], **kw: object) -> ImportProgress:
    return asyncio.run(import_files(data_dir, paths, sync=OFF, **kw))  # type: ignore[arg-type]


def test_each_file_becomes_the_segment_of_its_name(tmp_path: pathlib.Path) -> None:
    paths = series(tmp_path / "archive", [5, 3, 4])
    done = run(str(tmp_path / "log"), paths)
    assert (done.files_done, done.transactions, done.position) == (3, 12, "0-1-12")
    assert done.basename == "mysql-bin"
    for path in paths:
        segment = tmp_path / "log" / os.path.basename(path)
        assert segment.read_bytes() == pathlib.Path(path).read_bytes(), path
    log = RelayLog(str(tmp_path / "log"), basename="mysql-bin", sync=OFF)
    log.open()
    assert list(log.segments) == [os.path.basename(p) for p in paths]
    assert str(log.state) == "0-1-12"
    log.close()


def test_an_interrupted_import_goes_on_where_it_stopped(tmp_path: pathlib.Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    paths = series(tmp_path / "archive", [40, 30, 20])
    monkeypatch.setattr(archive, "BATCH_BYTES", 2000)  # several batches a file

    async def stopped_early() -> ImportProgress:
        stop = asyncio.Event()

        def progress(p: ImportProgress) -> None:
            if p.bytes_done > 6000:
                stop.set()
        return await import_files(str(tmp_path / "log"), paths, sync=OFF,
                                  on_progress=progress, stop=stop)
    first = asyncio.run(stopped_early())
    assert 0 < first.transactions < 90 and first.files_done < 3
    rest = run(str(tmp_path / "log"), paths)
    assert first.transactions + rest.transactions == 90 and rest.position == "0-1-90"
    for path in paths:
        segment = tmp_path / "log" / os.path.basename(path)
        assert segment.read_bytes() == pathlib.Path(path).read_bytes(), path


def test_newer_files_are_added_to_a_log_an_import_made(tmp_path: pathlib.Path) -> None:
    paths = series(tmp_path / "archive", [5, 3, 4])
    run(str(tmp_path / "log"), paths[:2])
    later = run(str(tmp_path / "log"), paths)  # the old ones again, and a newer one
    assert later.skipped == [os.path.basename(p) for p in paths[:2]]
    assert (later.files_done, later.transactions, later.position) == (1, 4, "0-1-12")
    # A file the server still wrote when it was imported, and that grew since, goes on.
    grown = series(tmp_path / "archive2", [5, 3, 4, 6])
    more = run(str(tmp_path / "log"), grown[2:])
    assert more.position == "0-1-18"
    assert (tmp_path / "log" / "mysql-bin.000009").read_bytes() == \
        pathlib.Path(grown[2]).read_bytes()


def test_a_missing_file_is_refused_by_its_number(tmp_path: pathlib.Path) -> None:
    paths = series(tmp_path / "archive", [2, 2, 2])
    with pytest.raises(ArchiveError, match=r"mysql-bin\.000008 is missing between"):
        run(str(tmp_path / "log"), [paths[0], paths[2]])
    run(str(tmp_path / "log"), paths[:1])
    with pytest.raises(ArchiveError, match=r"mysql-bin\.000008 is missing"):
        run(str(tmp_path / "log"), paths[2:])


@pytest.mark.parametrize(("start", "says"), [
    (7, "files are missing in between"),
    (3, "these files overlap or come from another server's history")])
def test_a_file_whose_gtids_do_not_follow_is_refused(tmp_path: pathlib.Path, start: int,
                                                     says: str) -> None:
    first, _ = primary_file("b.000001", [Gtid(0, 1, s) for s in range(1, 6)], [],
                            next_file="b.000002")
    second, _ = primary_file("b.000002", [Gtid(0, 1, s) for s in range(start + 1, start + 3)],
                             [Gtid(0, 1, start)])
    paths = [write(tmp_path / "a", "b.000001", first), write(tmp_path / "a", "b.000002", second)]
    with pytest.raises(ArchiveError, match=says) as refused:
        run(str(tmp_path / "log"), paths)
    assert "b.000002 starts after MariaDB GTIDs" in str(refused.value)
    assert "end at 0-1-5" in str(refused.value)


def test_a_corrupt_event_is_named_by_file_and_offset(tmp_path: pathlib.Path) -> None:
    paths = series(tmp_path / "archive", [3, 3])
    data = bytearray(pathlib.Path(paths[1]).read_bytes())
    spans = list(walk.spans(bytes(data), 4))
    at, size = spans[5]
    data[at + size - 6] ^= 0xFF  # a byte of an event's body: its CRC32 no longer holds
    pathlib.Path(paths[1]).write_bytes(bytes(data))
    with pytest.raises(ArchiveError, match="checksum mismatch") as refused:
        run(str(tmp_path / "log"), paths)
    assert paths[1] in str(refused.value) and f"offset {at}" in str(refused.value)
    # What came before it is in the log, whole.
    log = RelayLog(str(tmp_path / "log"), basename="mysql-bin", sync=OFF)
    log.open()
    assert str(log.state).startswith("0-1-") and len(log.segments) == 2
    log.close()


def test_files_that_are_not_one_servers_series_are_refused(tmp_path: pathlib.Path) -> None:
    a = series(tmp_path / "one", [1], base="alpha")
    b = series(tmp_path / "two", [1], base="beta")
    with pytest.raises(ArchiveError, match="files of 2 series"):
        run(str(tmp_path / "log"), a + b)
    with pytest.raises(ArchiveError, match="not a binlog file name"):
        run(str(tmp_path / "log"), [write(tmp_path, "notes.txt", b"\xfebin")])
    with pytest.raises(ArchiveError, match="no \\\\xfebin magic"):
        run(str(tmp_path / "log"), [write(tmp_path, "x-bin.000001", b"hello")])
    run(str(tmp_path / "log"), a)
    with pytest.raises(ArchiveError, match="holds a relay log of alpha"):
        run(str(tmp_path / "log"), b)


def test_a_relay_pointed_at_an_imported_log_is_told_its_base_name(
        tmp_path: pathlib.Path) -> None:
    from relay.app import build_relay_log
    from relay.config import parse_config
    from relay.errors import ConfigError
    run(str(tmp_path / "log"), series(tmp_path / "archive", [2]))
    config = parse_config({"relay": {"data_dir": str(tmp_path / "log")}})
    with pytest.raises(ConfigError, match='set \\[relaylog\\] basename = "mysql-bin"'):
        build_relay_log(config)
    named = parse_config({"relay": {"data_dir": str(tmp_path / "log")},
                          "relaylog": {"basename": "mysql-bin"}})
    log = build_relay_log(named)
    log.open()
    assert str(log.state) == "0-1-2"
    log.close()
