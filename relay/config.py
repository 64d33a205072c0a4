"""config.toml: frozen settings per section, validated on load, and the vocabulary every
component shares with it (the modes as enums, upstream sources, the sync policy).

A leaf: it imports nothing of the relay but its errors, so any layer may take its own
section. Every error names the key (as `section.key`) and says what is accepted; an
unknown key suggests the closest known one. What only a component can check (rule
patterns, a GTID start position) is checked when the app builds that component, with the
same key-naming messages (`relay check-config` builds them too).

The sections are msgspec Structs, checked by `msgspec.convert`: types, bounds and patterns
as annotations, checks across keys in `__post_init__`. msgspec, not pydantic: pydantic's
import and its schema builds took about 115 ms of the 320 ms the relay took to import;
msgspec's import and these Structs take about 17 ms.
msgspec stops at its first error, at a `$.path`; `_explain` words it as `section.key`, and
`parse_config` converts each section alone too, to name one error per section.
"""

from __future__ import annotations

import base64
import dataclasses
import difflib
import ipaddress
import logging
import os
import re
import tomllib
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Annotated, Any, ClassVar, Literal, TypeVar
from urllib.parse import SplitResult, parse_qs, unquote, urlsplit

import msgspec
import msgspec.inspect
from msgspec import Meta, Struct, field

from relay.errors import ConfigError

_T = TypeVar("_T")

# --- the shared vocabulary ------------------------------------------------------------------


class SyncMode(Enum):
    """When the relay log is fsynced: per transaction (group commit), on an interval, never."""

    TRANSACTION = "transaction"
    INTERVAL = "interval"
    OFF = "off"


@dataclass(frozen=True)
class SyncPolicy:
    mode: SyncMode
    interval: float = 0.0  # seconds, for INTERVAL

    @classmethod
    def parse(cls, text: str) -> SyncPolicy:
        text = text.strip().lower()
        if text in ("transaction", "off"):
            return cls(SyncMode(text))
        m = re.fullmatch(r"interval:(\d+(?:\.\d+)?)(ms|s)", text)
        if m:
            value = float(m.group(1)) / (1000.0 if m.group(2) == "ms" else 1.0)
            if value <= 0:
                raise ValueError("sync interval must be positive")
            return cls(SyncMode.INTERVAL, value)
        raise ValueError(f"unknown sync policy {text!r}: use \"transaction\", "
                         "\"interval:100ms\" (or any ms/s value) or \"off\"")

    @property
    def syncs(self) -> bool:
        return self.mode is not SyncMode.OFF


class VerifyMode(Enum):
    """Which segments recovery verifies at start: all of them, or the last only."""

    ALL = "all"
    LAST = "last"


class OnDivergence(Enum):
    """A source that lacks transactions the relay holds: wait for it, or stop."""

    WAIT = "wait"
    STOP = "stop"


class StartMode(Enum):
    """Where an empty relay log starts on its primary."""

    CURRENT = "current"      # the primary's @@gtid_binlog_pos: new transactions only
    EARLIEST = "earliest"    # the start of the primary's oldest binlog
    POSITION = "position"    # an explicit GTID position


class RulePoint(Enum):
    """Where a rule runs: before the relay log, per downstream client, per tap reader."""

    RECEIVE = "receive"
    SEND = "send"
    TAP = "tap"


class OnError(Enum):
    """What a failing rule does: stop its stream, or count the failure and keep the event."""

    STOP = "stop"
    SKIP = "skip"


class OnStatement(Enum):
    """What a statement-format event (its values are in its SQL text, where no row mask
    reaches) on a table a rule masks or filters does to a client's stream."""

    STOP = "stop"    # the stream stops with an error naming the statement's position
    DROP = "drop"    # the statement is dropped (its transaction keeps its GTID)


class MaskKind(Enum):
    NULL = "null"
    CONSTANT = "constant"
    HASH = "hash"


class TlsMode(Enum):
    """A client's `ssl-mode`, as the MySQL and MariaDB clients name them."""

    DISABLED = "DISABLED"
    PREFERRED = "PREFERRED"            # TLS when the server offers it, else plain
    REQUIRED = "REQUIRED"              # TLS or no connection; the certificate is not checked
    VERIFY_CA = "VERIFY_CA"            # ... and the certificate is signed by the CA
    VERIFY_IDENTITY = "VERIFY_IDENTITY"  # ... and names the host connected to

    @property
    def required(self) -> bool:
        return self not in (TlsMode.DISABLED, TlsMode.PREFERRED)


@dataclass(frozen=True)
class ClientTls:
    """TLS of a connection the relay makes (to a primary, or a tap client to the relay).
    Paths are PEM files; no `ca` with a verifying mode means the system's CAs."""

    mode: TlsMode = TlsMode.DISABLED
    ca: str | None = None
    cert: str | None = None
    key: str | None = None


# The URL parameters of a source, named as the mysql and mariadb clients' options.
_TLS_PARAMS = ("ssl-mode", "ssl-ca", "ssl-cert", "ssl-key", "get-server-public-key")
_TRUE = ("1", "true", "on", "yes")


def parse_client_tls(params: dict[str, list[str]], where: str) -> ClientTls:
    """The TLS parameters of a mysql:// URL's query (ssl-mode, ssl-ca, ssl-cert, ssl-key)."""
    for name in params:
        if name not in _TLS_PARAMS:
            close = difflib.get_close_matches(name, _TLS_PARAMS, 1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ValueError(f"{where}: unknown parameter {name!r} (known: "
                             f"{', '.join(_TLS_PARAMS)}){hint}")
    one = {k: v[-1] for k, v in params.items() if k.startswith("ssl-")}
    ca, cert, key = one.get("ssl-ca"), one.get("ssl-cert"), one.get("ssl-key")
    if (cert is None) != (key is None):
        raise ValueError(f"{where}: give ssl-cert and ssl-key together")
    raw_mode = one.get("ssl-mode")
    if raw_mode is None:
        # As the mysql client: a CA alone means VERIFY_CA; a client certificate alone, TLS.
        mode = (TlsMode.VERIFY_CA if ca else TlsMode.REQUIRED if cert else TlsMode.DISABLED)
    else:
        try:
            mode = TlsMode(raw_mode.upper())
        except ValueError:
            raise ValueError(f"{where}: ssl-mode={raw_mode!r} is none of "
                             f"{', '.join(m.value for m in TlsMode)}") from None
    return ClientTls(mode, ca, cert, key)


@dataclass(frozen=True)
class Source:
    """An upstream primary, from a `mysql://user:password@host:port` URL, with the TLS
    options of the mysql client as parameters: `?ssl-mode=VERIFY_IDENTITY&ssl-ca=ca.pem`;
    or an archive of a primary's binlog files, `file:///archive/mariadb-bin.*` (`archive`
    is then the files' path or glob pattern, and there is no host)."""

    host: str
    port: int
    user: str
    password: str = dataclasses.field(default="", repr=False)  # repr() never shows it
    tls: ClientTls = ClientTls()
    # caching_sha2_password's full authentication without TLS may fetch the server's RSA
    # key (trusting the network), as the mysql client's --get-server-public-key.
    get_server_public_key: bool = False
    archive: str = ""

    @classmethod
    def parse(cls, url: str) -> Source:
        if url.startswith("file://"):
            path = unquote(url.removeprefix("file://"))
            if not path.startswith("/"):
                raise ValueError(f"source {url!r}: an archive is file:// and an absolute "
                                 "path or pattern, as file:///backups/binlog/mariadb-bin.*")
            return cls("", 0, "", archive=path)
        parts = split_url(url, "source")
        shown = redact_url(url)
        if parts.scheme not in ("mysql", "mariadb") or "://" not in url:
            raise ValueError(f"source {shown!r} must start with mysql://, mariadb:// or "
                             "file:// (an archive of binlog files)")
        if not parts.hostname:
            raise ValueError(f"source {shown!r} has no host")
        try:
            port = parts.port or 3306
        except ValueError:
            raise ValueError(_bad_port("source", url, parts)) from None
        params = parse_qs(parts.query, keep_blank_values=True)
        tls = parse_client_tls(params, f"source {shown!r}")
        key = params.get("get-server-public-key", ["0"])[-1].lower() in _TRUE
        return cls(parts.hostname, port, unquote(parts.username or "root"),
                   unquote(parts.password or ""), tls, key)

    @property
    def address(self) -> str:
        return f"file://{self.archive}" if self.archive else f"{self.host}:{self.port}"

    def __str__(self) -> str:  # never print the password
        return self.address if self.archive else f"{self.user}@{self.address}"


_GTID_LIST_RE = re.compile(r"^\s*\d+-\d+-\d+(\s*,\s*\d+-\d+-\d+)*\s*$")
# A MySQL GTID set: uuid:interval[:interval...][,uuid:...] (checked again when parsed).
_GTID_SET_ELEMENT = r"[0-9a-fA-F-]{32,36}(:([A-Za-z_]\w{0,31}|\d+(-\d+)?))+"
_GTID_SET_RE = re.compile(rf"^\s*{_GTID_SET_ELEMENT}(\s*,\s*{_GTID_SET_ELEMENT})*\s*$")


# --- secrets out of messages -----------------------------------------------------------------
# Redaction parses: a URL's user part runs from `://` to its LAST @ (a password may hold
# @, /, ?, #, quotes and spaces, written raw), and everything after the user name in it
# is masked. No pattern of what a password may hold is assumed.


def redact_url(url: str) -> str:
    """One URL (its exact text) with its password masked: `mysql://repl:***@db1:3306`.
    Everything between the user name and the URL's last @ is masked, whatever it holds;
    without `://` before that @, everything before it."""
    at = url.rfind("@")
    if at < 0:
        return url
    start = url.find("://")
    if start < 0 or start > at:
        return "***" + url[at:]
    start += 3
    user, colon, _ = url[start:at].partition(":")
    return url[:start] + (f"{user}:***" if colon else user) + url[at:]


def redact(text: str) -> str:
    """Any text (a message that may quote URLs) with the password of every URL masked: on
    each line, from a URL's `://` to the line's last @ after it. It masks too much rather
    than too little (an @ later on the line widens the mask); where the URL's exact text
    is known, `redact_url` masks exactly its user part."""
    return "\n".join(_redact_line(line) for line in text.split("\n"))


def _redact_line(line: str) -> str:
    out, pos = [], 0
    while (start := line.find("://", pos)) >= 0:
        at = line.rfind("@", start + 3)
        if at < 0:
            break
        user, colon, _ = line[start + 3:at].partition(":")
        out.append(line[pos:start + 3] + (f"{user}:***" if colon else user) + "@")
        pos = at + 1
    out.append(line[pos:])
    return "".join(out)


def split_url(url: str, what: str) -> SplitResult:
    """`urlsplit(url)`, or ValueError naming `what` and the URL with its password masked.
    A raw / ? or # in a password ends the URL's user part early: refused (percent-encode
    it), so that no piece of the password is ever read as a host, port or parameter."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # an unclosed [IPv6] host, ...: its text names no value
        raise ValueError(f"{what} {redact_url(url)!r}: {exc}") from None
    _, sep, rest = url.partition("://")
    if sep and "@" in rest and "@" not in parts.netloc:
        raise ValueError(
            f"{what} {redact_url(url)!r}: its user or password holds a / ? or # (they end "
            "a URL's user part): percent-encode them (/ as %2F, ? as %3F, # as %23); an at "
            "sign in a parameter is %40")
    return parts


def _bad_port(what: str, url: str, parts: SplitResult) -> str:
    """The message for a URL whose port does not parse: the URL masked as `redact_url`
    does; without a user part, its host only (`mysql://repl:secret` is host repl, port
    "secret": maybe a password given without its host)."""
    if "@" in url:
        return f"{what} {redact_url(url)!r} has a bad port"
    return f"{what} for host {parts.hostname!r} has a bad port (not a number)"


def split_host_port(value: str, key: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"{key}: {value!r} is not host:port (e.g. \"0.0.0.0:3307\")")
    return host.strip("[]"), int(port)


# --- sections ------------------------------------------------------------------------------

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|KB|MB|GB|K|M|G)?\s*$", re.I)
_UNITS = {"": 1, "b": 1, "k": 1024, "kib": 1024, "kb": 1000, "m": 1 << 20, "mib": 1 << 20,
          "mb": 10**6, "g": 1 << 30, "gib": 1 << 30, "gb": 10**9}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_DUR_UNITS = {"ms": 0.001, "s": 1.0, "": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_size(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    m = _SIZE_RE.match(str(value))
    if not m:
        raise ValueError(f"{value!r} is not a size; write e.g. \"256MiB\", \"1GiB\" or bytes")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])


def parse_duration(value: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        if value != value:  # TOML's nan: every comparison with it is False
            raise ValueError("nan is not a duration")
        return float(value)
    m = _DURATION_RE.match(str(value))
    if not m:
        raise ValueError(f"{value!r} is not a duration; write e.g. \"500ms\", \"5s\", \"2m\"")
    return float(m.group(1)) * _DUR_UNITS[m.group(2) or ""]


class Size(int):
    """A byte count: an integer, or a string with a unit ("256MiB", "1GiB")."""


class Duration(float):
    """Seconds: a number, or a string with a unit ("500ms", "5s", "2m")."""


def _decode(kind: type, value: Any) -> Any:
    """msgspec's hook for the two types TOML has no literal for."""
    if kind is Size:
        return Size(parse_size(value))
    if kind is Duration:
        return Duration(parse_duration(value))
    raise NotImplementedError(kind)


def _at_least(key: str, value: float | None, low: float, what: str = "") -> None:
    if value is not None and value < low:
        raise ValueError(f"{key}: must be at least {what or f'{low:g}'} (got {value:g})")


class _Section(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A table of config.toml: unknown keys are errors, values are frozen once loaded.
    A check that spans keys raises ValueError("key: ...") in __post_init__; the message
    then names `section.key`."""


class RelaySection(_Section, frozen=True):
    server_id: Annotated[int, Meta(ge=1, le=2**32 - 1)] = 4242
    data_dir: str = "./data"
    log_level: Literal["debug", "info", "warning", "error"] = "info"


class UpstreamSection(_Section, frozen=True):
    sources: list[str] = field(default_factory=list)
    start: str = "current"
    heartbeat_period: Duration = Duration(5.0)
    read_timeout: Duration = Duration(15.0)
    connect_timeout: Duration = Duration(10.0)
    retry_initial: Duration = Duration(0.5)
    retry_max: Duration = Duration(10.0)
    max_retries: Annotated[int, Meta(ge=0)] = 0
    failover_after: Duration = Duration(30.0)
    prefer_first: bool = False
    prefer_check: Duration = Duration(5.0)
    on_divergence: OnDivergence = OnDivergence.STOP
    semi_sync: bool = False
    semi_sync_wait_for_replicas: Annotated[int, Meta(ge=0)] = 0
    semi_sync_timeout: Duration = Duration(10.0)

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for url in self.sources:
            try:
                address = Source.parse(url).address
            except ValueError as exc:
                raise ValueError(f"sources: {exc}") from None
            if address in seen:
                raise ValueError(f"sources: {address} is listed twice (each primary once: "
                                 "the first is preferred, the rest are passive primaries)")
            seen.add(address)
        if not (self.start in ("current", "earliest") or _GTID_LIST_RE.match(self.start)
                or _GTID_SET_RE.match(self.start)):
            # the numbers' ranges are checked where the position is parsed
            raise ValueError(f"start: not a GTID position {self.start!r}: use \"current\", "
                             "\"earliest\", a MariaDB domain-server-seq[,...] such as "
                             "\"0-1-100\", or a MySQL GTID set such as "
                             "\"3e11fa47-71ca-11e1-9e33-c80aa9429562:1-100\"")
        if self.heartbeat_period > 0 and self.read_timeout <= self.heartbeat_period:
            raise ValueError("read_timeout must be longer than heartbeat_period "
                             f"({self.read_timeout:g}s <= {self.heartbeat_period:g}s)")

    @property
    def start_mode(self) -> StartMode:
        if self.start in ("current", "earliest"):
            return StartMode(self.start)
        return StartMode.POSITION

    @property
    def source_list(self) -> tuple[Source, ...]:
        return tuple(Source.parse(u) for u in self.sources)


class RelayLogSection(_Section, frozen=True):
    segment_size: Size = Size(256 << 20)
    sync: str = "transaction"
    basename: Annotated[str, Meta(pattern=r"^[A-Za-z0-9_.-]+$")] = "relay-bin"
    verify_on_start: VerifyMode = VerifyMode.ALL
    retention_age: Duration | None = None
    retention_size: Size | None = None
    retention_min_segments: Annotated[int, Meta(ge=1)] = 2
    retention_max_size: Size | None = None
    retention_check_interval: Duration = Duration(10.0)
    compress_after: Annotated[int, Meta(ge=1)] | None = None

    def __post_init__(self) -> None:
        _at_least("segment_size", self.segment_size, 1 << 16, "65536 bytes (64KiB)")
        if not self.retention_check_interval > 0:
            raise ValueError("retention_check_interval: must be positive")
        try:
            SyncPolicy.parse(self.sync)
        except ValueError as exc:
            raise ValueError(f"sync: {exc}") from None
        if self.retention_max_size is not None and self.retention_size is not None \
                and self.retention_max_size < self.retention_size:
            raise ValueError("retention_max_size (the hard cap, which overrides readers) must "
                             "be at least retention_size; raise it or drop it")

    @property
    def sync_policy(self) -> SyncPolicy:
        return SyncPolicy.parse(self.sync)


class AuthPlugin(Enum):
    """How a user of the relay's SQL port proves its password, as the servers name it."""

    NATIVE = "mysql_native_password"
    ED25519 = "ed25519"                   # MariaDB's
    CACHING_SHA2 = "caching_sha2_password"  # MySQL 8's default


class _PasswordUser(_Section, frozen=True):
    """A named user with its password, or the environment variable holding it."""

    name: str
    password: str | None = None
    password_env: str | None = None
    # A user with no password (or an empty one) logs in with none: refused unless said so.
    allow_empty_password: bool = False

    TABLE: ClassVar[str] = "users"   # where the user is defined, for messages

    def __post_init__(self) -> None:
        if self.password is not None and self.password_env is not None:
            raise ValueError("give either password or password_env, not both")
        if self.allow_empty_password:
            return
        if self.password == "":
            raise ValueError(f"password: user {self.name!r} has an empty password, so it would "
                             f"log in without one: give it {self._fix()}")
        if self.password is None and not self._credential_keys():
            raise ValueError(f"password: user {self.name!r} has no password, so it would log "
                             f"in without one: give it {self._fix()}")

    def __repr__(self) -> str:  # never the password, as Source
        shown = ", ".join(f"{f}={getattr(self, f)!r}" for f in self.__struct_fields__
                          if f != "password")
        return f"{type(self).__name__}({shown})"

    def _credential_keys(self) -> bool:
        """Whether a key other than `password` gives the user a credential."""
        return self.password_env is not None

    def has_password(self) -> bool:
        """Whether the user has a password that is not empty (resolved now)."""
        return bool(self.password) or bool(self.password_env
                                           and os.environ.get(self.password_env))

    def _fix(self) -> str:
        return ("a password: password_env (an environment variable's name) or password; or "
                "set allow_empty_password = true to allow that")

    def empty_password_problem(self) -> str | None:
        """Why the user's resolved password is refused: its password_env names a variable
        set to "" (and allow_empty_password is not set); None when it is not."""
        if self.allow_empty_password or self.password_env is None:
            return None
        if os.environ.get(self.password_env) == "":
            return (f"{self.TABLE} {self.name!r}: environment variable {self.password_env} "
                    f"(its password_env) is empty, a login without a password: set it, or "
                    f"set allow_empty_password = true for user {self.name!r}")
        return None

    def resolve_password(self) -> str:
        if self.password_env is not None:
            value = os.environ.get(self.password_env)
            if value is None:
                raise ConfigError(f"{self.TABLE}: environment variable "
                                  f"{self.password_env} (password_env of user {self.name!r}) "
                                  "is not set")
            problem = self.empty_password_problem()
            if problem is not None:
                raise ConfigError(problem)
            return value
        return self.password or ""


class TapUser(_PasswordUser, frozen=True):
    """A user of the tap (an HMAC login: the tap needs the password itself)."""

    TABLE: ClassVar[str] = "tap.users"


class DownstreamUser(_PasswordUser, frozen=True):
    """A user of the relay's SQL port. `password_hash` keeps the secret out of the file:
    `*` and 40 hex digits (SELECT PASSWORD('...')) for mysql_native_password, the base64
    key `SHOW CREATE USER` prints for ed25519, the hex of SHA2(UNHEX(SHA2(pw,256)),256)
    for caching_sha2_password."""

    # None: the flavour's default, as the servers have it: mysql_native_password on a
    # relay that follows MariaDB, caching_sha2_password on one that follows MySQL (a
    # password_hash without a plugin is a mysql_native_password hash).
    plugin: AuthPlugin | None = None
    password_hash: str | None = None
    admin: bool = False   # may run PURGE BINARY LOGS, FLUSH HOSTS (as on a server)
    require_tls: bool = False
    require_x509: bool = False   # ... with a client certificate [downstream.tls] ca verified
    networks: list[str] = field(default_factory=list)   # CIDRs it may come from; [] = any
    max_connections: Annotated[int, Meta(ge=0)] = 0    # 0 = only max_clients limits it
    # Point-in-time recovery for this user: [downstream] serve_until, for its dumps only.
    serve_until: datetime | None = None

    TABLE: ClassVar[str] = "downstream.users"

    def _credential_keys(self) -> bool:
        return self.password_env is not None or self.password_hash is not None

    def has_password(self) -> bool:
        return self.password_hash is not None or super().has_password()

    def _fix(self) -> str:
        return ("a password: password_hash (what the server stores), password_env (an "
                "environment variable's name) or password; or set allow_empty_password = "
                "true to allow that")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.password_hash is not None and (self.password is not None
                                               or self.password_env is not None):
            raise ValueError("give one of password, password_env and password_hash")
        _check_until(self.serve_until)
        for net in self.networks:
            try:
                ipaddress.ip_network(net, strict=False)
            except ValueError:
                raise ValueError(f"networks: {net!r} is not an address or CIDR network such "
                                 "as 10.0.0.0/8") from None


class TlsSection(_Section, frozen=True):
    """A server's TLS: its certificate chain and key (PEM files), and a CA to verify client
    certificates with (optional: clients then may present one)."""

    cert: str
    key: str
    ca: str | None = None
    require: bool = False   # refuse clients that do not switch to TLS (downstream)

    def __post_init__(self) -> None:
        for name, path in (("cert", self.cert), ("key", self.key), ("ca", self.ca)):
            if path is not None and not os.access(path, os.R_OK):
                raise ValueError(f"{name}: {path!r} is not a readable file")


def _check_until(until: datetime | None) -> None:
    if until is not None and until.tzinfo is None:
        raise ValueError("serve_until: give the time with its offset, as 2026-12-06T10:03:00Z "
                         "or 2026-12-06T12:03:00+02:00 (binlog times are UTC)")


class DownstreamSection(_Section, frozen=True):
    listen: str = "127.0.0.1:3307"
    # A listener beyond loopback without [downstream.tls] is refused at start unless this.
    allow_insecure: bool = False
    users: list[DownstreamUser] = field(default_factory=list)
    tls: TlsSection | None = None
    # Without [downstream.tls]: offer TLS with a self-signed certificate made at start,
    # which MariaDB 11.4+ replicas verify through their password (false: no TLS).
    generate_certificate: bool = True
    max_clients: Annotated[int, Meta(ge=1)] = 256
    # failed logins in a row before a host is blocked; how long (FLUSH HOSTS ends it sooner)
    max_connect_errors: Annotated[int, Meta(ge=1)] = 100
    host_block_time: Duration = Duration(600.0)
    write_timeout: Duration = Duration(30.0)
    handshake_timeout: Duration = Duration(10.0)
    catchup_wait: Duration = Duration(60.0)
    forward_metadata: bool = True
    forward_timeout: Duration = Duration(10.0)
    # The account metadata look-ups run as on the primary (default: the upstream source's
    # user); it needs no SELECT (REFERENCES shows tables' metadata, not their rows).
    metadata_user: str | None = None
    metadata_password_env: str | None = None
    metadata_max_rows: Annotated[int, Meta(ge=1)] = 10_000
    # Look-ups waiting for the one metadata connection; past this a client gets an error.
    metadata_queue: Annotated[int, Meta(ge=1)] = 32
    semi_sync: bool = False
    # Point-in-time recovery: no transaction committed after this time is served (an
    # RFC 3339 time with its offset); a replica holds at the last one before it.
    serve_until: datetime | None = None

    def __post_init__(self) -> None:
        _check_until(self.serve_until)
        if (self.metadata_user is None) != (self.metadata_password_env is None):
            raise ValueError("metadata_user: give metadata_user and metadata_password_env "
                             "together (or neither: the upstream source's user)")


class TapSection(_Section, frozen=True):
    listen: str = ""                      # "" = no tap
    users: list[TapUser] = field(default_factory=list)
    tls: TlsSection | None = None         # TLS from the first byte: plain clients fail
    max_clients: Annotated[int, Meta(ge=1)] = 64
    frame_size: Size = Size(1 << 20)
    subscriber_ttl: Duration = Duration(7 * 86400.0)
    retain_max: Size = Size(50 << 30)
    handshake_timeout: Duration = Duration(10.0)
    # A listener beyond loopback without [tap.tls] and [[tap.users]] is refused at start
    # unless this.
    allow_insecure: bool = False
    # Failed logins in a row from one address before it is blocked; for how long.
    max_connect_errors: Annotated[int, Meta(ge=1)] = 100
    host_block_time: Duration = Duration(600.0)
    # Snapshots a tap user may keep at once, and the bytes of their plans together.
    max_snapshots_per_user: Annotated[int, Meta(ge=1)] = 16
    # Subscriber names (each a retention hold) and re-snapshot requests a tap user may keep.
    max_subscribers_per_user: Annotated[int, Meta(ge=1)] = 64
    max_snapshot_bytes_per_user: Size = Size(64 << 20)

    def __post_init__(self) -> None:
        _at_least("frame_size", self.frame_size, 4096, "4096 bytes")
        if self.frame_size > 32 << 20:
            raise ValueError(f"frame_size: must be at most 32MiB (got {self.frame_size})")


class MetricsSection(_Section, frozen=True):
    listen: str = "127.0.0.1:9104"
    ready_max_lag: Duration = Duration(60.0)
    ready_grace: Duration = Duration(30.0)
    # Who may read /metrics, /status and /-/reload (/healthz and /readyz stay open for
    # probes): a bearer token (as Prometheus' `authorization`), or basic auth.
    token_env: str | None = None
    token_file: str | None = None
    basic_user: str | None = None
    basic_password_env: str | None = None
    tls: TlsSection | None = None
    # A listener beyond loopback without credentials and [metrics.tls] is refused at start
    # unless this.
    allow_insecure: bool = False

    def __post_init__(self) -> None:
        if self.token_env is not None and self.token_file is not None:
            raise ValueError("give token_env or token_file, not both")
        if (self.basic_user is None) != (self.basic_password_env is None):
            raise ValueError("basic_user and basic_password_env go together")
        if self.basic_user is not None and (self.token_env or self.token_file):
            raise ValueError("give a bearer token or basic auth, not both")

    def credentials(self) -> tuple[str, str] | None:
        """("Bearer", token) or ("Basic", base64 of user:password); None: no auth."""
        if self.token_env is not None:
            return "Bearer", _env(self.token_env, "metrics.token_env")
        if self.token_file is not None:
            try:
                with open(self.token_file) as f:
                    token = f.read().strip()
            except OSError as exc:
                raise ConfigError(f"metrics.token_file {self.token_file!r}: {exc}") from None
            if not token:
                raise ConfigError(f"metrics.token_file {self.token_file!r} is empty")
            return "Bearer", token
        if self.basic_user is not None and self.basic_password_env is not None:
            password = _env(self.basic_password_env, "metrics.basic_password_env")
            raw = f"{self.basic_user}:{password}".encode()
            return "Basic", base64.b64encode(raw).decode()
        return None


def _env(name: str, key: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise ConfigError(f"{key}: environment variable {name} is not set")
    return value


class MaskEntry(_Section, frozen=True):
    column: Annotated[str, Meta(pattern=r"^[^.]+\.[^.]+\.[^.]+$")]
    with_: MaskKind = field(name="with")
    value: str | int | float | bool | None = None
    key_env: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.value, bool):  # for a BOOL column, which is a TINYINT
            msgspec.structs.force_setattr(self, "value", int(self.value))
        if self.with_ is MaskKind.CONSTANT and self.value is None:
            raise ValueError(f"mask of {self.column} with a constant needs value = ...")
        if self.with_ is MaskKind.HASH:
            if not self.key_env:
                raise ValueError(f"mask of {self.column} with a hash needs key_env = the "
                                 "name of the environment variable holding the key")
            if not os.environ.get(self.key_env):
                raise ValueError(f"mask of {self.column}: environment variable "
                                 f"{self.key_env} (the hash key) is not set")


class RuleEntry(_Section, frozen=True):
    """One `[[rules]]` entry: where it runs, for whom, and exactly one action."""

    name: str
    at: RulePoint
    clients: list[str | int] = field(default_factory=list)
    on_error: OnError = OnError.STOP
    do_tables: list[str] = field(default_factory=list)
    ignore_tables: list[str] = field(default_factory=list)
    rename_schema: dict[str, str] = field(default_factory=dict)
    drop_events: list[Literal["annotate", "ddl", "query", "insert", "update", "delete"]] = \
        field(default_factory=list)
    mask: list[MaskEntry] = field(default_factory=list)
    hook: str | None = None
    hook_timeout: Duration = Duration(1.0)
    # A statement-format event on a table this rule masks or filters: stop the stream
    # (its SQL text carries values no row rule reaches), or drop the statement.
    on_statement: OnStatement = OnStatement.STOP

    def __post_init__(self) -> None:
        actions = [k for k, on in (("do_tables/ignore_tables",
                                    bool(self.do_tables or self.ignore_tables)),
                                   ("rename_schema", bool(self.rename_schema)),
                                   ("drop_events", bool(self.drop_events)),
                                   ("mask", bool(self.mask)), ("hook", bool(self.hook))) if on]
        if len(actions) != 1:
            raise ValueError(f"rule {self.name!r} must do exactly one thing: one of "
                             "do_tables/ignore_tables, rename_schema, drop_events, mask, hook"
                             f" (it has {', '.join(actions) or 'none'}); split it into "
                             "several rules, they run in order")
        if self.clients and self.at is RulePoint.RECEIVE:
            raise ValueError(f"rule {self.name!r}: clients apply to send and tap rules; at "
                             "receive a rule applies to everything the relay stores")


class Config(_Section, frozen=True):
    relay: RelaySection = field(default_factory=RelaySection)
    upstream: UpstreamSection = field(default_factory=UpstreamSection)
    relaylog: RelayLogSection = field(default_factory=RelayLogSection)
    downstream: DownstreamSection = field(default_factory=DownstreamSection)
    metrics: MetricsSection = field(default_factory=MetricsSection)
    tap: TapSection = field(default_factory=TapSection)
    rules: list[RuleEntry] = field(default_factory=list)

    def __post_init__(self) -> None:
        u = self.upstream
        if u.semi_sync_wait_for_replicas and not (u.semi_sync and self.downstream.semi_sync):
            raise ValueError(
                "upstream.semi_sync_wait_for_replicas waits for downstream semi-sync "
                "acknowledgements: set upstream.semi_sync = true and downstream.semi_sync = "
                "true, or semi_sync_wait_for_replicas = 0")
        names = [r.name for r in self.rules]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"rules: names must be unique ({', '.join(dup)} repeated)")
        tls = self.downstream.tls
        for user in self.downstream.users:
            if (user.require_x509 or user.require_tls) and tls is None:
                raise ValueError(f"downstream.users {user.name!r}: require_tls / require_x509 "
                                 "need [downstream.tls] (cert and key)")
            if user.require_x509 and tls is not None and tls.ca is None:
                raise ValueError(f"downstream.users {user.name!r}: require_x509 needs "
                                 "[downstream.tls] ca, the CA that signs client certificates")


# --- loading and explaining ----------------------------------------------------------------

_PATH_STEP = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")
_TYPE_WORDS = {"int": "an integer", "float": "a number", "str": "a string",
               "bool": "true or false", "array": "a list", "object": "a table"}


def _expected(types: str) -> str:
    """msgspec's `int | float | null` as "an integer or a number" (TOML has no null)."""
    words = list(dict.fromkeys(_TYPE_WORDS.get(t, t) for t in types.split(" | ") if t != "null"))
    return " or ".join(filter(None, (", ".join(words[:-1]), words[-1])))


def _steps(path: str) -> list[str | int]:
    """`$.rules[0].mask` as ["rules", 0, "mask"]."""
    return [m[1] if m[1] is not None else (int(m[2]) if m[2].isdigit() else m[2])
            for m in _PATH_STEP.finditer(path)]


def _key(steps: list[str | int]) -> str:
    return "".join(f"[{s}]" if isinstance(s, int) or s == "..." else f".{s}"
                   for s in steps).lstrip(".")


def _plain(node: Any) -> Any:
    """An optional type (`X | None`) as the type itself."""
    if isinstance(node, msgspec.inspect.UnionType):
        kinds = [t for t in node.types if not isinstance(t, msgspec.inspect.NoneType)]
        return kinds[0] if len(kinds) == 1 else node
    return node


def _node(root: Any, steps: list[str | int]) -> Any:
    """msgspec's description of the type at a path into `root` (a StructType, an EnumType,
    ...); None where the path leaves the types."""
    node = _plain(msgspec.inspect.type_info(root))
    for step in steps:
        if isinstance(node, msgspec.inspect.StructType):
            node = next((f.type for f in node.fields if f.encode_name == step), None)
        elif isinstance(node, msgspec.inspect.ListType):
            node = node.item_type
        elif isinstance(node, msgspec.inspect.DictType):
            node = node.value_type
        else:
            return None
        node = _plain(node)
    return node


def _known_keys(root: Any, steps: list[str | int]) -> list[str]:
    node = _node(root, steps)
    return [f.encode_name for f in node.fields] \
        if isinstance(node, msgspec.inspect.StructType) else []


def _accepted(node: Any) -> list[str]:
    """The values an enum or Literal field takes, as they are written in config.toml."""
    if isinstance(node, msgspec.inspect.EnumType):
        return [str(m.value) for m in node.cls]
    return [str(v) for v in node.values] if isinstance(node, msgspec.inspect.LiteralType) else []


_TYPE_NAMES = {bool: "bool", int: "int", float: "float", str: "str", list: "array",
               dict: "object"}


def _table_key(data: Any, steps: list[str | int], got: str) -> list[str | int]:
    """msgspec names a bad value of a table `[...]`: the first value of the type it got."""
    if "..." not in steps:
        return steps
    i = steps.index("...")
    table = _value_at(data, steps[:i])
    if isinstance(table, dict):
        for key, value in table.items():
            if _TYPE_NAMES.get(type(value)) == got:
                return [*steps[:i], key, *steps[i + 1:]]
    return steps


def _value_at(data: Any, steps: list[str | int]) -> Any:
    for step in steps:
        try:
            data = data[step]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def _explain(exc: msgspec.ValidationError, data: Any, root: Any, at: str = "") -> str:
    """msgspec's "<what> - at `$.path`" in the relay's words: `section.key: what`. `data`
    was converted as `root`; `at` names where it sits in the file."""
    prefix: list[str | int] = [at] if at else []
    text, found, where = str(exc).rpartition(" - at `")
    if not found:
        text, where = str(exc), "$`"
    steps = _steps(where.rstrip("`"))
    expected = re.fullmatch(r"Expected `([^`]+)`(.*?)(?:, got `([^`]+)`)?", text)
    if expected and expected[3]:
        steps = _table_key(data, steps, expected[3])
    unknown = re.fullmatch(r"Object contains unknown field `(.+)`", text)
    if unknown:
        known = _known_keys(root, steps)
        close = difflib.get_close_matches(unknown[1], known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return f"{_key([*prefix, *steps, unknown[1]])}: unknown key; {hint}known keys here: " \
               f"{', '.join(known)}"
    shown = _shown(_value_at(data, steps), [*prefix, *steps])
    if expected:
        text = f"expected {_expected(expected[1])}{expected[2]}"
    elif text.startswith("Invalid enum value"):
        text = f"use one of {', '.join(_accepted(_node(root, steps)))}"
    else:  # a check of ours: "key: what" names a key of the table it ran on
        first, sep, rest = text.partition(": ")
        if sep and first in _known_keys(root, steps):
            steps, text = [*steps, first], rest
        shown = ""
    steps = [*prefix, *steps]
    return redact(f"{_key(steps)}: {text}{shown}" if steps else f"{text}{shown}")


# Keys whose values are never echoed: a password, whatever its type (a number, a list).
_SECRET_KEYS = frozenset({"password"})


def _shown(got: Any, steps: list[str | int]) -> str:
    """" (got ...)" for an error: one value (a table may hold passwords), never one under a
    password key or a user entry itself, and a source URL with its password masked."""
    if not isinstance(got, str | int | float) or _SECRET_KEYS & {str(s) for s in steps}:
        return ""
    names = [s for s in steps if isinstance(s, str)]
    if names and names[-1] == "users":   # a user entry that is not a table
        return ""
    if "sources" in names and isinstance(got, str):
        return f" (got {redact_url(got)!r})"
    return f" (got {got!r})"


def _convert(data: Any, kind: type[_T]) -> _T:
    """`data` as `kind`, TOML's lax way: "5s" for a Duration, 1.0 for an int."""
    return msgspec.convert(data, kind, strict=False, dec_hook=_decode)


def validated(kind: type[_T], data: Any, source: str = "defaults") -> _T:
    """`data` (a TOML table) as `kind`, or ConfigError naming the key and the fix."""
    try:
        return _convert(data, kind)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid configuration in {source}:\n  {_explain(exc, data, kind)}") \
            from None


def parse_config(data: dict[str, Any], source: str = "defaults") -> Config:
    """config.toml's tables as a Config. msgspec stops at the first error: on one, each
    section is converted alone too, so the error names one problem per section."""
    try:
        return _convert(data, Config)
    except msgspec.ValidationError as exc:
        problems = []
        if isinstance(data, dict):
            sections = {f.encode_name: f.type for f in msgspec.structs.fields(Config)}
            for name, table in data.items():
                if name not in sections:
                    problems.append(_explain(msgspec.ValidationError(
                        f"Object contains unknown field `{name}`"), data, Config))
                    continue
                try:
                    _convert(table, sections[name])
                except msgspec.ValidationError as section_exc:
                    problems.append(_explain(section_exc, table, sections[name], name))
        # none of its own: the first error came from a check across sections
        lines = problems or [_explain(exc, data, Config)]
        raise ConfigError(f"invalid configuration in {source}:\n  " + "\n  ".join(lines)) \
            from None


def load_config(path: str | None) -> Config:
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = path
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError(f"config file {path} not found") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    config = parse_config(data, source)
    if path is not None:
        _warn_if_readable(path, config)
    return config


def plain_secrets(config: Config) -> list[str]:
    """Where the file holds a password itself (not an environment variable or a hash)."""
    found = [f"upstream.sources[{i}]" for i, url in enumerate(config.upstream.sources)
             if urlsplit(url).password]
    found += [f"downstream.users {u.name!r}" for u in config.downstream.users if u.password]
    found += [f"tap.users {u.name!r}" for u in config.tap.users if u.password]
    return found


def _warn_if_readable(path: str, config: Config) -> None:
    secrets = plain_secrets(config)
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if secrets and mode & 0o077:
        logging.getLogger("relay.config").warning(
            "%s holds passwords (%s) and is readable by other users (mode %o): chmod 600 "
            "it, or use password_env / password_hash", path, ", ".join(secrets), mode & 0o777)


# --- secure defaults: what a start refuses, and what it warns about -----------------------


def is_loopback(host: str) -> bool:
    """Whether a listen host reaches this machine only: 127.0.0.0/8, ::1 (also as
    ::ffff:127.x) or localhost. 0.0.0.0, :: and every other address or name are not."""
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def _exposures(config: Config) -> list[tuple[str, bool, str, str]]:
    """Each listener beyond loopback that lacks a protection: (section, allowed by its
    allow_insecure, what is missing, what that exposes)."""
    out = []
    d, t, m = config.downstream, config.tap, config.metrics
    if not is_loopback(split_host_port(d.listen, "downstream.listen")[0]) and d.tls is None:
        out.append(("downstream", d.allow_insecure, "[downstream.tls]",
                    "replicas' logins and every row the relay sends them cross the network "
                    "in plain text"))
    if t.listen and not is_loopback(split_host_port(t.listen, "tap.listen")[0]):
        missing, exposed = [], []
        if t.tls is None:
            missing.append("[tap.tls]")
            exposed.append("row changes cross the network in plain text")
        if not t.users:
            missing.append("[[tap.users]]")
            exposed.append("anyone who reaches the port reads every row change, no login")
        if missing:
            out.append(("tap", t.allow_insecure, " and ".join(missing), "; ".join(exposed)))
    if not is_loopback(split_host_port(m.listen, "metrics.listen")[0]):
        creds = any(v is not None for v in (m.token_env, m.token_file, m.basic_user))
        missing, exposed = [], []
        if not creds:
            missing.append("credentials (token_file, token_env or basic_user)")
            exposed.append("anyone who reaches it reads /metrics and /status (clients, "
                           "users, addresses, paths)")
        if m.tls is None:
            missing.append("[metrics.tls]")
            exposed.append("what it serves" + (" and its credentials" if creds else "")
                           + " cross the network in plain text")
        if missing:
            out.append(("metrics", m.allow_insecure, " and ".join(missing), "; ".join(exposed)))
    return out


def _listen_of(config: Config, section: str) -> str:
    return str(getattr(config, section).listen)


def exposure_problems(config: Config) -> list[str]:
    """Listeners beyond loopback without TLS, logins or credentials that no allow_insecure
    accepts: each refuses a start, naming what is missing and the setting that accepts it."""
    return [f"{section}.listen = {_listen_of(config, section)!r} is beyond loopback without "
            f"{missing}: {exposed}. Add {missing}, listen on 127.0.0.1, or set [{section}] "
            "allow_insecure = true to accept that"
            for section, allowed, missing, exposed in _exposures(config) if not allowed]


def exposure_warnings(config: Config) -> list[str]:
    """Listeners beyond loopback that allow_insecure accepts without a protection: what
    each exposes (a start logs each as a WARNING)."""
    return [f"{section}.listen = {_listen_of(config, section)!r} is beyond loopback without "
            f"{missing} ([{section}] allow_insecure = true): {exposed}"
            for section, allowed, missing, exposed in _exposures(config) if allowed]


def _users(config: Config) -> list[_PasswordUser]:
    return [*config.downstream.users, *config.tap.users]


def security_problems(config: Config) -> list[str]:
    """What refuses a start (and `relay check-config`): exposed listeners, and users whose
    password_env names a variable set to "" (a user with no password at all is refused
    as the file is read)."""
    empty = [p for p in (u.empty_password_problem() for u in _users(config)) if p]
    return [*exposure_problems(config), *empty]


def security_warnings(config: Config) -> list[str]:
    """What `relay check-config` and a start warn about: listeners accepted by
    allow_insecure, users allowed an empty password, and rules that hide data from
    clients named by server_id."""
    out = exposure_warnings(config)
    for user in _users(config):
        if user.allow_empty_password and not user.has_password():
            out.append(f"{user.TABLE} {user.name!r}: no password (allow_empty_password = "
                       "true): anyone who reaches the port logs in as this user")
    for rule in config.rules:
        ids = [c for c in rule.clients if isinstance(c, int)]
        hides = bool(rule.mask or rule.do_tables or rule.ignore_tables or rule.hook)
        if ids and hides:
            out.append(f"rules {rule.name!r} names clients by server_id "
                       f"({', '.join(map(str, ids))}): a client chooses its own server_id: "
                       "this rule routes, it does not protect; name users for rules that "
                       "hide data")
    return out


def check_security(config: Config) -> list[str]:
    """ConfigError listing every `security_problems` entry; else the warnings."""
    problems = security_problems(config)
    if problems:
        raise ConfigError("configuration refused as insecure:\n  " + "\n  ".join(problems))
    return security_warnings(config)
