"""The flavour object (relay/binlog/flavour.py) and what both position types answer alike."""

from __future__ import annotations

import pytest

from relay.binlog import build
from relay.binlog.constants import EventType
from relay.binlog.flavour import Flavour, header_position
from relay.binlog.gtid import GtidSet, GtidState, MysqlGtid

UUID_A = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
UUID_B = "4e11fa47-71ca-11e1-9e33-c80aa9429562"


def test_a_flavour_is_known_by_its_version_position_and_header() -> None:
    assert Flavour.of_version("10.11.9-MariaDB-log") is Flavour.MARIADB
    assert Flavour.of_version("11.8.9-MariaDB-0+deb13u1 from Debian-log") is Flavour.MARIADB
    assert Flavour.of_version("9.7.4-2") is Flavour.MYSQL
    assert Flavour.of_position(GtidState()) is Flavour.MARIADB
    assert Flavour.of_position(GtidSet()) is Flavour.MYSQL
    assert Flavour.MARIADB.header_event is EventType.GTID_LIST
    assert Flavour.MYSQL.header_event is EventType.PREVIOUS_GTIDS
    assert Flavour.MYSQL.executed_variable == "gtid_executed"


@pytest.mark.parametrize(("flavour", "text"), [
    (Flavour.MARIADB, "0-1-100,1-2-5"), (Flavour.MYSQL, f"{UUID_A}:1-100:200,{UUID_B}:7")])
def test_positions_round_trip_through_their_header_event(flavour: Flavour, text: str) -> None:
    position = flavour.parse(text)
    for checksum in (False, True):
        event = build.position_event(position, server_id=1, log_pos=0, checksum=checksum)
        assert event[4] == flavour.header_event
        assert header_position(event, checksum) == position
        assert str(flavour.decode_header(event, checksum)) == str(position)
    with pytest.raises(ValueError):
        flavour.parse("not a position")
    assert len(flavour.empty()) == 0


def test_first_missing_sees_gaps_only_where_the_position_has_been() -> None:
    log = GtidSet.parse(f"{UUID_A}:1-5:8-10")
    assert log.first_missing(GtidSet.parse(f"{UUID_A}:2-3:7,{UUID_B}:1")) == \
        MysqlGtid(GtidSet.parse(f"{UUID_A}:1").intervals().__next__()[0], 7)
    assert log.first_missing(GtidSet.parse(f"{UUID_A}:1-5,{UUID_B}:1-9")) is None
    state = GtidState.parse("0-1-5")
    assert str(state.first_missing(GtidState.parse("0-1-7,1-1-3"))) == "0-1-7"
    assert state.first_missing(GtidState.parse("0-1-5,2-1-9")) is None


def test_a_mismatch_names_both_flavours() -> None:
    words = Flavour.MYSQL.mismatch(Flavour.MARIADB, "the position 0-1-5")
    assert "MySQL" in words and "MariaDB" in words and "0-1-5" in words
