#!/usr/bin/env python3
"""`relay import` killed with SIGKILL at random points, again and again, then run to its
end: the relay log must equal an uninterrupted import of the same files, byte for byte
(segments, their GTID indexes and the index file).

Builds --size MB of binlog on a sandbox MariaDB primary (files of --file-mb), imports it
once without interruption as the reference, then for --rounds rounds: starts the import
into a fresh directory, kills it after a random delay (up to the reference's duration),
repeats --kills times, lets the last run finish and compares.

    PYTHONPATH=. python bench/import_kill9.py [--size 60] [--rounds 5] [--kills 4]
"""

from __future__ import annotations

import argparse
import filecmp
import os
import random
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.import_archive import sandbox_archive


def import_cmd(data_dir: str, files: list[str]) -> list[str]:
    return [sys.executable, "-m", "relay.cli", "import", "--quiet", "--data-dir", data_dir,
            *files]


def same_log(a: str, b: str) -> list[str]:
    """The files of two relay logs that differ (the epoch, a random identity, aside)."""
    names = sorted(set(os.listdir(a)) | set(os.listdir(b)))
    return [n for n in names if not n.endswith(".epoch") and not (
        os.path.exists(os.path.join(a, n)) and os.path.exists(os.path.join(b, n))
        and filecmp.cmp(os.path.join(a, n), os.path.join(b, n), shallow=False))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=60, help="MB of binlog")
    ap.add_argument("--file-mb", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--kills", type=int, default=4, help="kills per round")
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    with sandbox_archive(args.size, args.file_mb) as (_, files, work):
        reference = os.path.join(work, "reference")
        start = time.perf_counter()
        subprocess.run(import_cmd(reference, files), check=True)
        took = time.perf_counter() - start
        print(f"seed {seed}: {len(files)} files, "
              f"{sum(map(os.path.getsize, files)) / 1e6:.0f} MB, reference import {took:.2f} s")
        failed = 0
        for round_ in range(args.rounds):
            target = os.path.join(work, f"round-{round_}")
            kills = []
            for _ in range(args.kills):
                proc = subprocess.Popen(import_cmd(target, files), start_new_session=True,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                delay = rng.uniform(0, took)
                time.sleep(delay)
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                kills.append(f"{delay:.2f}s{'' if proc.returncode == -9 else ' (done)'}")
            subprocess.run(import_cmd(target, files), check=True)
            differ = same_log(reference, target)
            failed += bool(differ)
            print(f"round {round_}: killed at {', '.join(kills)}: "
                  + ("equal, byte for byte" if not differ else f"DIFFER: {differ}"))
            shutil.rmtree(target)
        print(f"{args.rounds - failed} of {args.rounds} rounds equal")
        if failed:
            sys.exit(1)


if __name__ == "__main__":
    main()
