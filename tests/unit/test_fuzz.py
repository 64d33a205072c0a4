"""Hypothesis over every surface that reads network bytes (tests/fuzz_targets.py): random
bytes and mutations of valid inputs end in a clean error (a RelayError) or none. The long
runs (a million inputs per surface, with the slowest input and the peak RSS) are in
bench/fuzz.py."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import socket
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pymysql
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay.binlog.constants import HEADER_LEN, EventType
from relay.binlog.file import iter_events
from relay.config import SyncMode, SyncPolicy
from relay.downstream.accounts import Account
from relay.downstream.context import DownstreamSettings
from relay.downstream.registry import EndReason
from relay.downstream.server import DownstreamServer
from relay.errors import RelayError
from relay.relaylog.log import RelayLog
from relay.tap.client import TapClient
from relay.tap.protocol import TapError
from relay.tap.server import TapServer
from relay.tap.settings import TapSettings
from relay.wire.auth import NATIVE_PASSWORD, native_scramble
from relay.wire.handshake import build_response, parse_greeting
from relay.wire.packets import PacketReader, frame
from tests.fuzz_targets import TARGETS, seeds

T = TypeVar("T")
BINLOG = os.path.join(os.path.dirname(__file__), "..", "data", "mariadb", "types.000001")


def mutated(surface: str) -> st.SearchStrategy[bytes]:
    """A valid input with some bytes overwritten, cut or extended."""
    def mutate(seed: bytes, edits: list[tuple[int, int]], cut: int, tail: bytes) -> bytes:
        out = bytearray(seed)
        for pos, value in edits:
            if out:
                out[pos % len(out)] = value
        return bytes(out[: max(0, len(out) - cut)]) + tail
    return st.builds(mutate, st.sampled_from(seeds(surface)),
                     st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)),
                              max_size=8),
                     st.integers(0, 16), st.binary(max_size=16))


@pytest.mark.parametrize("surface", sorted(TARGETS))
def test_seeds_are_accepted(surface: str) -> None:
    """The seeds are valid inputs: a target that refuses them reaches nothing deeper."""
    for seed in seeds(surface):
        TARGETS[surface](seed)


@pytest.mark.parametrize("surface", sorted(TARGETS))
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_random_and_mutated_input_gives_clean_errors(surface: str, data: st.DataObject) -> None:
    raw = data.draw(st.one_of(st.binary(max_size=512), mutated(surface)))
    with contextlib.suppress(RelayError):
        TARGETS[surface](raw)


# --- the servers themselves, over sockets -------------------------------------------------

def _before_schema(data: bytes, schema: bytes) -> int:
    """The offset of the first transaction in a binlog that maps a table of `schema`."""
    group = 0
    for ev in iter_events(data, where=BINLOG):
        if ev.type_code == EventType.GTID:
            group = ev.offset
        elif ev.type_code == EventType.TABLE_MAP and \
                ev.data[HEADER_LEN + 8 : HEADER_LEN + 9 + len(schema)] == \
                bytes((len(schema),)) + schema:
            return group
    raise AssertionError(f"no table of {schema!r} in {BINLOG}")

class Servers:
    """The downstream server and the tap over a small relay log, on a loop in a thread."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self._call(self._start())

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    async def _start(self) -> None:
        # A real MariaDB binlog as the relay log's segment: its rows events have their
        # TABLE_MAPs, so a request that reads the log fails only by the relay's fault. It
        # ends before the schema `old`, whose pre-10.1.2 temporal columns decode only with
        # type hints (without them the tap rightly answers an error, not rows).
        with open(BINLOG, "rb") as f:
            data = f.read()
        with open(os.path.join(self.directory, "relay-bin.000001"), "wb") as f:
            f.write(data[:_before_schema(data, b"old")])
        with open(os.path.join(self.directory, "relay-bin.index"), "w") as f:
            f.write("./relay-bin.000001\n")
        self.log = RelayLog(self.directory, sync=SyncPolicy(SyncMode.OFF))  # the loop's
        self.log.open()
        self.log.start()
        self.downstream = DownstreamServer(self.log, DownstreamSettings(
            "127.0.0.1", 0, {"repl": Account.with_password("repl", "pw")}, 4242, handshake_timeout=2, catchup_wait=0.1,
            write_timeout=2))
        await self.downstream.start()
        self.tap = TapServer(self.log, TapSettings("127.0.0.1", 0, {"reader": "pw"},
                                                   handshake_timeout=2))
        await self.tap.start()

    async def _close(self) -> None:
        await self.downstream.close()
        await self.tap.close()
        self.log.close()

    def endings(self) -> dict[EndReason, int]:
        """How the downstream sessions ended so far, read once every session has ended."""
        async def settled() -> dict[EndReason, int]:
            registry = self.downstream.registry
            async with asyncio.timeout(10):
                while len(registry):
                    await asyncio.sleep(0.01)
            return dict(registry.ended)
        return self._call(settled())

    def tap_counts(self) -> tuple[int, dict[str, int]]:
        """The tap's requests served and error frames by code so far."""
        async def read() -> tuple[int, dict[str, int]]:
            return sum(self.tap.stats.requests.values()), dict(self.tap.stats.errors)
        return self._call(read())

    def close(self) -> None:
        self._call(self._close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    s = Servers(str(tmp_path_factory.mktemp("fuzz-servers")))
    yield s
    s.close()


@contextlib.contextmanager
def login(port: int) -> Iterator[socket.socket]:
    """A raw connection logged in as repl (the relay's own client-side handshake code)."""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        reader = PacketReader()
        while (greeting := reader.next_payload()) is None:
            reader.feed(sock.recv(4096))
        hello = parse_greeting(greeting)
        sock.sendall(frame(build_response("repl", native_scramble(b"pw", hello.scramble),
                                          NATIVE_PASSWORD), 1)[0])
        reader.next_seq = 2  # after our response (1)
        while (reply := reader.next_payload()) is None:
            reader.feed(sock.recv(4096))
        assert reply[:1] == b"\x00", reply
        yield sock


COMMANDS = (0x01, 0x02, 0x03, 0x04, 0x09, 0x0E, 0x12, 0x15, 0x1B, 0x1E, 0x1F, 0xFF)


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(command=st.sampled_from(COMMANDS), payload=st.binary(max_size=300))
def test_any_command_after_login_ends_that_session_at_worst(
        servers: Servers, command: int, payload: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    port = servers.downstream.port
    before = servers.endings()
    with login(port) as sock:
        sock.sendall(frame(bytes((command,)) + payload, 0)[0])
        with contextlib.suppress(OSError):
            sock.recv(65536)  # an answer, an error, a stream or a close: any is fine
    # The server answers the next client as if nothing happened.
    with contextlib.closing(pymysql.connect(host="127.0.0.1", port=port, user="repl",
                                            password="pw", connect_timeout=5)) as ok, \
            ok.cursor() as cur:
        cur.execute("SELECT @@gtid_binlog_pos")
        assert cur.fetchone() == (str(servers.log.visible_state),)
    # Both sessions (the fuzzed one and the check) ended and were counted, neither with an
    # unexpected error: a session that caught one, or whose task raised, counts as ERROR.
    after = servers.endings()
    ended = {r.value: after[r] - before[r] for r in EndReason if after[r] != before[r]}
    assert sum(ended.values()) == 2 and EndReason.ERROR.value not in ended, ended
    # A fault is logged at ERROR or with a traceback, whatever its words.
    failed = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not failed, failed


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(request=st.dictionaries(st.sampled_from(["cmd", "at", "start", "end", "name", "pos",
                                                "epoch", "tables", "max_rows", "form"]),
                               st.one_of(st.integers(-(2**63), 2**64 - 1), st.text(max_size=20),
                                         st.binary(max_size=20), st.none(), st.booleans(),
                                         st.lists(st.text(max_size=5), max_size=3)),
                               max_size=6),
       cmd=st.sampled_from(["status", "resolve", "plan", "fetch", "checksum", "ack", "acked",
                            "schema", "subscribe", "changes", "nonsense"]))
def test_any_tap_request_after_login_gets_an_answer_or_an_error_frame(
        servers: Servers, request: dict[str, Any], cmd: str,
        caplog: pytest.LogCaptureFixture) -> None:
    request = {**request, "cmd": cmd}
    requests, errors = servers.tap_counts()
    with TapClient(f"127.0.0.1:{servers.tap.port}", "reader", "pw", timeout=5) as tap:
        tap.send(request)
        try:
            assert _answer(tap, cmd)
        except TapError as exc:  # an error frame, but not the relay's own fault
            assert exc.code != "internal", exc
        assert tap.ping() > 0  # the same connection goes on (a fault of ours would end it)
    # The tap served the login, the request and the ping (and a refused subscription's
    # stop), and answered no "internal" error.
    requests_after, errors_after = servers.tap_counts()
    assert requests_after - requests in (3, 4)
    assert errors_after.get("internal", 0) == errors.get("internal", 0), errors_after
    # A fault is logged at ERROR or with a traceback, whatever its words.
    failed = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not failed, failed


def _answer(tap: TapClient, cmd: str) -> list[dict[str, Any]]:
    """The frames that answer one request (an error frame raises TapError): one frame; a
    fetch's up to its end frame; a subscription is stopped and read up to its end frame."""
    if cmd == "subscribe":
        tap.send({"cmd": "stop"})
        try:
            frames = [tap.read_frame()]
        except TapError:  # refused: the stop was then a request of its own
            with pytest.raises(TapError, match="unknown_command"):
                tap.read_frame()
            raise
    else:
        frames = [tap.read_frame()]
    if cmd in ("subscribe", "fetch"):
        while frames[-1].get("k") != "end" and "ok" not in frames[-1]:
            frames.append(tap.read_frame())
    return frames


@pytest.mark.parametrize(("surface", "data"), [
    # sqlglot raised IndexError on a comment right after SHOW BINLOG: a dropped connection.
    ("statements", b"SHOW BINLOG#EVENTS LIMIT 0"),
    # A TRANSACTION_PAYLOAD whose header field is cut short raised struct.error.
    ("binlog", base64.b64decode(
        "cKoEaygBAAAAQwAAAP////9xAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBqmsABAAB/v7+/v7+"
        "/v7+/v7+/v7+/v7+/v7+8///AJv+/vP//wCb/xDxGP8FPA==")),
    # A LIMIT of "8." raised ValueError out of SHOW BINLOG EVENTS.
    ("statements", b"SHOW BINLOG EVENTS LIMIT 8."),
    # msgpack raised TypeError for a map keyed by a list: a traceback in the tap's log.
    ("tap", b"\x00\x00\x00\x04\x81\x91\x01\x01"),
    # A greeting's plugin name that is not UTF-8 ended the upstream task.
    ("upstream", b"\x00\n10.11.9-MariaDB-log\x00\x07\x00\x00\x00ssssssss\x00\x0c\xa2\x08\x02"
                 b"\x00:\x01\x15" + b"\x00" * 10 + b"ssssssssssss\x00mysql_native_password\x80"),
])
def test_inputs_fuzzing_found_give_clean_errors(surface: str, data: bytes) -> None:
    with contextlib.suppress(RelayError):
        TARGETS[surface](data)
