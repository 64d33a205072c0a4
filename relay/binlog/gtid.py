"""GTIDs and GTID positions of both flavours, behind one protocol.

A transaction id (`TxnId`) is a MariaDB `Gtid` (domain-server-seq) or a MySQL `MysqlGtid`
(uuid[:tag]:gno). A position (`GtidPosition`) says which transactions a reader holds:
MariaDB's `GtidState` keeps the last GTID of each domain, MySQL's `GtidSet` keeps
intervals of transaction numbers per source UUID and tag (8.3+). Both answer the same
questions (does it contain a transaction, does it cover another position), take
transactions as they commit, and
encode as the event that opens a binlog file (GTID_LIST, PREVIOUS_GTIDS), so the relay
log, its index and the readers need not know the flavour.
"""

from __future__ import annotations

import bisect
import re
import struct
import uuid
from collections.abc import Iterable, Iterator
from typing import NamedTuple, Protocol, Self

from relay.binlog.serialization import MAX_TAG, read_unsigned, write_unsigned
from relay.errors import MalformedEvent


class Gtid(NamedTuple):
    """A MariaDB transaction id. A tuple: one is made per transaction on the hot path."""

    domain: int
    server_id: int
    seq: int

    def __str__(self) -> str:
        return f"{self.domain}-{self.server_id}-{self.seq}"

    @classmethod
    def parse(cls, text: str) -> Gtid:
        parts = text.strip().split("-")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise ValueError(f"not a MariaDB GTID (domain-server-seq): {text!r}")
        d, s, q = (int(p) for p in parts)
        if d >= 1 << 32 or s >= 1 << 32 or q >= 1 << 64:
            raise ValueError(f"GTID component out of range: {text!r}")
        return cls(d, s, q)


_UUID_RE = re.compile(r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?"
                      r"[0-9a-fA-F]{12}$")
# A GTID tag (MySQL 8.3+): a letter or underscore, then up to 31 letters, digits or
# underscores.
_TAG_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")


class MysqlGtid(NamedTuple):
    """A MySQL transaction id: the source server's UUID, its transaction number and (8.3+)
    its tag: `uuid:gno` or `uuid:tag:gno`. A tag names a transaction sequence of its own;
    the untagged sequence has the tag "". Tags compare lower-cased, as MySQL's do."""

    sid: uuid.UUID
    gno: int
    tag: str = ""

    def __str__(self) -> str:
        return f"{self.sid}:{self.tag}:{self.gno}" if self.tag else f"{self.sid}:{self.gno}"

    @classmethod
    def parse(cls, text: str) -> MysqlGtid:
        head, _, gno = text.strip().rpartition(":")
        sid, _, tag = head.partition(":")
        if not _UUID_RE.match(sid) or not gno.isdigit() or (tag and not _TAG_RE.match(tag)):
            raise ValueError(f"not a MySQL GTID (uuid[:tag]:number): {text!r}")
        return cls(uuid.UUID(sid), int(gno), tag.lower())


TxnId = Gtid | MysqlGtid


class GtidPosition(Protocol):
    """Which transactions a reader (or the relay log) holds, in either flavour."""

    def contains(self, txn: TxnId) -> bool:
        """The transaction is in this position."""
        ...

    def covers(self, other: Self) -> bool:
        """Every transaction of `other` is in this position."""
        ...

    def update(self, txn: TxnId) -> None:
        """The transaction committed: it is in this position from now on."""
        ...

    def update_all(self, txns: Iterable[TxnId]) -> None:
        """Each of the transactions, in order (one call for a run of commits)."""
        ...

    def copy(self) -> Self: ...

    def first_missing(self, other: Self) -> TxnId | None:
        """A transaction of `other` this position lacks, in a domain (MariaDB) or of a
        source (MySQL) this position has seen (one it never saw is no gap), or None."""
        ...

    def header_body(self) -> bytes:
        """The body of the event a binlog file opens with: GTID_LIST (MariaDB) or
        PREVIOUS_GTIDS (MySQL)."""
        ...

    def __len__(self) -> int: ...


class GtidState:
    """A MariaDB replication position: the last GTID of each domain."""

    __slots__ = ("_by_domain",)

    def __init__(self, gtids: Iterable[Gtid] = ()) -> None:
        self._by_domain: dict[int, Gtid] = {}
        for g in gtids:
            self._by_domain[g.domain] = g

    @classmethod
    def parse(cls, text: str) -> GtidState:
        text = text.strip()
        if not text:
            return cls()
        state = cls()
        for part in text.split(","):
            g = Gtid.parse(part)
            if g.domain in state._by_domain:
                raise ValueError(f"domain {g.domain} appears twice in {text!r}")
            state._by_domain[g.domain] = g
        return state

    def __str__(self) -> str:
        return ",".join(str(g) for g in self)

    def __repr__(self) -> str:
        return f"GtidState({str(self)!r})"

    def __iter__(self) -> Iterator[Gtid]:
        return iter(sorted(self._by_domain.values()))

    def __len__(self) -> int:
        return len(self._by_domain)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GtidState) and self._by_domain == other._by_domain

    def __hash__(self) -> int:
        return hash(frozenset(self._by_domain.values()))

    def get(self, domain: int) -> Gtid | None:
        return self._by_domain.get(domain)

    def domains(self) -> set[int]:
        return set(self._by_domain)

    def update(self, txn: TxnId) -> None:
        if not isinstance(txn, Gtid):
            raise ValueError(f"a MySQL transaction {txn} in a MariaDB GTID position")
        self._by_domain[txn.domain] = txn

    def update_all(self, txns: Iterable[TxnId]) -> None:
        by_domain = self._by_domain
        for txn in txns:
            if not isinstance(txn, Gtid):
                raise ValueError(f"a MySQL transaction {txn} in a MariaDB GTID position")
            by_domain[txn.domain] = txn

    def copy(self) -> GtidState:
        s = GtidState()
        s._by_domain = dict(self._by_domain)
        return s

    def union(self, other: GtidState) -> GtidState:
        """Per domain, the GTID with the higher sequence number."""
        out = self.copy()
        for g in other:
            mine = out.get(g.domain)
            if mine is None or g.seq > mine.seq:
                out.update(g)
        return out

    def contains(self, txn: TxnId) -> bool:
        """True when `txn` is at or before this position in its domain."""
        if not isinstance(txn, Gtid):
            return False
        mine = self._by_domain.get(txn.domain)
        return mine is not None and txn.seq <= mine.seq

    def covers(self, other: GtidState) -> bool:
        """True when this position is at or past `other` in every domain of `other`."""
        return all(self.contains(g) for g in other)

    def first_missing(self, other: GtidState) -> Gtid | None:
        for g in other:
            mine = self._by_domain.get(g.domain)
            if mine is not None and g.seq > mine.seq:
                return g
        return None

    def header_body(self) -> bytes:
        items = sorted(self._by_domain.values())
        return struct.pack("<I", len(items)) + b"".join(
            struct.pack("<IIQ", g.domain, g.server_id, g.seq) for g in items)


# --- MySQL -------------------------------------------------------------------------------

Tsid = tuple[uuid.UUID, str]
_MAX_GNO = (1 << 63) - 1   # MySQL's GNO_END - 1: a transaction number is below 2^63


class GtidSet:
    """A MySQL GTID set: (source UUID, tag) -> sorted, disjoint, closed intervals
    [start, end]. The tag is "" for the untagged sequence of a source."""

    __slots__ = ("_sets",)

    def __init__(self) -> None:
        self._sets: dict[Tsid, list[tuple[int, int]]] = {}

    @classmethod
    def parse(cls, text: str) -> GtidSet:
        """MySQL's text form: `uuid:1-5:7,uuid2:1-3:tag:1-2` (after a tag, the intervals
        are that tag's, until the next tag)."""
        out = cls()
        text = "".join(text.split())
        if not text:
            return out
        for part in text.split(","):
            fields = part.split(":")
            if len(fields) < 2 or not _UUID_RE.match(fields[0]):
                raise ValueError(f"not a MySQL GTID set element (uuid:interval): {part!r}")
            sid = uuid.UUID(fields[0])
            tag = ""
            for iv in fields[1:]:
                if _TAG_RE.match(iv):
                    tag = iv.lower()
                    continue
                lo, _, hi = iv.partition("-")
                if not lo.isdigit() or (hi and not hi.isdigit()):
                    raise ValueError(f"bad interval {iv!r} in {part!r}")
                start, end = int(lo), int(hi or lo)
                if start < 1 or end < start or end > _MAX_GNO:
                    raise ValueError(f"bad interval {iv!r} in {part!r}")
                out.add_interval(sid, start, end, tag)
        return out

    def add_interval(self, sid: uuid.UUID, start: int, end: int, tag: str = "") -> None:
        key = (sid, tag)
        ivs = self._sets.get(key)
        if ivs is None:
            self._sets[key] = [(start, end)]
            return
        if start == ivs[-1][1] + 1:  # the common case: the next transaction of a source
            ivs[-1] = (ivs[-1][0], end)
            return
        ivs.append((start, end))
        ivs.sort()
        merged: list[tuple[int, int]] = []
        for s, e in ivs:
            if merged and s <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(e, merged[-1][1]))
            else:
                merged.append((s, e))
        self._sets[key] = merged

    def update(self, txn: TxnId) -> None:
        if not isinstance(txn, MysqlGtid):
            raise ValueError(f"a MariaDB transaction {txn} in a MySQL GTID set")
        self.add_interval(txn.sid, txn.gno, txn.gno, txn.tag)

    def update_all(self, txns: Iterable[TxnId]) -> None:
        for txn in txns:
            self.update(txn)

    def contains(self, txn: TxnId) -> bool:
        if not isinstance(txn, MysqlGtid):
            return False
        ivs = self._sets.get((txn.sid, txn.tag))
        if not ivs:
            return False
        i = bisect.bisect_right(ivs, (txn.gno, _MAX_GNO)) - 1  # sorted, disjoint
        return i >= 0 and ivs[i][0] <= txn.gno <= ivs[i][1]

    def copy(self) -> GtidSet:
        out = GtidSet()
        out._sets = {key: list(ivs) for key, ivs in self._sets.items()}
        return out

    def __len__(self) -> int:
        return len(self._sets)

    @property
    def tagged(self) -> bool:
        """Whether any tagged transaction is in the set (it then encodes in the tagged
        form, which only MySQL 8.3+ reads)."""
        return any(tag for _, tag in self._sets)

    def union(self, other: GtidSet) -> GtidSet:
        out = self.copy()
        for (sid, tag), ivs in other.intervals():
            for s, e in ivs:
                out.add_interval(sid, s, e, tag)
        return out

    def intervals(self) -> Iterator[tuple[Tsid, list[tuple[int, int]]]]:
        """Each (source UUID, tag) with its intervals [start, end], ends included."""
        for key, ivs in self._sets.items():
            yield key, list(ivs)

    def first_missing(self, other: GtidSet) -> MysqlGtid | None:
        for (sid, tag), ivs in other._sets.items():
            mine = self._sets.get((sid, tag))
            if mine is None:  # a sequence this set never saw: no gap
                continue
            for s, e in ivs:
                gno = s
                for ms, me in mine:  # (sorted, disjoint)
                    if ms <= gno <= me:
                        gno = me + 1
                if gno <= e:
                    return MysqlGtid(sid, gno, tag)
        return None

    def covers(self, other: GtidSet) -> bool:
        """Every transaction of `other` is in this set."""
        for key, ivs in other._sets.items():
            mine = self._sets.get(key, [])
            for s, e in ivs:
                if not any(ms <= s and e <= me for ms, me in mine):
                    return False
        return True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GtidSet) and self._sets == other._sets

    def __hash__(self) -> int:
        return hash(str(self))

    def __str__(self) -> str:
        """As MySQL prints it: sources in order, each one's untagged intervals first, then
        each tag (in order) with its intervals."""
        by_sid: dict[uuid.UUID, list[str]] = {}
        for sid, tag in sorted(self._sets, key=lambda k: (str(k[0]), k[1])):
            ivs = ":".join(f"{s}" if s == e else f"{s}-{e}" for s, e in self._sets[(sid, tag)])
            by_sid.setdefault(sid, []).append(f"{tag}:{ivs}" if tag else ivs)
        return ",".join(f"{sid}:{':'.join(parts)}" for sid, parts in by_sid.items())

    def __repr__(self) -> str:
        return f"GtidSet({str(self)!r})"

    def header_body(self) -> bytes:
        return self.encode()

    def encode(self) -> bytes:
        """The binary form of COM_BINLOG_DUMP_GTID and PREVIOUS_GTIDS (end exclusive).
        A set holding a tagged transaction takes MySQL 8.3's tagged form: byte 0 and 7 of
        the count are 1, the count in bytes 1..6, each source's tag after its UUID."""
        tagged = self.tagged
        keys = sorted(self._sets, key=lambda k: (k[0].bytes, k[1]))
        if tagged:
            out = bytearray(b"\x01" + len(keys).to_bytes(6, "little") + b"\x01")
        else:
            out = bytearray(struct.pack("<Q", len(keys)))
        for sid, tag in keys:
            ivs = self._sets[(sid, tag)]
            out += sid.bytes
            if tagged:
                name = tag.encode("ascii")
                out += write_unsigned(len(name)) + name
            out += struct.pack("<Q", len(ivs))
            for s, e in ivs:
                out += struct.pack("<QQ", s, e + 1)
        return bytes(out)

    @classmethod
    def decode(cls, data: bytes | memoryview) -> GtidSet:
        """The binary form, held to MySQL's rules (Gtid_set::add_gtid_encoding): each
        source's intervals ascending, disjoint and apart, numbers from 1 to 2^63 - 1, a tag
        of ASCII letters, digits and underscores. Linear in its size: a client's set costs
        what it weighs."""
        out = cls()
        try:
            (n_sids,) = struct.unpack_from("<Q", data, 0)
            tagged = data[0] == 1 and len(data) >= 8 and data[7] == 1
            if tagged:
                n_sids = int.from_bytes(bytes(data[1:7]), "little")
            pos = 8
            if n_sids > (len(data) - pos) // 24:
                raise MalformedEvent(f"GTID set claims {n_sids} sources")
            for _ in range(n_sids):
                sid = uuid.UUID(bytes=bytes(data[pos : pos + 16]))
                pos += 16
                tag = ""
                if tagged:
                    tag_len, pos = read_unsigned(data, pos)
                    name = bytes(data[pos : pos + tag_len]).decode("ascii", "replace")
                    if tag_len > MAX_TAG or (tag_len and not _TAG_RE.match(name)):
                        raise MalformedEvent(f"GTID set: {name!r} is not a GTID tag")
                    tag = name.lower()
                    pos += tag_len
                (n_iv,) = struct.unpack_from("<Q", data, pos)
                pos += 8
                if n_iv > (len(data) - pos) // 16:
                    raise MalformedEvent(f"GTID set claims {n_iv} intervals")
                ivs = out._sets.setdefault((sid, tag), [])
                last = ivs[-1][1] + 1 if ivs else 0   # (a source listed twice goes on)
                for s, e in struct.iter_unpack("<QQ", data[pos : pos + 16 * n_iv]):
                    if s <= last or e <= s or e - 1 > _MAX_GNO:
                        raise MalformedEvent(f"GTID set: interval {s}..{e} after {last} is "
                                             "not ascending, disjoint and within 1..2^63-1")
                    ivs.append((s, e - 1))
                    last = e
                pos += 16 * n_iv
                if not ivs:
                    del out._sets[(sid, tag)]
        except (struct.error, IndexError, ValueError) as exc:
            raise MalformedEvent(f"truncated GTID set: {exc}") from exc
        return out


def empty_position(mariadb: bool) -> GtidPosition:
    """The empty position of a flavour."""
    return GtidState() if mariadb else GtidSet()


def parse_position(text: str) -> GtidPosition:
    """A position in either flavour's text form: a MariaDB GTID list ("0-1-5,1-2-9") or
    a MySQL GTID set ("3e11fa47-...:1-5"); the empty string is an empty MariaDB list."""
    if ":" in text:
        return GtidSet.parse(text)
    return GtidState.parse(text)
