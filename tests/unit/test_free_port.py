"""free_port with two pytest-xdist workers: each takes ports from its own share, so one
never hands out a port the other has just picked and not yet bound."""

from __future__ import annotations

import socket

import pytest

from relay.testing.mariadb import free_port


def _ports(monkeypatch: pytest.MonkeyPatch, worker: str, n: int) -> list[int]:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    return [free_port() for _ in range(n)]


def test_two_workers_take_ports_from_disjoint_shares(monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = _ports(monkeypatch, "gw0", 50), _ports(monkeypatch, "gw1", 50)
    assert all(20000 <= p < 26000 for p in first) and all(26000 <= p < 32000 for p in second)
    assert len(set(first)) == 50 and len(set(second)) == 50  # never the same twice in a row


def test_a_port_in_use_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    taken = _ports(monkeypatch, "gw0", 1)[0]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", taken + 1))
        busy.listen()
        assert _ports(monkeypatch, "gw0", 1)[0] != taken + 1
