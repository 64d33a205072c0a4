"""The tap server's settings (apart from the server, so the app loads the tap only when
one is configured)."""

from __future__ import annotations

from dataclasses import dataclass, field

from relay.config import TlsSection


@dataclass(frozen=True)
class TapSettings:
    host: str
    port: int
    users: dict[str, str] = field(default_factory=dict)   # name -> password
    frame_bytes: int = 1 << 20
    max_clients: int = 64
    subscriber_ttl: float = 7 * 86400.0
    retain_max: int = 50 << 30
    idle_interval: float = 5.0
    handshake_timeout: float = 10.0
    tls: TlsSection | None = None   # TLS from the first byte
    max_connect_errors: int = 100   # failed logins in a row before an address is blocked
    host_block_time: float = 600.0
    max_snapshots_per_user: int = 16
    max_subscribers_per_user: int = 64
    max_snapshot_bytes_per_user: int = 64 << 20
