"""The relay's error tree: one root, and kinds that tell the caller whom to blame."""

from __future__ import annotations


class RelayError(Exception):
    """Root of every error the relay raises on purpose."""


class ProtocolError(RelayError):
    """The MySQL wire protocol was violated."""


class LocalProtocolError(ProtocolError):
    """We tried to do something illegal: a bug in the relay."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something illegal: drop that peer only."""


class MalformedEvent(RelayError):
    """A binlog event's bytes do not parse. Carries where it was found when known."""

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

    def __init__(self, path: str, offset: int, what: str):
        self.path = path
        self.offset = offset
        super().__init__(f"corrupt relay log {path} at offset {offset}: {what}")


class ServerError(RelayError):
    """An ERR packet from a MySQL server."""

    def __init__(self, code: int, sqlstate: str, message: str):
        self.code = code
        self.sqlstate = sqlstate
        self.message = message
        super().__init__(f"({code}, {sqlstate}) {message}")


class UpstreamError(RelayError):
    """Talking to the upstream primary failed. `retriable` says whether reconnecting may help."""

    retriable = True


class FatalUpstreamError(UpstreamError):
    """The upstream refused us in a way a reconnect cannot fix (e.g. wrong password)."""

    retriable = False


class ConfigError(RelayError):
    """A configuration problem; the message names the key and the fix."""


class HookError(RelayError):
    """A rule or hook failed on an event: names the rule and the event's position."""

    def __init__(self, rule: str, position: str, what: str):
        self.rule = rule
        self.position = position
        super().__init__(f"rule {rule!r} at {position}: {what}")
