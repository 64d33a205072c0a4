"""Zero-configuration TLS on the relay's SQL port, without servers: the proof of the
certificate through the password (against a value a real MariaDB 11.8.9 sent), the
certificate the relay makes when none is configured, the OK packet that carries the proof
to a client of the relay, and the count of clients that refuse the certificate."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import ssl
import struct
from pathlib import Path
from typing import Any

import pymysql
import pytest

from relay.config import AuthPlugin, SyncMode, SyncPolicy
from relay.downstream.accounts import Account
from relay.downstream.context import DownstreamSettings
from relay.downstream.server import DownstreamServer
from relay.relaylog.log import RelayLog
from relay.tls import ServerTls, cert_fingerprint, self_signed
from relay.wire import ed25519
from relay.wire.auth import native_password_hash, tls_password_proof


def test_the_proof_is_mariadbs() -> None:
    """MariaDB 11.8.9's OK to user u (password 'pw', mysql_native_password) over TLS with its
    generated certificate, as PyMySQL read it: the greeting's scramble, the SHA-256 of the
    certificate it presented, and the OK's info."""
    scramble = b"Y|%?OQ&i_$1g7z&Hu:]H"
    fingerprint = bytes.fromhex(
        "bc98e8b90abb1d53782685a9c7c6ebf0fec9f20456f0575d35b1526705297245")
    info = b"\x01181EEE255AF2EF7BA5FCE27F1DFAF029AE1E2730B5BD07EEFEAFAD680ECF79C9"
    assert tls_password_proof(native_password_hash(b"pw"), scramble, fingerprint) == info
    assert tls_password_proof(native_password_hash(b"pW"), scramble, fingerprint) != info


def test_a_generated_certificate() -> None:
    cert_pem, key_pem = self_signed("relay")
    assert "BEGIN CERTIFICATE" in cert_pem and "PRIVATE KEY" in key_pem
    der = ssl.PEM_cert_to_DER_cert(cert_pem)
    assert cert_fingerprint(cert_pem) == hashlib.sha256(der).digest()
    assert self_signed("relay")[0] != cert_pem          # a new one each start
    tls = ServerTls(None, "[downstream.tls]")
    assert tls.generated and not tls.required
    before = tls.current()
    assert tls.reload() and tls.current() == before     # nothing to reload: it stays
    with pytest.raises(ValueError, match="no certificate"):
        cert_fingerprint("nothing here")


def _ok_info(packets: list[bytes]) -> bytes:
    """The info of the OK that ended the login (b"" when it has none): the first OK after
    the greeting (PyMySQL's SET autocommit gets one too)."""
    ok = next(p for p in packets[1:] if p[0] == 0)
    pos = 1 + 2 + 4   # no rows, no insert id (one byte each), status and warnings
    if pos >= len(ok):
        return b""
    n = ok[pos]
    return ok[pos + 1 : pos + 1 + n]


async def test_the_relay_proves_its_certificate_to_a_client(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    log = RelayLog(str(tmp_path), sync=SyncPolicy(SyncMode.OFF))
    log.open()
    log.start()
    accounts = {"n": Account.with_password("n", "pw"),
                "e": Account.with_password("e", "ed pw", AuthPlugin.ED25519),
                "s": Account.with_password("s", "pw", AuthPlugin.CACHING_SHA2)}
    server = DownstreamServer(log, DownstreamSettings("127.0.0.1", 0, accounts, 4242,
                                                      handshake_timeout=5))
    assert server.tls is not None and server.tls.generated
    await server.start()
    packets: list[bytes] = []
    original: Any = pymysql.connections.Connection._read_packet

    def read_packet(self: Any, *args: Any, **kwargs: Any) -> Any:
        packet = original(self, *args, **kwargs)
        packets.append(packet.get_all_data())
        return packet
    monkeypatch.setattr(pymysql.connections.Connection, "_read_packet", read_packet)
    # PyMySQL signs ed25519 with the optional pynacl: the relay's own signing instead
    monkeypatch.setattr("pymysql.connections._auth.ed25519_password", ed25519.sign)
    unverified = ssl.create_default_context()
    unverified.check_hostname = False
    unverified.verify_mode = ssl.CERT_NONE

    def login(user: str, password: str, tls: bool = True) -> tuple[bytes, bytes, bytes]:
        """(the OK's info, the greeting's scramble, the certificate's fingerprint)"""
        packets.clear()
        conn: Any = pymysql.connect(host="127.0.0.1", port=server.port, user=user,
                                    password=password, connect_timeout=5,
                                    **({"ssl": unverified} if tls else {"ssl_disabled": True}))
        sock = conn._sock
        der = sock.getpeercert(binary_form=True) if isinstance(sock, ssl.SSLSocket) else b""
        conn.close()
        return _ok_info(packets), conn.salt[:20], hashlib.sha256(der or b"").digest()

    try:
        info, scramble, fp = await asyncio.to_thread(login, "n", "pw")
        assert server.tls is not None and fp == server.tls.fingerprint
        assert info == tls_password_proof(native_password_hash(b"pw"), scramble, fp)
        # ed25519: the hash is the public key, the scramble the greeting's (its own 32-byte
        # nonce comes in the plugin switch)
        info, scramble, fp = await asyncio.to_thread(login, "e", "ed pw")
        assert info == tls_password_proof(ed25519.public_key(b"ed pw"), scramble, fp)
        # No proof where a MariaDB client could not check one (caching_sha2_password has
        # no hash_password_bin), nor without TLS.
        assert (await asyncio.to_thread(login, "s", "pw"))[0] == b""
        assert (await asyncio.to_thread(login, "n", "pw", False))[0] == b""

        # A client that switches to TLS and hangs up (as a MariaDB client does when it
        # does not trust the certificate) is counted.
        def hang_up_after_tls() -> None:
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
                raw.recv(4096)   # the greeting
                caps = 0x0800 | 0x0200 | 0x8000   # CLIENT_SSL, PROTOCOL_41, SECURE_CONN.
                request = struct.pack("<IIB23x", caps, 1 << 24, 45)
                raw.sendall(len(request).to_bytes(3, "little") + b"\x01" + request)
                with unverified.wrap_socket(raw) as tls:
                    tls.unwrap()
        await asyncio.to_thread(hang_up_after_tls)
        for _ in range(100):
            if server.auth.tls_failures:
                break
            await asyncio.sleep(0.05)
        assert server.auth.tls_failures == 1
    finally:
        await server.close()
        log.close()
