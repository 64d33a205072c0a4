#!/usr/bin/env python3
"""The relay process copying one binlog, at several git revisions, against
`mariadb-binlog --read-from-remote-server --raw`, alternating in one run.

Builds a binlog of --size MB on a sandbox MariaDB primary (the workload of
relay_throughput.py), checks out each revision into a temporary directory (`git archive`),
then in rounds runs `mariadb-binlog --raw` and `python -m relay.cli run` of each revision
against the primary (start = "earliest", the default sync policy unless --sync), and
prints per contestant the median and minimum of: wall time to a log holding the primary's
last GTID, the process's CPU time (user + system), and its start-up (spawn to /healthz).

    python bench/ingest_revisions.py --rev 5b46194 --rev HEAD --rev WORKTREE [--size 230]

WORKTREE is the working tree as it is (uncommitted changes included).
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
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.relay_throughput import build_binlog, run_mysqlbinlog
from relay.testing.mariadb import MariaDB, free_port

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


PURE = "PURE"  # the work tree with RELAY_PURE_PYTHON=1: the kernels' pure-Python twins


def checkout(rev: str, into: str) -> str:
    """The tree of `rev` (WORKTREE and PURE: this one), its compiled kernels built."""
    if rev in ("WORKTREE", PURE):
        return ROOT
    dest = os.path.join(into, f"rev-{rev}")
    os.makedirs(dest)
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    if os.path.exists(os.path.join(dest, "setup.py")):
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                       cwd=dest, check=True, capture_output=True)
    return dest


def tree_env(rev: str, tree: str) -> dict[str, str]:
    """The environment a relay of `rev` runs in: its tree first on the path, and for PURE
    the pure-Python kernels."""
    env = dict(os.environ, PYTHONPATH=tree)
    env.pop("RELAY_PURE_PYTHON", None)
    if rev == PURE:
        env["RELAY_PURE_PYTHON"] = "1"
    return env


def last_gtid(data_dir: str) -> bytes:
    """The last record of the newest segment's GTID index (domain, server, seq)."""
    try:
        with open(os.path.join(data_dir, "relay-bin.index")) as f:
            names = [line.strip() for line in f if line.strip()]
        with open(os.path.join(data_dir, os.path.basename(names[-1]) + ".gtidx"), "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            if size < 32:
                return b""
            f.seek(size - size % 32 - 32)
            return f.read(16)
    except (OSError, IndexError):
        return b""


def write_config(work: str, server: MariaDB, *, sync: str, listen: int, metrics: int,
                 users: tuple[tuple[str, str], ...] = (), plugin: str = "",
                 source_query: str = "", downstream: str = "") -> str:
    """A relay's config.toml in `work` (data in work/data) mirroring `server` from its
    first binlog into one segment; returns its path. `plugin`: the users' login method;
    `source_query`: appended to the source's URL; `downstream`: more [downstream] lines."""
    cfg = os.path.join(work, "config.toml")
    method = f'plugin = "{plugin}"\n' if plugin else ""
    accounts = "".join(f'[[downstream.users]]\nname = "{name}"\npassword = "{password}"\n'
                       f"{method}" for name, password in users)
    with open(cfg, "w") as f:
        f.write(f"""[relay]
server_id = 4242
data_dir = "{work}/data"
log_level = "warning"
[upstream]
sources = ["{server.url}{source_query}"]
start = "earliest"
[relaylog]
sync = "{sync}"
segment_size = "1GiB"
[downstream]
listen = "127.0.0.1:{listen}"
{downstream}{accounts}[metrics]
listen = "127.0.0.1:{metrics}"
""")
    return cfg


def run_relay(rev: str, tree: str, server: MariaDB, work: str, target: bytes, sync: str,
              profile: str = "") -> tuple[float, float, float]:
    """(wall seconds to the last GTID, CPU seconds of the relay process, start-up)."""
    data = os.path.join(work, "data")
    metrics = free_port()
    cfg = write_config(work, server, sync=sync, listen=free_port(), metrics=metrics)
    env = tree_env(rev, tree)
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "relay.cli", "run", "--config", cfg]
    if profile:  # py-spy samples the relay from its start (collapsed stacks to `profile`)
        cmd = ["py-spy", "record", "--format", "raw", "--rate", "250", "-o", profile,
               "--", *cmd]
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    startup = 0.0
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"relay at {tree} exited with {proc.returncode}")
            if not startup:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/healthz",
                                                timeout=1):
                        startup = time.perf_counter() - t0
                except OSError:
                    pass
            if last_gtid(data) == target:
                wall = time.perf_counter() - t0
                break
            time.sleep(0.005)
    finally:
        if profile:
            subprocess.run(["pkill", "-INT", "-f", cfg], check=False)
        else:
            proc.terminate()
        _, _, usage = os.wait4(proc.pid, 0)
    return wall, usage.ru_utime + usage.ru_stime, startup


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", action="append", default=[],
                    help="a git revision, WORKTREE, or PURE (the work tree on the "
                    "pure-Python kernels) (repeatable)")
    ap.add_argument("--size", type=int, default=230, help="binlog size to build, MB")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--sync", default="transaction")
    ap.add_argument("--compiled", action="store_true",
                    help="compile each tree's bytecode first (as `pip install` does); by "
                         "default every run compiles its sources (PYTHONDONTWRITEBYTECODE)")
    ap.add_argument("--py-spy", default="", metavar="DIR",
                    help="after the timed rounds, one profiled run per revision: collapsed "
                         "stacks in DIR/<rev>.txt")
    args = ap.parse_args()
    revs = args.rev or ["HEAD", "WORKTREE"]
    work = tempfile.mkdtemp(prefix="relay-bench-revs-")
    server = MariaDB(base_dir=os.path.join(work, "primary"),
                     options={"max_binlog_size": "256M", "binlog_checksum": "CRC32"})
    try:
        trees = {rev: checkout(rev, work) for rev in revs}
        if args.compiled:  # bytecode beside the sources, as `pip install` leaves it
            for rev, tree in trees.items():
                if tree == ROOT:  # the working tree stays as it is: compile a copy
                    tree = trees[rev] = os.path.join(work, f"rev-{rev}")
                    shutil.copytree(os.path.join(ROOT, "relay"), os.path.join(tree, "relay"),
                                    ignore=shutil.ignore_patterns("__pycache__"))
                subprocess.run([sys.executable, "-m", "compileall", "-q", "relay"], cwd=tree,
                               check=True)
        server.start()
        print(f"building a {args.size} MB binlog ...", flush=True)
        build_binlog(server, args.size)
        size = sum(os.path.getsize(server.binlog_path(f)) for f in server.binlog_files())
        domain, server_id, seq = (int(x) for x in server.gtid_binlog_pos().split("-"))
        target = (domain.to_bytes(4, "little") + server_id.to_bytes(4, "little")
                  + seq.to_bytes(8, "little"))
        print(f"binlog: {size / 1e6:.1f} MB, last GTID {server.gtid_binlog_pos()}", flush=True)
        names = ["mariadb-binlog --raw", *revs]
        runs: dict[str, list[tuple[float, float, float]]] = {n: [] for n in names}
        for i in range(args.repeat):
            for name in names:
                d = os.path.join(work, f"run-{i}")
                os.makedirs(d)
                if name == "mariadb-binlog --raw":
                    before = os.times()
                    wall = run_mysqlbinlog(server, d)
                    after = os.times()
                    cpu = (after.children_user - before.children_user
                           + after.children_system - before.children_system)
                    result = (wall, cpu, 0.0)
                else:
                    result = run_relay(name, trees[name], server, d, target, args.sync)
                shutil.rmtree(d)
                subprocess.run(["sync"], check=False)
                runs[name].append(result)
                print(f"  round {i + 1}: {name:22s} {result[0]:5.2f} s wall, {result[1]:5.2f} s "
                      f"CPU, start-up {result[2]:4.2f} s", flush=True)
        if args.py_spy:
            os.makedirs(args.py_spy, exist_ok=True)
            for rev in revs:
                d = os.path.join(work, "profiled")
                os.makedirs(d)
                out = os.path.join(os.path.abspath(args.py_spy), f"{rev}.txt")
                run_relay(rev, trees[rev], server, d, target, args.sync, profile=out)
                shutil.rmtree(d)
                print(f"  profile of {rev}: {out}")
        print(f"\n{'':22s} {'wall median':>12s} {'wall min':>9s} {'CPU median':>11s} "
              f"{'start-up':>9s} {'MB/s':>7s}")
        for name in names:
            walls = [r[0] for r in runs[name]]
            med = statistics.median(walls)
            print(f"{name:22s} {med:11.2f}s {min(walls):8.2f}s "
                  f"{statistics.median(r[1] for r in runs[name]):10.2f}s "
                  f"{statistics.median(r[2] for r in runs[name]):8.2f}s {size / med / 1e6:7.1f}")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
