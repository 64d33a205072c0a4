#!/usr/bin/env python3
"""What TLS on every link costs, plain and TLS in the same run against one primary (which
offers TLS but does not require it):

(a) ingest: a relay copies the primary's whole binlog, the upstream link plain or with
    ssl-mode=VERIFY_IDENTITY: seconds and the relay's CPU seconds;
(b) replica catch-up: a real MariaDB replica's IO thread fetches the relay's whole log,
    plain or with MASTER_SSL=1 and the relay's certificate verified: MB/s;
(c) the tap: a TapClient reads every row change (decoded on the relay), plain or over TLS:
    rows/s;
(d) for scale, (b) from the primary itself: MariaDB's own cost of TLS on this machine.

    python bench/tls_cost.py [--size 100] [--rounds 2]

Each measurement takes the best of --rounds, alternating plain and TLS; the last column
is TLS / plain (1.0 = free; the issue aims at 0.8 or better).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from downstream_fanout import cpu_seconds, wait
from relay_throughput import build_binlog

from relay.tap.client import TapClient
from relay.testing.certs import Certs
from relay.testing.mariadb import MariaDB, free_port


def start_relay(work: str, primary: MariaDB, certs: Certs, tls: bool
                ) -> tuple[subprocess.Popen[bytes], int, int, int]:
    port, tap, metrics = free_port(), free_port(), free_port()
    source = primary.url + (f"?ssl-mode=VERIFY_IDENTITY&ssl-ca={certs.ca}" if tls else "")
    cfg = os.path.join(work, "relay.toml")
    with open(cfg, "w") as f:
        f.write(f'[relay]\ndata_dir = "{work}/relay"\nserver_id = 4242\n'
                f'[upstream]\nsources = ["{source}"]\nstart = "earliest"\n'
                f'[relaylog]\nsync = "off"\nsegment_size = "1GiB"\n'
                f'[downstream]\nlisten = "127.0.0.1:{port}"\n'
                f'[[downstream.users]]\nname = "repl"\npassword = "relaypass"\n'
                f'[tap]\nlisten = "127.0.0.1:{tap}"\n'
                f'[metrics]\nlisten = "127.0.0.1:{metrics}"\n')
        if tls:
            for section in ("downstream.tls", "tap.tls"):
                f.write(f'[{section}]\ncert = "{certs.cert}"\nkey = "{certs.key}"\n')
    os.chmod(cfg, 0o600)
    with open(f"{work}/relay.log", "wb") as log:
        relay = subprocess.Popen([sys.executable, "-m", "relay.cli", "run", "--config", cfg],
                                 stdout=subprocess.DEVNULL, stderr=log)
    return relay, port, tap, metrics


def relay_holds(metrics: int, target: str) -> bool:
    import json
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/status", timeout=2) as resp:
            return bool(json.loads(resp.read())["relay_log"]["gtid_pos"] == target)
    except (OSError, KeyError, ValueError):
        return False


def catch_up(work: str, port: int, certs: Certs, tls: bool, target: str,
             password: str = "relaypass") -> float:
    replica = MariaDB(server_id=7, base_dir=os.path.join(work, "replica"))
    replica.start()
    try:
        ssl = (f", MASTER_SSL=1, MASTER_SSL_CA='{certs.ca}', MASTER_SSL_VERIFY_SERVER_CERT=1"
               if tls else "")
        replica.execute_many([
            f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={port}, "
            f"MASTER_USER='repl', MASTER_PASSWORD='{password}', MASTER_USE_GTID=slave_pos{ssl}"])
        t0 = time.perf_counter()
        replica.execute_many(["START SLAVE IO_THREAD"])

        def done() -> bool:
            st = replica.slave_status()
            if st.get("Last_IO_Error"):
                raise SystemExit(f"replica error: {st['Last_IO_Error']}")
            return str(st.get("Gtid_IO_Pos")) == target
        wait(done)
        return time.perf_counter() - t0
    finally:
        replica.stop()
        shutil.rmtree(os.path.join(work, "replica"), ignore_errors=True)


def tap_rows(tap: int, certs: Certs, tls: bool) -> tuple[int, float]:
    with TapClient(f"127.0.0.1:{tap}", timeout=600, tls=tls,
                   tls_ca=certs.ca if tls else None) as client:
        t0 = time.perf_counter()
        rows = sum(len(tx.get("changes", ())) for tx in
                   client.fetch_changes("earliest", "latest"))
        return rows, time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=100, help="binlog MB")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="relay-tls-bench-")
    certs = Certs(work, "bench")
    primary = MariaDB(base_dir=os.path.join(work, "primary"), options={
        "ssl_ca": certs.ca, "ssl_cert": certs.cert, "ssl_key": certs.key})
    primary.start()
    results: dict[str, dict[str, list[float]]] = {"plain": {}, "tls": {}}
    try:
        build_binlog(primary, args.size)
        target = primary.gtid_binlog_pos()
        size = sum(os.path.getsize(primary.binlog_path(f)) for f in primary.binlog_files())
        for _ in range(args.rounds):
            for mode in ("plain", "tls"):
                tls = mode == "tls"
                run = os.path.join(work, f"relay-{mode}")
                shutil.rmtree(run, ignore_errors=True)
                os.makedirs(run)
                relay, port, tap, metrics = start_relay(run, primary, certs, tls)
                try:
                    t0 = time.perf_counter()
                    wait(lambda m=metrics: relay_holds(m, target), 900)  # type: ignore[misc]
                    r = results[mode]
                    r.setdefault("ingest s", []).append(time.perf_counter() - t0)
                    r.setdefault("ingest CPU s", []).append(cpu_seconds(relay.pid))
                    secs = catch_up(run, port, certs, tls, target)
                    r.setdefault("catch-up MB/s", []).append(size / 1e6 / secs)
                    secs = catch_up(run, primary.port, certs, tls, target, primary.repl_password)
                    r.setdefault("(primary) MB/s", []).append(size / 1e6 / secs)
                    rows, secs = tap_rows(tap, certs, tls)
                    r.setdefault("tap rows/s", []).append(rows / secs)
                finally:
                    relay.terminate()
                    relay.wait(60)
        print(f"\nbinlog {size / 1e6:.0f} MB; best of {args.rounds}")
        print(f"{'':<16}{'plain':>12}{'TLS':>12}{'TLS/plain':>11}")
        for key in results["plain"]:
            lower_better = key.endswith(" s")
            pick = min if lower_better else max
            plain, tls_v = pick(results["plain"][key]), pick(results["tls"][key])
            ratio = plain / tls_v if lower_better else tls_v / plain
            print(f"{key:<16}{plain:>12,.2f}{tls_v:>12,.2f}{ratio:>11.2f}")
    finally:
        primary.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
