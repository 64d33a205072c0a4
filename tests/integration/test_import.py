"""`relay import` of real servers' binlog files (MariaDB 10.11 and 11.8, MySQL 9.7): the
files become segments of their own names, a replica asking for a file by name and
position gets it from them, a replica by GTID gets the whole history, and the relay then
follows the live primary from where the files end; kill -9 during an import loses and
tears nothing, and the same command goes on."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from relay.binlog import walk
from relay.testing.builds import ServerBuild
from relay.testing.mariadb import MariaDB
from tests.conftest import RelayProcess, replicate_through, required_build, wait_until
from tests.integration.common import assert_same_data, converged, listening

pytestmark = pytest.mark.integration

IN_USE_FLAG_AT = 4 + 17  # the FORMAT_DESCRIPTION's flags: a server marks its open file


def relay_import(data_dir: str, files: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "relay.cli", "import", "--data-dir", data_dir,
                           *files], capture_output=True, text=True, timeout=300)


def history(primary: MariaDB, db: str) -> list[str]:
    """Three binlog files: one closed by a rotation, one by a restart, one still open."""
    primary.execute_many([f"CREATE DATABASE {db}",
                          f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v VARCHAR(40), d DATETIME)",
                          *[f"INSERT INTO {db}.t VALUES ({i}, 'v{i}', NOW())" for i in range(200)],
                          "FLUSH BINARY LOGS",
                          *[f"UPDATE {db}.t SET v = 'u{i}' WHERE id = {i}" for i in range(200)]])
    primary.stop()
    primary.start()
    primary.execute_many([f"DELETE FROM {db}.t WHERE id < 20",
                          f"INSERT INTO {db}.t VALUES (1000, 'after the restart', NOW())"])
    return [primary.binlog_path(n) for n in primary.binlog_files()]


def more_history(primary: MariaDB, db: str) -> list[str]:
    """Then a second GTID domain, statements in MIXED format, DDL and a transaction over
    16 MiB (an event larger than a packet), in a fourth file."""
    conn = primary.root()
    try:
        with conn.cursor() as cur:
            cur.execute("FLUSH BINARY LOGS")
            cur.execute("SET SESSION gtid_domain_id = 1")
            cur.execute(f"CREATE TABLE {db}.other (id INT PRIMARY KEY, b LONGBLOB)")
            cur.execute(f"INSERT INTO {db}.other VALUES (1, REPEAT('z', 17 << 20))")
            cur.execute("SET SESSION gtid_domain_id = 0")
            cur.execute("SET SESSION binlog_format = 'MIXED'")
            cur.execute(f"UPDATE {db}.t SET v = CONCAT(v, '!') WHERE id < 100")
            cur.execute(f"INSERT INTO {db}.t (id, v, d) SELECT id + 5000, v, d FROM {db}.t "
                        "WHERE id < 10")
            cur.execute("SET SESSION binlog_format = 'ROW'")
            cur.execute(f"ALTER TABLE {db}.t ADD COLUMN extra INT DEFAULT 7")
        conn.commit()
    finally:
        conn.close()
    return [primary.binlog_path(n) for n in primary.binlog_files()]


def decoded(build: ServerBuild, path: str) -> str:
    """mariadb-binlog's reading of a file (its end_log_pos values aside: MariaDB 11.4+
    writes 0 for a transaction's inner events, the relay log their real positions)."""
    import re
    out = subprocess.run(build.command(build.tool("mariadb-binlog"), "--no-defaults",
                                       "--base64-output=decode-rows", "-v",
                                       build.server_path(path) if build.root else path),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    text = re.sub(r"end_log_pos \d+|CRC32 0x[0-9a-f]+", "", out.stdout)
    # (the relay log does not mark a file its server still had open)
    return re.sub(r"(?m)^.*Warning: this binlog is either in use or was not closed.*\n",
                  "", text)


def relay_at(relay: RelayProcess, primary: MariaDB) -> bool:
    """The relay's log holds the primary's transactions (its segments are not relay-bin.*
    here: /status, not the segment files)."""
    return bool(relay.status().get("relay_log", {}).get("gtid_pos") == primary.gtid_binlog_pos())


def same_file(segment: str, path: str, *, positions_only: bool) -> None:
    with open(segment, "rb") as f:
        mine = f.read()
    with open(path, "rb") as f:
        theirs = f.read()
    assert len(mine) == len(theirs), (segment, len(mine), len(theirs))
    assert list(walk.spans(mine, 4)) == list(walk.spans(theirs, 4)), segment
    if not positions_only:
        differ = [i for i in range(len(mine)) if mine[i] != theirs[i]]
        assert differ in ([], [IN_USE_FLAG_AT]), (segment, differ[:10])


@pytest.mark.builds("machine", "mariadb-11.8")
def test_imported_files_are_served_by_name_and_by_gtid_then_the_primary_followed(
        mariadb_factory: Callable[..., MariaDB],
        relay_factory: Callable[..., RelayProcess]) -> None:
    primary = mariadb_factory()
    history(primary, "arch")
    files = more_history(primary, "arch")
    assert len(files) == 4 and "1-1-" in primary.gtid_binlog_pos()
    relay = relay_factory(primary.url, relaylog={"basename": "mariadb-bin"},
                          downstream={"listen": f"127.0.0.1:{_port()}"},
                          users={"repl": "relaypass"})
    out = relay_import(relay.data_dir, files)
    assert out.returncode == 0, out.stderr
    assert "4 file(s)" in out.stderr and primary.gtid_binlog_pos() in out.stderr, out.stderr
    build = primary.build
    assert build is not None
    # MariaDB 11.4+ writes end_log_pos 0 for a transaction's inner events, which the
    # relay log stores with their real positions: the same events at the same offsets.
    for path in files:
        segment = os.path.join(relay.data_dir, os.path.basename(path))
        same_file(segment, path, positions_only=build.root is not None)
        if build.root is not None:  # (the root's tool reads a copy inside the root)
            segment = primary.readable(segment)
            path = primary.readable(path)
            segment, path = build.host_path(segment), build.host_path(path)
        mine, theirs = decoded(build, segment), decoded(build, path)
        assert mine == theirs, (path, "".join(__import__("difflib").unified_diff(
            theirs.splitlines(True), mine.splitlines(True), n=1))[:3000])
    relay.start()
    wait_until(lambda: listening(relay.port), 30, "the relay to listen")
    wait_until(lambda: relay_at(relay, primary), 60, "the relay to resume from the files")
    primary.execute_many(["INSERT INTO arch.t (id, v, d) VALUES (2000, 'live', NOW())"])
    by_file = mariadb_factory(server_id=21)
    by_gtid = mariadb_factory(server_id=22)
    replicate_through(by_file, relay.port, gtid=False)  # mariadb-bin.000001 at 4
    replicate_through(by_gtid, relay.port, gtid=True)
    for replica in (by_file, by_gtid):
        wait_until(functools.partial(converged, primary, replica), 90, "the replica")
        assert_same_data(primary, replica)
    assert by_file.query("SELECT v FROM arch.t WHERE id = 2000")[0][0] == "live"
    status = by_file.slave_status()
    assert str(status["Master_Log_File"]).startswith("mariadb-bin.0000")


def test_a_mysql_servers_files_import_with_compressed_transactions(
        tmp_path: object, relay_factory: Callable[..., RelayProcess]) -> None:
    build = required_build("mysql-9.7")
    primary = MariaDB(build=build, base_dir=str(tmp_path) + "/primary")
    primary.start()
    try:
        primary.execute_many([f"GRANT REFERENCES ON *.* TO '{primary.repl_user}'@'%'"])
        conn = primary.root()
        with conn.cursor() as cur:
            cur.execute("CREATE DATABASE m")
            cur.execute("CREATE TABLE m.t (id INT PRIMARY KEY, v VARCHAR(40))")
            cur.execute("SET SESSION binlog_transaction_compression = ON")
            cur.execute("INSERT INTO m.t VALUES " +
                        ",".join(f"({i}, 'compressed {i}')" for i in range(300)))
            cur.execute("SET SESSION binlog_transaction_compression = OFF")
            cur.execute("SET gtid_next = 'AUTOMATIC:archived'")  # a tagged transaction
            cur.execute("INSERT INTO m.t VALUES (1000, 'tagged')")
            cur.execute("SET gtid_next = 'AUTOMATIC'")
            cur.execute("FLUSH BINARY LOGS")
            for i in range(300, 320):
                cur.execute(f"INSERT INTO m.t VALUES ({i}, 'plain {i}')")
        conn.commit()
        conn.close()
        files = [primary.binlog_path(n) for n in primary.binlog_files()]
        tap_port = _port()
        relay = relay_factory(f"{primary.url}?get-server-public-key=true",
                              '[[tap.users]]\nname = "reader"\npassword = "s3cret"\n',
                              relaylog={"basename": "binlog"},
                              tap={"listen": f"127.0.0.1:{tap_port}"})
        out = relay_import(relay.data_dir, files)
        assert out.returncode == 0, out.stderr
        for path in files:
            same_file(os.path.join(relay.data_dir, os.path.basename(path)), path,
                      positions_only=False)
        # relay changes reads the imported log as the files (compressed rows included)
        changes = [subprocess.run([sys.executable, "-m", "relay.cli", "changes", "--table",
                                   "m.t", source], capture_output=True, text=True, timeout=120)
                   for source in (f"relay://{relay.data_dir}",  # (its one log: binlog.*)
                                  f"file://{os.path.dirname(files[0])}")]
        assert changes[0].returncode == 0, changes[0].stderr
        assert changes[0].stdout == changes[1].stdout and changes[0].stdout.count("\n") == 321
        assert '"compressed 299"' in changes[0].stdout
        relay.start()
        wait_until(lambda: relay_at(relay, primary), 60, "the relay to follow from the files")
        assert ":archived:1" in relay.status()["relay_log"]["gtid_pos"]
        # The tap reads the imported log as any other: the rows, compressed ones included.
        from relay.tap.client import TapClient
        with TapClient(f"127.0.0.1:{tap_port}", "reader", "s3cret") as tap:
            after = sorted((c[4]["id"], c[4]["v"]) for m in tap.fetch_changes(
                "earliest", "latest", tables=["m.t"]) for c in m["changes"])
        assert after == sorted((int(str(i)), str(v, "utf8") if isinstance(v, bytes) else v)
                               for i, v in primary.query("SELECT id, v FROM m.t"))
        assert len(after) == 321
    finally:
        primary.cleanup()


def test_kill_9_during_an_import_tears_nothing_and_the_same_command_goes_on(
        mariadb_factory: Callable[..., MariaDB], tmp_path: object) -> None:
    primary = mariadb_factory()
    primary.execute_many(["CREATE DATABASE k", "CREATE TABLE k.t (id INT PRIMARY KEY, b LONGBLOB)"])
    for n in range(3):
        primary.execute_many([f"INSERT INTO k.t VALUES ({n * 1000 + i}, REPEAT('x', 20000))"
                              for i in range(800)] + ["FLUSH BINARY LOGS"])
    files = [primary.binlog_path(n) for n in primary.binlog_files()]
    data_dir = str(tmp_path) + "/log"
    for attempt in range(3):
        proc = subprocess.Popen([sys.executable, "-m", "relay.cli", "import", "--data-dir",
                                 data_dir, *files], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 30
        index = os.path.join(data_dir, "mariadb-bin.index")
        # kill -9 once it has written part of the log (later attempts: at once)
        while attempt == 0 and time.monotonic() < deadline and proc.poll() is None:
            if os.path.exists(index) and imported_bytes(data_dir) > 20 << 20:
                break
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if attempt == 0:  # it was stopped inside the import, not after it
            assert proc.returncode == -signal.SIGKILL
            assert 0 < imported_bytes(data_dir) < sum(map(os.path.getsize, files))
    out = relay_import(data_dir, files)
    assert out.returncode == 0, out.stderr
    for path in files:
        same_file(os.path.join(data_dir, os.path.basename(path)), path, positions_only=False)
    assert primary.gtid_binlog_pos() in out.stderr


def imported_bytes(data_dir: str) -> int:
    return sum(os.path.getsize(os.path.join(data_dir, n)) for n in os.listdir(data_dir)
               if n.startswith("mariadb-bin.0") and not n.endswith(".gtidx"))


def _port() -> int:
    from relay.testing.mariadb import free_port
    return free_port()


_ = ServerBuild  # (the builds the module runs against are named by its markers)


def test_an_archive_folder_is_followed_as_a_primary(
        mariadb_factory: Callable[..., MariaDB], relay_factory: Callable[..., RelayProcess],
        tmp_path: object) -> None:
    """`file:///archive/mariadb-bin.*` as the relay's only source: a backup process copies
    the primary's files there; the relay mirrors them into its own segments, serves a
    replica, and takes the files as they grow and as new ones appear."""
    import shutil
    primary = mariadb_factory()
    files = history(primary, "folder")
    archive = os.path.join(str(tmp_path), "archive")
    os.makedirs(archive)

    def back_up() -> None:  # what a backup job does: copy the files as they are now
        for name in primary.binlog_files():
            shutil.copy(primary.binlog_path(name), os.path.join(archive, name))
    back_up()
    relay = relay_factory(f"file://{archive}/mariadb-bin.*",
                          downstream={"listen": f"127.0.0.1:{_port()}"},
                          users={"repl": "relaypass"})
    relay.start()
    wait_until(lambda: listening(relay.port), 30, "the relay to listen")
    wait_until(lambda: relay_at(relay, primary), 60, "the relay to mirror the archive")
    replica = mariadb_factory(server_id=41, options={"gtid_strict_mode": "1"})
    replicate_through(replica, relay.port, gtid=True)
    wait_until(functools.partial(converged, primary, replica), 90, "the replica")
    # The archive grows: the open file gets more, then a rotation brings a new file.
    primary.execute_many(["INSERT INTO folder.t VALUES (3000, 'grown', NOW())"])
    back_up()
    wait_until(lambda: relay_at(relay, primary), 60, "the relay to take the grown file")
    primary.execute_many(["FLUSH BINARY LOGS", "UPDATE folder.t SET v = 'newest' WHERE id = 3000"])
    back_up()
    wait_until(lambda: relay_at(relay, primary), 60, "the relay to take the new file")
    wait_until(functools.partial(converged, primary, replica), 90, "the replica to follow")
    # kill -9, more in the archive meanwhile: the relay resumes inside the archive's file
    # from its log's position (nothing twice: the replica's GTID strictness would stop it)
    relay.kill9()
    primary.execute_many([f"INSERT INTO folder.t VALUES ({4000 + i}, 'x', NOW())"
                          for i in range(20)])
    back_up()
    relay.start()
    wait_until(lambda: relay_at(relay, primary), 60, "the relay to resume from the archive")
    wait_until(lambda: str(replica.query("SELECT @@gtid_slave_pos")[0][0])
               == primary.gtid_binlog_pos(), 90, "the replica to reconnect and follow")
    assert not replica.slave_status()["Last_SQL_Errno"]
    assert_same_data(primary, replica)
    status = relay.status()
    assert status["upstream"]["connected"] and status["upstream"]["source"] == \
        f"file://{archive}/mariadb-bin.*", status["upstream"]
    assert status["upstream"]["primary_version"].startswith("10.11")
    assert len(files) == 3 and len(relay.segments()) >= 1  # its own segments (relay-bin.*)


def test_an_archive_is_the_last_source_of_a_failover_list(
        mariadb_factory: Callable[..., MariaDB], relay_factory: Callable[..., RelayProcess],
        tmp_path: object) -> None:
    import shutil
    primary = mariadb_factory()
    history(primary, "last")
    archive = os.path.join(str(tmp_path), "archive")
    os.makedirs(archive)
    for name in primary.binlog_files():
        shutil.copy(primary.binlog_path(name), os.path.join(archive, name))
    gone = f"mysql://repl:replpass@127.0.0.1:{_port()}"  # a primary that is down
    relay = relay_factory(gone, upstream={"sources": [gone, f"file://{archive}/*"],
                                          "failover_after": "1s", "connect_timeout": "1s"})
    relay.start()
    wait_until(lambda: relay_at(relay, primary), 60, "the relay to fail over to the archive")
    status = relay.status()["upstream"]
    assert status["failovers"] >= 1 and status["source"] == f"file://{archive}/*", status
