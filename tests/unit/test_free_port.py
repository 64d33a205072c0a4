"""free_port with two pytest-xdist workers: each takes ports from its own share, so one
never hands out a port the other has just picked and not yet bound; a process a worker
starts takes the kernel's picks instead of walking its parent's share."""

from __future__ import annotations

import os
import socket

import pytest

from relay.testing import mariadb
from relay.testing.mariadb import free_port


def _ports(monkeypatch: pytest.MonkeyPatch, worker: str, n: int) -> list[int]:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    monkeypatch.setenv("RELAY_PORT_SHARE_PID", str(os.getpid()))
    return [free_port() for _ in range(n)]


def test_two_workers_take_ports_from_disjoint_shares(monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = _ports(monkeypatch, "gw0", 50), _ports(monkeypatch, "gw1", 50)
    assert all(20000 <= p < 26000 for p in first) and all(26000 <= p < 32000 for p in second)
    assert len(set(first)) == 50 and len(set(second)) == 50  # never the same twice in a row


def test_a_port_in_use_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mariadb, "_next_port", 0)  # gw0's next is 20000
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 20000))
        busy.listen()
        assert _ports(monkeypatch, "gw0", 1) == [20001]


def test_a_process_the_worker_started_takes_the_kernels_pick(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low, high = map(int, f.read().split())
    if low < 32000 and high >= 20000:
        pytest.skip(f"the kernel's own range {low}-{high} overlaps the shares")
    _ports(monkeypatch, "gw0", 0)
    monkeypatch.setenv("RELAY_PORT_SHARE_PID", str(os.getpid() + 1))  # another process's
    assert not any(20000 <= free_port() < 32000 for _ in range(20))
