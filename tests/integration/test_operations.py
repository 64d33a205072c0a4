"""Metrics, health and the dashboard, checked against a real relay serving a real replica."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from relay.tap.client import TapClient
from relay.testing.mariadb import MariaDB, free_port
from tests.conftest import RelayProcess, replicate_through, wait_until
from tests.integration import workload
from tests.integration.common import converged

pytestmark = pytest.mark.integration

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
DASHBOARDS = os.path.join(ROOT, "dashboards")
METRIC_RE = re.compile(r"\brelay_[a-z0-9_]+")


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI"):
            raise AssertionError("promtool missing: scripts/setup installs Debian's prometheus")
        pytest.skip("promtool not installed (apt-get install prometheus)")
    return path


def samples(text: str) -> dict[str, float]:
    """Sum of every sample by name (labels folded)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def declared(text: str) -> set[str]:
    """Every metric the text declares, with or without samples (a labelled family with no
    series yet, such as the readers holding retention back, has none)."""
    out = set()
    for family in text_string_to_metric_families(text):
        out.add(family.name)
        if family.type == "counter":
            out.add(family.name + "_total")
    return out


def dashboard_metrics() -> set[str]:
    with open(os.path.join(DASHBOARDS, "relay.json")) as f:
        dash = json.load(f)
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    with open(os.path.join(DASHBOARDS, "alerts.yml")) as f:
        rules = yaml.safe_load(f)
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    names = {m for e in exprs for m in METRIC_RE.findall(e)}
    assert len(names) >= 15
    return names


def test_metrics_dashboard_alerts_and_readiness(mariadb_factory: Callable[..., MariaDB],
                                                relay_factory: Callable[..., RelayProcess]) -> None:
    primary = mariadb_factory()
    relay = relay_factory(primary.url, users={"repl": "relaypass"},
                          metrics={"ready_grace": "2s"}).start()
    wait_until(lambda: relay.http("/readyz")[0] == 200, 30, "ready")
    assert relay.http("/healthz") == (200, "ok\n")
    replica = mariadb_factory(server_id=71)
    replicate_through(replica, relay.port)
    workload.mixed(primary, rounds=1)
    wait_until(lambda: converged(primary, replica), 60, "replica sync")

    status, text = relay.http("/metrics")
    assert status == 200
    first = samples(text)
    missing = sorted(n for n in dashboard_metrics() if n not in first and n not in declared(text))
    assert not missing, f"dashboard/alerts use metrics the relay does not export: {missing}"
    assert first["relay_upstream_connected"] == 1
    # relay_build_info and /status name the commit (this checkout's HEAD) and flavours.
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert (f'commit="{head}",flavours="mariadb,mysql",' in text), \
        [line for line in text.splitlines() if line.startswith("relay_build_info")]
    assert relay.status()["commit"] == head
    assert first["relay_downstream_clients"] >= 1
    assert first["relay_replication_lag_seconds"] < 60
    assert 'relay_downstream_client_sent_bytes_total{replica="71"}' in text

    res = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stdout + res.stderr

    workload.mixed(primary, rounds=1)
    wait_until(lambda: converged(primary, replica), 60, "replica sync")
    second = samples(relay.http("/metrics")[1])
    for name in ("relay_upstream_events_total", "relay_upstream_bytes_total",
                 "relay_relaylog_transactions_total", "relay_downstream_client_sent_bytes_total",
                 "relay_relaylog_written_bytes_total", "relay_relaylog_fsync_seconds_count"):
        assert second[name] > first[name], name

    primary.kill()  # SIGKILL: no goodbye on the replication connection
    wait_until(lambda: relay.http("/readyz")[0] == 503, 30, "unready without upstream")
    status, body = relay.http("/readyz")
    assert "upstream disconnected" in body
    assert samples(relay.http("/metrics")[1])["relay_upstream_connected"] == 0
    assert relay.http("/healthz")[0] == 200  # alive all the same
    primary.start()
    wait_until(lambda: relay.http("/readyz")[0] == 200, 60, "ready again")
    reconnects = samples(relay.http("/metrics")[1])["relay_upstream_reconnects_total"]
    assert reconnects >= 1


def test_promtool_checks_rules_and_their_tests() -> None:
    tool = promtool()
    for args in (["check", "rules", "alerts.yml"], ["test", "rules", "alerts_test.yml"]):
        res = subprocess.run([tool, *args], cwd=DASHBOARDS, capture_output=True, text=True)
        assert res.returncode == 0, res.stdout + res.stderr



# Series of one client or reader: they come and go with it (Prometheus cannot know a
# label value before it exists); their families are declared from the start.
PER_CLIENT = re.compile(r"relay_downstream_client_|relay_retention_reader_held_back_")


def test_every_series_is_there_from_the_start_and_ready_waits_for_the_upstream(
        mariadb_factory: Callable[..., MariaDB], relay_factory: Callable[..., RelayProcess],
        tmp_path: pathlib.Path) -> None:
    """Prometheus' convention: a relay with the default settings (an upstream, nothing
    else), before its primary has ever answered, has a sample of every series the
    dashboard and the alert rules use, zero where nothing happened yet. Otherwise a panel
    shows "No data" and an alert on increase() misses the first event (a series that
    appears at 1 has increased by nothing). And it is not ready until the upstream has
    connected: ready_grace (30 s) covers a reconnect, not a first connect."""
    primary = MariaDB(base_dir=str(tmp_path / "primary"))   # its port, not yet its server
    try:
        relay = relay_factory(primary.url).start()
        wait_until(lambda: relay.http("/metrics")[0] == 200, 30, "the metrics endpoint")
        text = relay.http("/metrics")[1]
        have = samples(text)
        used = dashboard_metrics()
        missing = sorted(n for n in used if n not in have and not PER_CLIENT.match(n))
        assert not missing, f"absent until something happens: {missing}"
        assert {n for n in used if PER_CLIENT.match(n)} <= declared(text)
        assert have["relay_upstream_connected"] == 0
        assert have["relay_retention_held_back_bytes"] == 0
        code, body = relay.http("/readyz")
        assert code == 503 and "has not connected yet" in body, body
        assert relay.status()["ready"] is False
        primary.start()
        wait_until(lambda: relay.http("/readyz")[0] == 200, 60, "ready once connected")
        assert relay.status()["upstream"]["streams"] >= 1
    finally:
        primary.stop()
        primary.drop_storage()


def test_a_refusal_no_reconnect_fixes_is_not_ready_at_once_and_alerts(
        mariadb_factory: Callable[..., MariaDB],
        relay_factory: Callable[..., RelayProcess]) -> None:
    """A wrong password: the relay retries (an operator may fix the account) but is not
    ready from the first refusal (not after ready_grace), says why in /status, and
    relay_upstream_refused is 1 (the RelayUpstreamRefused alert). Fixing the account
    clears it. Then the account locked while the relay streams: its next login (the dump
    killed on the primary) is refused the same way (MariaDB's error 4151), until it is
    unlocked."""
    primary = mariadb_factory()
    relay = relay_factory(primary.url.replace(primary.repl_password, "not-the-password"),
                          metrics={"ready_grace": "1h"}).start()

    def refused() -> bool:
        return samples(relay.http("/metrics")[1]).get("relay_upstream_refused") == 1
    wait_until(refused, 30, "the refusal")
    code, body = relay.http("/readyz")
    assert code == 503 and "refused the relay" in body and "denied" in body.lower(), body
    status = relay.status()
    assert status["ready"] is False and "denied" in status["upstream"]["refused"].lower()
    primary.execute_many([f"ALTER USER '{primary.repl_user}'@'%' IDENTIFIED BY "
                          "'not-the-password'"])
    wait_until(lambda: relay.http("/readyz")[0] == 200, 60, "ready once the account is fixed")
    assert samples(relay.http("/metrics")[1])["relay_upstream_refused"] == 0
    assert relay.status()["upstream"]["refused"] == ""
    account = f"'{primary.repl_user}'@'%'"
    primary.execute_many([f"ALTER USER {account} ACCOUNT LOCK"])
    for (thread,) in primary.query("SELECT id FROM information_schema.processlist WHERE "
                                   "command LIKE 'Binlog Dump%'"):
        primary.execute_many([f"KILL {thread}"])
    wait_until(refused, 30, "the locked account's refusal")
    assert "locked" in relay.status()["upstream"]["refused"].lower()
    assert relay.http("/readyz")[0] == 503
    primary.execute_many([f"ALTER USER {account} ACCOUNT UNLOCK"])
    wait_until(lambda: relay.http("/readyz")[0] == 200, 60, "ready once unlocked")


def test_the_metrics_reference_page_is_a_running_relays_metrics(
        mariadb_factory: Callable[..., MariaDB], relay_factory: Callable[..., RelayProcess],
        tmp_path: pathlib.Path) -> None:
    """docs/reference/metrics.md is what scripts/reference.py makes of this relay's /metrics
    (a replica, a tap reader and a send rule attached): a metric added, renamed or given
    other labels or help fails here until the page is made again."""
    primary = mariadb_factory()
    tap_port = free_port()
    relay = relay_factory(primary.url, textwrap.dedent("""
        [[tap.users]]
        name = "reader"
        password = "s3cret"

        [[rules]]
        name = "no-scratch"
        at = "send"
        ignore_tables = ["scratch.%"]
        """), users={"repl": "relaypass"}, tap={"listen": f"127.0.0.1:{tap_port}"}).start()
    wait_until(lambda: relay.http("/readyz")[0] == 200, 60, "ready")
    replica = mariadb_factory(server_id=73)
    replicate_through(replica, relay.port)
    workload.mixed(primary, rounds=1)
    wait_until(lambda: converged(primary, replica), 60, "replica sync")
    with TapClient(f"127.0.0.1:{tap_port}", "reader", "s3cret") as tap:
        assert tap.status()["gtid_state"]
    scrape = tmp_path / "metrics.txt"
    scrape.write_text(relay.http("/metrics")[1])
    done = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "reference.py"),
                           "--metrics-from", str(scrape), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
