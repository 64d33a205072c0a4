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


CAPTURES = pathlib.Path(__file__).parent.parent / "data" / "mysql8"
PAIRS: list[tuple[str, ...]] = [("mysql-8.0.45-gtid-seq1-rotate.bin", "mysql-8.0.45-gtid-seq2-previous-gtids-stop.bin"),
         ("mysql-8.0.45-anonymous-seq1-rotate.bin", "mysql-8.0.45-anonymous-seq2-stop.bin")]
SINGLE = sorted(p.name for p in CAPTURES.glob("*.bin")
                if p.name not in {n for pair in PAIRS for n in pair}
                and "relay-log" not in p.name and "truncated" not in p.name)


def scanned(path: pathlib.Path) -> str:
    """The GTID position a file ends at, by the relay's own scan of it."""
    from relay.binlog.file import iter_file_events
    from relay.binlog.scan import FileScan
    scan = FileScan()
    with open(path, "rb") as f:
        for raw in iter_file_events(f, verify_crc=False):
            scan.feed(raw.offset, raw.data)
    return str(scan.state)


@pytest.mark.parametrize("names", [*((n,) for n in SINGLE), *PAIRS],
                         ids=[n for n in SINGLE] + ["gtid-pair", "anonymous-pair"])
def test_mysql_captures_import_as_their_files(tmp_path: pathlib.Path,
                                              names: tuple[str, ...]) -> None:
    # MySQL 5.7 to 9.6 files (tests/data/mysql8): each a segment byte for byte (but the
    # in-use mark of a file its server had open), the log's GTID set the files' own.
    paths = [write(tmp_path / "a", f"binlog.{i + 1:06d}", (CAPTURES / n).read_bytes())
             for i, n in enumerate(names)]
    done = run(str(tmp_path / "log"), paths)
    assert done.position == scanned(CAPTURES / names[-1]) and not done.torn
    for path in paths:
        mine = (tmp_path / "log" / os.path.basename(path)).read_bytes()
        theirs = pathlib.Path(path).read_bytes()
        assert len(mine) == len(theirs)
        assert [i for i in range(len(mine)) if mine[i] != theirs[i]] in ([], [4 + 17])


def test_a_replicas_relay_log_and_a_torn_file_are_named(tmp_path: pathlib.Path) -> None:
    relay_log = write(tmp_path / "a", "binlog.000001",
                      (CAPTURES / "mysql-8.0.17-relay-log-two-fde-hidden-gcol.bin").read_bytes())
    with pytest.raises(ArchiveError, match=r"a segment named master-bin\.000001 cannot follow"):
        run(str(tmp_path / "log"), [relay_log])
    torn = write(tmp_path / "b", "binlog.000001",
                 (CAPTURES / "mysql-5.7.2-truncated-previous-gtids-negative.bin").read_bytes())
    done = run(str(tmp_path / "log2"), [torn])
    assert done.torn == [("binlog.000001", 120)] and done.transactions == 0


def test_a_mariadb_file_among_mysql_ones_is_refused(tmp_path: pathlib.Path) -> None:
    mysql = write(tmp_path / "a", "binlog.000001",
                  (CAPTURES / "mysql-8.0.45-gtid-seq1-rotate.bin").read_bytes())
    mariadb, _ = primary_file("binlog.000002", [Gtid(0, 1, 1)], [])
    with pytest.raises(ArchiveError, match=r"binlog\.000002 is a MariaDB binlog, and this "
                                           r"log holds MySQL transactions"):
        run(str(tmp_path / "log"), [mysql, write(tmp_path / "a", "binlog.000002", mariadb)])


def test_an_archive_source_is_a_file_url_with_an_absolute_path() -> None:
    from relay.config import Source
    source = Source.parse("file:///backups/binlog/mariadb-bin.*")
    assert source.archive == "/backups/binlog/mariadb-bin.*"
    assert str(source) == source.address == "file:///backups/binlog/mariadb-bin.*"
    with pytest.raises(ValueError, match="an absolute path or pattern"):
        Source.parse("file://backups/binlog")


def test_a_file_its_server_crashed_in_imports_again_with_newer_files(
        tmp_path: pathlib.Path) -> None:
    # mysql-bin.000007 ends inside 0-1-4 (the server crashed in it: never committed), the
    # server restarted into .000008. Its segment is shorter than the file; running the
    # same import again, with a newer file, goes on.
    from relay.binlog import build
    from tests.helpers import gtid_event, rows_event
    crashed, _ = primary_file("mysql-bin.000007", [Gtid(0, 1, s) for s in (1, 2, 3)], [])
    torn_tx = b"".join(build.reframe(ev, True, log_pos=len(crashed) + 42 * (i + 1))
                       for i, ev in enumerate([gtid_event(Gtid(0, 1, 4))]))
    crashed += torn_tx + rows_event()
    after, _ = primary_file("mysql-bin.000008", [Gtid(0, 1, 4), Gtid(0, 1, 5)],
                            [Gtid(0, 1, 3)], next_file="mysql-bin.000009")
    newer, _ = primary_file("mysql-bin.000009", [Gtid(0, 1, 6)], [Gtid(0, 1, 5)])
    paths = [write(tmp_path / "a", n, d) for n, d in (("mysql-bin.000007", crashed),
                                                       ("mysql-bin.000008", after))]
    first = run(str(tmp_path / "log"), paths)
    assert first.dropped == ["mysql-bin.000007"] and first.position == "0-1-5"
    paths.append(write(tmp_path / "a", "mysql-bin.000009", newer))
    again = run(str(tmp_path / "log"), paths)
    assert again.position == "0-1-6" and again.skipped == ["mysql-bin.000007",
                                                           "mysql-bin.000008"]


def test_a_same_named_file_of_another_history_is_not_appended(tmp_path: pathlib.Path) -> None:
    paths = series(tmp_path / "archive", [3, 2])
    run(str(tmp_path / "log"), paths)  # .000008 is the log's open segment
    other, _ = primary_file("mysql-bin.000008", [Gtid(0, 1, s) for s in range(40, 50)],
                            [Gtid(0, 1, 39)])
    with pytest.raises(ArchiveError, match="not the file this log was made from"):
        run(str(tmp_path / "log"), [write(tmp_path / "b", "mysql-bin.000008", other)])


def test_the_mariadb_capture_imports_as_its_file(tmp_path: pathlib.Path) -> None:
    source = CAPTURES.parent / "mariadb" / "types.000001"  # every type family, 10.11
    path = write(tmp_path / "a", "mariadb-bin.000001", source.read_bytes())
    done = run(str(tmp_path / "log"), [path])
    assert done.position == scanned(source) and done.transactions > 30
    assert (tmp_path / "log" / "mariadb-bin.000001").read_bytes() == source.read_bytes()
