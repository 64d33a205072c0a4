"""SessionContext: everything a downstream session needs, handed to it whole and frozen,
so a session never reaches back into the server that accepted it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass

from relay.config import TlsSection
from relay.downstream.accounts import Account
from relay.downstream.answers import Answers
from relay.downstream.auth import Authenticator
from relay.downstream.registry import SessionRegistry
from relay.downstream.replies import Err, Rows
from relay.downstream.semisync import SemiSyncPrimary
from relay.relaylog.log import RelayLog
from relay.relaylog.retention import Retention
from relay.rules.runtime import Rules

# A metadata look-up the relay composed, run on the primary as the metadata account in the
# client's character set (a Lookup's `sql` or `exists`); its rows are the server's bytes.
MetadataQuery = Callable[[str, str], Awaitable[Rows | Err]]


@dataclass(frozen=True)
class DownstreamSettings:
    host: str
    port: int
    accounts: dict[str, Account]
    server_id: int
    max_clients: int = 256
    write_timeout: float = 30.0
    handshake_timeout: float = 10.0
    catchup_wait: float = 60.0
    forward_metadata: bool = True
    metadata_max_rows: int = 10_000
    semi_sync: bool = False        # ask semi-sync replicas to acknowledge each transaction
    tls: TlsSection | None = None
    generate_certificate: bool = True   # without `tls`: a self-signed one made at start
    max_connect_errors: int = 100  # failed logins in a row before an address is blocked
    host_block_time: float = 600.0
    serve_until_us: int | None = None   # [downstream] serve_until (a user's own wins)


@dataclass(frozen=True)
class SessionContext:
    log: RelayLog
    settings: DownstreamSettings
    auth: Authenticator
    answers: Answers
    registry: SessionRegistry
    lookup: MetadataQuery
    rules: Rules
    rules_executor: Executor       # where send rules run, off the event loop
    semi_sync: SemiSyncPrimary     # the relay as a semi-sync primary: its counters
    retention: Retention           # PURGE BINARY LOGS goes through it
