"""Zero-configuration TLS as MariaDB 11.4+ does it (issue 32): a relay with no
[downstream.tls] makes a self-signed certificate at start and proves it to a client through
the password, so a MariaDB 11.8 replica left at its defaults (MASTER_SSL=1, certificate
verification on) replicates through it as it does from a primary, also on a loopback
address other than 127.0.0.1 (where the client makes no exception for self-signed
certificates). A man in the middle with a certificate of his own is refused by the same
replica, and a client that will not trust the certificate is counted in /status.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pathlib
import select
import socket
import ssl
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator

import pytest

from relay.testing.mariadb import MariaDB, free_port
from relay.tls import self_signed
from tests.conftest import RelayProcess, wait_until
from tests.integration.common import converged

pytestmark = [pytest.mark.integration, pytest.mark.builds("mariadb-11.8")]

HOST = "127.0.0.2"   # loopback, but not the 127.0.0.1 a MariaDB client trusts blindly
ED_USER, ED_PASSWORD = "ed", "ed pass"


def on(host: str, port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


def client(server: MariaDB, port: int, user: str, password: str, *options: str
           ) -> subprocess.CompletedProcess[str]:
    """The 11.8 build's own `mariadb` client, at its defaults unless `options` say."""
    build = server.build
    assert build is not None
    return subprocess.run(
        build.command(build.tool("mariadb"), "--no-defaults", f"--host={HOST}",
                      f"--port={port}", f"--user={user}", f"--password={password}",
                      *options, "-N", "-e", "SHOW SESSION STATUS LIKE 'Ssl_version'"),
        capture_output=True, text=True, timeout=60)


class ManInTheMiddle:
    """Sits between a client and the relay: passes the greeting and the client's switch to
    TLS on, then ends the client's TLS with a certificate of its own and opens its own TLS
    to the relay, and copies the plain text between the two (it sees the login and every
    event: what a client that accepts any certificate exposes)."""

    def __init__(self, host: str, relay_port: int, directory: str) -> None:
        self.relay = (host, relay_port)
        cert_pem, key_pem = self_signed("not the relay")
        cert, key = os.path.join(directory, "mitm.pem"), os.path.join(directory, "mitm.key")
        for path, text in ((cert, cert_pem), (key, key_pem)):
            with open(path, "w") as f:
                f.write(text)
        self.server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.server_ctx.load_cert_chain(cert, key)
        self.client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        self.client_ctx.check_hostname = False
        self.client_ctx.verify_mode = ssl.CERT_NONE
        self.listener = socket.create_server((host, free_port()))
        self.port = self.listener.getsockname()[1]
        self.logins_seen = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                sock, _ = self.listener.accept()
                threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    @staticmethod
    def _packet(sock: socket.socket) -> bytes:
        head = sock.recv(4, socket.MSG_WAITALL)
        n = int.from_bytes(head[:3], "little")
        return head + (sock.recv(n, socket.MSG_WAITALL) if n else b"")

    def _serve(self, down: socket.socket) -> None:
        with contextlib.suppress(OSError), down, \
                socket.create_connection(self.relay) as up:
            down.sendall(self._packet(up))          # the relay's greeting
            ssl_request = self._packet(down)
            if len(ssl_request) != 4 + 32:          # no TLS: nothing to intercept
                return
            up.sendall(ssl_request)
            tls_up = self.client_ctx.wrap_socket(up)
            tls_down = self.server_ctx.wrap_socket(down, server_side=True)
            self.logins_seen += 1
            self._pump(tls_up, tls_down)

    @staticmethod
    def _pump(a: ssl.SSLSocket, b: ssl.SSLSocket) -> None:
        """Copy both ways from one thread (an SSL socket is not shared between threads),
        reading without blocking: a record that holds no data (a TLS 1.3 session ticket)
        then says so instead of reading as the end."""
        for s in (a, b):
            s.setblocking(False)
        with contextlib.suppress(OSError):
            while True:
                ready = [s for s in (a, b) if s.pending()] or \
                    select.select([a, b], [], [], 60)[0]
                if not ready:
                    return
                for s in ready:
                    try:
                        data = s.recv(65536)
                    except ssl.SSLWantReadError:
                        continue
                    if not data:
                        return
                    dst = b if s is a else a
                    dst.setblocking(True)
                    dst.sendall(data)
                    dst.setblocking(False)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def relay_at_defaults(mariadb_factory: Callable[..., MariaDB],
                      relay_factory: Callable[..., RelayProcess]
                      ) -> Iterator[tuple[MariaDB, RelayProcess]]:
    """An 11.8 primary and a relay in front of it listening on 127.0.0.2 with no
    [downstream.tls]: users repl (mysql_native_password) and ed (ed25519)."""
    primary = mariadb_factory()
    primary.execute_many(["CREATE DATABASE s", "CREATE TABLE s.t (id INT PRIMARY KEY)",
                          "INSERT INTO s.t VALUES (1)"])
    users = (f'[[downstream.users]]\nname = "{ED_USER}"\nplugin = "ed25519"\n'
             f'password = "{ED_PASSWORD}"\n')
    relay = relay_factory(primary.url, users, downstream={"listen": f"{HOST}:{free_port()}"},
                          users={"repl": "relaypass"})
    relay.start()
    wait_until(lambda: on(HOST, relay.port), 30, "the relay to listen")
    yield primary, relay


def test_a_replica_at_its_defaults_verifies_the_relays_own_certificate(
        relay_at_defaults: tuple[MariaDB, RelayProcess],
        mariadb_factory: Callable[..., MariaDB], tmp_path: pathlib.Path) -> None:
    primary, relay = relay_at_defaults
    tls = relay.status()["downstream"]["tls"]
    assert tls["certificate"] == "generated" and len(tls["sha256"]) == 64, tls

    # An 11.8 replica at its defaults: no MASTER_SSL settings at all.
    replica = mariadb_factory(server_id=2)
    replica.replicate_from(HOST, relay.port, user="repl", password="relaypass")
    wait_until(functools.partial(converged, primary, replica), 60, "the replica to catch up")
    primary.execute_many(["INSERT INTO s.t VALUES (2)"])
    wait_until(functools.partial(converged, primary, replica), 60, "the replica to stream")
    assert replica.query("SELECT COUNT(*) FROM s.t")[0][0] == 2
    st = replica.slave_status()
    assert st["Master_SSL_Allowed"] == "Yes" and st["Master_SSL_Verify_Server_Cert"] == "Yes"
    assert st["Master_SSL_CA_File"] == "" and st["Master_SSL_CA_Path"] == "", st
    dumps = [c for c in relay.status()["clients"] if c.get("server_id") == 2]
    assert dumps and str(dumps[0]["tls"]).startswith("TLSv1"), dumps

    # The 11.8 client at its defaults: the proof holds for ed25519 (its hash is the public
    # key) as for mysql_native_password.
    for user, password in ((ED_USER, ED_PASSWORD), ("repl", "relaypass")):
        out = client(primary, relay.port, user, password)
        assert out.returncode == 0 and out.stdout.split()[-1].startswith("TLSv1"), \
            (user, out.stderr)

    # A man in the middle with a self-signed certificate of his own: the same replica at
    # the same defaults refuses him, since his certificate is not the one the relay's
    # proof names.
    mitm = ManInTheMiddle(HOST, relay.port, str(tmp_path))
    try:
        fooled = mariadb_factory(server_id=3)
        fooled.replicate_from(HOST, mitm.port, user="repl", password="relaypass")

        def refused() -> bool:   # CR_SSL_CONNECTION_ERROR, after the relay's OK
            return fooled.slave_status().get("Last_IO_Errno") == 2026
        wait_until(refused, 60, "the replica to refuse the man in the middle")
        assert mitm.logins_seen >= 1
        assert not [c for c in relay.status()["clients"] if c.get("server_id") == 3]
        assert fooled.query("SELECT COUNT(*) FROM information_schema.schemata "
                            "WHERE schema_name = 's'")[0][0] == 0   # nothing arrived
        out = client(primary, mitm.port, "repl", "relaypass")
        assert out.returncode != 0 and "ERROR 2026" in out.stderr, out
    finally:
        mitm.close()


def test_a_client_that_refuses_the_certificate_is_counted(
        relay_at_defaults: tuple[MariaDB, RelayProcess]) -> None:
    """A MariaDB client told to trust one CA checks the certificate after the TLS handshake
    and hangs up before it logs in; the relay counts it (and logs it, throttled)."""
    primary, relay = relay_at_defaults
    build = primary.build
    assert build is not None
    other_ca, _ = self_signed("some other authority")
    folder = build.host_path("/srv/relay-tests")
    os.makedirs(folder, exist_ok=True)
    fd, ca_path = tempfile.mkstemp(prefix="other-ca-", suffix=".pem", dir=folder)
    with os.fdopen(fd, "w") as f:
        f.write(other_ca)
    before = relay.status()["downstream"]["tls"]["failures"]
    out = client(primary, relay.port, "repl", "relaypass",
                 f"--ssl-ca={build.server_path(ca_path)}")
    assert out.returncode != 0, out
    try:
        wait_until(lambda: relay.status()["downstream"]["tls"]["failures"] == before + 1, 10,
                   "the relay to count the refusal")
    finally:
        os.unlink(ca_path)
