"""The relay follows a real MySQL 9.7 primary (issue 32): by GTID set, with heartbeats,
resuming after a restart and a kill -9 with nothing lost or repeated; its segments are
binlog files MySQL's own mysqlbinlog 9.7 reads, with the primary's transactions.

The server comes from a Debian root (scripts/build-roots; relay/testing/builds.py); without
one the module is skipped, and under CI it fails instead.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from relay.testing.builds import BuildMissing, ServerBuild, build
from relay.testing.mariadb import MariaDB
from tests.conftest import RelayProcess, wait_until

pytestmark = pytest.mark.integration


def _mysql() -> ServerBuild:
    try:
        return build("mysql-9.7")
    except BuildMissing as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def primary(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDB]:
    server = MariaDB(build=_mysql(), base_dir=str(tmp_path_factory.mktemp("mysql-primary")))
    server.start()
    server.execute_many([f"GRANT REFERENCES ON *.* TO '{server.repl_user}'@'%'"])
    yield server
    server.cleanup()


def source_url(server: MariaDB) -> str:
    # caching_sha2_password's full authentication over plain text takes the server's key
    return f"{server.url}?get-server-public-key=true"


def relay_state(relay: RelayProcess) -> str:
    return str(relay.status().get("relay_log", {}).get("gtid_pos", ""))


def caught_up(relay: RelayProcess, primary: MariaDB) -> Callable[[], bool]:
    return lambda: relay_state(relay) == primary.gtid_binlog_pos()


def workload(primary: MariaDB, rounds: int, start: int = 0) -> None:
    statements = []
    for i in range(start, start + rounds):
        statements += [f"INSERT INTO app.t VALUES ({i}, 'v{i}', '{{\"n\": {i}}}')",
                       f"UPDATE app.t SET v = 'u{i}' WHERE id = {i}"]
        if i % 5 == 0:
            statements.append(f"DELETE FROM app.t WHERE id = {i}")
    primary.execute_many(statements)


def mysqlbinlog_rows(build_: ServerBuild, paths: list[str]) -> list[str]:
    """The transactions of binlog files as MySQL's mysqlbinlog decodes them: each GTID and
    each row change (positions, timestamps and server ids left out)."""
    stage = build_.host_path("/srv/relay-tests/mysqlbinlog")
    shutil.rmtree(stage, ignore_errors=True)
    os.makedirs(stage)
    inside = []
    for i, path in enumerate(paths):
        shutil.copy(path, os.path.join(stage, f"{i:03d}.bin"))
        inside.append(f"/srv/relay-tests/mysqlbinlog/{i:03d}.bin")
    out = subprocess.run(build_.command(build_.tool("mysqlbinlog"), "-v",
                                        "--base64-output=decode-rows",
                                        "--verify-binlog-checksum", *inside),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    keep = re.compile(r"^(SET @@SESSION.GTID_NEXT= '[^A]|### )")
    return [line for line in out.stdout.splitlines() if keep.match(line)]


def test_the_relay_mirrors_a_mysql_primary_and_resumes_by_gtid_set(
        primary: MariaDB, relay_factory: Callable[..., RelayProcess]) -> None:
    primary.execute_many(["CREATE DATABASE app",
                          "CREATE TABLE app.t (id INT PRIMARY KEY, v VARCHAR(40), j JSON)"])
    workload(primary, 20)
    relay = relay_factory(source_url(primary),
                          upstream={"heartbeat_period": "1s", "read_timeout": "4s"})
    relay.start()
    wait_until(caught_up(relay, primary), 60, "the relay to hold the primary's transactions")
    status = relay.status()
    assert status["upstream"]["primary_version"].startswith("9.7")
    # Idle past read_timeout: the primary's heartbeats keep the one connection alive.
    wait_until(lambda: relay.status()["upstream"]["reconnects"] == 0 and
               float(relay.status()["upstream"]["active_since"]) < _now() - 6, 30,
               "six idle seconds on one connection")
    assert relay.status()["upstream"]["reconnects"] == 0
    # A restart resumes by the relay's own GTID set; a kill -9 too.
    relay.stop()
    workload(primary, 10, 100)
    relay.start()
    wait_until(caught_up(relay, primary), 60, "the relay to resume after a restart")
    workload(primary, 200, 200)
    # Tagged GTIDs (8.3+) and compressed transactions (TRANSACTION_PAYLOAD) among them.
    tagged = primary.root()
    try:
        with tagged.cursor() as cur:
            cur.execute("SET SESSION binlog_transaction_compression = ON")
            cur.execute("INSERT INTO app.t VALUES (5000, 'compressed', NULL)")
            cur.execute("SET gtid_next = 'AUTOMATIC:nightly'")
            cur.execute("INSERT INTO app.t VALUES (5001, 'tagged', NULL)")
            cur.execute("SET gtid_next = 'AUTOMATIC'")
            cur.execute("SET SESSION binlog_transaction_compression = OFF")
    finally:
        tagged.close()
    wait_until(caught_up(relay, primary), 60, "the relay to hold tagged and compressed ones")
    relay.kill9()
    workload(primary, 10, 1000)
    relay.start()
    wait_until(caught_up(relay, primary), 60, "the relay to resume after kill -9")
    # Every transaction once, as MySQL's mysqlbinlog reads the primary's files.
    segments = relay.segments()
    primary_files = [primary.binlog_path(n) for n in primary.binlog_files()]
    ours = mysqlbinlog_rows(primary.build, segments)   # type: ignore[arg-type]
    theirs = mysqlbinlog_rows(primary.build, primary_files)   # type: ignore[arg-type]
    assert ours == theirs
    gtids = [line for line in ours if line.startswith("SET @@SESSION.GTID_NEXT")]
    assert len(gtids) == len(set(gtids)) > 200


def _now() -> float:
    import time

    return time.time()


def test_status_names_the_flavour(primary: MariaDB,
                                  relay_factory: Callable[..., RelayProcess]) -> None:
    relay = relay_factory(source_url(primary))
    relay.start()
    wait_until(lambda: bool(relay.status().get("upstream", {}).get("connected")), 60,
               "the relay to follow its primary")
    status: dict[str, Any] = relay.status()
    assert status["relay_log"]["flavour"] == "mysql"
    assert ":" in status["relay_log"]["gtid_pos"]   # a MySQL GTID set
