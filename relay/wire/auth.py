"""Password authentication, both as client and as server, sans I/O: the scrambles of
mysql_native_password, caching_sha2_password and MariaDB's ed25519, their server-side
checks, and `ClientAuth`, the client's side of the exchange (greeting plugin, auth switch,
caching_sha2's fast and full authentication over TLS or with the server's RSA key).

RSA (caching_sha2's full authentication without TLS) comes from `cryptography`, loaded
only when that exchange happens.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from relay.errors import AuthError
from relay.wire import ed25519, shacrypt
from relay.wire.login_policy import LoginPolicy

NATIVE_PASSWORD = "mysql_native_password"
CACHING_SHA2 = "caching_sha2_password"
CLIENT_ED25519 = "client_ed25519"   # the client side of MariaDB's `ed25519` plugin
CLIENT_PLUGINS = (NATIVE_PASSWORD, CACHING_SHA2, CLIENT_ED25519)

# caching_sha2_password's one-byte messages after 0x01 (AuthMoreData)
FAST_AUTH_OK = 3
PERFORM_FULL_AUTH = 4
REQUEST_PUBLIC_KEY = 2
MAX_SWITCHES = 2   # a server switches once; COM_CHANGE_USER may add one

def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def native_scramble(password: bytes, salt: bytes) -> bytes:
    """Client side: SHA1(pw) XOR SHA1(salt || SHA1(SHA1(pw)))."""
    if not password:
        return b""
    stage1 = hashlib.sha1(password).digest()
    stage2 = hashlib.sha1(stage1).digest()
    return _xor(stage1, hashlib.sha1(salt[:20] + stage2).digest())


def native_password_hash(password: bytes) -> bytes:
    """What a server stores: SHA1(SHA1(password)); empty for an empty password."""
    if not password:
        return b""
    return hashlib.sha1(hashlib.sha1(password).digest()).digest()


def native_verify(stored_hash: bytes, salt: bytes, response: bytes) -> bool:
    """Server side check of a client's mysql_native_password response."""
    if not stored_hash:
        return response == b""
    if len(response) != 20:
        return False
    candidate = _xor(response, hashlib.sha1(salt[:20] + stored_hash).digest())
    return hmac.compare_digest(hashlib.sha1(candidate).digest(), stored_hash)


def sha2_scramble(password: bytes, nonce: bytes) -> bytes:
    """caching_sha2_password, client side: SHA256(pw) XOR SHA256(SHA256(SHA256(pw)) ||
    nonce)."""
    if not password:
        return b""
    stage1 = hashlib.sha256(password).digest()
    stage2 = hashlib.sha256(stage1).digest()
    return _xor(stage1, hashlib.sha256(stage2 + nonce[:20]).digest())


def sha2_password_hash(password: bytes) -> bytes:
    """What the relay keeps for a caching_sha2_password user: SHA256(SHA256(password))
    (the digest MySQL keeps in its fast-authentication cache); empty for no password."""
    if not password:
        return b""
    return hashlib.sha256(hashlib.sha256(password).digest()).digest()


def sha2_verify(stored_hash: bytes, nonce: bytes, response: bytes) -> bool:
    """Server side check of a caching_sha2_password scramble (the fast path)."""
    if not stored_hash:
        return response == b""
    if len(response) != 32:
        return False
    candidate = _xor(response, hashlib.sha256(stored_hash + nonce[:20]).digest())  # SHA256(pw)
    return hmac.compare_digest(hashlib.sha256(candidate).digest(), stored_hash)


def sha2_verify_cleartext(stored_hash: bytes, password: bytes) -> bool:
    """Server side check of a password sent whole (full authentication), against
    SHA256(SHA256(pw)) or MySQL's stored `$A$...` form (relay/wire/shacrypt.py)."""
    if stored_hash.startswith(shacrypt.PREFIX):
        return shacrypt.StoredHash.parse(stored_hash).matches(password)
    return hmac.compare_digest(sha2_password_hash(password), stored_hash)


def tls_password_proof(password_hash: bytes, scramble: bytes, fingerprint: bytes) -> bytes:
    """MariaDB 11.4+'s proof of a server's certificate through the password, as the OK
    packet's info carries it: 0x01, then SHA-256(password hash || the greeting's 20-byte
    scramble || SHA-256 of the certificate's DER) in upper-case hex. `password_hash` is
    the auth plugin's hash_password_bin: SHA1(SHA1(pw)) for mysql_native_password, the
    Ed25519 public key for ed25519."""
    digest = hashlib.sha256(password_hash + scramble[:20] + fingerprint).hexdigest()
    return b"\x01" + digest.upper().encode()


def _nonce_mask(data: bytes, nonce: bytes) -> bytes:
    """`data` XOR the 20-byte nonce repeated: how the password travels under RSA."""
    return _xor(data, (nonce[:20] * (len(data) // 20 + 1))[: len(data)])


def _oaep() -> Any:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    return padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA1()), algorithm=hashes.SHA1(),
                        label=None)


def rsa_encrypt_password(password: bytes, nonce: bytes, public_key_pem: bytes) -> bytes:
    """Full authentication without TLS, client side: (password NUL) XOR the nonce, under
    the server's RSA key with OAEP padding, as libmysqlclient sends it."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    try:
        key = serialization.load_pem_public_key(public_key_pem)
        if not isinstance(key, rsa.RSAPublicKey):
            raise AuthError("the server's public key is not an RSA key")
        return key.encrypt(_nonce_mask(password + b"\0", nonce), _oaep())
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:  # a bad key from the wire
        raise AuthError(f"the server's RSA public key is unusable: {exc}") from None


def rsa_decrypt_password(private_key: Any, packet: bytes, nonce: bytes) -> bytes | None:
    """Server side of the same: the password, or None for a packet that is no such
    ciphertext."""
    try:
        plain: bytes = private_key.decrypt(packet, _oaep())
    except ValueError:
        return None
    return _nonce_mask(plain, nonce).rstrip(b"\0")


def rsa_public_pem(private_key: Any) -> bytes:
    """The public half of the server's key, as the server sends it (PEM)."""
    from cryptography.hazmat.primitives import serialization

    pem: bytes = private_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return pem


def ed25519_verify(public_key: bytes, nonce: bytes, signature: bytes) -> bool:
    """Server side check of MariaDB's ed25519: a standard Ed25519 signature of the nonce."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if len(signature) != 64:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, nonce)
    except (InvalidSignature, ValueError):
        return False
    return True


def scramble_for(plugin: str, password: bytes, nonce: bytes) -> bytes:
    if plugin == NATIVE_PASSWORD:
        return native_scramble(password, nonce)
    if plugin == CACHING_SHA2:
        return sha2_scramble(password, nonce)
    if plugin == CLIENT_ED25519:
        return ed25519.sign(password, nonce)
    raise AuthError(f"the server asks for authentication plugin {plugin!r}; the relay "
                    f"speaks {', '.join(CLIENT_PLUGINS)}")


class ClientAuth:
    """The client's side of authentication, fed the server's packets after the handshake
    response until its OK (or ERR, which the caller raises)."""

    def __init__(self, password: bytes, *, tls: bool, policy: LoginPolicy | None = None
                 ) -> None:
        """`policy`: what the login refuses (login_policy.py), as every client of the
        relay's does."""
        self.password = password
        self.tls = tls
        self.policy = policy if policy is not None else LoginPolicy()
        self.plugin = NATIVE_PASSWORD
        self._nonce = b""
        self._want_key = False
        self._switches = 0

    def first_response(self, plugin: str, nonce: bytes) -> bytes:
        """The handshake response's auth data: in the greeting's plugin when the relay
        speaks it (no switch then), else mysql_native_password."""
        self.plugin = plugin if plugin in CLIENT_PLUGINS else NATIVE_PASSWORD
        self._nonce = nonce
        return scramble_for(self.plugin, self.password, nonce)

    def answer(self, packet: bytes) -> bytes | None:
        """What to send after `packet` (not OK or ERR); None: wait for the next one."""
        kind = packet[:1]
        if kind == b"\xfe":  # AuthSwitchRequest: plugin NUL data
            self._switches += 1
            if self._switches > MAX_SWITCHES:  # each costs a signature or a hash: no loop
                raise AuthError(f"the server switched authentication plugins more than "
                                f"{MAX_SWITCHES} times")
            name, _, data = bytes(packet[1:]).partition(b"\0")
            self.plugin = name.decode("utf-8", "replace")
            self.policy.switched(self.plugin, secure=self.tls,
                                 has_password=bool(self.password))
            # native and caching_sha2 end their 20-byte nonce with a NUL; ed25519's 32 bytes
            # are all nonce
            ed = self.plugin == CLIENT_ED25519
            self._nonce = data[:-1] if not ed and data.endswith(b"\0") else data
            return scramble_for(self.plugin, self.password, self._nonce)
        if kind != b"\x01" or self.plugin != CACHING_SHA2:
            raise AuthError(f"unexpected packet 0x{packet[:1].hex() or '--'} during "
                            f"{self.plugin} authentication")
        data = bytes(packet[1:])
        if self._want_key:       # the server's PEM public key
            self._want_key = False
            return rsa_encrypt_password(self.password, self._nonce, data)
        if data == bytes((FAST_AUTH_OK,)):
            return None           # OK follows
        if data == bytes((PERFORM_FULL_AUTH,)):
            if self.tls:
                return self.password + b"\0"
            self.policy.full_authentication(secure=False)
            self._want_key = True
            return bytes((REQUEST_PUBLIC_KEY,))
        raise AuthError(f"unexpected caching_sha2_password message {data[:8].hex()}")
