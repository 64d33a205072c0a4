"""Failover time between two real primaries, back and forth (relay.testing.failover_drill).

Per run: the primary is killed -9 (or, with --freeze, stopped with SIGSTOP: no reset, only
silence until read_timeout) after a burst of writes; printed are the times from the fault
to the relay streaming from the standby, to the standby's first write (made right after
promotion) in the relay log, and to that write at a MariaDB replica behind the relay.
Settings: heartbeat 1 s, read_timeout 3 s, failover_after 1 s.

    python bench/failover_time.py [--runs 10] [--freeze]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from relay.testing.failover_drill import relay_settings, relay_status, run_drill
from relay.testing.mariadb import MariaDB, free_port


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--freeze", action="store_true", help="SIGSTOP the primary, not kill -9")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="relay-bench-failover-")
    x = MariaDB(base_dir=f"{work}/x", server_id=1, options={"log_slave_updates": "ON"}).start()
    y = MariaDB(base_dir=f"{work}/y", server_id=2, options={"log_slave_updates": "ON"}).start()
    replica = MariaDB(base_dir=f"{work}/r", server_id=3).start()
    relay = None
    try:
        y.replicate_from("127.0.0.1", x.port, user=x.repl_user, password=x.repl_password)
        x.execute_many(["CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY)",
                        "CREATE USER IF NOT EXISTS 'r'@'%' IDENTIFIED BY 'rp'"])
        port, metrics = free_port(), free_port()
        upstream = relay_settings(x, y)
        lines = [f'[relay]\ndata_dir = "{work}/relay"\nserver_id = 4242\n[upstream]']
        for k, v in upstream.items():
            lines.append(f"{k} = " + (str(v).replace("'", '"') if isinstance(v, list)
                                      else f'"{v}"'))
        lines += ['start = "earliest"', f'[downstream]\nlisten = "127.0.0.1:{port}"',
                  '[[downstream.users]]\nname = "r"\npassword = "rp"',
                  f'[metrics]\nlisten = "127.0.0.1:{metrics}"']
        cfg = os.path.join(work, "relay.toml")
        with open(cfg, "w") as f:
            f.write("\n".join(lines) + "\n")
        relay = subprocess.Popen([sys.executable, "-m", "relay.cli", "run", "--config", cfg],
                                 stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not relay_status(metrics).get("upstream") and time.monotonic() < deadline:
            time.sleep(0.1)
        replica.replicate_from("127.0.0.1", port, user="r", password="rp")
        rounds = run_drill(x, y, replica, metrics, rounds=args.runs,
                           fault="freeze" if args.freeze else "kill")
        print(f"{'run':>4} {'switched':>9} {'at relay':>9} {'at replica':>11}")
        for i, r in enumerate(rounds, 1):
            print(f"{i:>4} {r.switched:>8.2f}s {r.at_relay:>8.2f}s {r.at_replica:>10.2f}s")
        for name in ("switched", "at_relay", "at_replica"):
            values = [getattr(r, name) for r in rounds]
            print(f"{name:<11} median {statistics.median(values):.2f}s  max {max(values):.2f}s")
        print("target: median under read_timeout + failover_after + 1 s = 5 s")
    finally:
        if relay is not None:
            relay.terminate()
            relay.wait(30)
        for server in (replica, y, x):
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
