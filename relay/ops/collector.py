"""The Prometheus collector: the relay's metric families, made at scrape time.

Hot paths keep plain counters (IngestStats, LogStats, DumpStream fields); this turns them
into families only when Prometheus asks, so a scrape costs the event path nothing. A
series the dashboard or an alert uses is there from the start (0 where nothing happened):
tests/integration/test_operations.py scrapes a relay whose primary has not answered yet.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from relay import __version__, kernels
from relay.binlog.constants import EventType, type_name
from relay.buildinfo import FLAVOURS, commit
from relay.ops.parts import RelayParts
from relay.relaylog.readers import ReaderKind
from relay.upstream.runner import SemiSyncState

# Every stream opens with these: their series are there (at 0) before the first connect,
# so the throughput panels have data from the start; other types appear when received.
STREAM_OPENERS = frozenset({EventType.ROTATE, EventType.FORMAT_DESCRIPTION})

class RelayCollector(Collector):
    """The relay's metric families, made at scrape time from the parts' plain counters."""

    def __init__(self, parts: RelayParts) -> None:
        self.parts = parts

    def _retention(self) -> Iterator[Metric]:
        rt = self.parts.retention
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
        oldest = self.parts.relay_log.segments.sealed_at(self.parts.relay_log.segments.names[0]) \
            if self.parts.relay_log.segments else None
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
        for h in st.held_back:   # (one per reader name and kind: retention.plan)
            held.add_metric([h.reader, h.kind], h.bytes)
        yield held
        # By kind, every kind from the start: a series that appeared at 1 would never
        # show an increase(). /status retention.losses names each reader and its place.
        losses = CounterMetricFamily("relay_retention_reader_losses",
                                     "segments a reader still needed that retention removed "
                                     "(the hard cap retention_max_size; for a tap hold, "
                                     "[tap] retain_max), by kind of reader",
                                     labels=["kind"])
        for kind, n in st.losses_by_kind.items():
            losses.add_metric([kind], n)
        yield losses
        policy = rt.policy
        for name, value, setting in (
                ("age_seconds", policy.max_age, "retention_age"),
                ("size_bytes", policy.max_size, "retention_size"),
                ("max_size_bytes", policy.hard_cap, "retention_max_size")):
            yield GaugeMetricFamily(f"relay_retention_{name}",
                                    f"[relaylog] {setting} (0: not set)", value=value or 0)

    def collect(self) -> Iterator[Metric]:
        up = self.parts.upstream
        status = up.status
        g = GaugeMetricFamily("relay_build_info",
                              "relay version, the commit it was built from, the server "
                              "flavours it follows and serves, Python runtime and kernels "
                              "(compiled or pure-python)",
                              labels=["version", "commit", "flavours", "python", "kernels"])
        g.add_metric([__version__, commit(), ",".join(FLAVOURS), platform.python_version(),
                      kernels.IMPLEMENTATION.value], 1)
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
                                value=self.parts.lag_seconds())

        rl = self.parts.relay_log
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
        g = GaugeMetricFamily("relay_relaylog_floor_segment",
                              "the oldest segment a reader still needs (while one holds any)")
        if floor is not None:
            g.add_metric([], floor[0])
        yield g

        yield from self._retention()

        ds = self.parts.downstream
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
                    newest = self.parts.upstream.ingest.stats.last_event_ts
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
            # One series per server id, its ended sessions' acknowledgements and its live
            # ones' (two sessions of one id made the series twice: a refused scrape).
            acks_by = dict(reg.ended_acks)
            for info in sessions:
                if info.semi_sync is not None and info.replica is not None:
                    sid = info.replica.server_id
                    acks_by[sid] = acks_by.get(sid, 0) + info.semi_sync.acks
            for sid, n in sorted(acks_by.items()):
                acks.add_metric([str(sid)], n)
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
                                value=self.parts.loop_lag.max_recent)
        yield from self._rules()
        yield from self._tap()

    def _tap(self) -> Iterator[Metric]:
        tap = self.parts.tap
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
        retain = tap.retention_floor()
        g = GaugeMetricFamily("relay_tap_retain_from", "lowest position an active tap "
                              "subscriber has acknowledged (once one has)")
        if retain is not None:
            g.add_metric([], retain)
        yield g
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
        rules = self.parts.rules
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
                                value=1 if self.parts.upstream.status.stopped_by_rule else 0)
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
