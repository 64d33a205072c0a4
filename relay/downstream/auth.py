"""The connection phase of a downstream client, as a server runs it: the greeting (offering
TLS with `[downstream.tls]` or a certificate made at start), the switch to TLS, the
client's response, the user's plugin (mysql_native_password, ed25519, caching_sha2_password
with its fast path and full authentication over TLS or RSA) with the plugin switch a client
expects, the account's networks, TLS requirement and connection cap, failed-login back-off
per address, and the OK (with MariaDB's proof of the certificate through the password) or
the error a server sends."""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from relay.binlog.charsets import charset_name
from relay.config import AuthPlugin
from relay.downstream.accounts import Account
from relay.downstream.connection import PacketConnection
from relay.logins import LoginGuard
from relay.tls import ServerTls, Throttle, tls_failure
from relay.wire import handshake, shacrypt
from relay.wire.auth import (
    CACHING_SHA2,
    CLIENT_ED25519,
    FAST_AUTH_OK,
    NATIVE_PASSWORD,
    PERFORM_FULL_AUTH,
    REQUEST_PUBLIC_KEY,
    ed25519_verify,
    native_verify,
    rsa_decrypt_password,
    rsa_public_pem,
    sha2_password_hash,
    sha2_verify,
    sha2_verify_cleartext,
    tls_password_proof,
)
from relay.wire.handshake import CLIENT_SSL, SSL_REQUEST_LEN
from relay.wire.replies import OK_PACKET, build_err, build_ok

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey

log = logging.getLogger("relay.downstream")

ER_ACCESS_DENIED = 1045
ER_HOST_IS_BLOCKED = 1129
ER_HOST_NOT_PRIVILEGED = 1130
ER_TOO_MANY_USER_CONNECTIONS = 1203
ER_SECURE_TRANSPORT_REQUIRED = 3159

_CLIENT_PLUGIN = {AuthPlugin.NATIVE: NATIVE_PASSWORD, AuthPlugin.ED25519: CLIENT_ED25519,
                  AuthPlugin.CACHING_SHA2: CACHING_SHA2}


@dataclass(frozen=True)
class Login:
    user: str
    collation: int | None   # the handshake's character set, when the relay knows it
    account: Account
    tls: bool


def _nonce(n: int) -> bytes:
    return bytes(b % 94 + 33 for b in os.urandom(n))  # printable, no NUL


class Authenticator:
    """Logs clients in. Owns what outlives one connection: the caching_sha2 cache (users
    that passed full authentication since the relay started, as MySQL's cache), the RSA key
    for clients without TLS (made on first need), and the failed-login guard."""

    def __init__(self, accounts: dict[str, Account], *, tls: ServerTls | None,
                 guard: LoginGuard, connections_of: Callable[[str], int],
                 handshake_timeout: float = 10.0) -> None:
        self.accounts = accounts
        self.handshake_timeout = handshake_timeout
        self.tls = tls
        self.guard = guard
        self._connections_of = connections_of
        # caching_sha2's cache: SHA256(SHA256(pw)) of each user that passed a full
        # authentication since the relay started (its fast path checks scrambles with it).
        self._sha2_cache: dict[str, bytes] = {}
        self._crypt_lock = asyncio.Lock()
        self._secret = os.urandom(32)   # decoys for unknown users
        self._rsa: RSAPrivateKey | None = None
        self._rsa_lock = asyncio.Lock()
        self.sha2_full_authentications = 0   # /status: the fast path's misses
        self._tls_failures = Throttle()
        # /status: clients whose TLS handshake failed, or that hung up right after it
        # (they refused the certificate)
        self.tls_failures = 0

    async def authenticate(self, conn: PacketConnection, *, greeting_version: str,
                           conn_id: int, default_plugin: AuthPlugin = AuthPlugin.NATIVE
                           ) -> Login | None:
        """None: the client was refused (the error is sent). `default_plugin`: the
        flavour's (named in the greeting; users configured without a plugin take it)."""
        if self.guard.blocked(conn.host):
            conn.send([build_err(ER_HOST_IS_BLOCKED, f"Host '{conn.host}' is blocked because "
                                 "of many connection errors; unblock with 'FLUSH HOSTS'",
                                 "HY000")])
            return None
        nonce = _nonce(20)
        caps = handshake.SERVER_CAPS | (CLIENT_SSL if self.tls is not None else 0)
        conn.send([handshake.build_greeting(greeting_version, conn_id, nonce, caps,
                                            plugin=_CLIENT_PLUGIN[default_plugin])])
        payload = await conn.read()
        encrypted = False
        fingerprint = b""   # of the certificate this client was offered
        if len(payload) == SSL_REQUEST_LEN:
            if self.tls is None:
                conn.send([build_err(ER_ACCESS_DENIED, "relay does not offer TLS", "28000")])
                return None
            context, fingerprint = self.tls.current()
            try:
                await conn.open_streams(context, self.handshake_timeout)
            except (ssl.SSLError, OSError) as exc:
                self._tls_failed(conn, f"TLS handshake failed: {tls_failure(exc)}")
                return None
            encrypted = True
            try:
                payload = await conn.read()
            except (asyncio.IncompleteReadError, ConnectionError):
                # MariaDB's clients check the certificate after the handshake and hang up
                # on one they do not trust (MySQL's refuse it within the handshake).
                self._tls_failed(conn, "the client hung up right after the TLS handshake, "
                                 "before it logged in: it does not trust the relay's "
                                 "certificate")
                return None
        else:
            await conn.open_streams()
        resp = handshake.parse_response(payload)
        conn.capabilities = resp.capabilities
        if self.tls is not None and self.tls.required and not encrypted:
            conn.send([build_err(ER_SECURE_TRANSPORT_REQUIRED, "Connections using insecure "
                                 "transport are prohibited ([downstream.tls] require = true)",
                                 "08004")])
            log.warning("client %s: refused, it did not switch to TLS (user %r)", conn.peer,
                        resp.user)
            return None
        account = self.accounts.get(resp.user)
        if account is not None:
            account = account.for_default(default_plugin)
        # An unknown user goes through the exchange of a decoy account (MySQL does the
        # same), so the packets do not tell which users exist.
        checked = account if account is not None else self.decoy(resp.user, default_plugin)
        plugin = checked.plugin
        client_plugin = _CLIENT_PLUGIN[plugin]
        auth, used = resp.auth_response, nonce
        if plugin is AuthPlugin.ED25519 and (resp.plugin != client_plugin or len(auth) != 64):
            # Its own 32-byte nonce, also to a client that began in client_ed25519 with a
            # placeholder (--default-auth=client_ed25519)
            used = _nonce(32)
            conn.send([b"\xfe" + client_plugin.encode() + b"\0" + used])
            auth = await conn.read()
        elif resp.plugin != client_plugin:
            conn.send([b"\xfe" + client_plugin.encode() + b"\0" + nonce + b"\0"])
            auth = await conn.read()
        ok = await self._check(conn, checked, used, auth, encrypted)
        if account is None or not ok:
            return await self._deny(conn, resp.user, bool(auth))
        denied = self._policy(conn, account, encrypted)
        if denied is not None:
            conn.send([denied])
            return None
        self.guard.success(conn.host)
        conn.send([self._ok(account, nonce, fingerprint)])
        return Login(resp.user, resp.charset if charset_name(resp.charset) is not None
                     else None, account, encrypted)

    def _tls_failed(self, conn: PacketConnection, why: str) -> None:
        self.tls_failures += 1
        if (suppressed := self._tls_failures.allow()) is not None:
            log.warning("client %s: %s%s", conn.peer, why, suppressed)

    @staticmethod
    def _ok(account: Account, nonce: bytes, fingerprint: bytes) -> bytes:
        """The OK that ends a login. Over TLS, for a password plugin, it carries the proof
        of MariaDB 11.4+ (zero-configuration TLS): a client that cannot verify the
        certificate it was offered (a self-signed one) accepts it when the OK's info is 0x01
        and the hex (upper case) of SHA-256(password hash, the greeting's 20-byte scramble,
        SHA-256 of the certificate): only a server that knows the password's hash can make
        it, and only for that certificate, so a man in the middle with a certificate of his
        own cannot. The hash is the plugin's `hash_password_bin`: SHA1(SHA1(pw)) for
        mysql_native_password, the Ed25519 public key for ed25519 (MariaDB Connector/C's
        plugins/auth/my_auth.c, run_plugin_auth)."""
        if not fingerprint or not account.credential or account.plugin not in (
                AuthPlugin.NATIVE, AuthPlugin.ED25519):
            return OK_PACKET
        return build_ok(info=tls_password_proof(account.credential, nonce, fingerprint))

    def decoy(self, user: str, default_plugin: AuthPlugin = AuthPlugin.NATIVE) -> Account:
        """The same plugin for the same unknown name, among the plugins users log in with
        (under the flavour's `default_plugin`), and a credential no password matches."""
        digest = hmac.new(self._secret, user.encode(), "sha256").digest()
        logins = [a.for_default(default_plugin) for a in self.accounts.values()]
        plugins = sorted({a.plugin for a in logins} or {default_plugin}, key=lambda p: p.value)
        plugin = plugins[digest[0] % len(plugins)]
        # caching_sha2 users' full authentication costs a SHA-256 crypt for a stored "$A$"
        # hash and almost nothing for a plain one: an unknown name costs what one of them
        # costs (as many of each kind as there are), so the time does not tell it apart.
        kinds = sorted(a.credential.startswith(shacrypt.PREFIX) for a in logins
                       if a.plugin is AuthPlugin.CACHING_SHA2)
        if plugin is AuthPlugin.CACHING_SHA2 and kinds and kinds[digest[1] % len(kinds)]:
            salt = bytes(33 + b % 94 for b in digest[:shacrypt.SALT_LEN])  # no NUL, no $
            return Account(user, shacrypt.PREFIX + b"005$" + salt + b"." * shacrypt.DIGEST_LEN,
                           plugin)
        return Account(user, digest[:20] if plugin is AuthPlugin.NATIVE else digest, plugin)

    async def _deny(self, conn: PacketConnection, user: str, with_password: bool
                    ) -> Login | None:
        """Refuse a wrong password (after the back-off for its address); None."""
        delay = self.guard.failure(conn.host)
        log.warning("client %s: access denied for user %r", conn.peer, user)
        if delay:
            await asyncio.sleep(delay)   # back-off: a guessing client slows down
        conn.send([build_err(ER_ACCESS_DENIED, f"Access denied for user '{user}'@'{conn.host}'"
                             f" (using password: {'YES' if with_password else 'NO'})",
                             "28000")])
        return None

    def _policy(self, conn: PacketConnection, account: Account, encrypted: bool
                ) -> bytes | None:
        """The account's own limits, checked once its password is proven."""
        if not account.allows_host(conn.host):
            return build_err(ER_HOST_NOT_PRIVILEGED, f"Host '{conn.host}' is not allowed to "
                             "connect as this user", "HY000")
        if account.require_tls and not encrypted:
            return build_err(ER_ACCESS_DENIED, f"Access denied for user '{account.name}'@"
                             f"'{conn.host}': it must connect with TLS (require_tls)", "28000")
        if account.require_x509 and not conn.has_client_certificate():
            return build_err(ER_ACCESS_DENIED, f"Access denied for user '{account.name}'@"
                             f"'{conn.host}': it must present a client certificate signed by "
                             "[downstream.tls] ca (require_x509)", "28000")
        if account.max_connections and \
                self._connections_of(account.name) >= account.max_connections:
            return build_err(ER_TOO_MANY_USER_CONNECTIONS, f"User '{account.name}' has "
                             "exceeded the 'max_connections' resource", "42000")
        return None

    async def _check(self, conn: PacketConnection, account: Account, nonce: bytes,
                     auth: bytes, encrypted: bool) -> bool:
        if account.plugin is AuthPlugin.NATIVE:
            return native_verify(account.credential, nonce, auth)
        if account.plugin is AuthPlugin.ED25519:
            return ed25519_verify(account.credential, nonce, auth)
        return await self._sha2(conn, account, nonce, auth, encrypted)

    async def _sha2(self, conn: PacketConnection, account: Account, nonce: bytes,
                    auth: bytes, encrypted: bool) -> bool:
        if not account.credential or not auth:
            return not account.credential and not auth
        cached = self._sha2_cache.get(account.name)
        if cached is not None and sha2_verify(cached, nonce, auth):
            conn.send([bytes((1, FAST_AUTH_OK))])
            return True
        # Not cached, or a scramble that does not match: full authentication, as MySQL
        # does (aiomysql, for one, scrambles an auth switch's nonce with its NUL).
        conn.send([bytes((1, PERFORM_FULL_AUTH))])
        packet = await conn.read()
        if encrypted:
            password = packet.rstrip(b"\0")
        else:
            key = await self._key()
            if packet == bytes((REQUEST_PUBLIC_KEY,)):
                conn.send([b"\x01" + rsa_public_pem(key)])
                packet = await conn.read()
            decrypted = rsa_decrypt_password(key, packet, nonce)
            if decrypted is None:
                return False
            password = decrypted
        if account.credential.startswith(shacrypt.PREFIX):
            # 5,000 rounds (6 ms): off the loop, one at a time (the GIL is held throughout,
            # so more at once only takes more of the loop's time).
            async with self._crypt_lock:
                ok = await asyncio.to_thread(sha2_verify_cleartext, account.credential,
                                             password)
        else:
            ok = sha2_verify_cleartext(account.credential, password)
        if ok:
            self._sha2_cache[account.name] = sha2_password_hash(password)
            self.sha2_full_authentications += 1
        return ok

    async def _key(self) -> RSAPrivateKey:
        async with self._rsa_lock:
            if self._rsa is None:
                from cryptography.hazmat.primitives.asymmetric import rsa

                self._rsa = await asyncio.to_thread(rsa.generate_private_key, 65537, 2048)
            return self._rsa
