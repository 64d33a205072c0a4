"""Failover to a passive primary: the relay resumes from its own GTID state on the next
source, and a replica behind the relay sees one continuous stream."""

from __future__ import annotations

import pytest

from relay.relaylog.recovery import scan_segment
from tests.conftest import gtids_in, mysqlbinlog_reads, replicate_through, wait_until
from tests.integration import workload
from tests.integration.test_downstream import assert_same_data, converged, start_relay

pytestmark = pytest.mark.integration


def test_failover_to_passive_primary(mariadb_factory, relay_factory) -> None:  # type: ignore[no-untyped-def]
    active = mariadb_factory(server_id=1)
    passive = mariadb_factory(server_id=2, options={"log_slave_updates": "ON"})
    passive.replicate_from("127.0.0.1", active.port, user=active.repl_user,
                           password=active.repl_password)
    relay = start_relay(relay_factory, active, upstream={
        "sources": [active.url, passive.url], "failover_after": "2s", "retry_max": "0.5s"})
    replica = mariadb_factory(server_id=3)
    replicate_through(replica, relay.port)

    workload.mixed(active, rounds=1)
    wait_until(lambda: converged(active, replica) and converged(active, passive), 60,
               "everyone in sync with the active primary")
    active.kill()  # the active primary dies
    passive.execute_many(["STOP SLAVE", "RESET SLAVE ALL"])  # promote the passive one
    workload.mixed(passive, rounds=1)  # new writes: GTIDs 0-2-N continue the domain
    wait_until(lambda: converged(passive, replica), 90, "the replica, through the relay")
    assert_same_data(passive, replica)
    out = relay.output()
    assert f"failing over to repl@127.0.0.1:{passive.port}" in out
    assert f"streaming from repl@127.0.0.1:{passive.port}" in out
    # The passive primary's files have other offsets: events were re-positioned.
    metrics = relay.http("/metrics")[1]
    rewritten = [ln for ln in metrics.splitlines()
                 if ln.startswith("relay_relaylog_rewritten_events_total")]
    assert rewritten and float(rewritten[0].split()[-1]) > 0
    assert relay.stop() == 0
    got = gtids_in(relay.segments())
    assert len(got) == len(set(got))
    assert {g.server_id for g in got} == {1, 2}
    for seg in relay.segments():
        assert scan_segment(seg).error is None
        mysqlbinlog_reads(seg)
