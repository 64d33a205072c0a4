"""MySQL's stored form of a caching_sha2_password account: `$A$<rounds>$<salt><digest>`,
what `mysql.user.authentication_string` holds and `SHOW CREATE USER` prints, so an
operator can copy a user's hash from a MySQL server into `password_hash`.

The digest is Ulrich Drepper's SHA-256 crypt (the `$5$` of glibc's crypt) with MySQL's
framing: a 20-byte salt of 7-bit characters (glibc and passlib take at most 16, and
Python's `crypt` module leaves the standard library in 3.13, so no library computes it),
rounds given as a three-digit hexadecimal count of thousands ("005": 5,000), and the
43-character digest after the salt with no separator. Written here from the published
algorithm; tested against glibc for short salts and against hashes MySQL made.
"""

from __future__ import annotations

import hashlib
import hmac

PREFIX = b"$A$"
SALT_LEN = 20
DIGEST_LEN = 43
ROUNDS_UNIT = 1000
MAX_ROUNDS = 0xFFF * ROUNDS_UNIT   # MySQL's caching_sha2_password_digest_rounds bound
# MySQL refuses longer passwords (CACHING_SHA2_PASSWORD_MAX_PASSWORD_LENGTH): the digest's
# work grows with the password's length, and the password comes from the network.
MAX_PASSWORD = 256

_B64 = b"./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# The digest's bytes, three at a time, in the order the algorithm writes them out.
_ORDER = ((0, 10, 20), (21, 1, 11), (12, 22, 2), (3, 13, 23), (24, 4, 14), (15, 25, 5),
          (6, 16, 26), (27, 7, 17), (18, 28, 8), (9, 19, 29))


class StoredHash:
    """A parsed `$A$...` string: its rounds, salt and digest text."""

    __slots__ = ("digest", "rounds", "salt")

    def __init__(self, rounds: int, salt: bytes, digest: bytes) -> None:
        self.rounds = rounds
        self.salt = salt
        self.digest = digest

    @classmethod
    def parse(cls, stored: bytes) -> StoredHash:
        """Raises ValueError, saying what is wrong, for anything else."""
        if not stored.startswith(PREFIX):
            raise ValueError("a caching_sha2_password hash starts with $A$")
        field, sep, rest = stored[len(PREFIX):].partition(b"$")
        if not sep or len(field) != 3:
            raise ValueError("$A$ is followed by three hexadecimal digits of rounds and $")
        try:
            rounds = int(field, 16) * ROUNDS_UNIT
        except ValueError:
            raise ValueError(f"rounds {field!r} are not hexadecimal") from None
        if not 0 < rounds <= MAX_ROUNDS:
            raise ValueError(f"rounds {field.decode('ascii', 'replace')} out of range")
        if len(rest) != SALT_LEN + DIGEST_LEN:
            raise ValueError(f"a {SALT_LEN}-byte salt and a {DIGEST_LEN}-character digest "
                             f"follow the rounds, not {len(rest)} bytes")
        return cls(rounds, rest[:SALT_LEN], rest[SALT_LEN:])

    def matches(self, password: bytes) -> bool:
        """False for a password over MAX_PASSWORD bytes, without hashing it."""
        if len(password) > MAX_PASSWORD:
            return False
        return hmac.compare_digest(sha256_crypt(password, self.salt, self.rounds),
                                   self.digest)


def sha256_crypt(password: bytes, salt: bytes, rounds: int = 5000) -> bytes:
    """The 43-character SHA-256 crypt digest of `password` under `salt` and `rounds`."""
    sha = hashlib.sha256
    n = len(password)
    alternate = sha(password + salt + password).digest()
    a = sha(password + salt)
    a.update((alternate * (n // 32 + 1))[:n])
    bits = n
    while bits:
        a.update(alternate if bits & 1 else password)
        bits >>= 1
    digest = a.digest()
    p = sha()
    for _ in range(n):
        p.update(password)
    p_bytes = (p.digest() * (n // 32 + 1))[:n]
    s_bytes = (sha(salt * (16 + digest[0])).digest() * (len(salt) // 32 + 1))[:len(salt)]
    for i in range(rounds):
        c = sha(p_bytes if i & 1 else digest)
        if i % 3:
            c.update(s_bytes)
        if i % 7:
            c.update(p_bytes)
        c.update(digest if i & 1 else p_bytes)
        digest = c.digest()
    out = bytearray()
    for x, y, z in _ORDER:
        _b64_24(digest[x], digest[y], digest[z], 4, out)
    _b64_24(0, digest[31], digest[30], 3, out)
    return bytes(out)


def _b64_24(b2: int, b1: int, b0: int, n: int, out: bytearray) -> None:
    w = (b2 << 16) | (b1 << 8) | b0
    for _ in range(n):
        out.append(_B64[w & 0x3F])
        w >>= 6
