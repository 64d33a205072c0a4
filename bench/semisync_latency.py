"""Primary commit latency with a semi-sync replica: the relay vs a MariaDB replica.

One sandbox primary with semi-sync on (wait point AFTER_SYNC). Run 1: the relay (sync =
transaction, an fsync per transaction) is its only semi-sync replica, acknowledging once
durable. Run 2: the same, end to end: the relay acknowledges only after a MariaDB replica
behind it (rpl_semi_sync_slave_enabled, [downstream] semi_sync) acknowledged too
(semi_sync_wait_for_replicas = 1). Run 3: a MariaDB replica with
rpl_semi_sync_slave_enabled is the primary's semi-sync replica directly. A first run with
no semi-sync replica at all is the baseline. Each run commits --commits single-row
autocommit INSERTs from one client and prints p50/p99/max.

    python bench/semisync_latency.py [--commits 2000] [--sync transaction]
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pymysql

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from relay.testing.mariadb import MariaDB, free_port

PRIMARY = {"rpl_semi_sync_master_enabled": "ON",
           "rpl_semi_sync_master_wait_point": "AFTER_SYNC",
           "rpl_semi_sync_master_timeout": "10000"}


def status(server: MariaDB, name: str) -> str:
    rows = server.query(f"SHOW GLOBAL STATUS LIKE '{name}'")
    return str(rows[0][1]) if rows else ""


def wait(predicate, what: str, timeout: float = 60) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


def has_row(server: MariaDB, key: int) -> bool:
    try:
        return bool(server.query(f"SELECT COUNT(*) FROM b.t WHERE id = {key}")[0][0])
    except pymysql.MySQLError:  # the table has not arrived yet
        return False


def commits(primary: MariaDB, n: int, first: int) -> list[float]:
    conn = pymysql.connect(host="127.0.0.1", port=primary.port, user="root", autocommit=True)
    lat = []
    with conn, conn.cursor() as cur:
        for i in range(first, first + n):
            t = time.perf_counter()
            cur.execute(f"INSERT INTO b.t VALUES ({i}, 'x')")
            lat.append(time.perf_counter() - t)
    return sorted(lat)


def report(name: str, lat: list[float], primary: MariaDB) -> None:
    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))] * 1e3
    yes = status(primary, "Rpl_semi_sync_master_yes_tx")
    no = status(primary, "Rpl_semi_sync_master_no_tx")
    print(f"{name:<46} p50 {pct(0.50):6.2f} ms  p99 {pct(0.99):6.2f} ms  "
          f"max {lat[-1] * 1e3:6.2f} ms   (yes_tx {yes}, no_tx {no})", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commits", type=int, default=2000)
    ap.add_argument("--sync", default="transaction")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="relay-bench-semisync-")
    primary = MariaDB(base_dir=os.path.join(work, "primary"), options=PRIMARY).start()
    procs: list[subprocess.Popen[bytes]] = []
    servers: list[MariaDB] = []  # started mid-run: stopped on any way out
    replica: MariaDB | None = None
    try:
        primary.execute_many(["CREATE DATABASE b",
                              "CREATE TABLE b.t (id INT PRIMARY KEY, v CHAR(1))"])
        n = args.commits
        # baseline: no semi-sync replica (the primary waits for nobody)
        primary.execute_many(["SET GLOBAL rpl_semi_sync_master_wait_no_slave = OFF"])
        report("no semi-sync replica", commits(primary, n, 0), primary)
        primary.execute_many(["SET GLOBAL rpl_semi_sync_master_wait_no_slave = ON"])

        for run, wait_for in enumerate((0, 1)):
            port = free_port()
            cfg = os.path.join(work, f"relay{run}.toml")
            with open(cfg, "w") as f:
                f.write(f'[relay]\ndata_dir = "{work}/relay{run}"\n'
                        f'[upstream]\nsources = ["{primary.url}"]\nsemi_sync = true\n'
                        f'start = "earliest"\n'
                        f'semi_sync_wait_for_replicas = {wait_for}\n'
                        f'semi_sync_timeout = "10s"\n'
                        f'[relaylog]\nsync = "{args.sync}"\n'
                        f'[downstream]\nlisten = "127.0.0.1:{port}"\nsemi_sync = true\n'
                        f'[[downstream.users]]\nname = "repl"\npassword = "relaypass"\n'
                        f'[metrics]\nlisten = "127.0.0.1:{free_port()}"\n')
            relay = subprocess.Popen([sys.executable, "-m", "relay.cli", "run", "--config",
                                      cfg], stderr=subprocess.DEVNULL)
            procs.append(relay)
            wait(lambda: status(primary, "Rpl_semi_sync_master_clients") == "1", "the relay")
            behind: MariaDB | None = None
            if wait_for:
                behind = MariaDB(base_dir=os.path.join(work, "behind"), server_id=6,
                                 options={"rpl_semi_sync_slave_enabled": "ON"})
                servers.append(behind)
                behind.start()
                behind.replicate_from("127.0.0.1", port, user="repl", password="relaypass")
                marker = -1 - run  # apart from the ids the runs commit
                primary.execute_many([f"INSERT INTO b.t VALUES ({marker}, 'w')"])
                wait(functools.partial(has_row, behind, marker), "the replica behind the relay")
            name = (f"relay (sync={args.sync})" if not wait_for else
                    f"relay + 1 replica behind it (sync={args.sync})")
            report(name, commits(primary, n, (run + 1) * n + 1), primary)
            relay.terminate()
            relay.wait(30)
            if behind is not None:
                behind.stop()
                servers.remove(behind)
            wait(lambda: status(primary, "Rpl_semi_sync_master_clients") == "0",
                 "the relay to go")

        replica = MariaDB(base_dir=os.path.join(work, "replica"), server_id=7,
                          options={"rpl_semi_sync_slave_enabled": "ON"}).start()
        replica.replicate_from("127.0.0.1", primary.port, user=primary.repl_user,
                               password=primary.repl_password)
        wait(lambda: status(primary, "Rpl_semi_sync_master_clients") == "1", "the replica")
        report("MariaDB replica", commits(primary, n, 4 * n), primary)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(30)
        for server in servers:
            server.stop()
        if replica is not None:
            replica.stop()
        primary.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
