"""Secure defaults, against real relay processes (issue 31): a listener beyond loopback
without TLS, logins or credentials refuses the start unless its allow_insecure says so; a
user without a password refuses it unless allow_empty_password; the SQL port is on
127.0.0.1 when no listen is given; /-/reload is POST only, and beyond loopback only with
credentials. Snapshot reads (relay.tap.snapshot's connect, what Spark's executors run)
against fake MySQL servers that ask for the password in clear text, or for caching_sha2's
full authentication over plain text with an RSA key of theirs: the password never reaches
them. No primary is needed: the relays retry an upstream that is not there."""

from __future__ import annotations

import http.client
import ipaddress
import os
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pymysql
import pytest

from relay.config import TlsMode
from relay.errors import RelayError
from relay.tap.snapshot import SnapshotError, SourceSpec
from relay.testing.mariadb import free_port
from tests.conftest import RelayProcess, wait_until
from tests.integration.common import listening

pytestmark = pytest.mark.integration

SECRET = "Snap-Secret-42"


def nowhere() -> str:
    """A source URL nothing answers at: the relay starts its listeners and retries."""
    return f"mysql://repl:pw@127.0.0.1:{free_port()}"


def outside_address() -> str:
    """This machine's address beyond loopback (the source of its route out): a connection
    to it from here comes from a peer that is not loopback."""
    for target in ("192.0.2.1", "10.255.255.254", "172.31.255.254"):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.connect((target, 9))   # UDP: no packet is sent
            except OSError:
                continue
            address = str(s.getsockname()[0])
            if not ipaddress.ip_address(address).is_loopback:
                return address
    raise AssertionError("this machine has no IPv4 address beyond loopback to test from")


def refused_start(relay: RelayProcess) -> tuple[int, str]:
    """Start a relay that must refuse to: its exit status and what it printed."""
    relay.start()
    code = relay.wait_exit(60)
    return code, relay.output()


def up(relay: RelayProcess, port: int, host: str = "127.0.0.1") -> None:
    def check() -> bool:
        if relay.proc is not None and relay.proc.poll() is not None:
            raise AssertionError(f"the relay exited ({relay.proc.returncode}):\n"
                                 f"{relay.output()[-3000:]}")
        with socket.socket() as s:
            return s.connect_ex((host, port)) == 0
    wait_until(check, 30, f"the relay to listen on {host}:{port}")


# --- listeners beyond loopback --------------------------------------------------------------


def test_sql_port_beyond_loopback_needs_tls_or_allow_insecure(
        relay_factory: Callable[..., RelayProcess]) -> None:
    port = free_port()
    relay = relay_factory(nowhere(), downstream={"listen": f"0.0.0.0:{port}"})
    code, out = refused_start(relay)
    assert code == 2, out
    assert "downstream.listen = '0.0.0.0:" in out and "[downstream.tls]" in out, out
    assert "[downstream] allow_insecure = true" in out, out
    assert not listening(port)

    relay.settings["downstream"]["allow_insecure"] = True
    relay.start()
    up(relay, port, outside_address())   # exposed, as asked: reachable from the network
    assert relay.proc is not None and relay.proc.poll() is None


@pytest.mark.parametrize("section,settings,missing", [
    ("tap", {"listen": "0.0.0.0:{port}"}, ["[tap.tls]", "[[tap.users]]"]),
    ("metrics", {"listen": "0.0.0.0:{port}"},
     ["credentials (token_file, token_env or basic_user)", "[metrics.tls]"]),
    ("metrics", {"listen": "0.0.0.0:{port}", "token_env": "RELAY_TEST_TOKEN"},
     ["[metrics.tls]"]),
])
def test_tap_and_metrics_beyond_loopback_are_refused_unless_allowed(
        relay_factory: Callable[..., RelayProcess], section: str,
        settings: dict[str, str], missing: list[str]) -> None:
    port = free_port()
    values: dict[str, object] = {k: v.format(port=port) for k, v in settings.items()}
    relay = relay_factory(nowhere(), **{section: values})
    relay.env["RELAY_TEST_TOKEN"] = "t0ken"
    code, out = refused_start(relay)
    assert code == 2, out
    for what in missing:
        assert what in out, (what, out)
    assert f"[{section}] allow_insecure = true" in out, out

    relay.settings[section]["allow_insecure"] = True
    relay.start()
    up(relay, port, outside_address())


def test_default_sql_port_is_loopback(tmp_path: Any) -> None:
    """A relay started without [downstream] listen serves replicas on 127.0.0.1:3307 only:
    the listening sockets the process holds, and a connection from beyond loopback."""
    metrics = free_port()
    config = tmp_path / "relay.toml"
    config.write_text(f'[relay]\ndata_dir = "{tmp_path}/data"\n'
                      f'[upstream]\nsources = ["{nowhere()}"]\n'
                      '[[downstream.users]]\nname = "repl"\npassword_env = "RELAY_TEST_PW"\n'
                      f'[metrics]\nlisten = "127.0.0.1:{metrics}"\n')
    log = tmp_path / "relay.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "relay.cli", "run", "--config",
                                 str(config)], stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True,
                                env={**os.environ, "RELAY_TEST_PW": "pw"})
    try:
        def bound() -> set[tuple[str, int]]:
            assert proc.poll() is None, log.read_text()[-3000:]
            return {a for a in listening_addresses(proc.pid) if a[1] == 3307}
        wait_until(lambda: bool(bound()), 30, "the relay to listen on port 3307")
        assert bound() == {("127.0.0.1", 3307)}
        with socket.socket() as s:
            assert s.connect_ex((outside_address(), 3307)) != 0
    finally:
        proc.terminate()
        proc.wait(20)


def listening_addresses(pid: int) -> set[tuple[str, int]]:
    """The (address, port) of each TCP socket process `pid` listens on (from /proc)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table, size in (("tcp", 4), ("tcp6", 16)):
        with open(f"/proc/{pid}/net/{table}") as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] != "0A" or cols[9] not in inodes:   # 0A: LISTEN
                    continue
                hex_address, hex_port = cols[1].split(":")
                raw = bytes.fromhex(hex_address)
                # /proc prints each 32-bit word in host (little-endian) order
                packed = b"".join(raw[i:i + 4][::-1] for i in range(0, size, 4))
                found.add((str(ipaddress.ip_address(packed)), int(hex_port, 16)))
    return found


# --- passwords ------------------------------------------------------------------------------


def test_a_user_without_a_password_is_refused_unless_allowed(
        relay_factory: Callable[..., RelayProcess], tmp_path: Any) -> None:
    nopw = '[[downstream.users]]\nname = "nopw"\n'
    relay = relay_factory(nowhere(), nopw)
    code, out = refused_start(relay)
    assert code == 2, out
    assert "downstream.users[0].password: user 'nopw' has no password" in out, out
    assert "allow_empty_password = true" in out, out

    # A tap user likewise; and a password_env naming a variable set to "".
    tap = {"listen": f"127.0.0.1:{free_port()}"}
    relay = relay_factory(nowhere(), '[[tap.users]]\nname = "t"\npassword = ""\n', tap=tap)
    code, out = refused_start(relay)
    assert code == 2 and "tap.users[0].password: user 't' has an empty password" in out, out
    relay = relay_factory(nowhere(), '[[downstream.users]]\nname = "e"\n'
                                     'password_env = "RELAY_EMPTY_PW"\n')
    relay.env["RELAY_EMPTY_PW"] = ""
    code, out = refused_start(relay)
    assert code == 2, out
    assert "environment variable RELAY_EMPTY_PW (its password_env) is empty" in out, out

    # allow_empty_password: the start goes on, and the user logs in with no password;
    # check-config accepts it (exit 0) with a warning.
    relay = relay_factory(nowhere(), nopw + "allow_empty_password = true\n")
    relay.start()
    up(relay, relay.port)
    conn = pymysql.connect(host="127.0.0.1", port=relay.port, user="nopw", password="",
                           connect_timeout=10)
    conn.close()
    check = subprocess.run([sys.executable, "-m", "relay.cli", "check-config",
                            relay.config_path], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    assert "(1 warning)" in check.stdout
    assert "downstream.users 'nopw': no password (allow_empty_password = true)" in check.stderr


# --- /-/reload ------------------------------------------------------------------------------


def http_request(host: str, port: int, method: str, path: str,
                 headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.request(method, path, body=b"" if method == "POST" else None,
                     headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read().decode()
    finally:
        conn.close()


def test_reload_is_post_only_and_needs_credentials_beyond_loopback(
        relay_factory: Callable[..., RelayProcess]) -> None:
    rule = '[[rules]]\nname = "only-shop"\nat = "send"\ndo_tables = ["shop.%"]\n'
    port = free_port()
    relay = relay_factory(nowhere(), rule, metrics={"listen": f"0.0.0.0:{port}",
                                                    "allow_insecure": True})
    relay.start()
    up(relay, port)
    for method in ("GET", "HEAD"):
        status, headers, _ = http_request("127.0.0.1", port, method, "/-/reload")
        assert status == 405 and headers.get("Allow") == "POST", (method, status, headers)
    status, _, body = http_request("127.0.0.1", port, "POST", "/-/reload")
    assert status == 200 and "rules reloaded" in body and "1 at send" in body, body
    # A web page in a browser on the relay's host (a form's POST needs no preflight): the
    # browser names the page's origin, and the relay serves no page of its own.
    for page in ({"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"},
                 {"Origin": f"http://127.0.0.1:{port}"}):
        status, _, body = http_request("127.0.0.1", port, "POST", "/-/reload", page)
        assert status == 403 and "web page" in body, (page, status, body)
    cli = subprocess.run([sys.executable, "-m", "relay.cli", "rules", "reload", "--url",
                          f"http://127.0.0.1:{port}"], capture_output=True, text=True,
                         timeout=60)
    assert cli.returncode == 0 and "rules reloaded" in cli.stdout, cli.stderr
    # From beyond loopback, with no credentials configured: refused, naming the settings.
    outside = outside_address()
    status, _, body = http_request(outside, port, "POST", "/-/reload")
    assert status == 403 and "token_file" in body and "basic_user" in body, (status, body)
    relay.stop()

    # With a token: beyond loopback too, with the token only.
    relay.settings["metrics"]["token_env"] = "RELAY_TEST_TOKEN"
    relay.env["RELAY_TEST_TOKEN"] = "t0ken"
    relay.start()
    up(relay, port)
    status, _, _ = http_request(outside, port, "POST", "/-/reload")
    assert status == 401
    status, _, body = http_request(outside, port, "POST", "/-/reload",
                                   {"Authorization": "Bearer t0ken"})
    assert status == 200 and "rules reloaded" in body, (status, body)


# --- snapshot reads never hand over their password ------------------------------------------

CLIENT_CAPS = (1 | 512 | 32768 | (1 << 19) | (1 << 21))  # long password, 4.1, secure
# connection, plugin auth, length-encoded auth data; no CLIENT_SSL: this server has no TLS


@dataclass
class FakeMySQL:
    """A MySQL server that offers no TLS and tries to get the password: `clear` asks for
    mysql_clear_password; `sha2` asks caching_sha2_password for a full authentication and
    answers a key request with an RSA key of its own, then decrypts what comes."""

    mode: str
    received: list[bytes] = field(default_factory=list)   # each ended connection's bytes
    recovered: list[bytes] = field(default_factory=list)  # passwords it decrypted
    key_requests: int = 0
    port: int = 0

    def __post_init__(self) -> None:
        from cryptography.hazmat.primitives.asymmetric import rsa

        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._sock.close()
        self._thread.join(10)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(10)
                got = bytearray()
                try:
                    self._talk(conn, got)
                except (OSError, EOFError):
                    pass
                finally:
                    self.received.append(bytes(got))   # once the client is gone

    def _talk(self, conn: socket.socket, got: bytearray) -> None:
        nonce = bytes((i * 7 + 1) % 250 + 1 for i in range(20))   # no zero bytes
        plugin = b"caching_sha2_password" if self.mode == "sha2" else b"mysql_native_password"
        greeting = (b"\x0a5.7.99-fake\x00" + struct.pack("<I", 7) + nonce[:8] + b"\x00"
                    + struct.pack("<H", CLIENT_CAPS & 0xFFFF) + b"\x21"
                    + struct.pack("<H", 2) + struct.pack("<H", CLIENT_CAPS >> 16)
                    + bytes([21]) + b"\x00" * 10 + nonce[8:] + b"\x00" + plugin + b"\x00")
        self._send(conn, 0, greeting)
        self._read(conn, got)                                   # the handshake response
        if self.mode == "clear":
            self._send(conn, 2, b"\xfe" + b"mysql_clear_password\x00")
            self._read(conn, got)                               # what a client sends back
            self._send(conn, 4, b"\xff" + struct.pack("<H", 1045) + b"#28000fake: denied")
            return
        self._send(conn, 2, b"\x01\x04")                        # perform full authentication
        answer = self._read(conn, got)
        if answer == b"\x02":
            self.key_requests += 1
            from cryptography.hazmat.primitives import serialization

            pem = self._key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
            self._send(conn, 4, b"\x01" + pem)
            self.recovered.append(self._decrypt(self._read(conn, got), nonce))
        self._send(conn, 6, b"\xff" + struct.pack("<H", 1045) + b"#28000fake: denied")

    def _decrypt(self, data: bytes, nonce: bytes) -> bytes:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding

        plain = self._key.decrypt(data, padding.OAEP(mgf=padding.MGF1(hashes.SHA1()),
                                                     algorithm=hashes.SHA1(), label=None))
        return bytes(b ^ nonce[i % len(nonce)] for i, b in enumerate(plain)).rstrip(b"\x00")

    @staticmethod
    def _send(conn: socket.socket, seq: int, payload: bytes) -> None:
        conn.sendall(len(payload).to_bytes(3, "little") + bytes([seq]) + payload)

    @staticmethod
    def _read(conn: socket.socket, got: bytearray) -> bytes:
        def exactly(n: int) -> bytes:
            out = b""
            while len(out) < n:
                chunk = conn.recv(n - len(out))
                if not chunk:
                    raise EOFError("client closed")
                got.extend(chunk)
                out += chunk
            return out
        head = exactly(4)
        return exactly(int.from_bytes(head[:3], "little"))


@pytest.fixture
def fake_mysql() -> Iterator[Callable[[str], FakeMySQL]]:
    made: list[FakeMySQL] = []

    def make(mode: str) -> FakeMySQL:
        server = FakeMySQL(mode)
        made.append(server)
        return server
    yield make
    for server in made:
        server.close()


def snapshot_connect(url: str, **kwargs: Any) -> None:
    spec = SourceSpec.parse(url, default_address=None, user=None, password=None,
                            password_env=None, **kwargs)
    spec.connect(5).close()


def test_snapshot_read_never_sends_a_clear_text_password(
        fake_mysql: Callable[[str], FakeMySQL]) -> None:
    """No ssl-mode (PREFERRED when the relay's links are plain): the server offers no TLS,
    the read goes on in plain text (in the same connection), the server asks for
    mysql_clear_password: refused."""
    server = fake_mysql("clear")
    url = f"mysql://snap:{SECRET}@127.0.0.1:{server.port}"
    with pytest.raises(SnapshotError) as refused:
        snapshot_connect(url)
    wait_until(lambda: len(server.received) >= 1, 10, "the fake server's connection")
    assert all(SECRET.encode() not in got for got in server.received), server.received
    assert server.received[-1], "the plain-text attempt reached the server"
    assert "clear text" in str(refused.value) and "ssl-mode=REQUIRED" in str(refused.value)
    # Explicitly DISABLED: the same refusal.
    with pytest.raises(SnapshotError, match="clear text"):
        snapshot_connect(url + "?ssl-mode=DISABLED")
    assert all(SECRET.encode() not in got for got in server.received)


def test_snapshot_read_fetches_no_rsa_key_over_plain_text(
        fake_mysql: Callable[[str], FakeMySQL]) -> None:
    server = fake_mysql("sha2")
    url = f"mysql://snap:{SECRET}@127.0.0.1:{server.port}"
    with pytest.raises(SnapshotError) as refused:
        snapshot_connect(url)
    wait_until(lambda: len(server.received) >= 1, 10, "the fake server's connection")
    assert server.key_requests == 0 and server.recovered == [], server.recovered
    assert all(SECRET.encode() not in got for got in server.received)
    assert "get-server-public-key=true" in str(refused.value), refused.value
    assert "ssl-mode=REQUIRED" in str(refused.value)
    # What the refusal prevents: asked to trust the network, the client fetches the key
    # and this server decrypts the password.
    with pytest.raises(SnapshotError, match="fake: denied"):
        snapshot_connect(url + "?get-server-public-key=true")
    assert server.key_requests == 1 and server.recovered == [SECRET.encode()]


def test_snapshot_read_requires_tls_when_the_relay_s_links_use_it(
        fake_mysql: Callable[[str], FakeMySQL]) -> None:
    """The default Spark passes when its tap connection (or the relay's source) is TLS:
    REQUIRED, refused before a byte of the login is sent, naming the way out."""
    server = fake_mysql("clear")
    url = f"mysql://snap:{SECRET}@127.0.0.1:{server.port}"
    with pytest.raises(SnapshotError) as refused:
        snapshot_connect(url, tls_default=TlsMode.REQUIRED)
    message = str(refused.value)
    assert "offers no TLS" in message and "ssl-mode=PREFERRED" in message, message
    wait_until(lambda: len(server.received) >= 1, 10, "the fake server's connection")
    assert server.received == [b""], server.received   # not even a handshake response


def test_spark_takes_no_snapshot_address_from_a_plain_tap() -> None:
    """Without snapshotSource the executors connect to the address the tap's status
    names: over a plain-text tap beyond loopback that is refused (snapshotSource named);
    over TLS, or on loopback, it is taken, and a TLS tap makes TLS the default."""
    from relay.tap.spark import TapOptions  # pyspark: a dev dependency

    class Tap:
        def __init__(self, **status: Any) -> None:
            self.answer = status

        def status(self) -> dict[str, Any]:
            return self.answer

    def options(endpoint: str, **extra: str) -> TapOptions:
        return TapOptions({"endpoint": endpoint, "tables": "shop.%", "snapshot": "initial",
                           "snapshotUser": "snap", "snapshotPassword": SECRET, **extra})

    plain = options("relay.example:4000")
    with pytest.raises(RelayError, match=r'option\("snapshotSource"'):
        plain.learn_source(Tap(source="attacker.example:3306"))  # type: ignore[arg-type]
    assert plain.source_default is None

    local = options("127.0.0.1:4000")
    local.learn_source(Tap(source="db1:3306"))  # type: ignore[arg-type]
    assert (local.source().host, local.source().tls_default) == ("db1", TlsMode.PREFERRED)

    tls = options("relay.example:4000", tls="true")
    tls.learn_source(Tap(source="db1:3306"))  # type: ignore[arg-type]
    assert (tls.source().host, tls.source().tls_default) == ("db1", TlsMode.REQUIRED)

    # snapshotSource given: the tap's address is not needed; the relay's source on TLS
    # (its status says so) makes TLS the default too.
    named = options("relay.example:4000", snapshotSource="mysql://snap@db2:3306")
    named.learn_source(Tap(source="db1:3306", source_tls=True))  # type: ignore[arg-type]
    assert (named.source().host, named.source().tls_default) == ("db2", TlsMode.REQUIRED)


async def test_metrics_credentials_can_be_replaced() -> None:
    """AdminServer.reload_credentials (for a rotated token_file on SIGHUP): the next request is
    checked against the new token, the old one is refused."""
    import asyncio

    from relay.ops.service import Operations

    metrics = Operations(ready_max_lag=60, ready_grace=30, credentials=("Bearer", "old"))
    await metrics.http.serve("127.0.0.1", 0)
    try:
        def ask(token: str) -> int:
            return http_request("127.0.0.1", metrics.http.port, "POST", "/-/reload",
                                {"Authorization": f"Bearer {token}"})[0]
        assert await asyncio.to_thread(ask, "old") == 404   # authorized: nothing to reload
        assert await asyncio.to_thread(ask, "new") == 401
        metrics.http.reload_credentials(("Bearer", "new"))
        assert await asyncio.to_thread(ask, "new") == 404
        assert await asyncio.to_thread(ask, "old") == 401
    finally:
        await metrics.http.close()


def test_a_rotated_token_file_is_read_again_on_sighup(
        relay_factory: Callable[..., RelayProcess], tmp_path: Any) -> None:
    """A token_file replaced by a secrets manager: kill -HUP puts the new token in force
    and the old one stops working, without a restart."""
    import signal

    token = tmp_path / "token"
    token.write_text("first-token\n")
    port = free_port()
    relay = relay_factory(nowhere(), metrics={"listen": f"127.0.0.1:{port}",
                                              "token_file": str(token)})
    relay.start()
    up(relay, port)

    def status_with(value: str) -> int:
        return http_request("127.0.0.1", port, "GET", "/status",
                            {"Authorization": f"Bearer {value}"})[0]
    assert (status_with("first-token"), status_with("second-token")) == (200, 401)
    token.write_text("second-token\n")
    assert relay.proc is not None
    relay.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: status_with("second-token") == 200, 10, "the new token in force")
    assert status_with("first-token") == 401
