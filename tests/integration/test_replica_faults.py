"""Faults on the links between the relay and its replicas, under a workload: resets,
stalls longer than the relay's write_timeout, and one-byte-at-a-time delivery. Each
replica reconnects by itself and ends equal to the primary."""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest

from relay.testing.faultproxy import FaultProxy
from relay.testing.mariadb import MariaDB
from tests.conftest import RelayProcess, replicate_through, wait_until
from tests.integration import workload
from tests.integration.common import start_relay

pytestmark = pytest.mark.integration


def more_than(bg: workload.Background, count: int) -> bool:
    return bg.count > count


def applied(replica: MariaDB) -> str:
    st = replica.slave_status()
    assert not st.get("Last_SQL_Error"), st
    return str(replica.query("SELECT @@gtid_slave_pos")[0][0])


def test_replicas_behind_faulty_links_end_equal_to_the_primary(
        mariadb_factory: Callable[..., MariaDB],
        relay_factory: Callable[..., RelayProcess]) -> None:
    primary = mariadb_factory()
    relay = start_relay(relay_factory, primary, downstream={"write_timeout": "2s"})
    proxies = [FaultProxy("127.0.0.1", relay.port).start() for _ in range(2)]
    replicas = [mariadb_factory(server_id=80 + i) for i in range(2)]
    try:
        for proxy, replica in zip(proxies, replicas, strict=True):
            replicate_through(replica, proxy.port)
        resetting, slow = proxies
        with workload.Background(primary) as bg:
            wait_until(lambda: bg.count > 50, 30, "the workload")
            slow.trickle(True)  # every byte of the stream its own write
            for _ in range(3):
                wait_until(functools.partial(more_than, bg, bg.count + 30), 30,
                           "more transactions")
                resetting.reset_all()
            wait_until(lambda: slow.connections >= 1 and bg.count > 200, 30, "the workload")
            slow.trickle(False)

            def timeouts() -> int:
                return int(relay.status().get("downstream", {}).get("ended", {})
                           .get("timeout", 0))
            dropped = timeouts()
            slow.stall(True)  # longer than write_timeout: the relay drops that client
            wait_until(lambda: timeouts() > dropped, 60,
                       "the relay to drop the stalled replica (write_timeout)")
            slow.stall(False)
            before = bg.count
            wait_until(lambda: bg.count > before + 50, 30, "more transactions")
            assert bg.error is None, bg.error
        assert resetting.resets >= 3
        assert slow.trickled > 10_000  # stream bytes that reached it one at a time
        target = primary.gtid_binlog_pos()
        for replica in replicas:
            wait_until(lambda r=replica: applied(r) == target, 120,  # type: ignore[misc]
                       f"replica {replica.server_id} to converge")
            for table in ("bg.t",):
                assert replica.query(f"CHECKSUM TABLE {table}") == primary.query(
                    f"CHECKSUM TABLE {table}")
        assert slow.connections >= 2  # it reconnected after the stall
    finally:
        for proxy in proxies:
            proxy.stop()
