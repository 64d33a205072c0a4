"""Readiness and the /status document: one summary of the running relay, rendered as JSON
at /status and on screen by `relay status` (relay/status_view.py)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from relay import __version__, kernels
from relay.buildinfo import FLAVOURS, commit
from relay.mysql.metadata import MetadataStats
from relay.ops.parts import RelayParts
from relay.relaylog.retention import free_bytes
from relay.tls import ServerTls


class _Zero:
    kept = changed = dropped = errors = 0


_ZERO = _Zero()


@dataclass
class Readiness:
    ready: bool
    reasons: list[str]


def readiness(c: RelayParts, ready_max_lag: float, ready_grace: float) -> Readiness:
    """Ready to be sent traffic, or the reasons not."""
    reasons = []
    status = c.upstream.status
    if status.refused:   # whatever the grace: waiting does not fix it
        reasons.append(f"the upstream refused the relay: {status.refused}")
    elif not c.upstream.ingest.stats.events and not status.stopped:
        # (nothing received: a dump request the primary then refused counts for nothing)
        reasons.append("the upstream has not connected yet"
                       + (f": {status.last_error}" if status.last_error else ""))
    elif not status.connected and time.time() - status.disconnected_since > ready_grace:
        reasons.append(f"upstream disconnected for over {ready_grace:g}s"
                       + (f": {status.last_error}" if status.last_error else ""))
    if status.stopped:
        reasons.append(f"upstream stopped: {status.stopped}")
    if not os.access(c.relay_log.directory, os.W_OK):
        reasons.append(f"relay log directory {c.relay_log.directory} is not writable")
    if c.relay_log.failure is not None:
        reasons.append(f"relay log write failed: {c.relay_log.failure}")
    if status.disk_full:
        reasons.append(f"disk full, ingest paused until space returns: {status.disk_full}")
    lag = c.lag_seconds()
    if lag > ready_max_lag:
        reasons.append(f"replication lag {lag:.0f}s over ready_max_lag "
                       f"{ready_max_lag:g}s")
    return Readiness(not reasons, reasons)


def status_document(c: RelayParts, ready: Readiness) -> dict[str, Any]:
    """A one-screen summary for `relay status` (JSON at /status)."""
    up = c.upstream.status
    rl = c.relay_log
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
        "version": __version__, "commit": commit(), "flavours": list(FLAVOURS),
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
        "event_loop_lag_seconds": round(c.loop_lag.max_recent, 4),
        "retention": _retention_status(c),
        "rules": _rules_status(c),
        "tap": _tap_status(c),
    }


def _retention_status(c: RelayParts) -> dict[str, Any]:
    if c.retention is None:
        return {}
    rt, rl = c.retention, c.relay_log
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


def _tap_status(c: RelayParts) -> dict[str, Any]:
    if c.tap is None:
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


def _rules_status(c: RelayParts) -> dict[str, Any]:
    if c.rules is None:
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
