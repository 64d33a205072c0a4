"""The statements clients send, parsed with sqlglot (MySQL dialect) and answered from the
relay's state (answers.py): aliases with and without AS, several expressions, @@global./
@@session./@@ forms, LIKE and WHERE on SHOW VARIABLES / STATUS, SET with several
assignments, comments and any case. What the relay does not answer gets an error that
says so, never a made-up value.

Loaded on the first statement a client sends (answers.py imports it then): sqlglot costs a
relay that serves only replicas some 50 ms at every start.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import sqlglot
from pymysql.charset import charset_by_id, charset_by_name
from sqlglot import Token, TokenType, exp
from sqlglot.errors import ParseError, TokenError

from relay.downstream.listing import listing_for
from relay.downstream.lookups import Lookups, canonical_show, evaluate
from relay.downstream.replies import (
    NO_DEFAULT,
    NOT_NULL,
    T_LONG,
    T_LONG_BLOB,
    T_LONGLONG,
    UNSIGNED,
    Deferred,
    Err,
    FlushHosts,
    Kill,
    Ok,
    Purge,
    Reply,
    Rows,
    SessionDirectory,
    number_col,
    text_col,
)
from relay.downstream.sessionvars import SessionVars
from relay.relaylog.log import RelayLog
from relay.relaylog.positions import binlog_gtid_pos
from relay.rules.runtime import Rules
from relay.rules.tables import LikePattern
from relay.wire.replies import ColumnDef

logging.getLogger("sqlglot").setLevel(logging.ERROR)  # "falling back to Command" notes

_LISTING_DEFS = [text_col("Variable_name", NOT_NULL | NO_DEFAULT),
                 text_col("Value", NOT_NULL | NO_DEFAULT)]


SUPPORTED = ("SELECT of variables and VERSION(), DATABASE(), USER(), NOW(), UNIX_TIMESTAMP(), "
             "CONNECTION_ID(), BINLOG_GTID_POS(); SHOW VARIABLES / STATUS [LIKE | WHERE], "
             "SHOW MASTER STATUS, SHOW BINARY LOGS, SHOW BINLOG EVENTS, SHOW SLAVE HOSTS; "
             "PURGE BINARY LOGS TO / BEFORE; FLUSH HOSTS; SET; KILL; and, as look-ups the "
             "relay composes for its primary, information_schema SELECTs, SHOW CREATE TABLE "
             "and SHOW [FULL] COLUMNS / INDEX / TABLES / DATABASES")


class RelayState(Protocol):
    """What the answers need of the relay (answers.Answers is it)."""

    log: RelayLog
    server_id: int
    forward_metadata: bool
    metadata_max_rows: int
    sessions: SessionDirectory
    rules: Rules              # SHOW BINLOG EVENTS runs a user's send rules, as its dump

    def version(self) -> str: ...

    def checksum_name(self) -> str: ...

    def variables(self) -> dict[str, str]: ...

    def status(self) -> dict[str, str]: ...

    def var_type(self, name: str) -> str: ...

    def var_def(self, column: str, name: str) -> ColumnDef: ...

    def master_status(self) -> Rows: ...

    def processlist(self, session: SessionVars, text: str) -> Rows: ...

    def replica_hosts(self) -> Rows: ...


def split_statements(sql: str) -> list[str]:
    """The statements of one COM_QUERY (multi-statements), as written."""
    try:
        tokens = sqlglot.tokenize(sql, read="mysql")
    except TokenError:
        return [sql]
    out, start = [], 0
    for tok in tokens:
        if tok.token_type == TokenType.SEMICOLON:
            out.append(sql[start : tok.start])
            start = tok.end + 1
    out.append(sql[start:])
    return [s for s in out if s.strip()] or [sql]


def _select_item_texts(sql: str, tokens: list[Token]) -> list[str]:
    """The select list's items as written (MySQL names unaliased columns by their text)."""
    items: list[str] = []
    depth = 0
    first: Token | None = None
    last: Token | None = None
    started = False
    for tok in tokens:
        tt = tok.token_type
        if not started:
            started = tt == TokenType.SELECT
            continue
        if depth == 0 and tt in (TokenType.FROM, TokenType.LIMIT, TokenType.INTO,
                                 TokenType.WHERE, TokenType.SEMICOLON):
            break
        if tt == TokenType.L_PAREN:
            depth += 1
        elif tt == TokenType.R_PAREN:
            depth -= 1
        if depth == 0 and tt == TokenType.COMMA:
            if first is not None and last is not None:
                items.append(sql[first.start : last.end + 1])
            first = last = None
            continue
        first = first or tok
        last = tok
    if first is not None and last is not None:
        items.append(sql[first.start : last.end + 1])
    return items


class Statements:
    """One statement in, the reply out; the relay's state comes from `answers`."""

    def __init__(self, answers: RelayState) -> None:
        self.a = answers

    def answer(self, sql: str, session: SessionVars) -> Reply:
        text = sql.strip().rstrip(";").strip()
        if not text:
            return Err(1065, "Query was empty", "42000")
        try:
            tokens = sqlglot.tokenize(text, read="mysql")
            if tokens and tokens[0].text.upper() == "PURGE":  # sqlglot has no PURGE
                return _purge(tokens, text)
            if [t.text.upper() for t in tokens] == ["FLUSH", "HOSTS"]:
                return FlushHosts()
            tree = sqlglot.parse_one(text, read="mysql")
        except (ParseError, TokenError) as exc:
            return Err(1064, f"relay could not parse this statement ({_first_line(exc)}); it "
                             f"answers {SUPPORTED}", "42000")
        except Exception as exc:  # sqlglot fails on some garbage (IndexError on "SHOW BINLOG#"):
            # a client's bad statement gets a parse error, not a dropped connection
            return Err(1064, f"relay could not parse this statement ({type(exc).__name__}); "
                             f"it answers {SUPPORTED}", "42000")
        if isinstance(tree, exp.Select):
            if any(f.name.upper() == "BINLOG_GTID_POS" for f in tree.find_all(exp.Anonymous)):
                # it reads the GTID index: off the event loop
                return Deferred(lambda: self._select(tree, text, tokens, session))
            return self._select(tree, text, tokens, session)
        if isinstance(tree, exp.Show):
            return self._show(tree, text, session)
        if isinstance(tree, exp.Set):
            return self._set(tree, session)
        if isinstance(tree, exp.Kill):
            return self._kill(tree)
        if isinstance(tree, exp.Use):
            session.database = tree.this.name if tree.this else None
            return Ok()
        if isinstance(tree, (exp.Transaction, exp.Commit, exp.Rollback)):
            return Ok()
        if isinstance(tree, exp.Command):
            return self._command(tree, text, session)
        if isinstance(tree, exp.Describe):
            return self._metadata(lambda lk: lk.describe(tree, session))
        return Err(1235, f"relay does not support this statement: {text[:100]!r}; it "
                         f"answers {SUPPORTED}", "42000")

    # --- SELECT ------------------------------------------------------------------------------

    def _select(self, tree: exp.Select, text: str, tokens: list[Token],
                session: SessionVars) -> Reply:
        if tree.args.get("from_") is not None or tree.args.get("from") is not None:
            return self._metadata(lambda lk: lk.select(tree, session))
        names = _select_item_texts(text, tokens)
        exprs = tree.expressions
        if len(names) != len(exprs):
            names = [e.sql("mysql") for e in exprs]
        columns, values, defs = [], [], []
        for expr, written in zip(exprs, names, strict=True):
            column = expr.alias if isinstance(expr, exp.Alias) else written.strip()
            inner = expr.this if isinstance(expr, exp.Alias) else expr
            value = self._value(inner, session)
            if isinstance(value, Err):
                return value
            columns.append(column)
            values.append(value)
            defs.append(self._def_of(column, inner))
        limit = tree.args.get("limit")
        rows = [values]
        if limit is not None and limit.expression is not None and \
                limit.expression.name == "0":
            rows = []
        return Rows(columns, rows, defs)

    def _def_of(self, column: str, expr: exp.Expression) -> ColumnDef:
        if isinstance(expr, exp.SessionParameter):
            return self.a.var_def(column, expr.name.lower())
        if isinstance(expr, exp.Literal) and not expr.is_string and expr.is_int:
            small = abs(int(expr.this)) < 1 << 31
            return number_col(column, NOT_NULL, T_LONG if small else T_LONGLONG,
                              len(str(expr.this)))
        if isinstance(expr, (exp.Literal, exp.CurrentVersion)):
            return text_col(column, NOT_NULL)
        if isinstance(expr, exp.Parameter):  # user variables are LONGBLOB-typed strings
            return text_col(column, type_code=T_LONG_BLOB)
        if isinstance(expr, exp.Anonymous) and expr.name.upper() == "UNIX_TIMESTAMP":
            return number_col(column)
        if isinstance(expr, exp.Anonymous) and expr.name.upper() == "CONNECTION_ID":
            return number_col(column, NOT_NULL | UNSIGNED)
        if isinstance(expr, exp.Anonymous) and expr.name.upper() == "BINLOG_GTID_POS":
            return text_col(column, type_code=T_LONG_BLOB)
        return text_col(column)

    def _value(self, expr: exp.Expression, session: SessionVars) -> str | Err | None:
        if isinstance(expr, exp.Paren):
            return self._value(expr.this, session)
        if isinstance(expr, exp.Literal):
            return str(expr.this)
        if isinstance(expr, exp.Null):
            return None
        if isinstance(expr, exp.Boolean):
            return "1" if expr.this else "0"
        if isinstance(expr, exp.Neg) and isinstance(expr.this, exp.Literal):
            return f"-{expr.this.this}"
        if isinstance(expr, exp.SessionParameter):
            return self._system_var(expr, session)
        if isinstance(expr, exp.Parameter):
            name = expr.name.lower()
            if name in ("master_binlog_checksum", "source_binlog_checksum"):
                return session.checksum or "NONE"  # never NULL: a replica stops on NULL
            return session.user_vars.get(name)
        if isinstance(expr, exp.CurrentVersion):
            return self.a.version()
        if isinstance(expr, exp.CurrentSchema):
            return session.database
        if isinstance(expr, (exp.CurrentUser, exp.CurrentTimestamp, exp.Anonymous)):
            return self._function(expr, session)
        if isinstance(expr, exp.Func) and expr.sql_name().upper() in (
                "USER", "NOW", "CURRENT_USER", "SESSION_USER", "SYSTEM_USER"):
            return self._function(expr, session)
        return Err(1235, f"relay cannot evaluate {expr.sql('mysql')[:80]!r}; it answers "
                         f"{SUPPORTED}", "42000")

    def _function(self, expr: exp.Expression, session: SessionVars) -> str | Err | None:
        name = (expr.name if isinstance(expr, exp.Anonymous) else
                expr.sql_name() if isinstance(expr, exp.Func) else "").upper()
        if isinstance(expr, exp.CurrentUser) or name == "CURRENT_USER":
            return f"{session.user}@%"  # the matched account: relay users have no host part
        if name in ("USER", "SESSION_USER", "SYSTEM_USER"):
            return f"{session.user}@{session.host}"
        if isinstance(expr, exp.CurrentTimestamp) or name in ("NOW", "SYSDATE",
                                                              "CURRENT_TIMESTAMP"):
            return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
        if name == "UNIX_TIMESTAMP":
            return str(int(time.time()))
        if name == "CONNECTION_ID":
            return str(session.connection_id)
        if name == "BINLOG_GTID_POS":
            args = expr.expressions
            if len(args) != 2:
                return Err(1582, "Incorrect parameter count in the call to native function "
                                 "'BINLOG_GTID_POS'", "42000")
            file, pos = self._value(args[0], session), self._value(args[1], session)
            if isinstance(file, Err) or isinstance(pos, Err) or file is None or pos is None:
                return None
            try:
                state = binlog_gtid_pos(self.a.log, file, int(pos))
            except ValueError:
                return None
            return None if state is None else str(state)
        return Err(1235, f"relay cannot evaluate {name}(); it answers {SUPPORTED}", "42000")

    def _system_var(self, expr: exp.SessionParameter, session: SessionVars) -> str | Err:
        name = expr.name.lower()
        kind = (expr.args.get("kind") or "").lower()
        value = session.system.get(name) if kind != "global" else None
        if value is None:
            value = self.a.variables().get(name)
        if value is None:
            return Err(1193, f"Unknown system variable '{expr.name}'", "HY000")
        if self.a.var_type(name) == "BOOLEAN":  # SHOW says ON/OFF, SELECT gives 1/0
            return _BOOLEAN.get(value.upper(), value)
        return value

    # --- SHOW --------------------------------------------------------------------------------

    def _show(self, tree: exp.Show, text: str, session: SessionVars) -> Reply:
        what = str(tree.this or "").upper()
        if what in ("PROCESSLIST", "FULL PROCESSLIST"):
            return self.a.processlist(session, text)
        if what == "VARIABLES":
            return self._listing(["Variable_name", "Value"], sorted(self.a.variables().items()),
                                 tree)
        if what == "STATUS":
            status = self.a.status()  # the primary's, but this connection's TLS
            status.update(Ssl_cipher=session.tls_cipher, Ssl_version=session.tls_version)
            return self._listing(["Variable_name", "Value"], sorted(status.items()), tree)
        if what in ("MASTER STATUS", "BINARY LOG STATUS"):
            return self.a.master_status()
        if what in ("BINARY LOGS", "MASTER LOGS"):
            return Rows(["Log_name", "File_size"],
                        [[n, str(self.a.log.visible_size(n))] for n in self.a.log.segments.names],
                        [text_col("Log_name", NOT_NULL),
                         number_col("File_size", NOT_NULL | UNSIGNED, length=20)])
        if what in ("REPLICAS", "SLAVE HOSTS", "REPLICA HOSTS"):
            return self.a.replica_hosts()
        if what == "BINLOG EVENTS":
            return self._binlog_events(tree, session)
        if what in ("WARNINGS", "ERRORS"):
            return Rows(["Level", "Code", "Message"], [])
        if what in Lookups.SHOWS:
            return self._metadata(lambda lk: lk.show(tree, session))
        return Err(1235, f"relay does not support {text[:80]!r}; it answers {SUPPORTED}",
                   "42000")

    def _command(self, tree: exp.Command, text: str, session: SessionVars) -> Reply:
        """Statements sqlglot keeps as raw commands: SHOW forms it does not model."""
        if str(tree.this).upper() != "SHOW":
            return Err(1235, f"relay does not support {text[:80]!r}; it answers {SUPPORTED}",
                       "42000")
        rest = " ".join(str(tree.expression or "").split()).upper()
        if rest in ("BINARY LOG STATUS", "MASTER STATUS"):
            return self.a.master_status()
        if rest in ("REPLICA HOSTS", "SLAVE HOSTS", "REPLICAS"):
            return self.a.replica_hosts()
        canonical = canonical_show(text)
        if canonical is not None:  # SHOW FIELDS, SHOW KEYS, ...: as sqlglot spells them
            try:
                again = sqlglot.parse_one(canonical, read="mysql")
            except (ParseError, TokenError) as exc:
                return Err(1064, f"relay could not parse this statement ({_first_line(exc)})",
                           "42000")
            if isinstance(again, exp.Show):
                return self._show(again, canonical, session)
        return Err(1235, f"relay does not support {text[:80]!r}; it answers {SUPPORTED}",
                   "42000")

    def _metadata(self, compose: Callable[[Lookups], Reply]) -> Reply:
        """A look-up on the primary, composed by the relay (lookups.py)."""
        if not self.a.forward_metadata:
            return Err(1235, "relay does not forward metadata queries to its primary "
                             "([downstream] forward_metadata = false)", "42000")
        return compose(Lookups(mariadb="mariadb" in self.a.version().lower(),
                               max_rows=self.a.metadata_max_rows))

    def _listing(self, columns: list[str], items: Sequence[tuple[str, str]],
                 tree: exp.Show) -> Reply:
        like = tree.args.get("like")
        where = tree.args.get("where")
        rows = [[k, v] for k, v in items]
        if like is not None:
            pattern = like.name if isinstance(like, exp.Literal) else like.sql("mysql")
            like_ = LikePattern(pattern)
            rows = [r for r in rows if like_.fullmatch(r[0])]
        if where is not None:
            out = []
            for r in rows:
                verdict = evaluate(where.this, dict(zip(columns, r, strict=True)))
                if isinstance(verdict, Err):
                    return verdict
                if verdict:
                    out.append(r)
            rows = out
        return Rows(columns, [list(r) for r in rows], _LISTING_DEFS)

    def _binlog_events(self, tree: exp.Show, session: SessionVars) -> Reply:
        """The events as this user's dump would carry them (its send rules applied)."""
        log_name = tree.args.get("log")
        position = tree.args.get("position")
        offset = tree.args.get("offset")
        limit = tree.args.get("limit")
        segments = self.a.log.segments.names
        name = log_name.name if log_name is not None else (segments[0] if segments else "")
        try:
            start = int(position.name) if position is not None else 4
            skip = int(offset.name) if offset is not None else 0
            count = int(limit.name) if limit is not None else None
        except ValueError:  # "LIMIT 8.", "FROM 'x'": what a server refuses as syntax
            return Err(1064, "SHOW BINLOG EVENTS takes whole numbers in FROM and LIMIT",
                       "42000")
        if name not in segments:
            return Err(1220, "Error when executing command SHOW BINLOG EVENTS: Could not "
                             "find target log", "HY000")
        rules, user = self.a.rules, session.user
        return Deferred(lambda: listing_for(self.a.log, rules, user, name, start, skip, count))

    # --- SET, KILL -----------------------------------------------------------------------------

    def _set(self, tree: exp.Set, session: SessionVars) -> Reply:
        for item in tree.expressions:
            if not isinstance(item, exp.SetItem):
                continue
            assign = item.this
            kind = str(item.args.get("kind") or "").upper()
            if kind in ("NAMES", "CHARACTER SET", "CHARSET"):
                collation = _collation_of(assign.name, item.args.get("collate"))
                if collation is None:
                    return Err(1115, f"Unknown character set: '{assign.name}'", "42000")
                session.collation = collation
                continue
            if not isinstance(assign, exp.EQ):
                continue  # SET TRANSACTION ...: accepted
            target, value_expr = assign.this, assign.expression
            value = self._set_value(value_expr, session)
            if isinstance(value, Err):
                return value
            if isinstance(target, exp.Parameter):
                session.user_vars[target.name.lower()] = value
            elif isinstance(target, (exp.SessionParameter, exp.Column, exp.Var)):
                kind = str(item.args.get("kind") or "").lower()
                if isinstance(target, exp.SessionParameter):
                    kind = str(target.args.get("kind") or kind).lower()
                if kind == "global":
                    return Err(1227, "Access denied; the relay's global variables are "
                                     "read-only (set them on the primary)", "42000")
                session.system[target.name.lower()] = "" if value is None else value
        return Ok()

    def _set_value(self, expr: exp.Expression, session: SessionVars) -> str | Err | None:
        if isinstance(expr, exp.SessionParameter) and expr.name.lower() == "binlog_checksum":
            return self.a.checksum_name()
        if isinstance(expr, (exp.Column, exp.Var)):  # SET x = ON / a bare word
            return expr.name
        value = self._value(expr, session)
        if isinstance(value, Err):  # an unknown form: keep its text (replicas must not stop)
            return expr.sql("mysql")
        return value

    def _kill(self, tree: exp.Kill) -> Reply:
        target = tree.this
        kind = str(tree.args.get("kind") or "").upper()
        try:
            conn_id = int(target.name)
        except (AttributeError, ValueError):
            return Err(1094, f"Unknown thread id: {target}", "HY000")
        return Kill(conn_id, kind == "QUERY")


_BOOLEAN = {"ON": "1", "OFF": "0", "TRUE": "1", "FALSE": "0"}


def _purge(tokens: list[Token], text: str) -> Reply:
    """PURGE {BINARY | MASTER} LOGS {TO 'name' | BEFORE 'YYYY-MM-DD hh:mm:ss'}; the time
    is the relay's local time, as a server reads it in its own time zone."""
    words = [t.text.upper() for t in tokens[:4]]
    if len(tokens) != 5 or words[1] not in ("BINARY", "MASTER") or words[2] != "LOGS" \
            or words[3] not in ("TO", "BEFORE") or tokens[4].token_type is not TokenType.STRING:
        return Err(1064, "relay answers PURGE BINARY LOGS TO 'name' and PURGE BINARY LOGS "
                         f"BEFORE 'YYYY-MM-DD hh:mm:ss'; not {text[:80]!r}", "42000")
    value = tokens[4].text
    if words[3] == "TO":
        return Purge(to=value)
    try:
        when = datetime.datetime.fromisoformat(value)
    except ValueError:
        return Err(1292, f"Incorrect datetime value: '{value}' (write 'YYYY-MM-DD hh:mm:ss')",
                   "22007")
    return Purge(before=when.timestamp())


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


def _collation_of(charset: str, collate: exp.Expression | None) -> int | None:
    """The collation id SET NAMES / SET CHARACTER SET puts in force: the COLLATE clause's
    when pymysql's table knows it, else the character set's default."""
    name = charset.lower().strip("'\"")
    if name == "utf8":  # MariaDB's utf8 is utf8mb3 (pymysql maps it to utf8mb4)
        name = "utf8mb3"
    if name == "default":
        return 33
    try:
        default = charset_by_name(name)
    except KeyError:
        return None
    if default is None:
        return None
    if collate is not None:
        wanted = collate.name.lower().strip("'\"")
        for cid in range(1, 256):
            try:
                found = charset_by_id(cid)
            except KeyError:
                continue
            if getattr(found, "collation", None) == wanted:
                return int(getattr(found, "id", 0))
    return int(getattr(default, "id", 0)) or None
