"""Selecting row changes: tables by shell-style pattern, transactions by GTID range."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field

from relay.binlog.gtid import Gtid, GtidSet, GtidState, MysqlGtid


@dataclass(frozen=True)
class TableFilter:
    """`schema.table` patterns with `*` and `?` (e.g. `shop.*`, `*.audit_?`); a bare name
    means every table of that schema. No patterns: every table."""

    patterns: tuple[str, ...] = ()
    _compiled: tuple[re.Pattern[str], ...] = field(default=(), repr=False)

    @classmethod
    def parse(cls, patterns: list[str]) -> TableFilter:
        full = tuple(p if "." in p else f"{p}.*" for p in patterns)
        return cls(full, tuple(re.compile(fnmatch.translate(p)) for p in full))

    def __call__(self, schema: str, table: str) -> bool:
        if not self._compiled:
            return True
        name = f"{schema}.{table}"
        return any(rx.match(name) for rx in self._compiled)


class GtidFilter:
    """A GTID range. MariaDB: `FROM..TO`, each a GTID position (`0-1-5,1-2-9`), either
    side may be left out; per domain, sequence numbers from FROM to TO inclusive pass, and
    domains a side does not name are not limited by it. MySQL: a GTID set
    (`uuid:1-100`). Anonymous transactions pass only when no range is given."""

    def __init__(self, spec: str | None = None) -> None:
        self.spec = spec
        self._from = GtidState()
        self._to = GtidState()
        self._set: GtidSet | None = None
        if not spec:
            return
        if ".." in spec or re.fullmatch(r"[\d\-,\s]+", spec):
            lo, _, hi = spec.partition("..") if ".." in spec else (spec, "", spec)
            self._from = GtidState.parse(lo)
            self._to = GtidState.parse(hi)
        else:
            self._set = GtidSet.parse(spec)

    def __bool__(self) -> bool:
        return bool(self.spec)

    def __call__(self, gtid: str | None) -> bool:
        if not self.spec:
            return True
        if gtid is None:
            return False
        if self._set is not None:
            try:
                return self._set.contains(MysqlGtid.parse(gtid))
            except ValueError:
                return False
        try:
            g = Gtid.parse(gtid)
        except ValueError:
            return False
        lo, hi = self._from.get(g.domain), self._to.get(g.domain)
        return (lo is None or g.seq >= lo.seq) and (hi is None or g.seq <= hi.seq)

    def past_end(self, seen: GtidState) -> bool:
        """True once every domain with an upper bound is at or past it: nothing later
        can pass (used to stop following a stream)."""
        if self._set is not None or not self.spec or not len(self._to):
            return False
        return all((s := seen.get(g.domain)) is not None and s.seq >= g.seq for g in self._to)
