"""The dashboard as a picture, from its own JSON against a real Prometheus scraping a real
relay: a sandbox primary under a steady workload, a relay with retention and a replica
behind it, a primary restart midway (so reconnects and lag show), Prometheus (Debian's
package) scraping every second. Each panel of dashboards/relay.json is then drawn from
its own queries (`$job` and `$instance` match all; Grafana's `legendFormat` names the
lines; a stat panel shows its last value) into one PNG, laid out by the panels' grid.

    python bench/dashboard_picture.py [--minutes 4] [--rate 400] [--png docs/images/dashboard.png]

Hand-written: Grafana itself (which would render the JSON) is not packaged for Debian and
no container engine pulls it here; this draws the same queries with matplotlib.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from typing import Any

from soak import Writers

from relay.testing.mariadb import MariaDB, free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DASHBOARD = os.path.join(ROOT, "dashboards", "relay.json")


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)


def wait_for(what: str, check: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError, KeyError):
            if check():
                return
        time.sleep(0.5)
    raise SystemExit(f"dashboard_picture: {what} did not happen within {timeout:g}s")


def concrete(expr: str) -> str:
    """A panel's query as Prometheus takes it: Grafana's variables match every series."""
    return expr.replace('"$job"', '".*"').replace('"$instance"', '".*"')


def legend(fmt: str, labels: dict[str, str], expr: str) -> str:
    """Grafana's name for a series: its legendFormat, else its labels but the target's."""
    if not fmt:
        shown = [f"{k}={v}" for k, v in labels.items()
                 if k not in ("__name__", "job", "instance")]
        return ", ".join(shown) or labels.get("__name__") or re.sub(r"\{.*", "", expr)
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)


def query_range(prom: str, expr: str, start: float, end: float, step: float
                ) -> list[dict[str, Any]]:
    q = urllib.parse.urlencode({"query": concrete(expr), "start": start, "end": end,
                                "step": step})
    out = get_json(f"{prom}/api/v1/query_range?{q}")
    if out.get("status") != "success":
        raise SystemExit(f"dashboard_picture: Prometheus refused {expr!r}: {out}")
    return list(out["data"]["result"])


def draw(panels: list[dict[str, Any]], prom: str, start: float, end: float,
         path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    fig = plt.figure(figsize=(24, rows * 0.5))
    grid = fig.add_gridspec(rows, 24, hspace=2.5, wspace=1.5)
    step = max(1.0, (end - start) / 240)
    for panel in panels:
        g = panel["gridPos"]
        ax = fig.add_subplot(grid[g["y"]:g["y"] + g["h"], g["x"]:g["x"] + g["w"]])
        ax.set_title(panel.get("title", ""), fontsize=9, loc="left")
        ax.tick_params(labelsize=7)
        series = []
        for target in panel.get("targets", []):
            for s in query_range(prom, target["expr"], start, end, step):
                name = legend(target.get("legendFormat", ""), s["metric"], target["expr"])
                xs = [(float(t) - start) / 60 for t, _ in s["values"]]
                ys = [float(v) for _, v in s["values"]]
                series.append((name, xs, ys))
        if panel["type"] in ("stat", "table"):
            ax.axis("off")
            fmt = panel["targets"][0].get("legendFormat", "")
            if panel["type"] == "table" or (len(series) == 1 and "{{" in fmt):
                text = "\n".join(n for n, _, _ in series)
            elif len(series) == 1 and not fmt:
                text = f"{series[0][2][-1]:.4g}"
            else:
                text = "\n".join(f"{n}: {ys[-1]:.4g}" for n, _, ys in series)
            ax.text(0.02, 0.4, text or "no data", fontsize=9 if "\n" in text else 16,
                    va="center", transform=ax.transAxes)
            continue
        for name, xs, ys in series:
            ax.plot(xs, ys, linewidth=1, label=name[:40])
        if not series:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        elif len(series) <= 8:
            ax.legend(fontsize=7, loc="upper left")
        ax.set_xlabel("minutes", fontsize=7)
    fig.suptitle(title, fontsize=12)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=60, bbox_inches="tight")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=4.0)
    ap.add_argument("--rate", type=int, default=400, help="transactions/s the workload aims at")
    ap.add_argument("--png", default=os.path.join(ROOT, "docs", "images", "dashboard.png"))
    args = ap.parse_args()
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        raise SystemExit("dashboard_picture: needs Prometheus (Debian: apt-get install "
                         "prometheus)")
    work = tempfile.mkdtemp(prefix="relay-bench-dashboard-")
    primary = MariaDB(base_dir=f"{work}/p", server_id=1).start()
    replica = MariaDB(base_dir=f"{work}/r", server_id=61).start()
    port, metrics, prom_port = free_port(), free_port(), free_port()
    cfg = os.path.join(work, "relay.toml")
    with open(cfg, "w") as f:
        f.write(f'[relay]\ndata_dir = "{work}/relay"\nserver_id = 4242\n'
                f'[upstream]\nsources = ["{primary.url}"]\nstart = "earliest"\n'
                'heartbeat_period = "1s"\nretry_max = "2s"\n'
                '[relaylog]\nsegment_size = "4MiB"\nretention_size = "24MiB"\n'
                'retention_max_size = "64MiB"\nretention_check_interval = "5s"\n'
                f'[downstream]\nlisten = "127.0.0.1:{port}"\n'
                '[[downstream.users]]\nname = "repl"\npassword = "relaypass"\n'
                f'[metrics]\nlisten = "127.0.0.1:{metrics}"\n')
    with open(os.path.join(work, "prometheus.yml"), "w") as f:
        f.write("global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                "scrape_configs:\n  - job_name: relay\n"
                f"    static_configs: [{{targets: ['127.0.0.1:{metrics}']}}]\n")
    relay = subprocess.Popen([sys.executable, "-m", "relay.cli", "run", "--config", cfg],
                             stdout=subprocess.DEVNULL, stderr=open(  # noqa: SIM115
                                 os.path.join(work, "relay.log"), "wb"))
    prom = subprocess.Popen([prometheus, f"--config.file={work}/prometheus.yml",
                             f"--storage.tsdb.path={work}/tsdb",
                             f"--web.listen-address=127.0.0.1:{prom_port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    prom_url = f"http://127.0.0.1:{prom_port}"
    writers = Writers(primary, args.rate)
    try:
        wait_for("the relay to be ready", lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{metrics}/readyz", timeout=2).status == 200)
        wait_for("Prometheus to scrape the relay", lambda: any(
            t["health"] == "up" for t in get_json(f"{prom_url}/api/v1/targets")
            ["data"]["activeTargets"]))
        replica.replicate_from("127.0.0.1", port, user="repl", password="relaypass")
        start = time.time()
        writers.start()
        time.sleep(args.minutes * 60 / 2)
        writers.stop()
        done = writers.count
        primary.stop()          # a restart of the primary: reconnects, a gap in the stream
        time.sleep(10)
        primary.start()
        writers = Writers(primary, args.rate)
        writers.start()
        time.sleep(args.minutes * 60 / 2)
        writers.stop()
        done += writers.count
        time.sleep(5)
        end = time.time()
        with open(DASHBOARD) as f:
            panels = json.load(f)["panels"]
        draw(panels, prom_url, start, end, args.png,
             f"dashboards/relay.json against Prometheus scraping a relay: {args.minutes:g} "
             f"min, about {args.rate} transactions/s, one replica, the primary restarted "
             "midway")
        print(f"{args.png}: {len(panels)} panels, {done} transactions")
        return 0
    finally:
        writers.stop()
        for proc in (relay, prom):
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)
            if proc.poll() is None:
                proc.kill()
        for server in (replica, primary):
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
