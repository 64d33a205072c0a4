"""TLS contexts for every link: the relay as a client (to a primary; a tap client to the
relay) by the mysql client's `ssl-mode`, and the relay's servers (replicas, the tap) from
`[downstream.tls]` / `[tap.tls]`, reloadable without dropping connections.

The standard library's `ssl` does the protocol; this module only maps the relay's settings
onto it and turns its failures into messages that name the link and the reason.
"""

from __future__ import annotations

import logging
import ssl
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


class ServerTls:
    """A server's TLS settings and its current context. `reload()` (SIGHUP) reads the files
    again: new connections take the new certificate, connected clients keep theirs."""

    def __init__(self, section: TlsSection, where: str) -> None:
        self.section = section
        self.where = where   # "[downstream.tls]", for messages
        self._context = _server_context(section, where)

    @property
    def context(self) -> ssl.SSLContext:
        return self._context

    @property
    def required(self) -> bool:
        return self.section.require

    def reload(self) -> bool:
        """Load the files into a fresh context that new connections take (servers read
        `context` per connection; a CA taken out of the file stops being trusted); on
        failure keep the current one and say why."""
        try:
            self._context = _server_context(self.section, self.where)
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
