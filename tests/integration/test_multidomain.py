"""GTID resume with several domains interleaved: the relay must skip, per domain, exactly
what the replica has (replication-protocol.md 10.2)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest

from relay.testing.mariadb import MariaDB
from tests.conftest import RelayProcess, replicate_through, wait_until
from tests.integration.common import converged, start_relay

pytestmark = pytest.mark.integration


def interleaved(primary: MariaDB, start: int, count: int) -> None:
    with contextlib.closing(primary.root()) as conn, conn.cursor() as cur:
        cur.execute("CREATE DATABASE IF NOT EXISTS md")
        cur.execute("CREATE TABLE IF NOT EXISTS md.t (id INT PRIMARY KEY, domain INT)")
        for i in range(start, start + count):
            domain = 1 if i % 3 == 0 else 0  # domain 1 every third transaction
            cur.execute(f"SET SESSION gtid_domain_id = {domain}")
            cur.execute("INSERT INTO md.t VALUES (%s, %s)", (i, domain))


def test_resume_with_interleaved_domains(mariadb_factory: Callable[..., MariaDB],
                                         relay_factory: Callable[..., RelayProcess]) -> None:
    primary = mariadb_factory()
    relay = start_relay(relay_factory, primary)
    replica = mariadb_factory(server_id=71, options={"gtid_strict_mode": "1"})
    interleaved(primary, 0, 30)
    replicate_through(replica, relay.port)
    wait_until(lambda: converged(primary, replica), 60, "first sync")
    assert "," in primary.gtid_binlog_pos()  # two domains
    for round_ in range(3):
        replica.execute_many(["STOP SLAVE"])
        interleaved(primary, 100 * (round_ + 1), 25)
        replica.execute_many(["START SLAVE"])
        wait_until(lambda: converged(primary, replica), 60, f"resume {round_}")
        rows = replica.query("SELECT COUNT(*), SUM(id) FROM md.t")[0]
        assert rows == primary.query("SELECT COUNT(*), SUM(id) FROM md.t")[0]
    # and a fresh replica that starts from a state with only one of the domains
    late = mariadb_factory(server_id=72)
    domain0 = next(g for g in primary.gtid_binlog_pos().split(",") if g.startswith("0-"))
    seq0 = int(domain0.rsplit("-", 1)[1])
    late.execute_many(["CREATE DATABASE md", "CREATE TABLE md.t (id INT PRIMARY KEY, domain INT)",
                       "SET GLOBAL gtid_slave_pos = ''"])
    # Load what domain 0 holds up to now, and tell the replica it has domain 0 only.
    late.execute_many([f"INSERT INTO md.t VALUES ({r[0]}, 0)" for r in
                       primary.query("SELECT id FROM md.t WHERE domain = 0")]
                      + [f"SET GLOBAL gtid_slave_pos = '0-1-{seq0}'"])
    replicate_through(late, relay.port)
    wait_until(lambda: converged(primary, late), 60, "late replica")
    assert late.query("SELECT COUNT(*), SUM(id) FROM md.t")[0] == primary.query(
        "SELECT COUNT(*), SUM(id) FROM md.t")[0]
