"""Soak: the relay under a steady workload for an hour (by default) with five MariaDB
replicas, a tap subscriber that acknowledges as it goes, and retention active. Every
`--every` seconds it samples the relay's RSS, open file descriptors, event-loop lag, bytes
on disk, the replicas' lag and the achieved transaction rate; at the end it prints the
first, last and peak of each with its trend per hour, and draws the curves into a PNG.
A flat run: RSS, descriptors and disk bytes level off, lag stays small.

    python bench/soak.py [--minutes 60] [--rate 2000] [--replicas 5] [--no-tap] [--png soak.png]

`--no-tap`: no tap subscriber (the replicas alone: what serving them costs).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field

import pymysql
from downstream_fanout import cpu_seconds

from relay.tap.client import TapClient
from relay.testing.mariadb import MariaDB, free_port


@dataclass
class Samples:
    t: list[float] = field(default_factory=list)
    rss_mib: list[float] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)
    loop_lag_ms: list[float] = field(default_factory=list)
    disk_mib: list[float] = field(default_factory=list)
    replica_lag_tx: list[int] = field(default_factory=list)
    tps: list[float] = field(default_factory=list)
    relay_cpu_pct: list[float] = field(default_factory=list)  # of one core, per interval


class Writers:
    """Autocommit single-row transactions paced to `rate` in all, looped by a stored
    procedure on the primary in each of `threads` connections: a load generator in Python
    would take the CPU this bench measures (the primary, the replicas and the relay share
    the machine's cores), and pace no faster than its GIL allows."""

    PROCEDURE = """
        CREATE PROCEDURE soak.load(IN who INT, IN per_sec DOUBLE)
        BEGIN
          DECLARE n BIGINT DEFAULT 0;
          DECLARE t0 DOUBLE DEFAULT UNIX_TIMESTAMP(SYSDATE(6));
          DECLARE ahead DOUBLE;
          WHILE (SELECT stop FROM soak.ctl) = 0 DO
            IF n % 10 = 9 THEN
              DELETE FROM soak.t WHERE k = who ORDER BY id LIMIT 5;
            ELSE
              INSERT INTO soak.t (k, v) VALUES (who, REPEAT('s', 150));
            END IF;
            SET n = n + 1;
            IF n % 20 = 0 THEN
              SET ahead = t0 + n / per_sec - UNIX_TIMESTAMP(SYSDATE(6));
              IF ahead > 0 THEN DO SLEEP(ahead); END IF;
              IF ahead < -1 THEN SET t0 = UNIX_TIMESTAMP(SYSDATE(6)), n = 0; END IF;
            END IF;
          END WHILE;
        END"""

    def __init__(self, primary: MariaDB, rate: int, threads: int = 4) -> None:
        self.primary = primary
        self.per_thread = rate / threads
        self.errors: list[BaseException] = []
        self._base = 0
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                         for i in range(threads)]

    @property
    def count(self) -> int:
        """Transactions committed since start (the primary's GTID sequence: a DELETE that
        found nothing to delete writes no transaction, and is not counted)."""
        return seq_of(self.primary.gtid_binlog_pos()) - self._base

    def start(self) -> None:
        self.primary.execute_many([
            "CREATE DATABASE IF NOT EXISTS soak",
            "CREATE TABLE IF NOT EXISTS soak.t (id BIGINT PRIMARY KEY AUTO_INCREMENT, "
            "k INT, v VARCHAR(200), KEY (k))",
            "CREATE OR REPLACE TABLE soak.ctl (stop INT NOT NULL)",
            "INSERT INTO soak.ctl VALUES (0)",
            "DROP PROCEDURE IF EXISTS soak.load", self.PROCEDURE])
        self._base = seq_of(self.primary.gtid_binlog_pos())
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        if any(t.is_alive() for t in self._threads):
            self.primary.execute_many(["UPDATE soak.ctl SET stop = 1"])
        for t in self._threads:
            if t.is_alive():
                t.join(30)

    def _run(self, i: int) -> None:
        try:
            with contextlib.closing(pymysql.connect(
                    host="127.0.0.1", port=self.primary.port, user="root",
                    autocommit=True)) as conn, conn.cursor() as cur:
                cur.execute("CALL soak.load(%s, %s)", (i, self.per_thread))
        except BaseException as exc:  # reported at the end
            self.errors.append(exc)


class Subscriber:
    """A tap subscription that acknowledges what it read every few seconds."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.transactions = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)

    def _run(self) -> None:
        try:
            with TapClient(self.endpoint, "soak", "soakpw") as tap:
                frames = tap.subscribe("latest", name="soak", tables=["soak.%"])
                acked = time.monotonic()
                for frame in frames:
                    if frame["k"] == "tx":
                        self.transactions += 1
                        if time.monotonic() - acked > 5:
                            tap.subscription_ack(frame["pos"])
                            acked = time.monotonic()
                    if self._stop.is_set():
                        tap.stop()
                        return
        except BaseException as exc:
            self.error = exc


def status(metrics_port: int) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/status", timeout=10) as r:
        return dict(json.loads(r.read()))


def seq_of(gtid_pos: str) -> int:
    return max((int(g.rsplit("-", 1)[1]) for g in gtid_pos.split(",") if g), default=0)


def trend_per_hour(xs: list[float], ys: list[float]) -> float:
    if len(xs) < 3:
        return 0.0
    slope = statistics.linear_regression(xs, ys).slope
    return slope * 3600


def draw(samples: Samples, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [t / 60 for t in samples.t]
    series = [("relay RSS (MiB)", samples.rss_mib), ("open file descriptors", samples.fds),
              ("event-loop lag (ms)", samples.loop_lag_ms),
              ("relay log on disk (MiB)", samples.disk_mib),
              ("slowest replica behind (transactions)", samples.replica_lag_tx),
              ("transactions/s (primary)", samples.tps),
              ("relay CPU (% of one core)", samples.relay_cpu_pct)]
    fig, axes = plt.subplots(len(series), 1, figsize=(9, 13), sharex=True)
    for ax, (name, ys) in zip(axes, series, strict=True):
        ax.plot(minutes, ys, linewidth=1)
        ax.set_ylabel(name, fontsize=8)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("minutes")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--rate", type=int, default=2000, help="transactions/s to aim for")
    ap.add_argument("--replicas", type=int, default=5)
    ap.add_argument("--every", type=float, default=10.0, help="seconds between samples")
    ap.add_argument("--no-tap", dest="tap", action="store_false",
                    help="no tap subscriber: the replicas alone")
    ap.add_argument("--png", default="soak.png")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="relay-bench-soak-")
    primary = MariaDB(base_dir=f"{work}/p", server_id=1).start()
    replicas = [MariaDB(base_dir=f"{work}/r{i}", server_id=50 + i).start()
                for i in range(args.replicas)]
    port, metrics, tap_port = free_port(), free_port(), free_port()
    cfg = os.path.join(work, "relay.toml")
    with open(cfg, "w") as f:
        f.write(f'[relay]\ndata_dir = "{work}/relay"\nserver_id = 4242\n'
                f'[upstream]\nsources = ["{primary.url}"]\nstart = "earliest"\n'
                '[relaylog]\nsegment_size = "16MiB"\nretention_size = "128MiB"\n'
                'retention_max_size = "512MiB"\nretention_check_interval = "5s"\n'
                f'[downstream]\nlisten = "127.0.0.1:{port}"\n'
                '[[downstream.users]]\nname = "repl"\npassword = "relaypass"\n'
                f'[tap]\nlisten = "127.0.0.1:{tap_port}"\n'
                '[[tap.users]]\nname = "soak"\npassword = "soakpw"\n'
                f'[metrics]\nlisten = "127.0.0.1:{metrics}"\n')
    relay = subprocess.Popen([sys.executable, "-m", "relay.cli", "run", "--config", cfg],
                             stdout=subprocess.DEVNULL, stderr=open(  # noqa: SIM115
                                 os.path.join(work, "relay.log"), "wb"))
    writers = Writers(primary, args.rate)
    subscriber = Subscriber(f"127.0.0.1:{tap_port}")
    samples = Samples()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if status(metrics).get("upstream"):
                    break
            time.sleep(0.2)
        for r in replicas:
            r.replicate_from("127.0.0.1", port, user="repl", password="relaypass")
        writers.start()
        if args.tap:
            subscriber.start()
        t0 = time.monotonic()
        last_count, last_t = 0, t0
        last_cpu = cpu_seconds(relay.pid)
        while time.monotonic() - t0 < args.minutes * 60:
            time.sleep(args.every)
            now = time.monotonic()
            st = status(metrics)
            applied = [seq_of(str(r.query("SELECT @@gtid_slave_pos")[0][0]))
                       for r in replicas]
            head = seq_of(primary.gtid_binlog_pos())  # after the replicas: never behind them
            behind = head - min(applied)
            with open(f"/proc/{relay.pid}/status") as f:
                rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
            count = writers.count
            samples.t.append(now - t0)
            samples.rss_mib.append(rss / 1024)
            samples.fds.append(len(os.listdir(f"/proc/{relay.pid}/fd")))
            samples.loop_lag_ms.append(1000 * float(st["event_loop_lag_seconds"]))  # type: ignore[arg-type]
            samples.disk_mib.append(st["relay_log"]["size_bytes"] / (1 << 20))  # type: ignore[index]
            samples.replica_lag_tx.append(behind)
            samples.tps.append((count - last_count) / (now - last_t))
            cpu = cpu_seconds(relay.pid)
            samples.relay_cpu_pct.append(100 * (cpu - last_cpu) / (now - last_t))
            last_count, last_t, last_cpu = count, now, cpu
            print(f"{samples.t[-1] / 60:6.1f} min  rss {samples.rss_mib[-1]:6.1f} MiB  "
                  f"fds {samples.fds[-1]:4d}  loop lag {samples.loop_lag_ms[-1]:6.1f} ms  "
                  f"disk {samples.disk_mib[-1]:7.1f} MiB  behind {behind:6d}  "
                  f"{samples.tps[-1]:7.0f} tx/s  relay CPU {samples.relay_cpu_pct[-1]:5.1f}%",
                  flush=True)
        writers.stop()
        subscriber.stop()
        retention = status(metrics).get("retention", {})
        print()
        print(f"{args.minutes:g} min, {writers.count} transactions "
              f"({writers.count / (samples.t[-1] or 1):.0f}/s aimed at {args.rate}/s), "
              f"{args.replicas} replicas, tap subscriber read {subscriber.transactions} "
              f"transactions; retention purged {retention.get('purged_segments')} segments")
        # The first samples are the warm-up (buffers fill, segments reach the size cap).
        settled = len(samples.t) // 5
        xs = samples.t[settled:]
        for name in ("rss_mib", "fds", "loop_lag_ms", "disk_mib", "replica_lag_tx", "tps",
                     "relay_cpu_pct"):
            ys = [float(v) for v in getattr(samples, name)]
            print(f"{name:<15} first {ys[0]:9.1f}  last {ys[-1]:9.1f}  peak {max(ys):9.1f}  "
                  f"trend after warm-up {trend_per_hour(xs, ys[settled:]):+9.1f}/h")
        # The relay's CPU per transaction after the warm-up: comparable between runs whose
        # rates differ (the per-sample percentages move with the machine's other load).
        cpu_pct = samples.relay_cpu_pct[settled:]
        rates = samples.tps[settled:]
        print(f"relay CPU after warm-up: median {statistics.median(cpu_pct):.1f}% of a "
              f"core, {10_000 * statistics.fmean(cpu_pct) / max(statistics.fmean(rates), 1):.1f}"
              " µs per transaction")
        if writers.errors or subscriber.error:
            print(f"errors: {writers.errors[:3]} {subscriber.error}")
        draw(samples, args.png, f"relay soak: {args.minutes:g} min, {args.replicas} replicas, "
                                f"{'tap subscriber, ' if args.tap else ''}retention 128 MiB")
        print(f"curves: {args.png}")
        return 0 if not writers.errors and subscriber.error is None else 1
    finally:
        writers.stop()
        subscriber.stop()
        relay.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            relay.wait(30)
        if relay.poll() is None:
            relay.kill()
        for server in (*replicas, primary):
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
