"""`relay demo`: a sandbox primary, the relay, and a sandbox replica behind it, a light
workload, and a live view of throughput, lag and clients until Ctrl-C; then cleanup."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import threading
import time

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from relay.app import App
from relay.config import parse_config
from relay.status_view import render
from relay.testing.mariadb import MariaDB, free_port


class Workload(threading.Thread):
    def __init__(self, server: MariaDB, rate: float) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.rate = rate
        self.stop = threading.Event()
        self.done = 0

    def run(self) -> None:
        with contextlib.closing(self.server.root()) as conn, conn.cursor() as cur:
            cur.execute("CREATE DATABASE IF NOT EXISTS demo")
            cur.execute("CREATE TABLE IF NOT EXISTS demo.orders (id INT AUTO_INCREMENT "
                        "PRIMARY KEY, item VARCHAR(40), qty INT, at TIMESTAMP(6) DEFAULT "
                        "CURRENT_TIMESTAMP(6))")
            while not self.stop.is_set():
                cur.execute("INSERT INTO demo.orders (item, qty) VALUES (%s, %s)",
                            (f"item-{self.done % 97}", self.done % 7 + 1))
                if self.done % 10 == 9:
                    cur.execute("UPDATE demo.orders SET qty = qty + 1 ORDER BY id DESC LIMIT 5")
                self.done += 1
                time.sleep(1.0 / self.rate)


async def _demo(work: str, duration: float | None, rate: float, console: Console) -> int:
    console.print("starting a sandbox primary and a sandbox replica ...")
    primary = MariaDB(server_id=1, base_dir=os.path.join(work, "primary"))
    replica = MariaDB(server_id=3, base_dir=os.path.join(work, "replica"))
    await asyncio.gather(asyncio.to_thread(primary.start), asyncio.to_thread(replica.start))
    relay_port, metrics_port = free_port(), free_port()
    config = parse_config({
        "relay": {"server_id": 2, "data_dir": os.path.join(work, "relay"),
                  "log_level": "warning"},
        "upstream": {"sources": [primary.url], "start": "earliest",
                     "heartbeat_period": "1s", "read_timeout": "5s"},
        "downstream": {"listen": f"127.0.0.1:{relay_port}",
                       "users": [{"name": "repl", "password": "demo"}]},
        "metrics": {"listen": f"127.0.0.1:{metrics_port}"},
    })
    app = App(config)
    app_task = asyncio.create_task(app.run())
    workload = Workload(primary, rate)
    try:
        await asyncio.sleep(0.5)
        await asyncio.to_thread(replica.replicate_from, "127.0.0.1", relay_port, user="repl",
                                password="demo")
        workload.start()
        console.print(f"relay: replicas on 127.0.0.1:{relay_port}, metrics on "
                      f"http://127.0.0.1:{metrics_port}/metrics  (Ctrl-C to stop)")
        last = (time.monotonic(), 0, 0, 0)
        deadline = None if duration is None else time.monotonic() + duration
        with Live(console=console, refresh_per_second=2) as live:
            while not app_task.done() and (deadline is None or time.monotonic() < deadline):
                st = app.ops.status()
                stats = app.upstream.ingest.stats
                sent = sum(c["bytes_sent"] for c in st.get("clients", []))
                now = (time.monotonic(), stats.bytes, app.relay_log.stats.transactions, sent)
                dt = max(now[0] - last[0], 1e-6)
                rates = {"bytes": (now[1] - last[1]) / dt, "transactions": (now[2] - last[2]) / dt,
                         "sent": (now[3] - last[3]) / dt}
                last = now
                rep = await asyncio.to_thread(replica.slave_status)
                pos = await asyncio.to_thread(replica.query, "SELECT @@gtid_slave_pos")
                line = Text(f"sandbox replica (server_id 3): IO {rep.get('Slave_IO_Running')}, "
                            f"SQL {rep.get('Slave_SQL_Running')}, gtid_slave_pos {pos[0][0]}, "
                            f"Seconds_Behind_Master {rep.get('Seconds_Behind_Master')}   "
                            f"workload: {workload.done} transactions")
                live.update(Group(render(st, rates=rates), line))
                await asyncio.sleep(1.0)
        workload.stop.set()
        await asyncio.to_thread(workload.join, 10)
        await asyncio.sleep(2.0)
        final = await asyncio.to_thread(replica.query, "SELECT @@gtid_slave_pos")
        console.print(f"primary at {primary.gtid_binlog_pos()}, replica at {final[0][0]}")
        return 0 if final[0][0] == primary.gtid_binlog_pos() else 1
    finally:
        workload.stop.set()
        app_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await app_task
        await asyncio.gather(asyncio.to_thread(replica.stop), asyncio.to_thread(primary.stop))


def run_demo(duration: float | None = None, rate: float = 20.0) -> int:
    console = Console()
    work = tempfile.mkdtemp(prefix="relay-demo-")
    try:
        return asyncio.run(_demo(work, duration, rate, console))
    except KeyboardInterrupt:
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)
        console.print("demo stopped; sandbox servers removed")
