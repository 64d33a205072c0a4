"""Upstream source addresses: parsed from `mysql://user:password@host:port` URLs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit


@dataclass(frozen=True)
class Source:
    host: str
    port: int
    user: str
    password: str = ""

    @classmethod
    def parse(cls, url: str) -> Source:
        parts = urlsplit(url)
        if parts.scheme not in ("mysql", "mariadb"):
            raise ValueError(f"source {redact(url)!r} must start with mysql:// or mariadb://")
        if not parts.hostname:
            raise ValueError(f"source {redact(url)!r} has no host")
        try:
            port = parts.port or 3306
        except ValueError as exc:
            raise ValueError(f"source {redact(url)!r} has a bad port") from exc
        return cls(parts.hostname, port, unquote(parts.username or "root"),
                   unquote(parts.password or ""))

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def __str__(self) -> str:  # never print the password
        return f"{self.user}@{self.address}"


_PASSWORD_RE = re.compile(r"(//[^:/@\s]*:)[^@\s]*@")


def redact(text: str) -> str:
    """Hide the password of every URL in `text`."""
    return _PASSWORD_RE.sub(r"\1***@", text)
