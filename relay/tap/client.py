"""TapClient: a small blocking client of the tap protocol (relay/tap/protocol.py), for
scripts, tests and Spark executors (plain sockets: no event loop, picklable settings).

    with TapClient("127.0.0.1:4000", user="spark", password="...") as tap:
        print(tap.status())
        for message in tap.fetch_changes(start="earliest", end="latest"):
            ...
"""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Iterator
from typing import Any

from relay.config import ClientTls, TlsMode
from relay.tap import protocol
from relay.tap.frames import RawFrames, TapTransaction
from relay.tap.protocol import TapError
from relay.tls import client_context, tls_failure

Position = int | str


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"endpoint {endpoint!r} is not host:port")
    return host.strip("[]"), int(port)


class TapClient:
    def __init__(self, endpoint: str, user: str = "", password: str | None = None, *,
                 timeout: float = 60.0, password_env: str | None = None,
                 tls: bool = False, tls_ca: str | None = None,
                 tls_verify: TlsMode = TlsMode.VERIFY_IDENTITY) -> None:
        """`tls`: the tap has [tap.tls]; its certificate is checked against `tls_ca` (else
        the system's CAs) and the endpoint's host name, unless `tls_verify` says less."""
        self.host, self.port = parse_endpoint(endpoint)
        self.tls = ClientTls(tls_verify, tls_ca) if tls or tls_ca else None
        if password is None and password_env:
            password = os.environ.get(password_env)
            if password is None:
                raise TapError("auth", f"environment variable {password_env} (the tap "
                                       "password) is not set")
        self.user = user
        self._password = password or ""
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._decoder = protocol.FrameDecoder()
        self._pending: list[Any] = []
        self.epoch = ""
        self.hello: dict[str, Any] = {}

    # --- connection --------------------------------------------------------------------------

    def connect(self) -> TapClient:
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls is not None:
            context = client_context(self.tls)
            assert context is not None
            try:
                sock = context.wrap_socket(sock, server_hostname=self.host)
            except (ssl.SSLError, OSError) as exc:
                sock.close()
                raise TapError("tls", f"{self.host}:{self.port}: TLS handshake failed: "
                                      f"{tls_failure(exc)}") from exc
        self._sock = sock
        hello = self._read()
        if "error" in hello:
            self.close()
            raise TapError(hello["error"], hello.get("message", ""))
        if hello.get("hello") != "relay-tap":
            self.close()
            raise TapError("malformed", f"{self.host}:{self.port} is not a relay tap")
        self.hello = hello
        self.epoch = hello["epoch"]
        if hello.get("login") or self.user:
            self.request({"cmd": "login", "user": self.user,
                          "proof": protocol.proof(self._password, hello["nonce"])})
        return self

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> TapClient:
        return self.connect() if self._sock is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, obj: dict[str, Any]) -> None:
        if self._sock is None:
            self.connect()
        assert self._sock is not None
        self._sock.sendall(protocol.encode(obj))

    def _read(self) -> Any:
        while not self._pending:
            assert self._sock is not None
            data = self._sock.recv(1 << 20)
            if not data:
                raise TapError("internal", "the tap closed the connection")
            self._pending.extend(self._decoder.feed(data))
        return self._pending.pop(0)

    def read_frame(self) -> dict[str, Any]:
        frame = self._read()
        if "error" in frame:
            raise TapError(frame["error"], frame.get("message", ""))
        return frame  # type: ignore[no-any-return]

    def request(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.send(obj)
        return self.read_frame()

    # --- commands ----------------------------------------------------------------------------

    def ping(self) -> float:
        return float(self.request({"cmd": "ping"})["time"])

    def status(self) -> dict[str, Any]:
        return self.request({"cmd": "status"})

    def resolve(self, at: Position) -> int:
        """A position for "earliest", "latest", a GTID position ("0-1-42") or a
        position (checked to be a transaction boundary of this log)."""
        return int(self.request({"cmd": "resolve", "at": at, "epoch": self.epoch})["pos"])

    def gtid_at(self, at: Position) -> str | None:
        """The GTID state (MariaDB GTID position, MySQL GTID set) of the transactions
        before position `at` (resolved as `resolve` does); None from a relay that does
        not tell."""
        gtid = self.request({"cmd": "resolve", "at": at, "epoch": self.epoch,
                             "gtid": True}).get("gtid")
        return None if gtid is None else str(gtid)

    def plan(self, start: Position, end: Position = "latest", *, max_rows: int | None = None,
             split_rows: int | None = None, epoch: str | None = None) -> dict[str, Any]:
        return self.request({"cmd": "plan", "start": start, "end": end, "max_rows": max_rows,
                             "split_rows": split_rows, "epoch": epoch or self.epoch})

    def checksum(self, start: Position = "earliest", end: Position = "latest") -> dict[str, Any]:
        return self.request({"cmd": "checksum", "start": start, "end": end})

    def ack(self, name: str, pos: int) -> None:
        self.request({"cmd": "ack", "name": name, "pos": pos, "epoch": self.epoch})

    def acked(self, name: str) -> int | None:
        pos = self.request({"cmd": "acked", "name": name})["pos"]
        return None if pos is None else int(pos)

    def watermark(self, gtid: str, timeout: float = 60.0) -> tuple[int, int]:
        """(low, high): where a snapshot read of GTID state `gtid` lies in the log
        (relay/tap/snapshot.py); waits up to `timeout` for the relay to hold it."""
        r = self.request({"cmd": "watermark", "gtid": gtid, "timeout": timeout,
                          "epoch": self.epoch})
        return int(r["low"]), int(r["high"])

    def snapshot_save(self, name: str, start: int, tables: list[dict[str, Any]],
                      chunks: list[list[Any]], requested: list[str] | None = None,
                      ) -> str | None:
        """The plan kept by the relay: its id (None for a plan without chunks, which only
        marks the `requested` re-snapshot as done)."""
        snap_id = self.request({"cmd": "snapshot_save", "name": name, "start": start,
                                "tables": tables, "chunks": chunks, "requested": requested,
                                "epoch": self.epoch})["id"]
        return None if snap_id is None else str(snap_id)

    def resnapshot(self, name: str, tables: list[str], token: str | None = None) -> bool:
        """Copy `tables` (schema.table patterns) again for subscriber `name`, whose stream
        goes on: its Spark query takes the snapshot at its next batch. With a `token`,
        once: False when that token was honoured before."""
        req: dict[str, Any] = {"cmd": "resnapshot", "name": name, "tables": tables}
        if token is not None:
            req["token"] = token
        return bool(self.request(req).get("new", True))

    def snapshot_requested(self, name: str) -> list[str]:
        return [str(t) for t in self.request({"cmd": "snapshot_requested",
                                              "name": name})["tables"]]

    def snapshot_load(self, snap_id: str) -> dict[str, Any]:
        return self.request({"cmd": "snapshot_load", "id": snap_id})

    def snapshot_done(self, snap_id: str, chunk: int, rows: int) -> None:
        self.request({"cmd": "snapshot_done", "id": snap_id, "chunk": chunk, "rows": rows})

    def snapshot_drop(self, snap_id: str) -> None:
        self.request({"cmd": "snapshot_drop", "id": snap_id})

    def unsubscribe(self, name: str) -> None:
        """Forget subscriber `name`: its acknowledged position stops holding the log."""
        self.request({"cmd": "unsubscribe", "name": name})

    def schema(self, table: str) -> tuple[bytes, bytes]:
        """(FORMAT_DESCRIPTION, TABLE_MAP) events of the latest map of `table` (as the
        primary describes it when the log has no change of it)."""
        r = self.request({"cmd": "schema", "table": table})
        return r["fde"], r["event"]

    def schema_versions(self, table: str) -> list[tuple[bytes, bytes]]:
        """The same for each distinct map of `table` the log holds, oldest first."""
        r = self.request({"cmd": "schema", "table": table, "versions": True})
        return [(fde, event) for fde, event in r["versions"]]

    def fetch_frames(self, start: Position, end: Position, *, form: str = "raw",
                     tables: list[str] | None = None, epoch: str | None = None,
                     max_changes: int | None = None) -> Iterator[dict[str, Any]]:
        """The frames of [start, end), the end frame last; raises TapError on an error
        frame and when the connection ends early. The request goes out at once."""
        self.send({"cmd": "fetch", "start": start, "end": end, "form": form,
                   "tables": tables, "epoch": epoch or self.epoch,
                   "max_changes": max_changes})
        return self._until_end()

    def _until_end(self) -> Iterator[dict[str, Any]]:
        while True:
            frame = self.read_frame()
            yield frame
            if frame.get("k") == "end":
                return

    def fetch_transactions(self, start: Position, end: Position, *,
                           tables: list[str] | None = None, epoch: str | None = None,
                           ) -> Iterator[TapTransaction]:
        """Transactions of [start, end), decoded here from the raw form."""
        return iter(RawFrames(self.fetch_frames(start, end, tables=tables, epoch=epoch)))

    def fetch_changes(self, start: Position, end: Position, *,
                      tables: list[str] | None = None) -> Iterator[dict[str, Any]]:
        """The decoded form, as the tap sends it: {"k": "tx", ...} messages."""
        for frame in self.fetch_frames(start, end, form="rows", tables=tables):
            if frame.get("k") == "tx":
                yield frame

    def subscribe(self, start: Position = "latest", *, name: str | None = None,
                  form: str = "rows", tables: list[str] | None = None,
                  ) -> Iterator[dict[str, Any]]:
        """Frames from `start` on as the log grows ({"k": "idle"} while nothing comes),
        until stop(). Acknowledge with subscription_ack() meanwhile."""
        self.send({"cmd": "subscribe", "start": start, "name": name, "form": form,
                   "tables": tables, "epoch": self.epoch})
        return self._until_end()

    def subscription_ack(self, pos: int, name: str | None = None) -> None:
        """Acknowledge `pos` during a subscription (no answer unless it is wrong)."""
        req: dict[str, Any] = {"cmd": "ack", "pos": pos, "epoch": self.epoch}
        if name:
            req["name"] = name
        self.send(req)

    def stop(self) -> None:
        self.send({"cmd": "stop"})
