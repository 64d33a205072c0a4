"""kill -9 loop (relay.testing.kill_drill): the relay killed at random moments, 100 cycles
by default, under a steady workload with two GTID-strict MariaDB replicas and a
`mysqlbinlog --read-from-remote-server --stop-never` client attached. At the end every
replica equals the primary (CHECKSUM TABLE) with no replication error, and the relay log
and mysqlbinlog's copy hold the primary's transactions, each once.

    python bench/kill9_loop.py [--cycles 100] [--sync transaction|off]

Prints the cycles, the time they took, the workload's transactions and the checks.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from relay.relaylog.naming import read_index
from relay.testing.kill_drill import run_kill_drill
from relay.testing.mariadb import MariaDB, free_port


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", type=int, default=100)
    ap.add_argument("--sync", default="transaction")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="relay-bench-kill9-")
    primary = MariaDB(base_dir=f"{work}/p", server_id=1,
                      options={"max_binlog_size": "1M"}).start()
    replicas = [MariaDB(base_dir=f"{work}/r{i}", server_id=60 + i,
                        options={"gtid_strict_mode": "ON"}).start() for i in range(2)]
    port, metrics = free_port(), free_port()
    data = os.path.join(work, "relay")
    cfg = os.path.join(work, "relay.toml")
    with open(cfg, "w") as f:
        f.write(f'[relay]\ndata_dir = "{data}"\nserver_id = 4242\n'
                f'[upstream]\nsources = ["{primary.url}"]\nstart = "earliest"\n'
                'heartbeat_period = "1s"\nread_timeout = "5s"\nretry_initial = "0.1s"\n'
                'retry_max = "1s"\n'
                f'[relaylog]\nsync = "{args.sync}"\nsegment_size = "512KiB"\n'
                f'[downstream]\nlisten = "127.0.0.1:{port}"\n'
                '[[downstream.users]]\nname = "repl"\npassword = "relaypass"\n'
                f'[metrics]\nlisten = "127.0.0.1:{metrics}"\n')
    proc: list[subprocess.Popen[bytes]] = []
    log = open(os.path.join(work, "relay.log"), "ab")  # noqa: SIM115 - closed in finally

    def start() -> None:
        proc.append(subprocess.Popen([sys.executable, "-m", "relay.cli", "run", "--config", cfg],
                                     stdout=log, stderr=subprocess.STDOUT))

    def kill() -> None:
        p = proc.pop()
        p.send_signal(signal.SIGKILL)
        p.wait(10)

    def segments() -> list[str]:
        return [os.path.join(data, n) for n in read_index(data, "relay-bin")]

    try:
        start()
        deadline = time.monotonic() + 30
        while not segments() and time.monotonic() < deadline:
            time.sleep(0.1)
        for replica in replicas:
            replica.replicate_from("127.0.0.1", port, user="repl", password="relaypass")
        kill()
        report = run_kill_drill(primary, replicas, start_relay=start, kill_relay=kill,
                                relay_segments=segments, metrics_port=metrics,
                                relay_port=port, user="repl", password="relaypass",
                                work_dir=work, cycles=args.cycles)
        print(f"cycles            {report.cycles} ({report.kills_streaming} while streaming, "
              f"{report.kills_starting} during start-up or recovery), sync = {args.sync}")
        print(f"time              {report.seconds:.0f} s ({report.seconds / report.cycles:.2f} s "
              "a cycle)")
        print(f"transactions      {report.transactions} on the primary during the loop")
        print(f"final catch-up    {report.catch_up_seconds:.2f} s after the last restart")
        for check in report.checks:
            print(f"ok                {check}")
        return 0
    finally:
        while proc:
            kill()
        log.close()
        for server in (*replicas, primary):
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
