"""Shared fixtures: real MariaDB servers and the relay as a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from relay.binlog.constants import NON_GROUP_TYPES, EventType
from relay.binlog.events import decode_fde
from relay.binlog.file import TornTail, check_magic, iter_events
from relay.binlog.gtid import Gtid
from relay.errors import MalformedEvent
from relay.relaylog.naming import read_index
from relay.testing.builds import BuildMissing, ServerBuild, build, builds
from relay.testing.mariadb import MariaDB, MariaDBNotInstalled, find_binary, free_port


def _have_mariadb() -> bool:
    try:
        find_binary("mariadbd", "mysqld")
        return True
    except MariaDBNotInstalled:
        return False


# free_port() shares ports out between pytest-xdist workers in this process only; the
# processes the tests start (relay demo, relay run --sandbox) take the kernel's picks.
os.environ["RELAY_PORT_SHARE_PID"] = str(os.getpid())

# The Spark modules: one unit of work for pytest-xdist (scripts/test runs two workers, a
# unit each at a time), so they run one after the other on one worker and share its
# Spark JVM. Two at once on the two cores took a third longer each (their JVMs, Python
# workers and drivers' starts compete), and the run as a whole longer.
SPARK_MODULES = ("tests/integration/test_spark_tap.py", "tests/integration/test_delta_mirror.py",
                 "tests/integration/test_mysql_tap.py")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With --dist loadfile: the Spark modules are one scope (see SPARK_MODULES)."""
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling  # type: ignore[import-untyped]

    class SparkTogether(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.split("::", 1)[0] in SPARK_MODULES:
                return "spark"
            return str(super()._split_scope(nodeid))

    return SparkTogether(config, log)


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Every server build the suite can start, with its version (relay/testing/builds.py)."""
    found = builds()
    return ["servers: " + (", ".join(f"{name} = {b}" for name, b in sorted(found.items()))
                           or "none found")]


BUILDS_MARKER = "builds"
MACHINE = "machine"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{BUILDS_MARKER}(*names, only={{param: value}}): run the test once per "
        f"server build (names of relay/testing/builds.py, '{MACHINE}' for this machine's "
        "MariaDB); its mariadb_factory starts that build. With `only`, the builds other than "
        "the machine's run the parametrized test's cases with those values only")


def _build_id(name: str) -> str:
    """A build's name as a test id: the machine's MariaDB by its own name (mariadb-10.11)."""
    if name != MACHINE:
        return name
    machine = next((b for b in builds().values() if b.root is None), None)
    return machine.name if machine is not None else MACHINE


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The server matrix as a parameter: a test (or module, through pytestmark) marked
    `@pytest.mark.builds("machine", "mariadb-11.8")` runs once per build, and every server
    its mariadb_factory starts (primary and replicas) is that build. (A module-scoped
    fixture cannot take the function-scoped build: such a module starts its servers in
    the test, or names `build=`.)"""
    marker = metafunc.definition.get_closest_marker(BUILDS_MARKER)
    if marker is None or "server_build" not in metafunc.fixturenames:
        return
    names = list(marker.args)
    metafunc.parametrize("server_build", names, ids=[_build_id(n) for n in names],
                         indirect=True, scope="function")


@pytest.fixture
def server_build(request: pytest.FixtureRequest) -> ServerBuild | None:
    """The build a `builds`-marked test runs against (None: this machine's MariaDB). A
    build missing here skips its case, and fails it under CI (scripts/setup builds the
    roots)."""
    name = getattr(request, "param", MACHINE)
    if name == MACHINE:
        return None
    return required_build(name)


def required_build(name: str) -> ServerBuild:
    """A server build a test needs: missing here, the test skips, and under CI it fails
    (scripts/setup builds the roots)."""
    try:
        return build(name)
    except BuildMissing as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(exc))


def _other_build_not_wanted(item: pytest.Item) -> bool:
    """A case of another build than this machine's that the test's `builds(..., only=...)`
    does not ask for (a parametrized test runs the other builds with those values only)."""
    marker = item.get_closest_marker(BUILDS_MARKER)
    callspec = getattr(item, "callspec", None)
    only = marker.kwargs.get("only") if marker is not None else None
    if not only or callspec is None or callspec.params.get("server_build") in (None, MACHINE):
        return False
    return any(callspec.params.get(k) != v for k, v in only.items())


def _run_order(item: pytest.Item) -> int:
    """The Spark unit, the longest, first (--no-loadscope-reorder keeps this order), so
    that it never starts last; the unit tests, many and short, come last (collection
    order) and fill the gaps."""
    module = item.nodeid.split("::", 1)[0]
    return SPARK_MODULES.index(module) if module in SPARK_MODULES else len(SPARK_MODULES)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_run_order)  # stable: the order within a module is kept
    unwanted = [item for item in items if _other_build_not_wanted(item)]
    if unwanted:
        config.hook.pytest_deselected(items=unwanted)
        items[:] = [item for item in items if not _other_build_not_wanted(item)]
    if _have_mariadb():
        return
    if os.environ.get("CI"):
        raise pytest.UsageError("mariadbd is not installed; .ci/run must install it")
    skip = pytest.mark.skip(reason="mariadbd not installed (apt-get install mariadb-server)")
    for item in items:
        if "integration" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def mariadb_factory(tmp_path_factory: pytest.TempPathFactory, server_build: ServerBuild | None
                    ) -> Iterator[Callable[..., MariaDB]]:
    """Starts servers: the test's build (`builds` marker) unless a call names `build=`."""
    servers: list[MariaDB] = []

    def make(**kwargs: Any) -> MariaDB:
        base = str(tmp_path_factory.mktemp("mariadb"))
        kwargs.setdefault("build", server_build)
        server = MariaDB(base_dir=base, **kwargs)
        servers.append(server)
        return server.start()

    yield make
    for s in servers:
        s.stop()
        s.drop_storage()  # a full run starts ~130 servers: keep /tmp from filling up


def wait_until(predicate: Callable[[], bool], timeout: float, what: str,
               interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@dataclass
class RelayProcess:
    """The relay started as `python -m relay.cli run` with a generated config."""

    workdir: str
    source_url: str
    settings: dict[str, dict[str, object]] = field(default_factory=dict)
    extra_toml: str = ""          # appended as it is ([[rules]] tables, ...)
    proc: subprocess.Popen[bytes] | None = None
    runs: int = 0
    # A test that makes the relay log a traceback on purpose says so; any other traceback,
    # and any "Task exception was never retrieved" (an unowned task that failed), fails
    # the test at teardown.
    allow_traceback: bool = False
    env: dict[str, str] = field(default_factory=dict)  # added to the process's environment
    _ports: tuple[int, int] = field(default_factory=lambda: (free_port(), free_port()))

    @property
    def data_dir(self) -> str:
        return os.path.join(self.workdir, "data")

    @property
    def log_path(self) -> str:
        return os.path.join(self.workdir, "relay.log")

    @property
    def config_path(self) -> str:
        return os.path.join(self.workdir, "config.toml")

    def write_config(self) -> None:
        sections: dict[str, dict[str, object]] = {
            "relay": {"server_id": 4242, "data_dir": self.data_dir},
            "upstream": {"sources": [self.source_url], "start": "earliest",
                         "heartbeat_period": "1s", "read_timeout": "5s",
                         "retry_initial": "0.1s", "retry_max": "1s"},
            "relaylog": {"sync": "transaction"},
            "downstream": {"listen": f"127.0.0.1:{self._ports[0]}"},
            "metrics": {"listen": f"127.0.0.1:{self._ports[1]}"},
        }
        for name, values in self.settings.items():
            sections.setdefault(name, {}).update(values)
        lines = []
        users = sections.pop("users", {})
        for name, values in sections.items():
            lines.append(f"[{name}]")
            for k, v in values.items():
                if isinstance(v, bool):
                    lines.append(f"{k} = {str(v).lower()}")
                elif isinstance(v, str):
                    lines.append(f'{k} = "{v}"')
                elif isinstance(v, list):
                    lines.append(f"{k} = [" + ", ".join(f'"{x}"' for x in v) + "]")
                else:
                    lines.append(f"{k} = {v}")
        for user, password in users.items():
            lines += ["[[downstream.users]]", f'name = "{user}"', f'password = "{password}"']
        with open(self.config_path, "w") as f:
            f.write("\n".join(lines) + "\n" + self.extra_toml)

    def start(self) -> RelayProcess:
        self.write_config()
        self.runs += 1
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "relay.cli", "run", "--config", self.config_path],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, **self.env})
        return self

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.proc = None

    def stop(self) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:  # a hang at shutdown: say where it hangs
                stacks = "(py-spy is not installed)"
                if shutil.which("py-spy"):
                    spy = subprocess.run(["py-spy", "dump", "--pid", str(self.proc.pid)],
                                         capture_output=True, text=True, timeout=30)
                    stacks = spy.stdout + spy.stderr
                self.proc.kill()
                self.proc.wait(10)
                self.proc = None
                raise AssertionError(f"relay {self.workdir} did not stop 20 s after SIGTERM:"
                                     f"\n{stacks}\n{self.output()[-3000:]}") from None
        code = self.proc.returncode
        self.proc = None
        return code

    def wait_exit(self, timeout: float) -> int:
        assert self.proc is not None
        code = self.proc.wait(timeout)
        self.proc = None
        return code

    def output(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    @property
    def port(self) -> int:
        listen = str(self.settings.get("downstream", {}).get("listen", ""))
        return int(listen.rsplit(":", 1)[1]) if listen else self._ports[0]

    @property
    def metrics_port(self) -> int:
        listen = str(self.settings.get("metrics", {}).get("listen", ""))
        return int(listen.rsplit(":", 1)[1]) if listen else self._ports[1]

    def http(self, path: str) -> tuple[int, str]:
        """GET a path on the metrics endpoint: (status, body); (0, "") if not up."""
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}{path}",
                                        timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError:
            return 0, ""

    def status(self) -> dict[str, Any]:
        """/status as JSON ({} while the relay is not answering)."""
        code, body = self.http("/status")
        return json.loads(body) if code == 200 else {}

    def segments(self) -> list[str]:
        return [os.path.join(self.data_dir, n) for n in read_index(self.data_dir, "relay-bin")]


@pytest.fixture
def relay_factory(
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., RelayProcess]]:
    made: list[RelayProcess] = []

    def make(source_url: str, extra_toml: str = "", **settings: dict[str, object]
             ) -> RelayProcess:
        r = RelayProcess(str(tmp_path_factory.mktemp("relay")), source_url, dict(settings),
                         extra_toml)
        made.append(r)
        return r

    yield make
    hung = []
    for r in made:  # every relay stopped, even after one that hung
        try:
            r.stop()
        except AssertionError as exc:
            hung.append(exc)
    if hung:
        raise hung[0]
    for r in made:
        check_output(r)


UNOWNED_TASK = "Task exception was never retrieved"


def check_output(relay: RelayProcess) -> None:
    """What the relay must never log: a task nobody awaited that failed, or (unless the
    test asked for one) a traceback."""
    out = relay.output()
    assert UNOWNED_TASK not in out, f"the relay left a failed task unowned:\n{out[-4000:]}"
    assert "Future exception was never retrieved" not in out, out[-4000:]
    if not relay.allow_traceback:
        assert "Traceback (most recent call last)" not in out, \
            f"the relay logged a traceback:\n{out[-4000:]}"


# --- reading binlogs for comparison ---------------------------------------------------

@dataclass(frozen=True)
class GroupEvent:
    """A transaction event as it must survive the relay: all but log_pos and checksum."""

    type_code: int
    timestamp: int
    server_id: int
    flags: int
    body: bytes


def read_binlog(path: str, *, allow_torn: bool = False) -> list[bytes]:
    with open(path, "rb") as f:
        data = f.read()
    check_magic(data, path)
    out = []
    try:
        for raw in iter_events(data, where=path):
            out.append(raw.data)
    except TornTail:
        if not allow_torn:
            raise
    return out


def group_events(paths: list[str]) -> list[GroupEvent]:
    out = []
    for path in paths:
        checksum = False
        for data in read_binlog(path):
            typ = data[4]
            if typ == EventType.FORMAT_DESCRIPTION:
                checksum = decode_fde(data).has_crc
            if typ in NON_GROUP_TYPES:
                continue
            body = data[19 : len(data) - 4] if checksum else data[19:]
            out.append(GroupEvent(typ, int.from_bytes(data[0:4], "little"),
                                  int.from_bytes(data[5:9], "little"),
                                  int.from_bytes(data[17:19], "little"), body))
    return out


def gtids_in(paths: list[str]) -> list[Gtid]:
    out = []
    for path in paths:
        for data in read_binlog(path):
            if data[4] == EventType.GTID:
                seq = int.from_bytes(data[19:27], "little")
                domain = int.from_bytes(data[27:31], "little")
                out.append(Gtid(domain, int.from_bytes(data[5:9], "little"), seq))
    return out


def primary_binlogs(server: MariaDB) -> list[str]:
    return [server.binlog_path(n) for n in server.binlog_files()]


def mysqlbinlog_reads(path: str) -> None:
    res = subprocess.run([find_binary("mariadb-binlog", "mysqlbinlog"),
                          "--verify-binlog-checksum", path],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"mysqlbinlog failed on {path}: {res.stderr[-2000:]}"
    assert "ERROR" not in res.stderr, res.stderr[-2000:]


__all__ = ["GroupEvent", "MalformedEvent", "RelayProcess", "group_events", "gtids_in",
           "mysqlbinlog_reads", "primary_binlogs", "read_binlog", "wait_until"]


def replicate_through(replica: MariaDB, relay_port: int, *, gtid: bool = True,
                      password: str = "relaypass", heartbeat: float = 1.0) -> None:
    """CHANGE MASTER TO the relay, then START SLAVE."""
    replica.replicate_from("127.0.0.1", relay_port, user="repl", password=password, gtid=gtid,
                           heartbeat=heartbeat)


def slave_status(replica: MariaDB) -> dict[str, object]:
    return replica.slave_status()
