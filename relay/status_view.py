"""Render a relay's /status as one screen (rich): `relay status` and `relay demo`; and
`relay import`'s progress."""

from __future__ import annotations

import json
import ssl
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TransferSpeedColumn,
)
from rich.table import Table
from rich.text import Text

from relay.tap.protocol import position_text

if TYPE_CHECKING:
    from relay.importer import ImportProgress


@dataclass(frozen=True)
class AdminAccess:
    """How to reach a relay's admin endpoint: the Authorization [metrics] asks for, and
    HTTPS trusting exactly the certificate in [metrics.tls] cert (pinned: the CLI reads the
    relay's own config, so no CA or host name is needed to know it is that relay)."""

    credentials: tuple[str, str] | None = None
    pinned_cert: str | None = None

    def open(self, url: str, timeout: float, *, post: bool = False) -> Any:
        """GET `url` (or an empty POST: /-/reload takes nothing else)."""
        headers = {"Authorization": f"{self.credentials[0]} {self.credentials[1]}"} \
            if self.credentials else {}
        context = None
        if self.pinned_cert is not None:
            context = ssl.create_default_context(cafile=self.pinned_cert)
            context.check_hostname = False
            context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN  # the leaf is the anchor
        request = urllib.request.Request(url, data=b"" if post else None, headers=headers,
                                         method="POST" if post else "GET")
        return urllib.request.urlopen(request, timeout=timeout, context=context)


def fetch_status(url: str, timeout: float = 5.0, *,
                 access: AdminAccess | None = None) -> dict[str, Any]:
    with (access or AdminAccess()).open(url.rstrip("/") + "/status", timeout) as resp:
        data: dict[str, Any] = json.loads(resp.read())
    return data


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def render(st: dict[str, Any], *, rates: dict[str, float] | None = None) -> Group:
    up = st["upstream"]
    rl = st["relay_log"]
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    ready = Text("ready", style="green") if st["ready"] else Text(
        "NOT READY: " + "; ".join(st["not_ready_because"]), style="red")
    head.add_row("relay", f"{st['version']}  ", )
    head.add_row("state", ready)
    conn = Text("connected", style="green") if up["connected"] else Text("disconnected",
                                                                          style="red")
    head.add_row("upstream", Text.assemble(conn, f"  {up['source']}  {up['primary_version']}"
                                                 f"  server_id {up['primary_server_id']}"))
    if up.get("semi_sync", "off") != "off":
        head.add_row("semi-sync", f"{up['semi_sync']}, {up.get('semi_sync_acks', 0)} acks, "
                                  f"last {up.get('semi_sync_last_ack') or '-'}")
    if up.get("failovers"):
        head.add_row("failovers", f"{up['failovers']}, last {up['last_failover']}")
    if up.get("stopped"):
        head.add_row("STOPPED", Text(up["stopped"], style="red"))
    elif up.get("waiting_for_source"):
        head.add_row("waiting", Text(up["waiting_for_source"], style="yellow"))
    if up["last_error"] and not up["connected"]:
        head.add_row("last error", Text(up["last_error"], style="yellow"))
    head.add_row("lag", f"{st['lag_seconds']:.1f} s    reconnects {up['reconnects']}")
    head.add_row("relay log", f"{rl['file']} @ {rl['position']}   {rl['segments']} segment(s), "
                              f"{_size(rl['size_bytes'])}, {rl['transactions']} transactions")
    head.add_row("GTID", rl["gtid_pos"] or "(empty)")
    rt = st.get("retention") or {}
    if rt:
        policy = rt["policy"]
        caps = ", ".join(f"{k} {_size(v) if 'bytes' in k else f'{v:g} s'}"
                         for k, v in policy.items() if v is not None and k != "min_segments")
        head.add_row("retention", f"{caps or 'off'}; oldest {rt['oldest_segment'] or '-'} "
                                  f"({rt['oldest_gtid_pos'] or 'empty'}); purged "
                                  f"{rt['purged_segments']} segment(s), "
                                  f"{_size(rt['purged_bytes'])}; "
                                  f"{_size(rt['disk_free_bytes'])} free")
        for h in rt["held_back"]:
            head.add_row("held back", Text(f"{h['reader']} ({h['kind']}) keeps "
                                           f"{_size(h['bytes'])} from segment {h['segment']}",
                                           style="yellow"))
        if rt.get("disk_full"):
            head.add_row("DISK FULL", Text(f"ingest paused: {rt['disk_full']}", style="red"))
    tap = st.get("tap") or {}
    if tap:
        subs = tap.get("subscribers") or {}
        head.add_row("tap", f"port {tap['port']}, {tap['clients']} client(s), "
                            f"{_size(tap['bytes_sent'])} sent, {tap['transactions_sent']} "
                            f"transactions; retention floor {tap.get('retain_from') or '-'}")
        for name, pos in sorted(subs.items()):
            head.add_row("subscriber", f"{name} acknowledged {position_text(pos)}")
        for snap_id, snap in (tap.get("snapshots") or {}).items():
            for table, p in snap["tables"].items():
                owner = snap.get("user") or "-"
                head.add_row("snapshot", f"{owner}/{snap['name']} ({snap_id}) {table}: "
                                         f"{p['chunks_done']}/{p['chunks']} chunks, "
                                         f"{p['rows']} rows")
    if rates:
        head.add_row("throughput", f"{_size(rates.get('bytes', 0))}/s in, "
                                   f"{rates.get('transactions', 0):.0f} transactions/s, "
                                   f"{_size(rates.get('sent', 0))}/s out")
    clients = Table(title=f"downstream clients ({len(st['clients'])})", expand=True)
    for col in ("server_id", "peer", "file", "position", "sent", "behind"):
        clients.add_column(col)
    for c in st["clients"]:
        clients.add_row(str(c["server_id"] if c["server_id"] is not None else "-"), c["peer"],
                        c["file"] or "-", str(c["position"] or "-"), _size(c["bytes_sent"]),
                        _size(c["lag_bytes"]))
    return Group(Panel(head, title="relay status"), clients)


__all__ = ["fetch_status", "render"]


class ImportView:
    """`relay import`'s progress on stderr: a bar (bytes, rate, transactions) on a
    terminal, a line per file otherwise."""

    def __init__(self, *, quiet: bool) -> None:
        self.quiet = quiet
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self._file = ""

    def update(self, p: ImportProgress) -> None:
        if self.quiet:
            return
        if not sys.stderr.isatty():
            if p.file != self._file:
                self._file = p.file
                print(f"relay: importing {p.file} ({p.files_done + 1} of {p.files})",
                      file=sys.stderr)
            return
        if self._bar is None or self._task is None:
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(),
                                 DownloadColumn(), TransferSpeedColumn(),
                                 TextColumn("{task.fields[tx]} transactions"),
                                 console=Console(stderr=True))
            self._bar.start()
            self._task = self._bar.add_task("import", total=p.total_bytes, tx=0)
        self._bar.update(self._task, completed=p.bytes_done,
                         description=f"{p.file} ({p.files_done + 1}/{p.files})",
                         tx=p.transactions)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
