"""Test certificates: a CA and certificates it signed for 127.0.0.1 / localhost, as PEM
files, made with trustme (a dev dependency; only tests and benches import this)."""

from __future__ import annotations

import os

import trustme


class Certs:
    """A CA, and certificates it signed for 127.0.0.1 / localhost, as PEM files."""

    def __init__(self, directory: str, name: str) -> None:
        self.dir = directory
        self.authority = trustme.CA(key_type=trustme.KeyType.RSA)
        self.ca = self._path(f"{name}-ca.pem")
        self.authority.cert_pem.write_to_path(self.ca)
        self.cert, self.key = self.issue(f"{name}-server")

    def _path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def issue(self, name: str) -> tuple[str, str]:
        leaf = self.authority.issue_cert("127.0.0.1", "localhost", key_type=trustme.KeyType.RSA)
        cert, key = self._path(f"{name}.pem"), self._path(f"{name}-key.pem")
        for i, blob in enumerate(leaf.cert_chain_pems):
            blob.write_to_path(cert, append=i > 0)
        leaf.private_key_pem.write_to_path(key)
        return cert, key
