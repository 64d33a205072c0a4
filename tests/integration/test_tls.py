"""TLS on every link and the servers' authentication methods, against real servers: a
primary with require_secure_transport=ON streamed with VERIFY_IDENTITY by an ed25519 user
(and refused with a wrong CA, /readyz saying why); a MariaDB replica behind the relay with
MASTER_SSL=1 and server-certificate verification, as an ed25519 user of the relay, refused
in plain text when the relay requires TLS; the mariadb client and mariadb-binlog over TLS;
PyMySQL with caching_sha2_password (full authentication over TLS and with RSA, then the
fast path); the tap over TLS, a wrong CA refused; certificates reloaded on SIGHUP while a
replica streams. Certificates are made here with trustme. The first two run against
MariaDB 10.11 and 11.8 (primary, replica and their client tools of one build)."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable

import pymysql
import pytest

from relay.config import TlsMode
from relay.tap.client import TapClient
from relay.tap.protocol import TapError
from relay.tap.snapshot import SnapshotError, SourceSpec
from relay.testing.certs import Certs
from relay.testing.mariadb import MariaDB, free_port
from relay.wire import ed25519
from tests.conftest import RelayProcess, wait_until
from tests.integration.common import caught_up, listening

pytestmark = pytest.mark.integration


def peer_serial(port: int, ca: str) -> int:
    """The serial number of the certificate the relay's SQL port presents."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        raw.recv(4096)  # the greeting
        ssl_request = (b"\x20\x00\x00\x01" + (0x0000_0a00 | 0x0008_8201).to_bytes(4, "little")
                       + (1 << 24).to_bytes(4, "little") + b"\x21" + b"\0" * 23)
        raw.sendall(ssl_request)
        ctx = ssl.create_default_context(cafile=ca)
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            der = tls.getpeercert(binary_form=True)
    assert der is not None
    from cryptography import x509
    return int(x509.load_der_x509_certificate(der).serial_number)


def client_plugin_dir(directory: str) -> str:
    """The server's plugins and libmariadb's client plugins in one directory: a replica
    authenticating with ed25519 loads client_ed25519.so from its plugin_dir, which Debian
    ships with libmariadb3, not with the server."""
    out = os.path.join(directory, "plugins")
    os.makedirs(out, exist_ok=True)
    found = glob.glob("/usr/lib/*/libmariadb3/plugin/client_ed25519.so") + \
        glob.glob("/usr/lib/mysql/plugin/client_ed25519.so")
    assert found, "client_ed25519.so (package libmariadb3) is not installed"
    for source_dir in ("/usr/lib/mysql/plugin", os.path.dirname(found[0])):
        for path in glob.glob(os.path.join(source_dir, "*.so")):
            link = os.path.join(out, os.path.basename(path))
            if not os.path.exists(link):
                os.symlink(path, link)
    return out


# client_ed25519.so in Debian's MariaDB 11.8 root (libmariadb3), as its server names it
ROOTED_CLIENT_PLUGINS = "/usr/lib/x86_64-linux-gnu/libmariadb3/plugin"


def tool(server: MariaDB, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """A client tool of `server`'s build (the machine's 10.11 `mariadb-binlog` refuses a
    relay that says it is 11.8)."""
    build = server.build
    assert build is not None
    return subprocess.run(build.command(build.tool(name), "--no-defaults", *args),
                          capture_output=True, text=True, timeout=60)


@pytest.mark.builds("machine", "mariadb-11.8")
def test_tls_on_every_link(tmp_path: object, mariadb_factory: Callable[..., MariaDB],
                           relay_factory: Callable[..., RelayProcess]) -> None:
    d = str(tmp_path)
    primary_certs, relay_certs, stranger = Certs(d, "primary"), Certs(d, "relay"), Certs(d, "x")
    clients = Certs(d, "clients")   # the CA of client certificates the relay accepts
    primary = mariadb_factory(
        options={"require_secure_transport": "ON"},
        files={"ssl_ca": primary_certs.ca, "ssl_cert": primary_certs.cert,
               "ssl_key": primary_certs.key})
    # Debian's MariaDB 11.8 root holds the server's core only, without its auth plugins:
    # there the relay logs in with the native method (ed25519 is still the method of the
    # 11.8 replica's login to the relay below, from the root's client library).
    rooted = primary.build is not None and primary.build.root is not None
    method = "mysql_native_password" if rooted else "ed25519"
    primary.execute_many([
        "SET sql_log_bin = 0",
        *([] if rooted else ["INSTALL SONAME 'auth_ed25519'"]),
        f"CREATE USER edrepl@'%' IDENTIFIED VIA {method} USING PASSWORD('ed pass 1') "
        "REQUIRE X509",   # the relay presents a client certificate
        "GRANT REPLICATION SLAVE, REPLICATION CLIENT, SLAVE MONITOR, SELECT ON *.* "
        "TO edrepl@'%'",
        "SET sql_log_bin = 1",
        "CREATE DATABASE s", "CREATE TABLE s.t (id INT PRIMARY KEY, v VARCHAR(20))",
        "INSERT INTO s.t VALUES (1, 'one'), (2, 'two')"])
    if not rooted:
        # The key the server stores for the password is the one the relay computes.
        stored = str(primary.query("SHOW CREATE USER edrepl")[0][0])
        assert f"USING '{ed25519.public_key_text(b'ed pass 1')}'" in stored, stored
    # A plain connection is refused by the primary itself (the relay must not be).
    with pytest.raises(pymysql.err.OperationalError) as plain_primary:
        pymysql.connect(host="127.0.0.1", port=primary.port, user="repl",
                        password="replpass", ssl_disabled=True, connect_timeout=5)
    assert plain_primary.value.args[0] in (1045, 3159, 4151), plain_primary.value
    pymysql.connect(host="127.0.0.1", port=primary.port, user="repl", password="replpass",
                    ssl={"ca": primary_certs.ca}, connect_timeout=5).close()  # over TLS: in
    # Snapshot reads (snapshotSource): without an ssl-mode, TLS when the server offers it
    # (PREFERRED, or REQUIRED: Spark's default when its tap link or the relay's source is
    # TLS); a verifying mode checks the CA; DISABLED meets the primary's refusal.
    on_primary = f"mysql://repl:replpass@127.0.0.1:{primary.port}"
    assert snapshot_cipher(on_primary)
    assert snapshot_cipher(on_primary, tls_default=TlsMode.REQUIRED)
    assert snapshot_cipher(f"{on_primary}?ssl-mode=VERIFY_CA&ssl-ca={primary_certs.ca}")
    with pytest.raises(SnapshotError, match="certificate verify failed"):
        snapshot_cipher(f"{on_primary}?ssl-mode=VERIFY_CA&ssl-ca={stranger.ca}")
    with pytest.raises(SnapshotError, match=r"\((1045|3159|4151), "):  # as pymysql above
        snapshot_cipher(f"{on_primary}?ssl-mode=DISABLED")

    client_cert, client_key = primary_certs.issue("relay-client")
    source = (f"mysql://edrepl:ed%20pass%201@127.0.0.1:{primary.port}?ssl-mode=VERIFY_IDENTITY"
              f"&ssl-ca={primary_certs.ca}&ssl-cert={client_cert}&ssl-key={client_key}")
    tap_port = free_port()
    ed_key = ed25519.public_key_text(b"replica ed")
    users = f'''
[[downstream.users]]
name = "repl"
password = "relaypass"
admin = true
[[downstream.users]]
name = "edrepl"
plugin = "ed25519"
password_hash = "{ed_key}"
[[downstream.users]]
name = "sha2"
plugin = "caching_sha2_password"
password_env = "SHA2_PASSWORD"
[[downstream.users]]
name = "x509"
password = "x509pass"
require_x509 = true
[downstream.tls]
cert = "{relay_certs.cert}"
key = "{relay_certs.key}"
ca = "{clients.ca}"
require = true
[tap.tls]
cert = "{relay_certs.cert}"
key = "{relay_certs.key}"
'''
    relay = relay_factory(source, users,
                          downstream={"listen": f"127.0.0.1:{free_port()}",
                                      "handshake_timeout": "5s"},
                          tap={"listen": f"127.0.0.1:{tap_port}"})
    relay.env["SHA2_PASSWORD"] = "sha2 secret"
    relay.start()
    wait_until(lambda: listening(relay.port) and listening(tap_port), 30, "the relay")
    wait_until(lambda: caught_up(relay, primary), 60, "the relay to stream over TLS")
    status = relay.status()
    assert status["upstream"]["connected"], status

    # relay changes reads the primary over the same TLS (a URL with its ssl-* options).
    out = subprocess.run([sys.executable, "-m", "relay.cli", "changes", "--table", "s.t",
                          source + "&start=earliest"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert '"two"' in out.stdout and "ed pass" not in out.stdout + out.stderr, out.stdout

    # A relay that does not trust the primary's CA refuses it, and /readyz says why.
    doubter = relay_factory(source.replace(primary_certs.ca, stranger.ca),
                            metrics={"ready_grace": "1s"})
    doubter.start()

    def refused() -> bool:
        code, body = doubter.http("/readyz")
        return code == 503 and "certificate verify failed" in body
    wait_until(refused, 30, "the relay with the wrong CA to say why it is not ready")
    assert not doubter.segments(), "nothing may be read from an unverified primary"

    # A MariaDB replica through the relay: TLS with the relay's certificate verified, as an
    # ed25519 user of the relay.
    replica = mariadb_factory(server_id=3, options={
        "plugin_dir": ROOTED_CLIENT_PLUGINS if rooted else client_plugin_dir(d)})
    replica.execute_many([
        f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={relay.port}, "
        "MASTER_USER='edrepl', MASTER_PASSWORD='replica ed', MASTER_CONNECT_RETRY=1, "
        "MASTER_USE_GTID=slave_pos, MASTER_SSL=1, "
        f"MASTER_SSL_CA='{replica.readable(relay_certs.ca)}', MASTER_SSL_VERIFY_SERVER_CERT=1",
        "START SLAVE"])
    primary.execute_many(["INSERT INTO s.t VALUES (3, 'three')"])

    def replicated(n: int) -> Callable[[], bool]:
        def check() -> bool:
            with contextlib.suppress(pymysql.err.ProgrammingError):
                return replica.query("SELECT COUNT(*) FROM s.t")[0][0] == n
            return False
        return check
    wait_until(replicated(3), 60, "the TLS replica to apply the primary's rows")
    sessions = [c for c in relay.status()["clients"] if c["user"] == "edrepl"]
    assert sessions and sessions[0]["tls"] and sessions[0]["tls"].startswith("TLS"), sessions

    # Certificates reload on SIGHUP: new connections get the new one, the replica streams on.
    before = peer_serial(relay.port, relay_certs.ca)
    new_cert, new_key = relay_certs.issue("relay-server-2")
    os.replace(new_cert, relay_certs.cert)
    os.replace(new_key, relay_certs.key)
    assert relay.proc is not None
    os.kill(relay.proc.pid, signal.SIGHUP)
    wait_until(lambda: peer_serial(relay.port, relay_certs.ca) != before, 20,
               "the relay to present its new certificate")
    primary.execute_many(["INSERT INTO s.t VALUES (4, 'four')"])
    wait_until(replicated(4), 60, "the replica to stream on across the reload")
    after = [c for c in relay.status()["clients"] if c["user"] == "edrepl"]
    assert [c["id"] for c in after] == [sessions[0]["id"]], (sessions, after)

    # require = true: the same replica in plain text is refused.
    replica.execute_many(["STOP SLAVE", "CHANGE MASTER TO MASTER_SSL=0", "START SLAVE"])

    def plain_refused() -> bool:
        st = replica.slave_status()
        return st.get("Last_IO_Errno") in (3159, 1045, 2026) and \
            "insecure transport" in str(st.get("Last_IO_Error"))
    wait_until(plain_refused, 30, "the relay to refuse the plain replica")
    replica.execute_many(["STOP SLAVE"])

    # The mariadb client and mariadb-binlog over TLS, with the server certificate verified.
    tls_args = [f"--ssl-ca={replica.readable(relay_certs.ca)}", "--ssl-verify-server-cert", "-h", "127.0.0.1",
                "-P", str(relay.port), "-u", "repl", "-prelaypass"]
    out = tool(replica, "mariadb", *tls_args, "-N", "-e", "SHOW STATUS LIKE 'Ssl_version'")
    assert out.returncode == 0 and "TLSv1" in out.stdout, out.stderr
    first = os.path.basename(relay.segments()[0])
    out = tool(replica, "mariadb-binlog", *tls_args, "--read-from-remote-server", "--base64-output=NEVER",
               "--verbose", str(first))
    assert out.returncode == 0 and "three" in out.stdout, out.stderr[-2000:]
    out = tool(replica, "mariadb", "--skip-ssl", "-h", "127.0.0.1", "-P", str(relay.port), "-u", "repl",
               "-prelaypass", "-e", "SELECT 1")
    assert out.returncode != 0 and "insecure transport" in out.stderr, out

    # caching_sha2_password: full authentication over TLS (the first login since the relay
    # started), then the fast path; a wrong password refused.
    def sha2_login(password: str) -> str:
        conn = pymysql.connect(host="127.0.0.1", port=relay.port, user="sha2",
                               password=password, ssl={"ca": relay_certs.ca},
                               connect_timeout=5)
        with contextlib.closing(conn), conn.cursor() as cur:
            cur.execute("SELECT CURRENT_USER()")
            return str(cur.fetchone()[0])  # type: ignore[index]
    assert sha2_login("sha2 secret").startswith("sha2@")
    assert relay.status()["downstream"]["sha2_full_authentications"] == 1
    assert sha2_login("sha2 secret").startswith("sha2@")  # the fast path this time
    assert relay.status()["downstream"]["sha2_full_authentications"] == 1
    with pytest.raises(pymysql.err.OperationalError) as denied:
        sha2_login("wrong")
    assert denied.value.args[0] == 1045

    # A user with require_x509: in with a client certificate of [downstream.tls] ca, not
    # without one; a certificate from another CA fails the TLS handshake itself.
    def x509_login(**cert: str) -> None:
        pymysql.connect(host="127.0.0.1", port=relay.port, user="x509", password="x509pass",
                        ssl={"ca": relay_certs.ca, **cert}, connect_timeout=5).close()
    good_cert, good_key = clients.issue("client-1")
    x509_login(cert=good_cert, key=good_key)
    with pytest.raises(pymysql.err.OperationalError) as no_cert:
        x509_login()
    assert no_cert.value.args[0] == 1045 and "require_x509" in str(no_cert.value)
    bad_cert, bad_key = stranger.issue("client-2")
    with pytest.raises(pymysql.err.OperationalError):
        x509_login(cert=bad_cert, key=bad_key)

    # The tap over TLS; a client that does not trust the relay's CA is refused.
    with TapClient(f"127.0.0.1:{tap_port}", tls=True, tls_ca=relay_certs.ca) as tap:
        assert tap.resolve("latest") > 0
        # its status says the relay's source link is TLS: Spark's snapshot reads then
        # require TLS by default
        assert tap.status()["source_tls"] is True
    with pytest.raises(TapError) as wrong:
        TapClient(f"127.0.0.1:{tap_port}", tls=True, tls_ca=stranger.ca).connect()
    assert wrong.value.code == "tls" and "certificate verify failed" in wrong.value.message
    with pytest.raises((TapError, OSError)):
        TapClient(f"127.0.0.1:{tap_port}", timeout=5).connect()  # plain text

    # Nothing secret in what the relay shows.
    shown = json.dumps(relay.status()) + relay.http("/metrics")[1]
    for secret in ("ed pass 1", "ed%20pass%201", "relaypass", "sha2 secret", ed_key):
        assert secret not in shown and secret not in relay.output(), secret


@pytest.mark.builds("machine", "mariadb-11.8")
def test_caching_sha2_with_rsa_and_login_limits(
        mariadb_factory: Callable[..., MariaDB],
        relay_factory: Callable[..., RelayProcess]) -> None:
    """Without TLS: caching_sha2_password's full authentication with the relay's RSA key;
    then a burst of 1,000 bad logins from one address while a replica keeps streaming:
    the address is blocked (1129) until FLUSH HOSTS; a user's networks and
    max_connections."""
    primary = mariadb_factory(options={"ssl": "OFF"})  # 11.4+ would make a certificate
    primary.execute_many(["CREATE DATABASE s", "CREATE TABLE s.t (id INT PRIMARY KEY)",
                          "INSERT INTO s.t VALUES (1)"])
    users = '''
[[downstream.users]]
name = "repl"
password = "relaypass"
admin = true
[[downstream.users]]
name = "sha2"
plugin = "caching_sha2_password"
password_hash = "{}"
max_connections = 1
[[downstream.users]]
name = "far"
password = "farpass"
networks = ["10.0.0.0/8"]
'''.format(pymysql_sha2_hash("sha2 pw"))
    relay = relay_factory(primary.url, users,
                          downstream={"listen": f"127.0.0.1:{free_port()}",
                                      "max_connect_errors": 50, "max_clients": 400,
                                      "handshake_timeout": "10s"})
    relay.start()
    wait_until(lambda: listening(relay.port), 30, "the relay")
    wait_until(lambda: caught_up(relay, primary), 60, "the relay to catch up")

    def login(user: str, password: str, bind: str | None = None) -> pymysql.Connection:
        return pymysql.connect(host="127.0.0.1", port=relay.port, user=user, password=password,
                               connect_timeout=10, ssl_disabled=True, bind_address=bind)

    # RSA: PyMySQL asks for the relay's public key and sends the password encrypted.
    first = login("sha2", "sha2 pw")
    assert relay.status()["downstream"]["sha2_full_authentications"] == 1
    with pytest.raises(pymysql.err.OperationalError) as capped:
        login("sha2", "sha2 pw")   # max_connections = 1
    assert capped.value.args[0] == 1203
    first.close()
    wait_until(lambda: not [c for c in relay.status()["clients"] if c["user"] == "sha2"], 10,
               "the first sha2 session to end")
    login("sha2", "sha2 pw").close()  # now the fast path
    assert relay.status()["downstream"]["sha2_full_authentications"] == 1
    with pytest.raises(pymysql.err.OperationalError) as far:
        login("far", "farpass")
    assert far.value.args[0] == 1130

    # A relay that requires TLS of a primary that offers none refuses to go on in plain
    # text (its control connection and its dump), and /readyz says why.
    strict = relay_factory(primary.url + "?ssl-mode=REQUIRED", metrics={"ready_grace": "1s"})
    strict.start()

    def refused() -> bool:
        code, body = strict.http("/readyz")
        return code == 503 and "does not offer TLS" in body
    wait_until(refused, 30, "the relay requiring TLS to say why it is not ready")
    assert not strict.segments()

    replica = mariadb_factory(server_id=3)
    replica.replicate_from("127.0.0.1", relay.port, user="repl", password="relaypass")
    wait_until(lambda: replica_rows(replica) == 1, 60, "the replica to start")

    # Snapshot reads (snapshotSource) of a server without TLS. When the relay's own links
    # are plain (no ssl-mode: PREFERRED), in plain text, at once the second time: only
    # mysql_native_password's scramble crosses (a clear-text or RSA-key login is refused:
    # test_security_defaults.py). REQUIRED, given or the default because the relay's links
    # use TLS, is refused, naming the option that decides it.
    plain = f"mysql://repl:replpass@127.0.0.1:{primary.port}"
    assert snapshot_cipher(plain) == ""
    assert snapshot_cipher(plain) == ""
    with pytest.raises(SnapshotError, match=r"support.*ssl-mode=REQUIRED in snapshotSource"):
        snapshot_cipher(f"{plain}?ssl-mode=REQUIRED")
    with pytest.raises(SnapshotError) as required:
        snapshot_cipher(plain, tls_default=TlsMode.REQUIRED)
    assert "the default for snapshot reads when the relay's own links use it" in \
        str(required.value) and "ssl-mode=PREFERRED" in str(required.value)

    # 1,000 bad logins from 127.0.0.1, many at once.
    from concurrent.futures import ThreadPoolExecutor

    def bad(_: int) -> int:
        try:
            login("repl", "guess")
        except pymysql.err.OperationalError as exc:
            return int(exc.args[0])
        return 0
    with ThreadPoolExecutor(64) as pool:
        codes = list(pool.map(bad, range(1000)))
    assert set(codes) <= {1045, 1129}, set(codes)
    assert codes.count(1129) > 0 and codes.count(1045) >= 50
    # The good replica streams throughout.
    primary.execute_many(["INSERT INTO s.t VALUES (2)"])
    wait_until(lambda: replica_rows(replica) == 2, 60, "the replica to stream on")
    st = relay.status()["downstream"]
    assert "127.0.0.1" in st["blocked_hosts"] and st["failed_logins"] >= 50, st
    assert relay.proc is not None and relay.proc.poll() is None
    with pytest.raises(pymysql.err.OperationalError) as blocked:
        login("repl", "relaypass")
    assert blocked.value.args[0] == 1129
    # An admin from another address unblocks it.
    with contextlib.closing(login("repl", "relaypass", bind="127.0.0.2")) as admin, \
            admin.cursor() as cur:
        cur.execute("FLUSH HOSTS")
    login("repl", "relaypass").close()
    assert relay.status()["downstream"]["blocked_hosts"] == []


def snapshot_cipher(url: str, tls_default: TlsMode = TlsMode.PREFERRED) -> str:
    """The TLS cipher of a snapshot read's connection to `url` ("" in plain text)."""
    spec = SourceSpec.parse(url, default_address=None, user=None, password=None,
                            password_env=None, tls_default=tls_default)
    with contextlib.closing(spec.connect(5)) as conn, conn.cursor() as cur:
        cur.execute("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        row = cur.fetchone()
        assert row is not None
        return bytes(row[1]).decode()


def replica_rows(replica: MariaDB) -> int:
    with contextlib.suppress(pymysql.err.ProgrammingError):
        return int(str(replica.query("SELECT COUNT(*) FROM s.t")[0][0]))
    return 0


def pymysql_sha2_hash(password: str) -> str:
    import hashlib
    return hashlib.sha256(hashlib.sha256(password.encode()).digest()).hexdigest()


def test_metrics_over_https_with_a_token_scraped_by_prometheus(
        tmp_path: object, relay_factory: Callable[..., RelayProcess]) -> None:
    """[metrics] with TLS and a bearer token: a real Prometheus scrapes /metrics with the
    token (up = 1) and is refused without it (up = 0); probes stay open; `relay status`
    reads /status with the config's credentials."""
    prometheus = shutil.which("prometheus")
    assert prometheus, "prometheus is missing: scripts/setup installs Debian's prometheus"
    d = str(tmp_path)
    certs = Certs(d, "metrics")
    token_file = os.path.join(d, "token")
    with open(token_file, "w") as f:
        f.write("s3cret-scrape-token\n")
    # No primary needed: the relay serves its metrics while it retries its upstream.
    relay = relay_factory(f"mysql://repl:pw@127.0.0.1:{free_port()}", f'''
[metrics.tls]
cert = "{certs.cert}"
key = "{certs.key}"
''', metrics={"token_file": token_file})
    relay.start()
    wait_until(lambda: listening(relay.metrics_port), 30, "the metrics endpoint")
    base = f"https://127.0.0.1:{relay.metrics_port}"
    context = ssl.create_default_context(cafile=certs.ca)

    def get(path: str, token: str | None = None) -> int:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            with urllib.request.urlopen(urllib.request.Request(base + path, headers=headers),
                                        context=context, timeout=5) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
    assert get("/metrics") == 401 and get("/status", "wrong") == 401
    assert get("/metrics", "s3cret-scrape-token") == 200
    assert get("/healthz") == 200 and get("/readyz") in (200, 503)

    web = free_port()
    with open(os.path.join(d, "prometheus.yml"), "w") as f:
        f.write(f"""
global: {{scrape_interval: 1s, scrape_timeout: 1s}}
scrape_configs:
  - job_name: with_token
    scheme: https
    tls_config: {{ca_file: {certs.ca}}}
    authorization: {{credentials_file: {token_file}}}
    static_configs: [{{targets: ["127.0.0.1:{relay.metrics_port}"]}}]
  - job_name: without_token
    scheme: https
    tls_config: {{ca_file: {certs.ca}}}
    static_configs: [{{targets: ["127.0.0.1:{relay.metrics_port}"]}}]
""")
    proc = subprocess.Popen([prometheus, f"--config.file={d}/prometheus.yml",
                             f"--storage.tsdb.path={d}/tsdb", f"--web.listen-address=127.0.0.1:{web}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        def up() -> dict[str, str]:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{web}/api/v1/query?query=up",
                                            timeout=5) as resp:
                    result = json.loads(resp.read())["data"]["result"]
            except (urllib.error.URLError, OSError, KeyError):
                return {}
            return {r["metric"]["job"]: r["value"][1] for r in result}
        wait_until(lambda: len(up()) == 2, 60, "Prometheus to scrape both jobs")
        assert up() == {"with_token": "1", "without_token": "0"}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    # relay status reads /status with the credentials of --config.
    out = subprocess.run([sys.executable, "-m", "relay.cli", "status", "--config",
                          relay.config_path], capture_output=True, text=True, timeout=60)
    assert "upstream" in out.stdout.lower(), out.stdout + out.stderr
    assert "s3cret-scrape-token" not in relay.output() + out.stdout + out.stderr
