#!/usr/bin/env python3
"""What compress_after costs and saves: the relay serving compressed segments vs plain
ones, on the relay_throughput workload.

Builds a binlog of --size MB on a sandbox MariaDB (bench/relay_throughput.py's mix),
copies it into a relay log of 16 MiB segments, makes a second copy whose sealed segments
are all compressed, then, alternating, runs a relay process on each and times
`mysqlbinlog --read-from-remote-server --raw --to-last-log` fetching the whole log through
it (the replica catch-up path: every byte read from the segments and framed). Prints the
medians, the slowdown, and the compression ratio.

    python bench/compressed_serving.py [--size 100] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import uvloop
from relay_throughput import build_binlog, relay_copy

from relay.relaylog import segfile
from relay.relaylog.naming import read_index
from relay.testing.mariadb import MariaDB, find_binary, free_port


def serve_and_fetch(server: MariaDB, data_dir: str, work: str) -> float:
    port, metrics = free_port(), free_port()
    cfg = os.path.join(work, "serve.toml")
    with open(cfg, "w") as f:
        f.write(f'[relay]\ndata_dir = "{data_dir}"\nserver_id = 4242\n'
                f'[upstream]\nsources = ["{server.url}"]\n'
                '[relaylog]\nverify_on_start = "last"\n'
                f'[downstream]\nlisten = "127.0.0.1:{port}"\n'
                '[[downstream.users]]\nname = "r"\npassword = "rp"\n'
                f'[metrics]\nlisten = "127.0.0.1:{metrics}"\n')
    relay = subprocess.Popen([sys.executable, "-m", "relay.cli", "run", "--config", cfg],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = os.path.join(work, "fetched")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        first = read_index(data_dir, "relay-bin")[0]
        t0 = time.perf_counter()
        subprocess.run([find_binary("mariadb-binlog", "mysqlbinlog"),
                        "--read-from-remote-server", "--raw", "--to-last-log",
                        "--host=127.0.0.1", f"--port={port}", "--user=r", "--password=rp",
                        f"--result-file={out}/", first], check=True, capture_output=True)
        return time.perf_counter() - t0
    finally:
        relay.terminate()
        relay.wait(30)
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=100, help="binlog size to build, MB")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="relay-bench-zst-")
    server = MariaDB(base_dir=f"{work}/p", server_id=1, options={"max_binlog_size": "16M"})
    server.start()
    try:
        build_binlog(server, args.size)
        plain = os.path.join(work, "plain")
        uvloop.run(relay_copy(server, plain, "off"))
        squeezed = os.path.join(work, "compressed")
        shutil.copytree(plain, squeezed)
        names = read_index(squeezed, "relay-bin")
        before = after = 0
        t0 = time.perf_counter()
        for name in names[:-1]:
            path = os.path.join(squeezed, name)
            before += os.path.getsize(path)
            after += segfile.compress(path, sync=False)
        compress_s = time.perf_counter() - t0
        times: dict[str, list[float]] = {"plain": [], "compressed": []}
        for _ in range(args.repeat):
            for kind, directory in (("plain", plain), ("compressed", squeezed)):
                times[kind].append(serve_and_fetch(server, directory, work))
        total = sum(os.path.getsize(os.path.join(plain, n)) for n in names)
        print(f"relay log: {total / 1e6:.0f} MB in {len(names)} segments; "
              f"{len(names) - 1} sealed ones compressed")
        print(f"compression: {before / 1e6:.0f} MB -> {after / 1e6:.1f} MB "
              f"(ratio {before / after:.1f}x) in {compress_s:.1f} s "
              f"({before / 1e6 / compress_s:.0f} MB/s, zstd level {segfile.LEVEL})")
        for kind, ts in times.items():
            med = statistics.median(ts)
            print(f"serving {kind:<10} median {med:.2f} s ({total / 1e6 / med:.0f} MB/s), "
                  f"min {min(ts):.2f} max {max(ts):.2f} over {len(ts)}")
        ratio = statistics.median(times["compressed"]) / statistics.median(times["plain"])
        print(f"compressed / plain serving time: {ratio:.2f}")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
