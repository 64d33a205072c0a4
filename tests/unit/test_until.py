"""START SLAVE UNTIL master_gtid_pos on the primary's side: which groups a dump sends and
when every domain is reached (the rules of MariaDB's dump thread)."""

from __future__ import annotations

from relay.binlog import build
from relay.binlog.constants import EventType
from relay.binlog.events import Event, decode_gtid_list
from relay.binlog.group import commit_time_us
from relay.binlog.gtid import Gtid, GtidState
from relay.downstream.until import FLAG_UNTIL_REACHED, StopAfter, UntilGtid
from tests.helpers import gtid_event


def test_each_listed_domain_is_sent_up_to_its_gtid_and_unlisted_ones_not_at_all() -> None:
    until = UntilGtid(GtidState.parse("0-1-5,1-2-3"), GtidState())
    assert until.admits(Gtid(0, 1, 4), False)
    assert not until.admits(Gtid(7, 1, 1), False)       # a domain not listed: skipped
    assert until.admits(Gtid(0, 9, 6), False)           # another server: sent, reaches nothing
    assert until.admits(Gtid(0, 1, 5), False) and not until.reached  # domain 0 reached
    assert not until.admits(Gtid(0, 1, 6), False)       # ... and skipped from then on
    assert not until.admits(Gtid(1, 2, 4), True)        # past 1-2-3 without it: skipped
    assert until.reached and until.stop_after is StopAfter.STANDALONE


def test_a_domain_whose_gtid_was_passed_before_the_start_is_reached_before_it() -> None:
    def until(text: str, *passed: Gtid) -> UntilGtid:
        return UntilGtid(GtidState.parse(text), passed)
    assert until("0-1-5", Gtid(0, 1, 5)).reached
    assert until("0-1-5", Gtid(0, 1, 9)).reached
    # only another server's GTIDs passed: nothing of server 1 is behind the start
    assert not until("0-1-5", Gtid(0, 2, 9)).reached
    # server 1's GTID passed earlier than the start, which names server 2: reached (the
    # start file's GTID_LIST lists every server; the groups skipped count too)
    assert until("0-1-5", Gtid(0, 1, 5), Gtid(0, 2, 9)).reached
    last = until("0-1-5,1-1-2", Gtid(1, 1, 2))
    assert not last.reached and last.admits(Gtid(0, 1, 5), False)
    assert last.stop_after is StopAfter.TRANSACTION


def test_the_reached_gtid_list_carries_the_flag_in_its_count() -> None:
    ev = build.gtid_list([Gtid(0, 1, 5)], server_id=1, log_pos=100, artificial=True,
                         count_flags=FLAG_UNTIL_REACHED)
    assert ev[4] == EventType.GTID_LIST
    assert int.from_bytes(ev[19:23], "little") == 1 | FLAG_UNTIL_REACHED
    assert decode_gtid_list(Event(ev, True)) == [Gtid(0, 1, 5)]


def test_a_transactions_commit_time() -> None:
    ev = bytearray(gtid_event(Gtid(0, 1, 1)))
    ev[0:4] = (1_796_551_380).to_bytes(4, "little")
    assert commit_time_us(bytes(ev), True) == 1_796_551_380_000_000  # MariaDB: seconds
