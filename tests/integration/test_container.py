"""The container image, built and run, not only linted: the Dockerfile built with podman
on a base made from Debian's packages (the public python image cannot be pulled here;
scripts/build-roots makes the base, scripts/setup installs podman and runc), then run as a
user runs it, against a real primary with a real replica behind it: /healthz, /readyz and
the image's own health check, the non-root uid, the relay log on the named volume, the
replica replicating through the container, a clean stop, and no secret in any layer.

podman runs with runc and cgroupfs and a containers.conf without default ulimits (this
kernel refuses crun and the default ulimits), on the host's network."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator

import pytest

from relay.testing.builds import DEFAULT_ROOTS
from relay.testing.mariadb import MariaDB, free_port
from tests.conftest import replicate_through, wait_until
from tests.integration import workload
from tests.integration.common import assert_same_data, converged

pytestmark = pytest.mark.integration

ROOT = str(pathlib.Path(__file__).resolve().parents[2])
BASE_ROOT = os.path.join(os.environ.get("RELAY_ROOTS", DEFAULT_ROOTS), "container-base")
UID = 10001                  # the Dockerfile's relay user
# Made per run, so that finding one in the image means the image took it (a fixed word
# could be in relay's own files: the test servers' default password is).
DOWNSTREAM_PASSWORD = f"replicas-{uuid.uuid4().hex}"
UPSTREAM_PASSWORD = f"upstream-{uuid.uuid4().hex}"


class Podman:
    def __init__(self, conf: str) -> None:
        self.env = {**os.environ, "CONTAINERS_CONF": conf}

    def __call__(self, *args: str, check: bool = True, timeout: float = 300
                 ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs",
                               *args], capture_output=True, timeout=timeout, env=self.env,
                              text=True)
        if check:
            assert done.returncode == 0, f"podman {' '.join(args)}: {done.stderr[-3000:]}"
        return done


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Podman:
    missing = [what for what, there in (
        ("podman and runc (scripts/setup installs them)",
         subprocess.run(["sh", "-c", "command -v podman && command -v runc"],
                        capture_output=True).returncode == 0),
        (f"the base's root {BASE_ROOT} (scripts/build-roots container-base)",
         os.access(os.path.join(BASE_ROOT, "usr/local/bin/python"), os.X_OK))) if not there]
    if missing:
        if os.environ.get("CI"):
            raise AssertionError(f"missing: {'; '.join(missing)}")
        pytest.skip(f"missing: {'; '.join(missing)}")
    conf = tmp_path_factory.mktemp("podman") / "containers.conf"
    conf.write_text("[containers]\ndefault_ulimits = []\n")
    return Podman(str(conf))


# A secret a checkout may hold beside the sources (a local config, an .env, data): the
# image must take none of it. Made per run, so that finding it means the build took it.
CANARY = f"canary-{uuid.uuid4().hex}"
CANARY_FILES = (".env", "relay.toml", "data/relay.toml", "tests/local.toml", "bench/local.toml")


def _context(where: pathlib.Path) -> str:
    """The build context: what the Dockerfile builds from, as a checkout has it, and
    secrets in the places a checkout may have them."""
    for name in ("Dockerfile", ".dockerignore", "pyproject.toml", "setup.py", "README.md",
                 "config.toml"):
        shutil.copy(os.path.join(ROOT, name), where / name)
    shutil.copytree(os.path.join(ROOT, "relay"), where / "relay", ignore=shutil.ignore_patterns(
        "__pycache__", "*.so", "compiled.c", "_commit.txt"))
    for name in CANARY_FILES:
        (where / name).parent.mkdir(parents=True, exist_ok=True)
        (where / name).write_text(f'password = "{CANARY}"\n')
    return str(where)


@pytest.fixture(scope="module")
def image(podman: Podman, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Dockerfile built on the Debian base, with this checkout's commit."""
    tag = uuid.uuid4().hex[:12]
    base, name = f"localhost/relay-test-base:{tag}", f"localhost/relay-test:{tag}"
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"],
                            capture_output=True, text=True, check=True).stdout.strip()
    context = _context(tmp_path_factory.mktemp("context"))
    try:
        tar = subprocess.run(["tar", "-C", BASE_ROOT, "-c", "."], capture_output=True,
                             check=True)
        done = subprocess.run(  # (the root's tar on stdin: bytes, not text)
            ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs", "import",
             "--change", "ENV PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
             "--change", "ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt", "-", base],
            input=tar.stdout, capture_output=True, env=podman.env, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        del tar
        # (--layers=false: no intermediate image of the build stage is left behind)
        podman("build", "--layers=false", "--format", "docker", "--network", "host",
               "--build-arg", f"BASE={base}", "--build-arg", f"RELAY_COMMIT={commit}",
               "-t", name, context, timeout=1200)
        yield name
    finally:
        podman("rmi", "-f", name, base, check=False)


def _http(port: int, path: str) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def test_the_image_runs_as_users_run_it(podman: Podman, image: str,
                                        mariadb_factory: Callable[..., MariaDB],
                                        tmp_path: pathlib.Path) -> None:
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    version = podman("run", "--rm", "--network", "host", image, "--version").stdout
    assert f"commit {head};" in version and "kernels: compiled" in version, version
    # The shipped config, as the image has it, is valid.
    checked = podman("run", "--rm", "--network", "host", image, "check-config",
                     "/etc/relay/config.toml")
    assert "OK" in checked.stdout, checked.stdout + checked.stderr

    primary = mariadb_factory(repl_password=UPSTREAM_PASSWORD)
    sql_port, metrics_port = free_port(), free_port()
    config = tmp_path / "relay.toml"
    # The secrets a user gives at run time: the primary's password in the mounted config,
    # the replicas' through the environment.
    config.write_text(f"""
[relay]
server_id = 4242
[upstream]
sources = ["{primary.url}"]
start = "earliest"
heartbeat_period = "1s"
[downstream]
listen = "127.0.0.1:{sql_port}"
[[downstream.users]]
name = "repl"
password_env = "RELAY_REPL_PASSWORD"
[metrics]
listen = "127.0.0.1:{metrics_port}"
""")
    config.chmod(0o644)
    name = f"relay-test-{uuid.uuid4().hex[:8]}"
    volume = f"relay-data-{name}"
    podman("volume", "create", volume)
    try:
        podman("run", "-d", "--name", name, "--network", "host",
               "-v", f"{volume}:/var/lib/relay", "-v", f"{config}:/etc/relay/config.toml:ro",
               "-e", f"RELAY_REPL_PASSWORD={DOWNSTREAM_PASSWORD}",
               # (metrics on another port than 9104: the health check is told where)
               "-e", f"RELAY_HEALTHZ=http://127.0.0.1:{metrics_port}/healthz", image)
        try:
            wait_until(lambda: _http(metrics_port, "/readyz") == 200, 90,
                       "the container's relay to be ready")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {podman('logs', name, check=False).stderr[-3000:]}"
                                 ) from None
        assert _http(metrics_port, "/healthz") == 200
        assert podman("healthcheck", "run", name, check=False).returncode == 0
        # The relay itself (PID 1 of the container) runs as the image's user.
        pid = podman("inspect", "--format", "{{.State.Pid}}", name).stdout.strip()
        with open(f"/proc/{pid}/status") as f:
            uids = next(line for line in f if line.startswith("Uid:")).split()[1:]
        assert uids == [str(UID)] * 4, uids

        replica = mariadb_factory(server_id=91)
        replicate_through(replica, sql_port, password=DOWNSTREAM_PASSWORD)
        workload.mixed(primary, rounds=1)
        wait_until(lambda: converged(primary, replica), 60, "the replica through the container")
        assert_same_data(primary, replica)

        # The relay log is on the volume, the relay user's.
        mount = podman("volume", "inspect", "--format", "{{.Mountpoint}}", volume).stdout.strip()
        segments = [p for p in pathlib.Path(mount).iterdir() if p.name.startswith("relay-bin.0")]
        assert segments and all(p.stat().st_uid == UID for p in segments), \
            sorted(p.name for p in pathlib.Path(mount).iterdir())

        podman("stop", "-t", "30", name)
        state = json.loads(podman("inspect", name).stdout)[0]["State"]
        assert state["ExitCode"] == 0, podman("logs", name, check=False).stderr[-3000:]
        assert "Traceback" not in podman("logs", name).stderr
    finally:
        podman("rm", "-f", name, check=False)
        podman("volume", "rm", "-f", volume, check=False)

    # No secret in any layer of the image: not the files beside the sources in the build
    # context (a COPY of the whole context would take them), nor the passwords given at
    # run time.
    archive = tmp_path / "image.tar"
    podman("save", "--format", "docker-archive", "-o", str(archive), image, timeout=600)
    secrets = [UPSTREAM_PASSWORD.encode(), DOWNSTREAM_PASSWORD.encode(), CANARY.encode()]
    found = []
    with open(archive, "rb") as f:
        tail = b""
        while chunk := f.read(1 << 24):
            window = tail + chunk
            found += [s for s in secrets if s in window]
            tail = window[-64:]
    assert not found, found
