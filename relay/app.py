"""Composition root: builds the relay log and the upstream from the config, runs them,
and shuts down in order on SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
from typing import TYPE_CHECKING

from relay import kernels
from relay.binlog.gtid import parse_position
from relay.config import Config, StartMode, load_config, split_host_port
from relay.downstream.accounts import account_of, until_us
from relay.downstream.answers import PrimarySnapshot
from relay.downstream.replies import Err, Rows
from relay.downstream.server import DownstreamServer, DownstreamSettings
from relay.errors import ConfigError, ServerError, first_error
from relay.mysql.errors import NO_PRIVILEGE
from relay.mysql.metadata import MetadataClient
from relay.ops.parts import RelayParts
from relay.ops.service import Operations
from relay.relaylog.log import RelayLog
from relay.relaylog.naming import list_index_files
from relay.relaylog.retention import Retention, RetentionPolicy
from relay.rules.runtime import Rules
from relay.tap.settings import TapSettings
from relay.tls import ServerTls
from relay.upstream.control import PrimarySettings
from relay.upstream.runner import Upstream, UpstreamSettings

if TYPE_CHECKING:
    from relay.tap.server import TapServer

log = logging.getLogger("relay")


def build_relay_log(config: Config, ops: Operations | None = None) -> RelayLog:
    rl = config.relaylog
    hold_ttl = config.tap.subscriber_ttl
    data_dir = os.path.abspath(config.relay.data_dir)
    found = list_index_files(data_dir) if os.path.isdir(data_dir) else []
    if found and rl.basename not in found:
        # (`relay import` names a log's segments as the files it was made from)
        raise ConfigError(f"[relay] data_dir {data_dir} holds a relay log of {found[0]}.* "
                          f"segments, not {rl.basename}.*: set [relaylog] basename = "
                          f"\"{found[0]}\" to serve it, or name another data_dir")
    return RelayLog(data_dir, basename=rl.basename,
                    segment_size=rl.segment_size, sync=rl.sync_policy,
                    verify_on_start=rl.verify_on_start, hold_ttl=hold_ttl,
                    on_fsync=ops.fsync_seconds.observe if ops else None)


def retention_policy(config: Config) -> RetentionPolicy:
    rl = config.relaylog
    return RetentionPolicy(max_age=rl.retention_age, max_size=rl.retention_size,
                           min_segments=rl.retention_min_segments,
                           hard_cap=rl.retention_max_size,
                           interval=rl.retention_check_interval,
                           hold_max=config.tap.retain_max, compress_after=rl.compress_after)


def upstream_settings(config: Config) -> UpstreamSettings:
    u = config.upstream
    position = None
    if u.start_mode is StartMode.POSITION:
        try:
            position = parse_position(u.start)   # either flavour's: checked at the connect
        except ValueError as exc:
            raise ConfigError(f"upstream.start: {exc}; use \"current\", \"earliest\" or a "
                              "GTID position such as \"0-1-100\" (MariaDB) or "
                              "\"<uuid>:1-100\" (MySQL)") from None
    return UpstreamSettings(
        sources=u.source_list, start=u.start_mode, start_position=position,
        server_id=config.relay.server_id, heartbeat_period=u.heartbeat_period,
        read_timeout=u.read_timeout, connect_timeout=u.connect_timeout,
        retry_initial=u.retry_initial, retry_max=u.retry_max, max_retries=u.max_retries,
        failover_after=u.failover_after, prefer_first=u.prefer_first,
        prefer_check=u.prefer_check, on_divergence=u.on_divergence, semi_sync=u.semi_sync,
        semi_sync_wait_for_replicas=u.semi_sync_wait_for_replicas,
        semi_sync_timeout=u.semi_sync_timeout)


def downstream_settings(config: Config) -> DownstreamSettings:
    d = config.downstream
    host, port = split_host_port(d.listen, "downstream.listen")
    return DownstreamSettings(host, port, {u.name: account_of(u) for u in d.users},
                              config.relay.server_id, d.max_clients, d.write_timeout,
                              d.handshake_timeout, d.catchup_wait, d.forward_metadata,
                              d.metadata_max_rows, d.semi_sync, d.tls, d.generate_certificate,
                              d.max_connect_errors, d.host_block_time,
                              until_us(d.serve_until))


def tap_settings(config: Config) -> TapSettings | None:
    t = config.tap
    if not t.listen:
        return None
    host, port = split_host_port(t.listen, "tap.listen")
    return TapSettings(host, port, {u.name: u.resolve_password() for u in t.users},
                       frame_bytes=t.frame_size, max_clients=t.max_clients,
                       subscriber_ttl=t.subscriber_ttl, retain_max=t.retain_max,
                       handshake_timeout=t.handshake_timeout, tls=t.tls,
                       max_connect_errors=t.max_connect_errors,
                       host_block_time=t.host_block_time,
                       max_snapshots_per_user=t.max_snapshots_per_user,
                       max_subscribers_per_user=t.max_subscribers_per_user,
                       max_snapshot_bytes_per_user=t.max_snapshot_bytes_per_user)


def metadata_client(config: Config, upstream: Upstream) -> MetadataClient:
    d = config.downstream
    account = None
    if d.metadata_user is not None and d.metadata_password_env is not None:
        password = os.environ.get(d.metadata_password_env)
        if password is None:
            raise ConfigError(f"downstream.metadata_password_env: environment variable "
                              f"{d.metadata_password_env} is not set")
        account = (d.metadata_user, password)
    return MetadataClient(upstream.active_source, timeout=d.forward_timeout,
                          max_rows=d.metadata_max_rows, queue=d.metadata_queue,
                          account=account)


def _raw(value: object) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def build_rules(config: Config) -> Rules:
    try:
        return Rules.from_entries(config.rules)
    except (ValueError, ImportError, SyntaxError) as exc:
        raise ConfigError(f"rules: {exc}") from exc


def check_config(config: Config) -> list[str]:
    """Build what only the components can check (rule patterns and hooks, the start
    position, listen addresses): `relay check-config` and `relay run` both do it. Then
    the secure defaults: ConfigError for a listener beyond loopback without TLS, logins
    or credentials that no allow_insecure accepts, or a user with an empty password;
    returns the warnings (what allow_insecure and allow_empty_password accept, rules
    keyed by server_id that hide data)."""
    from relay.config import check_security

    build_rules(config)
    upstream_settings(config)
    downstream_settings(config)
    tap_settings(config)
    split_host_port(config.metrics.listen, "metrics.listen")
    return check_security(config)


class App:
    def __init__(self, config: Config, config_path: str | None = None) -> None:
        self.config = config
        self.config_path = config_path
        m = config.metrics
        self.ops = Operations(ready_max_lag=m.ready_max_lag, ready_grace=m.ready_grace,
                              credentials=m.credentials(),
                              tls=ServerTls(m.tls, "[metrics.tls]") if m.tls else None)
        self.rules = build_rules(config)
        self._primary_view: tuple[PrimarySettings, PrimarySnapshot] | None = None
        self.relay_log = build_relay_log(config, self.ops)
        self.retention = Retention(self.relay_log, retention_policy(config))
        self.upstream = Upstream(upstream_settings(config), self.relay_log, self.rules)
        self.upstream.on_disk_full = self.retention.wake
        self.metadata = metadata_client(config, self.upstream)
        self.downstream = DownstreamServer(self.relay_log, downstream_settings(config),
                                           rules=self.rules, primary=self._primary,
                                           lookup=self._lookup, metadata=self.metadata.stats,
                                           retention=self.retention)
        tap = tap_settings(config)
        self.tap: TapServer | None = None
        if tap is not None:
            from relay.tap.server import TapServer  # loaded only when a tap is configured

            self.tap = TapServer(self.relay_log, tap, self.rules,
                                 source=lambda: self.upstream.status.active_source,
                                 primary_rows=self._primary_rows,
                                 source_tls=self._source_tls)
        self.ops.bind(RelayParts(self.relay_log, self.upstream, self.downstream,
                                 self.ops.loop_lag, self.rules, self.tap, self.retention))
        self.ops.http.on_reload = self.reload_rules

    def _primary(self) -> PrimarySnapshot | None:
        """What downstream clients see of the primary: its variables and status."""
        info = self.upstream.status.primary_settings
        if info is None:
            return None
        if self._primary_view is None or self._primary_view[0] is not info:
            self._primary_view = (info, PrimarySnapshot(info.variables, info.variable_types,
                                                        info.status))
        return self._primary_view[1]

    def _source_tls(self) -> bool:
        """Whether the relay's link to the primary it follows is TLS (required)."""
        source = self.upstream.active_source()
        return source is not None and source.tls.mode.required

    async def _primary_rows(self, sql: str) -> list[list[bytes | None]]:
        """A look-up the tap composed, on the active primary (raises ServerError)."""
        result = await self.metadata.query(sql)
        return [[None if v is None else _raw(v) for v in row] for row in result.rows]

    async def _lookup(self, sql: str, charset: str) -> Rows | Err:
        """A metadata look-up the downstream composed (relay/downstream/lookups.py)."""
        try:
            result = await self.metadata.query(sql, charset)
        except ServerError as exc:
            message = exc.message
            if exc.errno in NO_PRIVILEGE:
                message += (f" (the relay asks its primary as {self.metadata.stats.account}: "
                            "grant it REFERENCES ON *.*, which shows tables' metadata and "
                            "none of their rows)")
            return Err(exc.errno, message, exc.sqlstate)
        rows = [[None if v is None else _raw(v) for v in row] for row in result.rows]
        return Rows([c.name for c in result.columns], rows, result.columns)

    def reload_rules(self) -> str:
        """Read the config file again and put its rules in force (each stream takes them at
        its next transaction boundary). Returns what happened; raises ConfigError and
        keeps the rules in force when the new ones are wrong."""
        if self.config_path is None:
            raise ConfigError("the relay runs without a config file: no rules to reload")
        config = load_config(self.config_path)
        try:
            self.rules.replace_entries(config.rules)
        except (ValueError, ImportError, SyntaxError) as exc:
            raise ConfigError(f"rules: {exc}") from exc
        counts = {p.value: len(v) for p, v in self.rules.describe().items()}
        msg = (f"rules reloaded from {self.config_path} (version {self.rules.version}): "
               + ", ".join(f"{n} at {p}" for p, n in counts.items()))
        log.info("%s", msg)
        return msg

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self.relay_log.open()
        self.relay_log.start()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGHUP, self._sighup)
        if kernels.UNEXPECTED:
            log.warning("kernels: pure Python, slower: %s; reinstall with a C compiler and "
                        "the Python headers (Debian: gcc python3-dev) to build them",
                        kernels.REASON)
        if not self.config.downstream.users:
            log.warning("no [[downstream.users]] configured: replicas cannot log in")
        await self.downstream.start()
        if self.tap is not None:
            await self.tap.start()
        m_host, m_port = split_host_port(self.config.metrics.listen, "metrics.listen")
        await self.ops.http.serve(m_host, m_port)
        # What start-up made lives as long as the process: out of every collection from
        # now on (`relay run` kept the collector off until here). The hot paths allocate
        # short-lived containers that refcounting frees and that form no cycles, so the
        # youngest generation is collected every 50,000 allocations, not every 700: the
        # ingest's CPU drops by about 5% (bench/ingest_revisions.py). No collection before
        # the freeze: it found some 1,200 unreachable objects (a few hundred KB, kept for
        # good now) and took 27 ms, between the listeners and the upstream's connect.
        gc.freeze()
        gc.set_threshold(50_000, 10, 10)
        gc.enable()
        try:
            async with asyncio.TaskGroup() as tg:
                lag = tg.create_task(self.ops.loop_lag.run(), name="loop-lag")
                up = tg.create_task(self.upstream.run(), name="upstream")
                keep = tg.create_task(self.retention.run(), name="retention")
                waiter = tg.create_task(stop.wait(), name="signals")
                done, _ = await asyncio.wait({up, waiter}, return_when=asyncio.FIRST_COMPLETED)
                if waiter in done:
                    log.info("stopping")
                up.cancel()
                waiter.cancel()
                lag.cancel()
                keep.cancel()
        except BaseExceptionGroup as group:
            # One task failed for a reason of ours: report that, not the group around it.
            raise first_error(group) from None
        finally:
            # In order: no new readers, the readers ended (each awaited), then the log.
            await self.ops.http.close()
            await self.downstream.close()
            if self.tap is not None:
                await self.tap.close()
            self.metadata.close()
            self.relay_log.close()
            log.info("relay log closed at %s", self.relay_log.state or "(empty GTID state)")


    def _sighup(self) -> None:
        try:
            self.reload_rules()
        except ConfigError as exc:
            log.error("rules not reloaded, the old ones stay in force: %s", exc)
        # Certificates too (rotated by a cert manager): new connections take them, connected
        # replicas and tap clients keep theirs.
        for tls in (self.downstream.tls, self.tap.tls if self.tap is not None else None,
                    self.ops.http.tls):
            if tls is not None:
                tls.reload()
        # ... and the metrics credentials (a rotated token_file): the next request is
        # checked against them
        try:
            self.ops.http.reload_credentials(self.config.metrics.credentials())
        except ConfigError as exc:
            log.error("metrics credentials not reloaded, the old ones stay in force: %s", exc)


# glibc's malloc hands a freed block above 128 KiB back to the kernel at once, so each
# socket read's 256 KiB (uvloop's bytes, the dump reader's batch) came back as fresh
# zeroed pages, a page fault per 4 KiB: about 4% of the ingest's time. Keeping up to a
# few MiB of freed heap lets the next read reuse warm pages.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_memory(mmap_threshold: int = 4 << 20, trim_threshold: int = 8 << 20) -> bool:
    """Tune glibc's malloc for a process that allocates and frees socket-read-sized
    blocks all day. False where the C library is not glibc (nothing changes)."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own symbols: its C library
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)
                and mallopt(_M_TRIM_THRESHOLD, trim_threshold))


def run_app(config: Config, config_path: str | None = None) -> None:
    keep_freed_memory()
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        asyncio.run(App(config, config_path).run())
    else:
        uvloop.run(App(config, config_path).run())
