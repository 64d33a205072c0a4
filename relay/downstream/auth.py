"""The connection phase of a downstream client: the relay's greeting, the client's
response, mysql_native_password (with the plugin switch a client expects when it offers
another plugin), and the OK or the access-denied error a server sends."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from relay.binlog.charsets import charset_name
from relay.downstream.connection import PacketConnection
from relay.wire import handshake
from relay.wire.auth import native_verify
from relay.wire.handshake import SSL_REQUEST_LEN
from relay.wire.replies import OK_PACKET, build_err

log = logging.getLogger("relay.downstream")


@dataclass(frozen=True)
class Login:
    user: str
    collation: int | None   # the handshake's character set, when the relay knows it


async def authenticate(conn: PacketConnection, *, greeting_version: str, conn_id: int,
                       users: dict[str, bytes]) -> Login | None:
    """Greet, read the response, check the password against `users` (name -> stored
    SHA1(SHA1(password))). None: the client was refused (the error is sent)."""
    scramble = bytes(b % 94 + 33 for b in os.urandom(20))  # printable, no NUL
    conn.send([handshake.build_greeting(greeting_version, conn_id, scramble)])
    payload = await conn.read()
    if len(payload) == SSL_REQUEST_LEN:
        conn.send([build_err(1045, "relay does not offer TLS", "28000")])
        return None
    resp = handshake.parse_response(payload)
    conn.capabilities = resp.capabilities
    auth = resp.auth_response
    if resp.plugin != handshake.NATIVE_PASSWORD:
        conn.send([b"\xfe" + handshake.NATIVE_PASSWORD.encode() + b"\0" + scramble + b"\0"])
        auth = await conn.read()
    stored = users.get(resp.user)
    if stored is None or not native_verify(stored, scramble, auth):
        log.warning("client %s: access denied for user %r", conn.peer, resp.user)
        conn.send([build_err(1045, f"Access denied for user '{resp.user}'@'{conn.host}' "
                                   f"(using password: {'YES' if auth else 'NO'})", "28000")])
        return None
    conn.send([OK_PACKET])
    return Login(resp.user, resp.charset if charset_name(resp.charset) is not None else None)
