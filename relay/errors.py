"""The relay's error tree: one root, kinds that tell the caller whom to blame, and a stable
`code` on each (what logs, metrics labels and the tap's error frames carry)."""

from __future__ import annotations


class RelayError(Exception):
    """Root of every error the relay raises on purpose."""

    code = "relay"


class ProtocolError(RelayError):
    """The MySQL wire protocol was violated."""

    code = "protocol"


class RemoteProtocolError(ProtocolError):
    """The peer sent something illegal: drop that peer only."""


class MalformedEvent(RelayError):
    """A binlog event's bytes do not parse. Carries where it was found when known."""

    code = "malformed_event"

    def __init__(self, message: str, *, where: str | None = None, offset: int | None = None):
        self.where = where
        self.offset = offset
        loc = ""
        if where is not None:
            loc = f" in {where}"
        if offset is not None:
            loc += f" at offset {offset}"
        super().__init__(f"{message}{loc}")


class CorruptLog(RelayError):
    """A relay log file holds bytes that cannot be what the relay wrote."""

    code = "corrupt_log"

    def __init__(self, path: str, offset: int, what: str):
        self.path = path
        self.offset = offset
        super().__init__(f"corrupt relay log {path} at offset {offset}: {what}")


class SegmentOrder(RelayError):
    """A source's file cannot be the log's next segment under its own name: it belongs to
    another series of files, or does not come after the log's last segment."""

    code = "segment_order"


class SegmentPurged(RelayError):
    """Retention removed a segment a reader was reading or asked for (the hard cap
    `retention_max_size` overrides readers): the reader gets this, never a silent gap."""

    code = "purged"


class LogWriteError(RelayError):
    """Writing or syncing the relay log failed (EIO, ENOSPC, ...): nothing past the last
    durable transaction is shown to readers or acknowledged, and ingest stops."""

    code = "log_write"

    def __init__(self, path: str, errno: int | None, what: str):
        self.path = path
        self.errno = errno
        super().__init__(f"relay log {path}: {what}")


class ServerError(RelayError):
    """An ERR packet from a MySQL server: its error number, SQL state and message."""

    code = "server"

    def __init__(self, errno: int, sqlstate: str, message: str):
        self.errno = errno
        self.sqlstate = sqlstate
        self.message = message
        super().__init__(f"({errno}, {sqlstate}) {message}")


class UpstreamError(RelayError):
    """Talking to the upstream primary failed. `retriable`: reconnecting may help.
    `server_error`: the primary's own error, when it sent one."""

    code = "upstream"
    retriable = True

    def __init__(self, message: str, *, server_error: ServerError | None = None) -> None:
        super().__init__(message)
        self.server_error = server_error


class FatalUpstreamError(UpstreamError):
    """The upstream refused us in a way a reconnect cannot fix (e.g. wrong password)."""

    code = "upstream_fatal"
    retriable = False


class SourceError(RelayError):
    """A source of events (binlog files, a relay log, a primary) cannot be opened or read;
    the message says which and why."""

    code = "source"


class ConfigError(RelayError):
    """A configuration problem; the message names the key and the fix."""

    code = "config"


class AuthError(RelayError):
    """An authentication exchange the relay cannot complete (a plugin it does not speak, a
    packet out of place); the message names the plugin and what was expected."""

    code = "auth"


class HookError(RelayError):
    """A rule or hook failed on an event: names the rule and the event's position."""

    code = "rules"

    def __init__(self, rule: str, position: str, what: str):
        self.rule = rule
        self.position = position
        super().__init__(f"rule {rule!r} at {position}: {what}")


class StatementRefused(HookError):
    """A rule that masks or filters met a statement-format event on one of its tables
    (or one whose tables cannot be read) under `on_statement = "stop"`: the stream stops
    before the statement, whose SQL text carries values no row rule reaches. Never
    subject to `on_error = "skip"` (skipping would send the text). The message names
    the rule, the statement's position and the remedy, never the statement's text."""

    code = "rules_statement"

    def __init__(self, rule: str, position: str, what: str) -> None:
        super().__init__(rule, position, f"{what}; its SQL text carries row values no mask "
                                         "or filter reaches, so this stream stops here. Set "
                                         'on_statement = "drop" on the rule to drop such '
                                         "statements (their transactions keep their GTIDs), "
                                         "or have the primary log binlog_format = ROW")


def first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first error inside a TaskGroup's exception group (nested groups opened): the
    one to report or handle, rather than the group around it."""
    first: BaseException = group
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    return first
