"""TLS contexts for every link: the relay as a client (to a primary; a tap client to the
relay) by the mysql client's `ssl-mode`, and the relay's servers (replicas, the tap) from
`[downstream.tls]` / `[tap.tls]`, reloadable without dropping connections, or a
certificate the relay makes at start when none is configured (the SQL port, as MariaDB
11.4+ does).

The standard library's `ssl` does the protocol; this module only maps the relay's settings
onto it and turns its failures into messages that name the link and the reason.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import os
import re
import ssl
import tempfile
import time

from relay.config import ClientTls, TlsMode, TlsSection
from relay.errors import ConfigError

log = logging.getLogger("relay.tls")


def client_context(tls: ClientTls) -> ssl.SSLContext | None:
    """The context for a connection made with `tls`; None for ssl-mode=DISABLED."""
    if tls.mode is TlsMode.DISABLED:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if tls.mode in (TlsMode.VERIFY_CA, TlsMode.VERIFY_IDENTITY):
        ctx.check_hostname = tls.mode is TlsMode.VERIFY_IDENTITY
        ctx.verify_mode = ssl.CERT_REQUIRED
        try:
            if tls.ca:
                ctx.load_verify_locations(cafile=tls.ca)
            else:
                ctx.load_default_certs()
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"ssl-ca {tls.ca!r}: cannot load it ({exc})") from exc
    else:  # PREFERRED, REQUIRED: encrypted, the server's certificate not checked
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if tls.cert and tls.key:
        try:
            ctx.load_cert_chain(tls.cert, tls.key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"ssl-cert {tls.cert!r} / ssl-key {tls.key!r}: cannot load "
                              f"them ({exc})") from exc
    return ctx


def _server_context(section: TlsSection, where: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(section.cert, section.key)
        if section.ca:
            ctx.load_verify_locations(cafile=section.ca)
            ctx.verify_mode = ssl.CERT_OPTIONAL  # a client may present one; it is checked
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{where}: cannot load cert {section.cert!r}, key {section.key!r}"
                          f"{f', ca {section.ca!r}' if section.ca else ''} ({exc})") from exc
    return ctx


_PEM_CERT = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)


def cert_fingerprint(pem: str) -> bytes:
    """SHA-256 of the first certificate of a PEM chain (its DER form): the fingerprint a
    client computes of the certificate the server presents."""
    m = _PEM_CERT.search(pem)
    if m is None:
        raise ValueError("no certificate in it")
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(m.group(0))).digest()


def self_signed(common_name: str, *, days: int = 3650) -> tuple[str, str]:
    """A self-signed certificate and its key (PEM), made now (ECDSA P-256): what the relay
    offers when no certificate is configured, as MariaDB 11.4+ makes one at start."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))   # clocks a little behind
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM,
                                serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    return cert.public_bytes(serialization.Encoding.PEM).decode(), key_pem


def _generated_context(common_name: str) -> tuple[ssl.SSLContext, bytes]:
    """A server context with a certificate made now, and its fingerprint. The key reaches
    the context through a file (the ssl module loads no other way) that lives only for the
    load, in a folder only this user reads."""
    cert_pem, key_pem = self_signed(common_name)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory(prefix="relay-tls-") as d:
        cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
        for path, text in ((cert, cert_pem), (key, key_pem)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
        ctx.load_cert_chain(cert, key)
    return ctx, cert_fingerprint(cert_pem)


class ServerTls:
    """A server's TLS settings and its current context. `reload()` (SIGHUP) reads the files
    again: new connections take the new certificate, connected clients keep theirs.

    Without a section (`generated`), the certificate is self-signed and made at start, as
    MariaDB 11.4+ makes its own: a client that cannot verify it checks the server through
    the password instead (the OK packet's proof, relay/downstream/auth.py)."""

    def __init__(self, section: TlsSection | None, where: str, *,
                 common_name: str = "relay") -> None:
        self.section = section
        self.where = where   # "[downstream.tls]", for messages
        if section is None:
            self._current = _generated_context(common_name)
        else:
            self._current = self._load(section)

    def _load(self, section: TlsSection) -> tuple[ssl.SSLContext, bytes]:
        ctx = _server_context(section, self.where)
        try:
            with open(section.cert) as f:
                fingerprint = cert_fingerprint(f.read())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{self.where}: cannot read a certificate in cert "
                              f"{section.cert!r} ({exc})") from exc
        return ctx, fingerprint

    @property
    def generated(self) -> bool:
        return self.section is None

    @property
    def context(self) -> ssl.SSLContext:
        return self._current[0]

    @property
    def fingerprint(self) -> bytes:
        """SHA-256 of the certificate new connections are offered (DER)."""
        return self._current[1]

    def current(self) -> tuple[ssl.SSLContext, bytes]:
        """The context and its certificate's fingerprint, as one (a reload between reading
        one and the other must not pair a context with another certificate)."""
        return self._current

    @property
    def required(self) -> bool:
        return self.section is not None and self.section.require

    def reload(self) -> bool:
        """Load the files into a fresh context that new connections take (servers read
        `context` per connection; a CA taken out of the file stops being trusted); on
        failure keep the current one and say why. A generated certificate stays."""
        if self.section is None:
            return True
        try:
            self._current = self._load(self.section)
        except ConfigError as exc:
            log.error("%s: certificates not reloaded, the current ones stay: %s", self.where,
                      exc)
            return False
        log.info("%s: certificates reloaded from %s", self.where, self.section.cert)
        return True


class Throttle:
    """At most one log line per `interval` for a kind of event a stranger can cause at will
    (failed TLS handshakes: a port scan must not fill the log)."""

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self._last = -interval
        self._suppressed = 0

    def allow(self) -> str | None:
        """None: stay quiet; else a suffix saying how many were not logged since."""
        now = time.monotonic()
        if now - self._last < self.interval:
            self._suppressed += 1
            return None
        self._last, n, self._suppressed = now, self._suppressed, 0
        return f" ({n} more since the last one)" if n else ""


def tls_failure(exc: BaseException) -> str:
    """Why a TLS handshake failed, in a few words (the verification message when the
    peer's certificate was refused)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    return str(exc) or type(exc).__name__
