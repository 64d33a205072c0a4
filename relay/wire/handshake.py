"""Connection phase: the server greeting (HandshakeV10) and the client response.

Both directions live here: the upstream uses parse_greeting/build_response, the
downstream server uses build_greeting/parse_response.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from relay.errors import RemoteProtocolError
from relay.wire.auth import NATIVE_PASSWORD
from relay.wire.codec import lenenc_int, read_lenenc_int, read_nul_str

CLIENT_LONG_PASSWORD = 1
CLIENT_MYSQL = 1  # MariaDB: bit 0 clear in a greeting means "extended caps follow"
CLIENT_LONG_FLAG = 1 << 2
CLIENT_CONNECT_WITH_DB = 1 << 3
CLIENT_PROTOCOL_41 = 1 << 9
CLIENT_SSL = 1 << 11
CLIENT_TRANSACTIONS = 1 << 13
CLIENT_SECURE_CONNECTION = 1 << 15
CLIENT_MULTI_RESULTS = 1 << 17
CLIENT_PLUGIN_AUTH = 1 << 19
CLIENT_CONNECT_ATTRS = 1 << 20
CLIENT_PLUGIN_AUTH_LENENC_DATA = 1 << 21
CLIENT_DEPRECATE_EOF = 1 << 24



@dataclass(frozen=True)
class Greeting:
    server_version: str
    connection_id: int
    scramble: bytes
    capabilities: int
    charset: int
    status: int
    auth_plugin: str


def parse_greeting(payload: bytes) -> Greeting:
    if not payload:
        raise RemoteProtocolError("empty greeting")
    if payload[0] == 0xFF:
        from relay.wire.replies import parse_err

        raise parse_err(payload)
    if payload[0] != 10:
        raise RemoteProtocolError(f"unsupported protocol version {payload[0]}")
    try:
        version, pos = read_nul_str(payload, 1)
        conn_id = struct.unpack_from("<I", payload, pos)[0]
        part1 = payload[pos + 4 : pos + 12]
        pos += 13
        caps_lo, charset, status, caps_hi, auth_len = struct.unpack_from("<HBHHB", payload, pos)
        pos += 8 + 10
        caps = caps_lo | (caps_hi << 16)
        part2_len = max(13, auth_len - 8)
        part2 = payload[pos : pos + part2_len].rstrip(b"\0")
        pos += part2_len
        plugin = b""
        if caps & CLIENT_PLUGIN_AUTH and pos < len(payload):
            plugin = payload[pos:].split(b"\0", 1)[0]
    except struct.error as exc:
        raise RemoteProtocolError(f"truncated greeting: {exc}") from exc
    return Greeting(version.decode("utf-8", "replace"), conn_id, part1 + part2, caps, charset,
                    status, plugin.decode("utf-8", "replace") or NATIVE_PASSWORD)


CLIENT_CAPS = (CLIENT_LONG_PASSWORD | CLIENT_LONG_FLAG | CLIENT_PROTOCOL_41 | CLIENT_TRANSACTIONS
               | CLIENT_SECURE_CONNECTION | CLIENT_MULTI_RESULTS | CLIENT_PLUGIN_AUTH
               | CLIENT_PLUGIN_AUTH_LENENC_DATA)


def build_response(user: str, auth_response: bytes, plugin: str, *,
                   max_packet: int = 1 << 30, charset: int = 33, tls: bool = False) -> bytes:
    caps = CLIENT_CAPS | (CLIENT_SSL if tls else 0)
    return (struct.pack("<IIB", caps, max_packet, charset) + b"\0" * 23
            + user.encode() + b"\0" + lenenc_int(len(auth_response)) + auth_response
            + plugin.encode() + b"\0")


def build_ssl_request(*, max_packet: int = 1 << 30, charset: int = 33) -> bytes:
    """The SSLRequest: the response's first 32 bytes with CLIENT_SSL; TLS starts after it."""
    return struct.pack("<IIB", CLIENT_CAPS | CLIENT_SSL, max_packet, charset) + b"\0" * 23


@dataclass(frozen=True)
class AuthSwitch:
    plugin: str
    data: bytes


def parse_auth_switch(payload: bytes) -> AuthSwitch:
    plugin, pos = read_nul_str(payload, 1)
    return AuthSwitch(plugin.decode("utf-8", "replace"), payload[pos:].rstrip(b"\0"))


# --- server side ------------------------------------------------------------------------

SERVER_CAPS = (CLIENT_LONG_PASSWORD | CLIENT_LONG_FLAG | CLIENT_CONNECT_WITH_DB
               | CLIENT_PROTOCOL_41 | CLIENT_TRANSACTIONS | CLIENT_SECURE_CONNECTION
               | CLIENT_MULTI_RESULTS | CLIENT_PLUGIN_AUTH | CLIENT_CONNECT_ATTRS
               | CLIENT_PLUGIN_AUTH_LENENC_DATA | CLIENT_DEPRECATE_EOF)


def build_greeting(server_version: str, connection_id: int, scramble: bytes,
                   capabilities: int = SERVER_CAPS, charset: int = 8,
                   plugin: str = NATIVE_PASSWORD) -> bytes:
    assert len(scramble) == 20
    # Clearing bit 0 (CLIENT_MYSQL) tells MariaDB clients the extended-caps word is present.
    caps = capabilities & ~CLIENT_MYSQL
    return (b"\x0a" + server_version.encode() + b"\0" + struct.pack("<I", connection_id)
            + scramble[:8] + b"\0" + struct.pack("<HBHH", caps & 0xFFFF, charset, 0x0002,
                                                  caps >> 16)
            + bytes((21,)) + b"\0" * 6 + struct.pack("<I", 0) + scramble[8:] + b"\0"
            + plugin.encode() + b"\0")


@dataclass
class HandshakeResponse:
    capabilities: int
    max_packet: int
    charset: int
    user: str
    auth_response: bytes
    database: str | None
    plugin: str
    attributes: dict[str, str] = field(default_factory=dict)


SSL_REQUEST_LEN = 32


def parse_response(payload: bytes) -> HandshakeResponse:
    try:
        caps, max_packet, charset = struct.unpack_from("<IIB", payload, 0)
        if not caps & CLIENT_PROTOCOL_41:
            raise RemoteProtocolError("client does not speak protocol 4.1")
        user, pos = read_nul_str(payload, 32)
        auth: bytes
        if caps & CLIENT_PLUGIN_AUTH_LENENC_DATA:
            n, pos = read_lenenc_int(payload, pos)
            auth = payload[pos : pos + (n or 0)]
            pos += n or 0
        elif caps & CLIENT_SECURE_CONNECTION:
            n = payload[pos]
            auth = payload[pos + 1 : pos + 1 + n]
            pos += 1 + n
        else:
            auth, pos = read_nul_str(payload, pos)
        database = None
        if caps & CLIENT_CONNECT_WITH_DB and pos < len(payload):
            db, pos = read_nul_str(payload, pos)
            database = db.decode("utf-8", "replace")
        plugin = NATIVE_PASSWORD
        if caps & CLIENT_PLUGIN_AUTH and pos < len(payload):
            raw, pos = read_nul_str(payload, pos)
            plugin = raw.decode("utf-8", "replace") or NATIVE_PASSWORD
    except (struct.error, IndexError) as exc:
        raise RemoteProtocolError(f"truncated handshake response: {exc}") from exc
    return HandshakeResponse(caps, max_packet, charset, user.decode("utf-8", "replace"),
                             bytes(auth), database, plugin)
