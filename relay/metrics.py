"""Prometheus metrics, health and readiness.

One registry, built by the app and passed in; no global state. Hot paths keep plain
counters (IngestStats, LogStats, DumpStream fields) and a collector turns them into
metric families at scrape time, so serving a scrape costs the event path nothing.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import platform
import socket
import ssl
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from relay import __version__, kernels
from relay.binlog.constants import EventType, type_name
from relay.config import is_loopback
from relay.errors import RelayError
from relay.mysql.metadata import MetadataStats
from relay.net import SocketListener, open_streams
from relay.relaylog.readers import ReaderKind
from relay.relaylog.retention import free_bytes
from relay.tls import ServerTls
from relay.upstream.runner import SemiSyncState

if TYPE_CHECKING:
    from relay.downstream.server import DownstreamServer
    from relay.relaylog.log import RelayLog
    from relay.relaylog.retention import Retention
    from relay.rules.runtime import Rules
    from relay.tap.server import TapServer
    from relay.upstream.runner import Upstream

log = logging.getLogger("relay.metrics")

class _Zero:
    kept = changed = dropped = errors = 0


_ZERO = _Zero()
FSYNC_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass
class Readiness:
    ready: bool
    reasons: list[str]


class LoopLag:
    """How late the event loop wakes a sleeper: the loop's own latency."""

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.last = 0.0
        self.max_recent = 0.0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t0 = loop.time()
            await asyncio.sleep(self.interval)
            self.last = max(0.0, loop.time() - t0 - self.interval)
            self.max_recent = max(self.max_recent * 0.9, self.last)


# Every stream opens with these: their series are there (at 0) before the first connect,
# so the throughput panels have data from the start; other types appear when received.
STREAM_OPENERS = frozenset({EventType.ROTATE, EventType.FORMAT_DESCRIPTION})


class RelayCollector(Collector):
    def __init__(self, relay_log: RelayLog, upstream: Upstream,
                 downstream: DownstreamServer | None, loop_lag: LoopLag,
                 rules: Rules | None = None, tap: TapServer | None = None,
                 retention: Retention | None = None) -> None:
        self.tap = tap
        self.retention = retention
        self.log = relay_log
        self.upstream = upstream
        self.downstream = downstream
        self.loop_lag = loop_lag
        self.rules = rules

    def _retention(self) -> Iterator[Metric]:
        rt = self.retention
        if rt is None:
            return
        st = rt.stats
        yield CounterMetricFamily("relay_retention_purged_segments",
                                  "segments retention and PURGE BINARY LOGS removed",
                                  value=st.purged_segments)
        yield CounterMetricFamily("relay_retention_purged_bytes", "bytes of removed segments",
                                  value=st.purged_bytes)
        yield CounterMetricFamily("relay_relaylog_compressed_segments",
                                  "sealed segments compressed (compress_after)",
                                  value=st.compressed_segments)
        yield CounterMetricFamily("relay_relaylog_compression_saved_bytes",
                                  "bytes compression saved on disk",
                                  value=st.compressed_in - st.compressed_out)
        oldest = self.log.segments.sealed_at(self.log.segments.names[0]) \
            if self.log.segments else None
        yield GaugeMetricFamily("relay_relaylog_oldest_segment_age_seconds",
                                "how long ago the oldest segment kept was sealed",
                                value=time.time() - oldest if oldest else 0.0)
        # The reader holding back the most holds every kept segment: it is the total.
        yield GaugeMetricFamily("relay_retention_held_back_bytes",
                                "bytes retention would remove but readers still need",
                                value=max((h.bytes for h in st.held_back), default=0))
        held = GaugeMetricFamily("relay_retention_reader_held_back_bytes",
                                 "bytes retention would remove but this reader still needs "
                                 "(a series while it holds any)", labels=["reader", "kind"])
        for h in st.held_back:
            held.add_metric([h.reader, h.kind], h.bytes)
        yield held
        # By kind, every kind from the start: a series that appeared at 1 would never
        # show an increase(). /status retention.losses names each reader and its place.
        losses = CounterMetricFamily("relay_retention_reader_losses",
                                     "segments a reader still needed that the hard cap "
                                     "(retention_max_size) removed, by kind of reader",
                                     labels=["kind"])
        counted = dict.fromkeys((k.value for k in ReaderKind), 0)
        for loss in st.losses:
            counted[loss.kind] += 1
        for kind, n in counted.items():
            losses.add_metric([kind], n)
        yield losses
        policy = rt.policy
        for name, value, setting in (
                ("age_seconds", policy.max_age, "retention_age"),
                ("size_bytes", policy.max_size, "retention_size"),
                ("max_size_bytes", policy.hard_cap, "retention_max_size")):
            yield GaugeMetricFamily(f"relay_retention_{name}",
                                    f"[relaylog] {setting} (0: not set)", value=value or 0)

    def lag_seconds(self) -> float:
        """How far the relay log is behind the primary, from event timestamps and
        heartbeats: a heartbeat after the last transaction means nothing is pending."""
        stats = self.upstream.ingest.stats
        now = time.time()
        connected = self.upstream.status.connected
        if connected and stats.last_heartbeat_at >= stats.last_event_at:
            return 0.0
        if stats.last_event_ts == 0:
            return 0.0 if connected else now - self.upstream.status.disconnected_since
        return max(0.0, now - stats.last_event_ts)

    def collect(self) -> Iterator[Metric]:
        up = self.upstream
        status = up.status
        g = GaugeMetricFamily("relay_build_info",
                              "relay version, Python runtime and kernels (compiled or "
                              "pure-python)", labels=["version", "python", "kernels"])
        g.add_metric([__version__, platform.python_version(), kernels.IMPLEMENTATION.value], 1)
        yield g
        yield GaugeMetricFamily("relay_upstream_connected",
                                "1 while a replication stream from a primary is open",
                                value=1 if status.connected else 0)
        g = GaugeMetricFamily("relay_upstream_source_info", "the primary the relay uses now",
                              labels=["source"])
        if status.active_source:
            g.add_metric([status.active_source], 1)
        yield g
        yield GaugeMetricFamily("relay_upstream_primary_server_id", "server_id of the primary",
                                value=status.primary_server_id)
        ev = CounterMetricFamily("relay_upstream_events", "events received from the primary",
                                 labels=["type"])
        by = CounterMetricFamily("relay_upstream_bytes", "bytes of events received, by type",
                                 labels=["type"])
        stats = up.ingest.stats
        for code, (n, size) in enumerate(zip(stats.events_by_type, stats.bytes_by_type,
                                             strict=True)):
            if n or code in STREAM_OPENERS:
                ev.add_metric([type_name(code)], n)
                by.add_metric([type_name(code)], size)
        yield ev
        yield by
        yield CounterMetricFamily("relay_upstream_heartbeats", "heartbeats from the primary",
                                  value=stats.heartbeats)
        yield _by_reason("relay_upstream_reconnects",
                         "upstream connections that ended, by reason", status.reconnects)
        yield CounterMetricFamily("relay_upstream_failovers",
                                  "switches from one upstream source to another",
                                  value=status.failovers)
        ss = status.semi_sync_stats
        yield CounterMetricFamily("relay_upstream_semisync_acks",
                                  "semi-sync acknowledgements sent to the primary",
                                  value=ss.acks_sent)
        yield CounterMetricFamily("relay_upstream_semisync_fallbacks",
                                  "times the downstream replicas' acknowledgements did not "
                                  "come within semi_sync_timeout", value=ss.fallbacks)
        yield GaugeMetricFamily("relay_upstream_semisync_wanted",
                                "1 when [upstream] semi_sync asks the relay to acknowledge",
                                value=1 if up.settings.semi_sync else 0)
        yield GaugeMetricFamily("relay_upstream_semisync_on",
                                "1 while the relay acknowledges as a semi-sync replica",
                                value=1 if status.semi_sync is SemiSyncState.ON else 0)
        yield GaugeMetricFamily("relay_upstream_stopped",
                                "1 when the upstream stopped for good (a source that does not "
                                "continue the relay's history)",
                                value=1 if status.stopped else 0)
        yield GaugeMetricFamily("relay_upstream_refused",
                                "1 while the upstream's last refusal is one a reconnect "
                                "cannot fix (access denied, ...); retried all the same",
                                value=1 if status.refused else 0)
        yield GaugeMetricFamily("relay_upstream_waiting_for_source",
                                "1 while the source lacks transactions the relay holds "
                                "(on_divergence = wait)",
                                value=1 if status.waiting else 0)
        yield GaugeMetricFamily("relay_upstream_disk_full",
                                "1 while ingest is paused because the relay log's file "
                                "system is full", value=1 if status.disk_full else 0)
        yield CounterMetricFamily("relay_upstream_disk_full_pauses",
                                  "times ingest paused on a full disk",
                                  value=status.disk_full_pauses)
        yield GaugeMetricFamily("relay_replication_lag_seconds",
                                "seconds the relay log is behind the primary",
                                value=self.lag_seconds())

        rl = self.log
        yield GaugeMetricFamily("relay_relaylog_size_bytes", "bytes in all segments",
                                value=rl.size_bytes())
        yield GaugeMetricFamily("relay_relaylog_segments", "segments in the relay log",
                                value=len(rl.segments))
        yield GaugeMetricFamily("relay_relaylog_segment_number", "number of the newest segment",
                                value=rl.visible[0])
        yield GaugeMetricFamily("relay_relaylog_committed_position_bytes",
                                "readers' end: offset of the last durable transaction end in "
                                "the newest segment", value=rl.visible[1])
        yield CounterMetricFamily("relay_relaylog_transactions", "transactions written",
                                  value=rl.stats.transactions)
        yield CounterMetricFamily("relay_relaylog_written_bytes", "bytes written to segments",
                                  value=rl.stats.bytes_written)
        yield CounterMetricFamily("relay_relaylog_rewritten_events",
                                  "events whose log_pos and checksum were rewritten",
                                  value=rl.stats.events_rewritten)
        yield CounterMetricFamily("relay_relaylog_rotations", "segments started",
                                  value=rl.stats.rotations)
        try:
            st = os.statvfs(rl.directory)
            free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
        except OSError:
            free = total = 0
        yield GaugeMetricFamily("relay_relaylog_disk_free_bytes",
                                "free bytes on the relay log's file system", value=free)
        yield GaugeMetricFamily("relay_relaylog_disk_total_bytes",
                                "size of the relay log's file system", value=total)

        readers = rl.readers.snapshot()
        g = GaugeMetricFamily("relay_relaylog_readers", "readers of the relay log: live "
                              "cursors and persisted holds (tap subscribers)", labels=["kind"])
        for kind in ReaderKind:
            g.add_metric([kind.value], sum(1 for r in readers if r.kind is kind))
        yield g
        floor = min((r.position for r in readers), default=None)
        if floor is not None:
            yield GaugeMetricFamily("relay_relaylog_floor_segment",
                                    "the oldest segment a reader still needs",
                                    value=floor[0])

        yield from self._retention()

        ds = self.downstream
        if ds is not None:
            reg = ds.registry
            sessions = reg.snapshot()
            yield GaugeMetricFamily("relay_downstream_clients", "connected downstream clients",
                                    value=len(sessions))
            yield CounterMetricFamily("relay_downstream_connections",
                                      "downstream connections accepted", value=reg.accepted)
            yield CounterMetricFamily("relay_downstream_rejected",
                                      "connections refused over max_clients",
                                      value=reg.rejected)
            yield CounterMetricFamily("relay_downstream_failed_logins",
                                      "logins refused for a wrong user or password",
                                      value=ds.logins.failed)
            yield GaugeMetricFamily("relay_downstream_blocked_hosts",
                                    "addresses blocked for failed logins (max_connect_errors)",
                                    value=len(ds.logins.blocked_hosts()))
            yield CounterMetricFamily("relay_downstream_kills_refused",
                                      "KILLs of another user's connection by a non-admin",
                                      value=reg.kills_refused)
            yield CounterMetricFamily("relay_downstream_semisync_refused_acks",
                                      "semi-sync acknowledgements of positions never sent to "
                                      "that replica", value=ds.semi_sync.refused_acks)
            md = ds.metadata
            if md is not None:
                yield CounterMetricFamily("relay_metadata_lookups",
                                          "metadata look-ups run on the primary",
                                          value=md.lookups)
                refused = CounterMetricFamily("relay_metadata_lookups_failed",
                                              "metadata look-ups not answered, by why",
                                              labels=["reason"])
                refused.add_metric(["busy"], md.refused_busy)
                refused.add_metric(["timeout"], md.timeouts)
                yield refused
                yield GaugeMetricFamily("relay_metadata_account_reads_tables",
                                        "1 when the metadata account can SELECT user tables "
                                        "(more than look-ups need)", value=int(bool(md.reads)))
            yield _by_reason("relay_downstream_sessions_ended",
                             "downstream sessions that ended, by how", reg.ended)
            sent = CounterMetricFamily("relay_downstream_client_sent_bytes",
                                       "bytes sent to a replica", labels=["replica"])
            lag_b = GaugeMetricFamily("relay_downstream_client_lag_bytes",
                                      "bytes of the relay log a replica has not been sent",
                                      labels=["replica"])
            lag_s = GaugeMetricFamily("relay_downstream_client_lag_seconds",
                                      "age of the oldest transaction a replica has not been "
                                      "sent", labels=["replica"])
            by_replica: dict[str, list[float]] = {}
            for info in sessions:
                dump = info.dump
                if dump is None or info.replica is None:
                    continue
                key = str(info.replica.server_id)
                entry = by_replica.setdefault(key, [0.0, 0.0, 0.0])
                behind = float(rl.bytes_behind(dump.segment, dump.position))
                entry[0] += dump.bytes_sent
                entry[1] = max(entry[1], behind)
                if behind > 0 and dump.last_ts:
                    newest = self.upstream.ingest.stats.last_event_ts
                    entry[2] = max(entry[2], float(max(0, newest - dump.last_ts)))
            for key, (b, lb, ls) in sorted(by_replica.items()):
                sent.add_metric([key], b)
                lag_b.add_metric([key], lb)
                lag_s.add_metric([key], ls)
            yield sent
            yield lag_b
            yield lag_s
            acks = CounterMetricFamily("relay_downstream_semi_sync_acks",
                                       "semi-sync acknowledgements read from a replica",
                                       labels=["replica"])
            for info in sessions:
                if info.semi_sync is not None and info.replica is not None:
                    acks.add_metric([str(info.replica.server_id)], info.semi_sync.acks)
            yield acks
            semi = ds.semi_sync
            yield GaugeMetricFamily("relay_downstream_semi_sync_clients",
                                    "dumps with semi-sync negotiated", value=semi.clients)
            yield CounterMetricFamily("relay_downstream_semi_sync_yes_tx",
                                      "transactions a semi-sync replica acknowledged",
                                      value=semi.yes_tx)
            yield CounterMetricFamily("relay_downstream_semi_sync_no_tx",
                                      "transactions no semi-sync replica acknowledged",
                                      value=semi.no_tx)
        yield GaugeMetricFamily("relay_event_loop_lag_seconds",
                                "how late the event loop ran a timer (recent maximum)",
                                value=self.loop_lag.max_recent)
        yield from self._rules()
        yield from self._tap()

    def _tap(self) -> Iterator[Metric]:
        tap = self.tap
        if tap is None:
            return
        st = tap.stats
        yield GaugeMetricFamily("relay_tap_clients", "connections to the tap now",
                                value=len(tap.clients))
        req = CounterMetricFamily("relay_tap_requests", "tap requests by command",
                                  labels=["command"])
        for cmd, n in sorted(st.requests.items()):
            req.add_metric([cmd], n)
        yield req
        err = CounterMetricFamily("relay_tap_errors", "error frames the tap sent, by code",
                                  labels=["code"])
        for code, n in sorted(st.errors.items()):
            err.add_metric([code], n)
        yield err
        yield CounterMetricFamily("relay_tap_sent_bytes", "bytes of frames the tap sent",
                                  value=st.bytes_sent)
        yield CounterMetricFamily("relay_tap_transactions", "transactions the tap served",
                                  value=st.transactions_sent)
        yield CounterMetricFamily("relay_tap_cpu_seconds", "thread CPU the tap spent "
                                  "reading, indexing and decoding", value=st.busy_seconds)
        yield CounterMetricFamily("relay_tap_failed_logins",
                                  "tap logins refused for a wrong user or password",
                                  value=st.login_failures)
        yield CounterMetricFamily("relay_tap_blocked_logins",
                                  "tap connections and logins refused: their address was "
                                  "blocked", value=st.logins_blocked)
        yield GaugeMetricFamily("relay_tap_blocked_hosts",
                                "addresses blocked for failed tap logins (max_connect_errors)",
                                value=len(tap.logins.blocked_hosts()))
        floor = tap.retention_floor()
        if floor is not None:
            yield GaugeMetricFamily("relay_tap_retain_from", "lowest position an active tap "
                                    "subscriber has acknowledged", value=floor)
        chunks = GaugeMetricFamily("relay_tap_snapshot_chunks", "chunks of a tap snapshot, "
                                   "planned and delivered, by snapshot and table",
                                   labels=["snapshot", "table", "state"])
        rows = GaugeMetricFamily("relay_tap_snapshot_rows", "rows a tap snapshot delivered, "
                                 "by snapshot and table", labels=["snapshot", "table"])
        for snap_id, snap in tap.snapshot_progress().items():
            for table, p in snap["tables"].items():
                chunks.add_metric([snap_id, table, "planned"], p["chunks"])
                chunks.add_metric([snap_id, table, "done"], p["chunks_done"])
                rows.add_metric([snap_id, table], p["rows"])
        yield chunks
        yield rows

    def _rules(self) -> Iterator[Metric]:
        rules = self.rules
        if rules is None:
            return
        ev = CounterMetricFamily("relay_rule_events", "events each rule kept, changed or "
                                 "dropped, and rule failures, by hook point",
                                 labels=["point", "rule", "outcome"])
        for (point, name), st in sorted(rules.totals().items(),
                                        key=lambda kv: (kv[0][0].value, kv[0][1])):
            for outcome in ("kept", "changed", "dropped", "errors"):
                ev.add_metric([point.value, name, outcome], getattr(st, outcome))
        yield ev
        yield GaugeMetricFamily("relay_rules_version", "reloads of the rules so far, plus one",
                                value=rules.version)
        yield GaugeMetricFamily("relay_upstream_stopped_by_rule",
                                "1 while a failing receive rule keeps the relay from storing",
                                value=1 if self.upstream.status.stopped_by_rule else 0)
        families: dict[tuple[str, str], Any] = {}
        for hook, kind, name, labels, value in sorted(
                rules.metrics.snapshot(), key=lambda t: (t[2], t[0], sorted(t[3].items()))):
            keys = ["hook", *sorted(labels)]
            fam = families.get((name, ",".join(keys)))
            if fam is None:
                cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
                fam = cls(f"relay_hook_{name}", f"set by hooks: {name}", labels=keys)
                families[(name, ",".join(keys))] = fam
            fam.add_metric([hook, *(labels[k] for k in sorted(labels))], value)
        yield from families.values()


def _by_reason(name: str, doc: str, counts: Mapping[Any, int]) -> CounterMetricFamily:
    """A counter with a `reason` label, every reason exported from the start."""
    family = CounterMetricFamily(name, doc, labels=["reason"])
    for reason, n in counts.items():
        family.add_metric([str(reason.value)], n)
    return family


OPEN_PATHS = ("/healthz", "/readyz")   # probes: no credentials needed


class Metrics:
    """The registry, the fsync histogram, readiness, and the HTTP endpoint."""

    def __init__(self, *, ready_max_lag: float, ready_grace: float,
                 credentials: tuple[str, str] | None = None,
                 tls: ServerTls | None = None) -> None:
        """`credentials`: ("Bearer", token) or ("Basic", base64): what /metrics, /status and
        /-/reload require in an Authorization header. `tls`: HTTPS."""
        self._authorization = (f"{credentials[0]} {credentials[1]}".encode()
                               if credentials is not None else None)
        self.tls = tls
        self.registry = CollectorRegistry(auto_describe=False)
        self.fsync_seconds = Histogram("relay_relaylog_fsync_seconds",
                                       "time one fsync of a relay log segment took",
                                       registry=self.registry, buckets=FSYNC_BUCKETS)
        self.loop_lag = LoopLag()
        self.ready_max_lag = ready_max_lag
        self.ready_grace = ready_grace
        self.collector: RelayCollector | None = None
        self._listener = SocketListener(self._accept)
        self.on_reload: Callable[[], str] | None = None

    def bind(self, relay_log: RelayLog, upstream: Upstream,
             downstream: DownstreamServer | None, rules: Rules | None = None,
             tap: TapServer | None = None, retention: Retention | None = None) -> None:
        self.collector = RelayCollector(relay_log, upstream, downstream, self.loop_lag, rules,
                                        tap, retention)
        self.registry.register(self.collector)

    def readiness(self) -> Readiness:
        c = self.collector
        if c is None:
            return Readiness(False, ["starting"])
        reasons = []
        status = c.upstream.status
        if status.refused:   # whatever the grace: waiting does not fix it
            reasons.append(f"the upstream refused the relay: {status.refused}")
        elif not status.streams and not status.stopped:
            reasons.append("the upstream has not connected yet"
                           + (f": {status.last_error}" if status.last_error else ""))
        elif not status.connected and time.time() - status.disconnected_since > self.ready_grace:
            reasons.append(f"upstream disconnected for over {self.ready_grace:g}s"
                           + (f": {status.last_error}" if status.last_error else ""))
        if status.stopped:
            reasons.append(f"upstream stopped: {status.stopped}")
        if not os.access(c.log.directory, os.W_OK):
            reasons.append(f"relay log directory {c.log.directory} is not writable")
        if c.log.failure is not None:
            reasons.append(f"relay log write failed: {c.log.failure}")
        if status.disk_full:
            reasons.append(f"disk full, ingest paused until space returns: {status.disk_full}")
        lag = c.lag_seconds()
        if lag > self.ready_max_lag:
            reasons.append(f"replication lag {lag:.0f}s over ready_max_lag "
                           f"{self.ready_max_lag:g}s")
        return Readiness(not reasons, reasons)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def status(self) -> dict[str, Any]:
        """A one-screen summary for `relay status` (JSON at /status)."""
        c = self.collector
        if c is None:
            return {"state": "starting"}
        up = c.upstream.status
        rl = c.log
        ready = self.readiness()
        clients = []
        downstream: dict[str, Any] = {}
        if c.downstream is not None:
            reg = c.downstream.registry
            for s in reg.snapshot():
                dump = s.dump
                clients.append({
                    "id": s.conn_id, "peer": s.peer, "user": s.user,
                    "server_id": s.replica.server_id if s.replica else None,
                    "file": dump.segment if dump else None,
                    "position": dump.position if dump else None,
                    "bytes_sent": dump.bytes_sent if dump else 0,
                    "state": s.state, "tls": s.tls or None,
                    "lag_bytes": rl.bytes_behind(dump.segment, dump.position) if dump else 0,
                    "semi_sync": {"requested": s.semi_sync.requested, "acks": s.semi_sync.acks,
                                  "last_ack": s.semi_sync.last_ack,
                                  "refused_acks": s.semi_sync.refused}
                    if s.semi_sync else None,
                })
            semi = c.downstream.semi_sync
            logins = c.downstream.logins
            downstream = {"accepted": reg.accepted, "rejected": reg.rejected,
                          "failed_logins": logins.failed,
                          "sha2_full_authentications":
                              c.downstream.auth.sha2_full_authentications,
                          "tls": _tls_status(c.downstream.tls,
                                             c.downstream.auth.tls_failures),
                          "blocked_hosts": logins.blocked_hosts(),
                          "refused_blocked": logins.refused,
                          "kills_refused": reg.kills_refused,
                          "metadata": _metadata_status(c.downstream.metadata),
                          "ended": {r.value: n for r, n in reg.ended.items() if n},
                          "recent_endings": [
                              {"id": e.conn_id, "server_id": e.server_id, "user": e.user,
                               "reason": e.reason.value, "file": e.segment,
                               "position": e.position, "bytes_sent": e.bytes_sent,
                               "at": e.at} for e in reg.recent_ended],
                          "semi_sync": {"enabled": semi.enabled, "clients": semi.clients,
                                        "yes_tx": semi.yes_tx, "no_tx": semi.no_tx,
                                        "acks": semi.acks,
                                        "refused_acks": semi.refused_acks}}
        readers = rl.readers.snapshot()
        return {
            "version": __version__,
            "kernels": {"implementation": kernels.IMPLEMENTATION.value,
                        "reason": kernels.REASON},
            "ready": ready.ready, "not_ready_because": ready.reasons,
            "upstream": {"connected": up.connected, "source": up.active_source,
                         "primary_version": up.primary_version,
                         "primary_server_id": up.primary_server_id,
                         "primary_settings_at": up.primary_settings_at,
                         "account_reads": up.account_reads,
                         "last_error": up.last_error,
                         "reconnects": sum(up.reconnects.values()), "streams": up.streams,
                         "reconnect_reasons": {r.value: n for r, n in up.reconnects.items()
                                               if n},
                         "active_since": up.active_since, "failovers": up.failovers,
                         "last_failover": up.last_failover, "waiting_for_source": up.waiting,
                         "stopped": up.stopped, "refused": up.refused,
                         "semi_sync": up.semi_sync.value,
                         "semi_sync_acks": up.semi_sync_stats.acks_sent,
                         "semi_sync_last_ack": up.semi_sync_stats.last_ack,
                         "semi_sync_fallbacks": up.semi_sync_stats.fallbacks,
                         "semi_sync_fallen_back": up.semi_sync_stats.fallen_back},
            "lag_seconds": round(c.lag_seconds(), 3),
            "relay_log": {"directory": rl.directory, "flavour": rl.flavour.value,
                          "segments": len(rl.segments),
                          "size_bytes": rl.size_bytes(),
                          "file": rl.segments.last if rl.segments else None,
                          "position": rl.visible[1], "gtid_pos": str(rl.visible_state),
                          "transactions": rl.stats.transactions,
                          "discarded_transactions": rl.stats.discarded_transactions,
                          "failure": str(rl.failure) if rl.failure else "",
                          "readers": [{"name": r.name, "kind": r.kind.value,
                                       "segment": r.position[0], "offset": r.position[1],
                                       "since": r.since} for r in readers],
                          "floor": list(min((r.position for r in readers), default=()))},
            "clients": clients,
            "downstream": downstream,
            "event_loop_lag_seconds": round(self.loop_lag.max_recent, 4),
            "retention": self._retention_status(),
            "rules": self._rules_status(),
            "tap": self._tap_status(),
        }

    def _retention_status(self) -> dict[str, Any]:
        c = self.collector
        if c is None or c.retention is None:
            return {}
        rt, rl = c.retention, c.log
        st, p = rt.stats, rt.policy
        free = free_bytes(rl.directory)
        return {"policy": {"age_seconds": p.max_age, "size_bytes": p.max_size,
                           "min_segments": p.min_segments, "max_size_bytes": p.hard_cap},
                "oldest_segment": rl.segments.names[0] if rl.segments else None,
                "oldest_gtid_pos": st.oldest_gtid, "disk_free_bytes": free,
                "purged_segments": st.purged_segments, "purged_bytes": st.purged_bytes,
                "last_purge": st.last_purge, "last_reason": st.last_reason,
                "held_back": [{"reader": h.reader, "kind": h.kind, "segment": h.segment,
                               "bytes": h.bytes} for h in st.held_back],
                "losses": [{"reader": x.reader, "kind": x.kind, "segment": x.segment,
                            "offset": x.offset, "at": x.at} for x in st.losses],
                "compress_after": p.compress_after,
                "compressed_segments": st.compressed_segments,
                "compressed_bytes": {"before": st.compressed_in, "after": st.compressed_out},
                "disk_full": c.upstream.status.disk_full,
                "disk_full_pauses": c.upstream.status.disk_full_pauses}

    def _tap_status(self) -> dict[str, Any]:
        c = self.collector
        if c is None or c.tap is None:
            return {}
        tap = c.tap
        st = tap.stats
        return {"port": tap.port, "clients": len(tap.clients), "requests": dict(st.requests),
                "errors": dict(st.errors), "bytes_sent": st.bytes_sent,
                "transactions_sent": st.transactions_sent,
                "cpu_seconds": round(st.busy_seconds, 3),
                "failed_logins": st.login_failures, "refused_blocked": st.logins_blocked,
                "blocked_hosts": tap.logins.blocked_hosts(),
                "retain_from": tap.retention_floor(),
                "subscribers": tap.subscribers(), "snapshots": tap.snapshot_progress()}

    def _rules_status(self) -> dict[str, Any]:
        c = self.collector
        if c is None or c.rules is None:
            return {}
        totals = c.rules.totals()
        out: dict[str, Any] = {"version": c.rules.version,
                               "stopped_receive": c.upstream.status.stopped_by_rule}
        for point, described in c.rules.describe().items():
            specs = [s for s in c.rules.ruleset.specs if s.at is point]
            rows = []
            for spec, text in zip(specs, described, strict=True):
                st = totals.get((point, spec.name), _ZERO)
                rows.append({"rule": text, "kept": st.kept, "changed": st.changed,
                             "dropped": st.dropped, "errors": st.errors})
            out[point.value] = rows
        return out

    async def serve(self, host: str, port: int) -> None:
        await self._listener.open(host, port)
        scheme = "https" if self.tls is not None else "http"
        log.info("metrics and health on %s://%s:%d/metrics, /healthz, /readyz%s", scheme, host,
                 self.port, " (/metrics and /status need credentials)"
                 if self._authorization is not None else "")

    @property
    def port(self) -> int:
        return self._listener.port

    async def close(self) -> None:
        self._listener.stop()
        await self._listener.closed()

    async def _accept(self, sock: socket.socket) -> None:
        try:
            reader, writer = await open_streams(
                sock, self.tls.context if self.tls is not None else None, 5.0)
        except (ssl.SSLError, OSError, TimeoutError):
            sock.close()  # a scraper that cannot do TLS; Prometheus reports it as down
            return
        await self._handle(reader, writer)

    def reload_credentials(self, credentials: tuple[str, str] | None) -> None:
        """Put new credentials in force (a rotated token_file or token_env, read again on
        SIGHUP): the next request is checked against them."""
        self._authorization = (f"{credentials[0]} {credentials[1]}".encode()
                               if credentials is not None else None)

    def _reload_refusal(self, method: bytes, peer: Any, request: bytes
                        ) -> tuple[bytes, str, str] | None:
        """Why /-/reload is refused (body, status, extra headers), or None. It re-reads the
        config and re-executes hook files: POST only (a browser's GET, a link or an
        <img> cannot trigger it), never from a web page (a browser names the page's origin
        in every cross-site POST, even a form's; the relay serves no page of its own, so a
        request that names any origin is a page's), and beyond loopback only with
        credentials."""
        if method != b"POST":
            return (b"/-/reload takes POST (curl -X POST ..., or relay rules reload)\n",
                    "405 Method Not Allowed", "Allow: POST\r\n")
        if {b"origin", b"sec-fetch-site"} & _header_names(request):
            return (b"/-/reload is not taken from a web page (the request names an origin); "
                    b"use relay rules reload, curl -X POST or SIGHUP\n", "403 Forbidden", "")
        host = peer[0] if isinstance(peer, tuple) and peer else ""
        if self._authorization is None and not is_loopback(str(host)):
            return (b"/-/reload from beyond loopback needs credentials: set [metrics] "
                    b"token_file, token_env or basic_user (and [metrics.tls]), or reload "
                    b"from the relay's host (relay rules reload, or SIGHUP)\n",
                    "403 Forbidden", "")
        return None

    def _authorized(self, request: bytes) -> bool:
        if self._authorization is None:
            return True
        for line in request.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"authorization":
                return hmac.compare_digest(value.strip(), self._authorization)
        return False

    def _reload(self) -> tuple[bytes, str]:
        if self.on_reload is None:
            return b"nothing to reload\n", "404 Not Found"
        try:
            return (self.on_reload() + "\n").encode(), "200 OK"
        except RelayError as exc:
            return (f"not reloaded, the old rules stay in force: {exc}\n").encode(), \
                "400 Bad Request"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(5):
                request = await reader.readuntil(b"\r\n\r\n")
            method, target = request.split(b" ", 2)[:2]
            path = target.split(b"?", 1)[0].decode("ascii", "replace")
            headers = ""
            if path not in OPEN_PATHS and not self._authorized(request):
                body, status, ctype = b"unauthorized\n", "401 Unauthorized", "text/plain"
                kind = self._authorization.split(b" ", 1)[0].decode() \
                    if self._authorization else "Bearer"
                writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                             f"WWW-Authenticate: {kind} realm=\"relay\"\r\nContent-Length: "
                             f"{len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
                await writer.drain()
                return
            if path == "/metrics":
                body, status, ctype = (self.exposition(), "200 OK",
                                       "text/plain; version=0.0.4; charset=utf-8")
            elif path == "/status":
                body = json.dumps(self.status(), indent=2).encode() + b"\n"
                status, ctype = "200 OK", "application/json"
            elif path == "/healthz":
                body, status, ctype = b"ok\n", "200 OK", "text/plain"
            elif path == "/-/reload":
                ctype = "text/plain"
                refusal = self._reload_refusal(method, writer.get_extra_info("peername"),
                                               request)
                if refusal is not None:
                    body, status, headers = refusal
                else:
                    await _drain_body(reader, request)
                    body, status = self._reload()
            elif path == "/readyz":
                r = self.readiness()
                body = ("ready\n" if r.ready else "not ready: " + "; ".join(r.reasons) + "\n"
                        ).encode()
                status = "200 OK" if r.ready else "503 Service Unavailable"
                ctype = "text/plain"
            else:
                body, status, ctype = b"not found: try /metrics, /status, /healthz, /readyz\n", \
                    "404 Not Found", "text/plain"
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n{headers}"
                         f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                         .encode() + body)
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError,
                ConnectionError, IndexError, ValueError):
            pass
        finally:
            writer.close()


def _header_names(request: bytes) -> set[bytes]:
    return {line.partition(b":")[0].strip().lower() for line in request.split(b"\r\n")[1:]}


async def _drain_body(reader: asyncio.StreamReader, request: bytes) -> None:
    """Read a request's body (Content-Length, up to 64 KiB; /-/reload ignores it), so that
    closing the connection does not reset it under the answer."""
    for line in request.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
            if length > 1 << 16:
                raise ValueError("request body too long")
            async with asyncio.timeout(5):
                await reader.readexactly(length)
            return


def _tls_status(tls: ServerTls | None, failures: int) -> dict[str, Any]:
    """The SQL port's TLS: its certificate (configured in [downstream.tls], or generated at
    start) and its SHA-256 fingerprint; how many clients failed the handshake or hung up
    right after it (refusing the certificate)."""
    if tls is None:
        return {"certificate": None, "failures": failures}
    return {"certificate": "generated" if tls.generated else "configured",
            "sha256": tls.fingerprint.hex(), "failures": failures}


def _metadata_status(md: MetadataStats | None) -> dict[str, Any]:
    if md is None:
        return {}
    return {"account": md.account, "account_reads": md.reads, "lookups": md.lookups,
            "refused_busy": md.refused_busy, "timeouts": md.timeouts, "connects": md.connects}
