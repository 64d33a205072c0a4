"""Authentication without servers: the scrambles and their server-side checks, MariaDB's
ed25519 (against standard Ed25519 for 32-byte secrets), the client's side of the exchange
fed the MySQL 8 captures in tests/data/mysql8 (every caching_sha2 branch on a plain link,
the auth switch, a plugin the relay does not speak), the TLS URL parameters, the
failed-login guard and account networks."""

from __future__ import annotations

import json
import os
import time

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ed25519 as std_ed25519
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from relay.config import AuthPlugin, DownstreamUser, Source, TlsMode, validated
from relay.downstream.accounts import Account, account_of
from relay.errors import AuthError, ConfigError
from relay.logins import LoginGuard
from relay.wire import ed25519
from relay.wire.auth import (
    CACHING_SHA2,
    CLIENT_ED25519,
    NATIVE_PASSWORD,
    ClientAuth,
    ed25519_verify,
    native_password_hash,
    native_scramble,
    native_verify,
    rsa_decrypt_password,
    sha2_password_hash,
    sha2_scramble,
    sha2_verify,
    sha2_verify_cleartext,
)
from relay.wire.handshake import parse_greeting
from relay.wire.login_policy import LoginPolicy
from relay.wire.shacrypt import StoredHash, sha256_crypt

CAPTURES = os.path.join(os.path.dirname(__file__), "..", "data", "mysql8",
                        "mysql-handshake-packets-from-zeek-pcaps.json")


def test_scrambles_verify_and_refuse() -> None:
    nonce = os.urandom(20)
    for pw in (b"secret", b"p\xc3\xa4ss word"):
        assert native_verify(native_password_hash(pw), nonce, native_scramble(pw, nonce))
        assert not native_verify(native_password_hash(pw), nonce, native_scramble(b"x", nonce))
        stored = sha2_password_hash(pw)
        assert sha2_verify(stored, nonce, sha2_scramble(pw, nonce))
        assert not sha2_verify(stored, nonce, sha2_scramble(b"x", nonce))
        assert not sha2_verify(stored, os.urandom(20), sha2_scramble(pw, nonce))
        assert sha2_verify_cleartext(stored, pw) and not sha2_verify_cleartext(stored, b"x")
    assert sha2_verify(b"", nonce, b"") and not sha2_verify(b"", nonce, b"x")


def test_ed25519_is_standard_ed25519_with_any_length_secret() -> None:
    message = os.urandom(32)
    for seed in (os.urandom(32), bytes(32)):  # a 32-byte secret: standard Ed25519's seed
        key = std_ed25519.Ed25519PrivateKey.from_private_bytes(seed)
        raw = key.public_key().public_bytes(serialization.Encoding.Raw,
                                            serialization.PublicFormat.Raw)
        assert ed25519.public_key(seed) == raw
        assert ed25519.sign(seed, message) == key.sign(message)
    pw = b"a password of any length at all"
    signature = ed25519.sign(pw, message)
    assert ed25519_verify(ed25519.public_key(pw), message, signature)
    assert not ed25519_verify(ed25519.public_key(b"other"), message, signature)
    text = ed25519.public_key_text(pw)
    assert len(text) == 43 and ed25519.parse_public_key(text) == ed25519.public_key(pw)


def _connections() -> list[list[dict[str, object]]]:
    with open(CAPTURES) as f:
        data = json.load(f)
    return [c["packets"] for cap in data["captures"] for c in cap["connections"]]


def _payload(packet: dict[str, object]) -> bytes:
    return bytes.fromhex(str(packet["wire_hex"]))[4:]


def test_client_side_against_mysql8_captures() -> None:
    """Each server packet of the captures, in order, into ClientAuth: what it answers has
    the shape libmysqlclient's answer has in the capture."""
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    checked = set()
    for packets in _connections():
        greeting_packets = [p for p in packets if "HandshakeV10" in str(p["what"])]
        if not greeting_packets or any(p["what"] == "SSLRequest" for p in packets):
            continue
        greeting = parse_greeting(_payload(greeting_packets[0]))
        auth = ClientAuth(b"pw", tls=False, policy=LoginPolicy(allow_key_request=True))
        first = auth.first_response(greeting.auth_plugin, greeting.scramble)
        assert len(first) == (32 if greeting.auth_plugin == CACHING_SHA2 else 20)
        for packet in packets[1:]:
            what = str(packet["what"])
            payload = _payload(packet)
            if packet["dir"] != "server->client":
                continue
            if payload[:1] in (b"\x00", b"\xff"):
                break   # authentication is over
            if "sha256_password" in what or b"sha256_password" in payload:
                with pytest.raises(AuthError, match="sha256_password"):
                    auth.answer(payload)
                checked.add("unknown plugin")
                break
            if "PEM" in what or payload.startswith(b"\x01-----BEGIN"):
                # The capture's key has its private half elsewhere: answer ours instead.
                pem = rsa_key.public_key().public_bytes(
                    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
                answer = auth.answer(b"\x01" + pem)
                assert answer is not None and len(answer) == 256
                plain = rsa_key.decrypt(answer, padding.OAEP(
                    mgf=padding.MGF1(hashes.SHA1()), algorithm=hashes.SHA1(), label=None))
                mask = (greeting.scramble * 2)[: len(plain)]
                assert bytes(a ^ b for a, b in zip(plain, mask, strict=True)) == b"pw\0"
                assert rsa_decrypt_password(rsa_key, answer, greeting.scramble) == b"pw"
                checked.add("rsa")
                continue
            answer = auth.answer(payload)
            if payload == b"\x01\x04":
                assert answer == b"\x02"            # no TLS: ask for the server's key
                checked.add("full")
            elif payload == b"\x01\x03":
                assert answer is None              # OK follows
                checked.add("fast")
            elif payload[:1] == b"\xfe":
                assert answer is not None
                assert len(answer) == (32 if auth.plugin == CACHING_SHA2 else 20)
                checked.add(f"switch to {auth.plugin}")
    assert {"full", "fast", "rsa", "unknown plugin", f"switch to {CACHING_SHA2}",
            f"switch to {NATIVE_PASSWORD}"} <= checked, checked


def test_client_full_auth_over_tls_and_ed25519_nonce() -> None:
    auth = ClientAuth(b"pw", tls=True)
    auth.first_response(CACHING_SHA2, os.urandom(20))
    assert auth.answer(b"\x01\x04") == b"pw\0"   # over TLS the password goes as it is
    ed = ClientAuth(b"pw", tls=False)
    ed.first_response(NATIVE_PASSWORD, os.urandom(20))
    nonce = os.urandom(31) + b"\0"              # a nonce may end in NUL: it is all nonce
    signature = ed.answer(b"\xfe" + CLIENT_ED25519.encode() + b"\0" + nonce)
    assert signature is not None and ed25519_verify(ed25519.public_key(b"pw"), nonce, signature)
    with pytest.raises(AuthError):
        ed.answer(b"\x01\x03")                  # AuthMoreData outside caching_sha2
    ed.answer(b"\xfe" + CLIENT_ED25519.encode() + b"\0" + nonce)   # a second switch
    with pytest.raises(AuthError, match="more than 2"):
        ed.answer(b"\xfe" + CLIENT_ED25519.encode() + b"\0" + nonce)
    # Without TLS, full authentication would trust the key the network sends: refused
    # unless allowed (get-server-public-key), and a bad key is a clean error.
    plain = ClientAuth(b"pw", tls=False)
    plain.first_response(CACHING_SHA2, os.urandom(20))
    with pytest.raises(AuthError, match="get-server-public-key"):
        plain.answer(b"\x01\x04")
    allowed = ClientAuth(b"pw", tls=False, policy=LoginPolicy(allow_key_request=True))
    allowed.first_response(CACHING_SHA2, os.urandom(20))
    assert allowed.answer(b"\x01\x04") == b"\x02"
    with pytest.raises(AuthError, match="unusable"):
        allowed.answer(b"\x01-----BEGIN PUBLIC KEY-----\ngarbage\n-----END PUBLIC KEY-----\n")


def test_source_tls_parameters() -> None:
    s = Source.parse("mysql://u:p@db:3306?ssl-mode=verify_identity&ssl-ca=/ca.pem")
    assert s.tls.mode is TlsMode.VERIFY_IDENTITY and s.tls.ca == "/ca.pem"
    assert Source.parse("mysql://u@db?ssl-ca=/ca.pem").tls.mode is TlsMode.VERIFY_CA
    assert Source.parse("mysql://u@db").tls.mode is TlsMode.DISABLED
    with pytest.raises(ValueError, match="did you mean ssl-ca"):
        Source.parse("mysql://u:p@db?ssl_ca=/x")
    with pytest.raises(ValueError, match="ssl-mode='sometimes'"):
        Source.parse("mysql://u@db?ssl-mode=sometimes")
    with pytest.raises(ValueError, match="together"):
        Source.parse("mysql://u@db?ssl-cert=/c.pem")
    assert str(s) == "u@db:3306"  # no password
    assert Source.parse("mysql://u@db?get-server-public-key=true").get_server_public_key


def test_login_guard_backs_off_blocks_and_flushes(monkeypatch: pytest.MonkeyPatch) -> None:
    guard = LoginGuard(max_errors=5, block_time=60)
    delays = [guard.failure("10.0.0.1") for _ in range(4)]
    assert delays[0] == 0 and delays[1] < delays[2] < delays[3]
    assert not guard.blocked("10.0.0.1")
    guard.failure("10.0.0.1")
    assert guard.blocked("10.0.0.1") and not guard.blocked("10.0.0.2")
    assert guard.blocked_hosts() == ["10.0.0.1"]
    guard.flush()
    assert not guard.blocked("10.0.0.1")
    for _ in range(5):
        guard.failure("10.0.0.3")
    now = time.monotonic()
    monkeypatch.setattr(time, "monotonic", lambda: now + 61)
    assert not guard.blocked("10.0.0.3")      # the block time passed
    guard.failure("10.0.0.4")
    guard.success("10.0.0.4")
    assert guard.failure("10.0.0.4") == 0      # a good login reset the count


def test_account_networks() -> None:
    account = Account.with_password("u", "pw", AuthPlugin.NATIVE)
    assert account.allows_host("192.0.2.1")
    import ipaddress
    limited = Account("u", b"", networks=(ipaddress.ip_network("10.0.0.0/8"),))
    assert limited.allows_host("10.1.2.3") and limited.allows_host("::ffff:10.1.2.3")
    assert not limited.allows_host("192.0.2.1") and not limited.allows_host("garbage")


async def test_the_relays_port_with_pymysql_and_unknown_users_get_a_decoy(
        tmp_path: object) -> None:
    """PyMySQL against the relay's own port (no database): caching_sha2 in and out, and an
    unknown user refused after the exchange of a decoy account of a configured plugin."""
    import asyncio

    import pymysql

    from relay.config import SyncMode, SyncPolicy
    from relay.downstream.context import DownstreamSettings
    from relay.downstream.server import DownstreamServer
    from relay.relaylog.log import RelayLog

    log = RelayLog(str(tmp_path), sync=SyncPolicy(SyncMode.OFF))
    log.open()
    log.start()
    accounts = {"s": Account.with_password("s", "pw", AuthPlugin.CACHING_SHA2),
                "e": Account.with_password("e", "pw", AuthPlugin.ED25519),
                "m": sha2_account("m", MYSQL_FOOBAR_HEX)}
    server = DownstreamServer(log, DownstreamSettings("127.0.0.1", 0, accounts, 4242,
                                                      handshake_timeout=5))
    await server.start()
    try:
        def login(user: str, password: str) -> int:
            try:
                pymysql.connect(host="127.0.0.1", port=server.port, user=user,
                                password=password, ssl_disabled=True, connect_timeout=5,
                                ).close()
            except pymysql.err.OperationalError as exc:
                return int(exc.args[0])
            return 0
        assert await asyncio.to_thread(login, "s", "pw") == 0   # full authentication, RSA
        assert await asyncio.to_thread(login, "s", "pw") == 0   # the fast path
        assert server.auth.sha2_full_authentications == 1
        assert await asyncio.to_thread(login, "s", "wrong") == 1045
        # A user whose password_hash MySQL made ($A$005$..., copied from mysql.user):
        # full authentication checks the SHA-256 crypt, then the fast path takes over.
        assert await asyncio.to_thread(login, "m", "foobaz") == 1045
        assert await asyncio.to_thread(login, "m", "foobar") == 0
        assert await asyncio.to_thread(login, "m", "foobar") == 0
        assert server.auth.sha2_full_authentications == 2
        # (a decoy of ed25519 would need PyMySQL's optional pynacl: take a name whose
        # decoy is caching_sha2, which then asks for full authentication, as for "s";
        # with stored $A$ hashes configured, a decoy's check costs a SHA-256 crypt too)
        # With one stored $A$ hash and one plain one configured, decoys take either kind,
        # so the time of a full authentication does not tell an unknown name apart.
        sha2_decoys = [d for d in (server.auth.decoy(f"nobody{i}") for i in range(200))
                       if d.plugin is AuthPlugin.CACHING_SHA2]
        assert {d.credential.startswith(b"$A$005$") for d in sha2_decoys} == {True, False}
        nobody = next(d.name for d in sha2_decoys if d.credential.startswith(b"$A$005$"))
        assert await asyncio.to_thread(login, nobody, "pw") == 1045
        assert server.auth.sha2_full_authentications == 2
        # aiomysql scrambles an auth switch's nonce with its NUL, so its fast path never
        # matches: as MySQL does, the relay falls back to full authentication (RSA here).
        import aiomysql
        conn = await aiomysql.connect(host="127.0.0.1", port=server.port, user="s",
                                      password="pw", connect_timeout=5)
        conn.close()
        assert server.auth.sha2_full_authentications == 3
        with pytest.raises(pymysql.err.OperationalError):
            await aiomysql.connect(host="127.0.0.1", port=server.port, user="s",
                                   password="wrong", connect_timeout=5)
        decoys = {server.auth.decoy(f"user{i}").plugin for i in range(64)}
        assert decoys == {AuthPlugin.CACHING_SHA2, AuthPlugin.ED25519}
        assert server.auth.decoy("x") == server.auth.decoy("x")
    finally:
        await server.close()
        log.close()


async def test_metrics_basic_auth_from_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """[metrics] basic_user / basic_password_env: /metrics needs that Authorization,
    /healthz does not; an unset variable or an empty token file is a config error."""
    import asyncio
    import base64
    import urllib.error
    import urllib.request

    from relay.config import MetricsSection
    from relay.errors import ConfigError
    from relay.ops.service import Operations

    monkeypatch.setenv("PROM_PW", "pr0m")
    section = MetricsSection(basic_user="prometheus", basic_password_env="PROM_PW")
    metrics = Operations(ready_max_lag=60, ready_grace=30, credentials=section.credentials())
    await metrics.http.serve("127.0.0.1", 0)
    try:
        def get(path: str, auth: str | None) -> int:
            headers = {"Authorization": auth} if auth else {}
            request = urllib.request.Request(f"http://127.0.0.1:{metrics.http.port}{path}",
                                             headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=5) as resp:
                    return int(resp.status)
            except urllib.error.HTTPError as exc:
                return int(exc.code)
        good = "Basic " + base64.b64encode(b"prometheus:pr0m").decode()
        bad = "Basic " + base64.b64encode(b"prometheus:guess").decode()
        assert await asyncio.to_thread(get, "/metrics", good) == 200
        assert await asyncio.to_thread(get, "/metrics", bad) == 401
        assert await asyncio.to_thread(get, "/metrics", None) == 401
        assert await asyncio.to_thread(get, "/healthz", None) == 200
    finally:
        await metrics.http.close()
    monkeypatch.delenv("PROM_PW")
    with pytest.raises(ConfigError, match="PROM_PW"):
        section.credentials()
    with pytest.raises(ValueError, match="not both"):
        MetricsSection(token_env="A", basic_user="u", basic_password_env="B")


# Made by MySQL servers (public test data): "foobar" from Vitess's tests, the others from
# a test of MySQL hash generation with salts holding control characters.
MYSQL_FOOBAR_HEX = (
    "0x24412430303524031A69251C34295C4B35167C7F1E5A7B63091349503974624D34504B5A4246793548"
    "56336868686F52485A736E4A733368786E427575516C73446469496537")
MYSQL_HASHES = {
    "9Aq7z": b'$A$005$9?\x113I\x03c@<~\r"c@g\x15F"z!f4egYDpJtjssix4x7rpd3RIxXlzLK4eeZcST.5SIzc1',
    "CMunq1PrKH": b"$A$005$&M\x15\x06UEK\rS#{: d}\x1a\x1ak'Pmqo1L9Dlfn03ogl4DiNubgaRsN4FYJjhE57s08"
                  b"Z39s2",
}


def sha2_account(name: str, password_hash: str) -> Account:
    return account_of(validated(DownstreamUser,
        {"name": name, "plugin": "caching_sha2_password", "password_hash": password_hash}))


def test_sha256_crypt_is_drepper_s_and_reads_mysql_s_stored_hashes() -> None:
    # The algorithm's published vectors (glibc's $5$, salts of at most 16 bytes) ...
    assert sha256_crypt(b"Hello world!", b"saltstring") == \
        b"5B8vYYiY.CVt1RlTTf8KbXBH3hsxY/GNooZaBBGWEc5"
    assert sha256_crypt(b"This is just a test", b"toolongsaltstrin") == \
        b"Un/5jzAHMgOGZ5.mWJpuVolil07guHPvOW8mGRcvxa5"
    # ... and MySQL's 20-byte salts in its $A$<rounds>$ framing.
    for password, stored in MYSQL_HASHES.items():
        parsed = StoredHash.parse(stored)
        assert parsed.rounds == 5000 and len(parsed.salt) == 20
        assert parsed.matches(password.encode())
        assert not parsed.matches(password.encode() + b"x")
    foobar = bytes.fromhex(MYSQL_FOOBAR_HEX[2:])
    assert sha2_verify_cleartext(foobar, b"foobar")
    assert not StoredHash.parse(foobar).matches(b"x" * 257)  # refused unhashed, as MySQL
    assert not sha2_verify_cleartext(foobar, b"Foobar")
    for bad, why in [(b"$5$abc", "starts with"), (b"$A$0z5$" + b"x" * 63, "hexadecimal"),
                     (b"$A$005$short", "20-byte salt"), (b"$A$000$" + b"x" * 63, "range")]:
        with pytest.raises(ValueError, match=why):
            StoredHash.parse(bad)


def test_password_hash_in_mysql_s_form_or_hex_and_wrong_ones_named() -> None:
    stored = MYSQL_HASHES["9Aq7z"].decode("latin-1")
    for text in (stored, MYSQL_FOOBAR_HEX):
        account = sha2_account("u", text)
        assert account.credential.startswith(b"$A$005$")
    with pytest.raises(ConfigError, match=r"user 'u': password_hash.*20-byte salt"):
        sha2_account("u", "$A$005$tooshort")


def test_a_user_without_a_plugin_takes_the_flavours_default() -> None:
    from relay.wire.auth import native_password_hash, sha2_password_hash

    plain = account_of(DownstreamUser(name="repl", password="pw"))
    assert plain.plugin is AuthPlugin.NATIVE and plain.credential == native_password_hash(b"pw")
    assert plain.for_default(AuthPlugin.NATIVE) is plain   # a MariaDB relay
    mysql = plain.for_default(AuthPlugin.CACHING_SHA2)       # a MySQL relay
    assert mysql.plugin is AuthPlugin.CACHING_SHA2
    assert mysql.credential == sha2_password_hash(b"pw")
    # A plugin said, or a hash given (a mysql_native_password hash): kept on both.
    said = account_of(DownstreamUser(name="a", password="pw",
                                     plugin=AuthPlugin.CACHING_SHA2))
    assert said.for_default(AuthPlugin.NATIVE).plugin is AuthPlugin.CACHING_SHA2
    hashed = account_of(DownstreamUser(
        name="b", password_hash="*2470C0C06DEE42FD1618BB99005ADCA2EC9D1E19"))
    assert hashed.for_default(AuthPlugin.CACHING_SHA2).plugin is AuthPlugin.NATIVE


def test_one_login_policy_for_every_client_of_a_primary() -> None:
    from relay.wire.login_policy import LoginRefused

    strict = LoginPolicy(tls_required=True)
    with pytest.raises(LoginRefused) as refused:
        strict.greeted(offers_tls=False, secure=False, method="caching_sha2_password",
                       has_password=True)
    assert refused.value.errno == 2026
    strict.greeted(offers_tls=True, secure=True, method="sha256_password", has_password=True)
    plain = LoginPolicy(hint="; (where to set it)")
    for method in ("mysql_clear_password", "dialog"):
        with pytest.raises(LoginRefused, match=r"clear text.*where to set it"):
            plain.switched(method, secure=False, has_password=True)
        plain.switched(method, secure=True, has_password=True)   # over TLS: fine
    # The server's RSA key over plain text: only with get-server-public-key.
    with pytest.raises(LoginRefused, match="get-server-public-key"):
        plain.greeted(offers_tls=False, secure=False, method="sha256_password",
                      has_password=True)
    with pytest.raises(LoginRefused, match="get-server-public-key") as refused:
        plain.full_authentication(secure=False)
    assert refused.value.errno == 2061
    trusting = LoginPolicy(allow_key_request=True)
    trusting.full_authentication(secure=False)
    trusting.switched("sha256_password", secure=False, has_password=True)
    plain.full_authentication(secure=True)
    # The binlog connection's own client follows it too (an AuthError to its caller).
    auth = ClientAuth(b"pw", tls=False)
    with pytest.raises(AuthError, match="clear text"):
        auth.answer(b"\xfemysql_clear_password\0")


def test_a_greeting_may_not_ask_for_what_a_switch_may_not() -> None:
    from relay.wire.login_policy import LoginRefused

    # aiomysql answers a greeting naming mysql_clear_password with the password in clear.
    with pytest.raises(LoginRefused, match="clear text"):
        LoginPolicy().greeted(offers_tls=False, secure=False, method="mysql_clear_password",
                              has_password=True)
    LoginPolicy().greeted(offers_tls=True, secure=True, method="mysql_clear_password",
                          has_password=True)
