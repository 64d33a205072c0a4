"""Per-client behaviour: a client that stops reading is dropped after write_timeout without
touching anyone else; a second dump with the same server_id replaces the first."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import pytest

from relay.binlog import walk
from relay.binlog.gtid import GtidPosition, GtidState
from relay.config import Source
from relay.testing.mariadb import MariaDB
from relay.upstream.protocol import StreamLink, StreamStart, UpstreamProtocol
from relay.upstream.session import Session, SessionSettings
from relay.wire.dumpstream import EventBatch
from tests.conftest import RelayProcess, replicate_through, wait_until
from tests.integration import workload
from tests.integration.common import converged, start_relay

pytestmark = pytest.mark.integration


class Sink:
    """Stands in for the ingest: counts events and can stop reading the socket."""

    def __init__(self) -> None:
        self.link: StreamLink | None = None
        self.packets = 0
        self.stall = False

    def on_stream(self, start: StreamStart) -> None:
        self.link = start.link

    def on_events(self, batch: EventBatch) -> None:
        for pos, size in walk.spans(batch.data):
            self.on_event(bytes(batch.data[pos : pos + size]))
            self.packets += 1
        if self.stall and self.link is not None:
            self.link.pause()  # a frozen client: the socket fills up

    def on_event(self, ev: bytes) -> None:
        pass

    async def on_end(self) -> None:
        pass


def ended(relay: RelayProcess, how: str) -> int:
    """How many downstream sessions ended this way, as /status counts them."""
    return int(relay.status().get("downstream", {}).get("ended", {}).get(how, 0))


def dumping(relay: RelayProcess, server_id: int) -> int:
    return sum(1 for c in relay.status().get("clients", [])
               if c["server_id"] == server_id and c["file"] is not None)


def dump_ids(relay: RelayProcess, server_id: int) -> list[int]:
    """The session ids of the dumps replica `server_id` has open."""
    return [c["id"] for c in relay.status().get("clients", [])
            if c["server_id"] == server_id and c["file"] is not None]


async def dump_client(port: int, server_id: int, sink: Sink) -> Session:
    session = Session(Source("127.0.0.1", port, "repl", "relaypass"),
                      SessionSettings(server_id, 0.5, 5.0, 30.0), sink)
    return session


def test_stuck_client_is_dropped_alone(mariadb_factory: Callable[..., MariaDB],
                                       relay_factory: Callable[..., RelayProcess]) -> None:
    primary = mariadb_factory()
    relay = start_relay(relay_factory, primary)  # write_timeout = 5s
    replica = mariadb_factory(server_id=91)
    replicate_through(replica, relay.port)
    wait_until(lambda: dumping(relay, 91) == 1, 30, "the replica's dump")
    replica_dump = dump_ids(relay, 91)
    ended_before = dict(relay.status()["downstream"]["ended"])

    async def scenario() -> tuple[BaseException | None, int]:
        sink = Sink()
        session = await dump_client(relay.port, 92, sink)
        sink.stall = True
        task = asyncio.create_task(session.run(GtidState()))
        # 80 MB through the relay while this client reads nothing
        await asyncio.to_thread(primary.execute_many, [
            "CREATE DATABASE IF NOT EXISTS s",
            "CREATE TABLE s.big (id INT PRIMARY KEY, v LONGBLOB)",
            "INSERT INTO s.big SELECT seq, REPEAT('s', 1048576) FROM mysql.seq_1_to_80"])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not await asyncio.to_thread(
                ended, relay, "timeout"):
            await asyncio.sleep(0.2)
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        return None, sink.packets

    _, packets = asyncio.run(scenario())
    # That client only: its dump is gone, the replica's is the same session as before.
    ended_after = relay.status()["downstream"]["ended"]
    assert {k: n - ended_before.get(k, 0) for k, n in ended_after.items()
            if n != ended_before.get(k, 0)} == {"timeout": 1}, (ended_before, ended_after)
    assert dump_ids(relay, 92) == [] and dump_ids(relay, 91) == replica_dump
    # The one that timed out was server_id 92's dump, stuck part way through the log.
    status = relay.status()
    ends = status["downstream"]["recent_endings"]
    assert [(e["server_id"], e["reason"]) for e in ends] == [(92, "timeout")], ends
    end = status["relay_log"]
    assert ends[0]["bytes_sent"] > 0, ends
    assert (ends[0]["file"], ends[0]["position"]) < (end["file"], end["position"]), (ends, end)
    wait_until(lambda: converged(primary, replica), 60, "the other replica")
    assert replica.query("CHECKSUM TABLE s.big")[0] == primary.query("CHECKSUM TABLE s.big")[0]
    assert packets > 0


def test_same_server_id_replaces_the_older_dump(mariadb_factory: Callable[..., MariaDB],
                                                relay_factory: Callable[..., RelayProcess]) -> None:
    primary = mariadb_factory()
    relay = start_relay(relay_factory, primary)
    workload.mixed(primary, rounds=1)

    async def scenario() -> tuple[bool, bool]:
        first, second = Sink(), Sink()
        s1 = await dump_client(relay.port, 77, first)
        t1 = asyncio.create_task(s1.run(GtidState()))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not await asyncio.to_thread(dumping, relay, 77):
            await asyncio.sleep(0.05)
        s2 = await dump_client(relay.port, 77, second)
        t2 = asyncio.create_task(s2.run(GtidState()))
        done, _ = await asyncio.wait({t1}, timeout=10)
        first_ended = t1 in done
        second_alive = not t2.done()
        for t in (t1, t2):
            t.cancel()
            with contextlib.suppress(BaseException):
                await t
        return first_ended, second_alive

    first_ended, second_alive = asyncio.run(scenario())
    assert first_ended, "the older dump session with server_id 77 was not reaped"
    assert second_alive
    assert ended(relay, "replaced") == 1


class Collect(Sink):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[bytes] = []

    def on_event(self, ev: bytes) -> None:
        self.events.append(ev)


class NoChecksumSession(Session):
    """A client from before binlog checksums: it never sets @master_binlog_checksum."""

    async def _setup(self, proto: UpstreamProtocol, state: GtidPosition) -> None:
        await self.query(proto, "SET @mariadb_slave_capability = 4")
        await self.query(proto, f"SET @slave_connect_state = '{state}'")


def test_checksums_are_stripped_for_a_client_without_them(
        mariadb_factory: Callable[..., MariaDB],
        relay_factory: Callable[..., RelayProcess]) -> None:
    from relay.binlog.checksum import verify
    from relay.binlog.constants import EventType
    from relay.binlog.events import decode_fde

    primary = mariadb_factory(options={"binlog_checksum": "CRC32"})
    relay = start_relay(relay_factory, primary)
    workload.mixed(primary, rounds=1)
    expected = primary.gtid_binlog_pos()
    wait_until(lambda: relay.http("/status")[0] == 200 and expected in relay.http("/status")[1],
               60, "relay catch-up")

    async def scenario() -> list[bytes]:
        sink = Collect()
        session = NoChecksumSession(Source("127.0.0.1", relay.port, "repl", "relaypass"),
                                    SessionSettings(93, 0.5, 5.0, 30.0), sink)
        task = asyncio.create_task(session.run(GtidState()))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and sum(
                1 for e in sink.events if e[4] == EventType.GTID) < 50:
            await asyncio.sleep(0.1)
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        return sink.events

    events = asyncio.run(scenario())
    fdes = [e for e in events if e[4] == EventType.FORMAT_DESCRIPTION]
    assert fdes and all(decode_fde(f).checksum_alg == 0 for f in fdes)
    gtids = [e for e in events if e[4] == EventType.GTID]
    assert len(gtids) >= 50
    assert all(len(e) == 19 + 19 for e in gtids)  # 42 bytes with a CRC, 38 without
    assert not any(verify(e) for e in gtids)
    for e in events:
        assert int.from_bytes(e[9:13], "little") == len(e)  # sizes fixed after stripping
