"""The accounts of the relay's SQL port: each user's plugin and stored credential (what a
server keeps, never the password), TLS requirement, networks, connection cap and rights;
built from `[[downstream.users]]`."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from relay.config import AuthPlugin, DownstreamUser
from relay.errors import ConfigError
from relay.wire import ed25519, shacrypt
from relay.wire.auth import native_password_hash, sha2_password_hash

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Account:
    name: str
    # native: SHA1(SHA1(pw)); ed25519: public key; sha2: SHA256(SHA256(pw)) or $A$...
    credential: bytes
    plugin: AuthPlugin = AuthPlugin.NATIVE
    admin: bool = False
    require_tls: bool = False
    networks: tuple[Network, ...] = field(default=())
    max_connections: int = 0
    require_x509: bool = False
    # A user with no plugin configured (and a password): its caching_sha2_password
    # credential, which it logs in with when the relay follows MySQL (for_default).
    sha2_credential: bytes | None = None
    serve_until_us: int | None = None   # its dumps hold before later transactions

    @classmethod
    def with_password(cls, name: str, password: str,
                      plugin: AuthPlugin = AuthPlugin.NATIVE, *, admin: bool = False
                      ) -> Account:
        return cls(name, credential_of(plugin, password.encode()), plugin, admin)

    def for_default(self, plugin: AuthPlugin) -> Account:
        """The account as it logs in when the relay's default plugin is `plugin`: a user
        configured without one takes it (caching_sha2_password on a MySQL relay)."""
        if plugin is AuthPlugin.CACHING_SHA2 and self.sha2_credential is not None:
            return replace(self, plugin=plugin, credential=self.sha2_credential,
                           sha2_credential=None)
        return self

    def allows_host(self, host: str) -> bool:
        if not self.networks:
            return True
        try:
            address = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in net for net in self.networks)


def credential_of(plugin: AuthPlugin, password: bytes) -> bytes:
    if plugin is AuthPlugin.ED25519:
        return ed25519.public_key(password)
    if plugin is AuthPlugin.CACHING_SHA2:
        return sha2_password_hash(password)
    return native_password_hash(password)


def _from_hash(user: DownstreamUser, text: str) -> bytes:
    where = f"downstream.users: user {user.name!r}: password_hash"
    plugin = user.plugin or AuthPlugin.NATIVE
    try:
        if plugin is AuthPlugin.ED25519:
            return ed25519.parse_public_key(text)
        if plugin is AuthPlugin.CACHING_SHA2 and (text.startswith("$A$") or
                                                       text.startswith(("0x", "0X"))):
            # MySQL's own form, as mysql.user holds it (SHOW CREATE USER prints it as
            # 0x... hex when the salt has unprintable bytes).
            stored = bytes.fromhex(text[2:]) if text[:2] in ("0x", "0X") else \
                text.encode("latin-1")
            shacrypt.StoredHash.parse(stored)
            return stored
        raw = bytes.fromhex(text.removeprefix("*"))
    except ValueError as exc:
        raise ConfigError(f"{where} is not a {plugin.value} hash ({exc})") from None
    size = 32 if plugin is AuthPlugin.CACHING_SHA2 else 20
    if len(raw) != size:
        raise ConfigError(f"{where}: a {plugin.value} hash has {2 * size} hex digits, "
                          f"not {2 * len(raw)}")
    return raw


def account_of(user: DownstreamUser) -> Account:
    plugin = user.plugin or AuthPlugin.NATIVE
    sha2 = None
    if user.password_hash is not None:
        credential = _from_hash(user, user.password_hash)
    else:
        password = user.resolve_password().encode()
        credential = credential_of(plugin, password)
        if user.plugin is None:
            sha2 = credential_of(AuthPlugin.CACHING_SHA2, password)
    return Account(user.name, credential, plugin, user.admin, user.require_tls,
                   tuple(ipaddress.ip_network(n, strict=False) for n in user.networks),
                   user.max_connections, user.require_x509, sha2, until_us(user.serve_until))


def until_us(until: datetime | None) -> int | None:
    """A serve_until time in microseconds since the epoch, as binlogs count commit times."""
    if until is None:
        return None
    return (until - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
