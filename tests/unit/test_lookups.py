"""Metadata look-ups (relay/downstream/lookups.py): what reaches the primary is composed by
the relay from an allow-list, never the client's text. The integration side, with marker
values on a real primary, is tests/integration/test_security_sql.py."""

from __future__ import annotations

import sqlglot
from hypothesis import given, settings
from sqlglot import exp

from relay.downstream.answers import Answers
from relay.downstream.lookups import _NODES, TABLES_ALLOWED, evaluate
from relay.downstream.replies import Err, Lookup, Rows
from relay.downstream.sessionvars import SessionVars
from relay.wire.replies import ColumnDef
from tests.sql_attacks import SECRET_TABLES, statements


class _NoLog:
    """Statements that compose a look-up read nothing of the relay log."""

    fde = None


def answer(sql: str, database: str | None = None) -> object:
    answers = Answers(_NoLog(), server_id=1)  # type: ignore[arg-type]
    return answers.answer(sql, SessionVars(database=database))


def _tables_and_nodes_allowed(sql: str) -> None:
    """What the primary would run: one statement, allow-listed nodes and tables only."""
    tree = sqlglot.parse_one(sql, read="mysql")
    if isinstance(tree, exp.Show):
        return
    assert isinstance(tree, exp.Select), sql
    for node in tree.walk():
        assert type(node) in _NODES, (sql, type(node))
        if isinstance(node, exp.Select):
            assert node is tree, sql
        if isinstance(node, exp.Table):
            assert node.db.lower() == "information_schema", sql
            assert node.name.upper() in TABLES_ALLOWED, sql
    assert "/*" not in sql and "--" not in sql and "#" not in sql, sql


ATTACKS = [
    # executable comments: MariaDB runs them, sqlglot reads a comment
    "SELECT 1 /*!, (SELECT group_concat(email) FROM app.users) */ FROM "
    "information_schema.SCHEMATA",
    "SELECT SCHEMA_NAME /*M!, (SELECT Password FROM mysql.user LIMIT 1) */ FROM "
    "information_schema.SCHEMATA",
    "SELECT 1 /*!99999 , (SELECT card FROM app.secrets) */ FROM information_schema.TABLES",
]
REFUSED = [
    "SHOW DATABASES WHERE EXTRACTVALUE(1, CONCAT(0x7e, (SELECT email FROM app.users LIMIT 1)))",
    "SHOW TABLES FROM app WHERE (SELECT COUNT(*) FROM mysql.user WHERE User='repl') = 1",
    "SHOW FULL TABLES IN app WHERE Table_type = (SELECT 'BASE TABLE' FROM app.users LIMIT 1)",
    "SELECT (SELECT email FROM app.users LIMIT 1) FROM information_schema.SCHEMATA",
    "SELECT * FROM information_schema.TABLES WHERE TABLE_NAME IN (SELECT email FROM app.users)",
    "SELECT * FROM information_schema.TABLES WHERE EXISTS (SELECT 1 FROM app.users)",
    "SELECT * FROM (SELECT email FROM app.users) x",
    "SELECT SLEEP(5) FROM information_schema.SCHEMATA",
    "SELECT BENCHMARK(100000000, MD5('x')) FROM information_schema.SCHEMATA",
    "SELECT LOAD_FILE('/etc/passwd') FROM information_schema.SCHEMATA",
    "SELECT EXTRACTVALUE(1, 'x') FROM information_schema.SCHEMATA",
    "SELECT @@hostname FROM information_schema.SCHEMATA",
    "SELECT @a FROM information_schema.SCHEMATA",
    "SELECT DATABASE() FROM information_schema.SCHEMATA",
    "SELECT * FROM information_schema.TABLES UNION SELECT email, 1 FROM app.users",
    "WITH x AS (SELECT email FROM app.users) SELECT * FROM information_schema.TABLES",
    "SELECT * FROM information_schema.TABLES FOR UPDATE",
    "SELECT /*+ MAX_EXECUTION_TIME(1) */ 1 FROM information_schema.TABLES",
    "SELECT * FROM information_schema.PROCESSLIST",
    "SELECT * FROM information_schema.USER_PRIVILEGES",
    "SELECT * FROM information_schema.GLOBAL_VARIABLES",
    "SELECT * FROM mysql.user",
    "SELECT email FROM app.users",
    "SELECT * FROM information_schema.TABLES, app.users",
    "SELECT * FROM information_schema.TABLES t JOIN app.users u ON 1=1",
    "SELECT TABLE_NAME REGEXP 'x' FROM information_schema.TABLES",
    "SELECT SQL_CALC_FOUND_ROWS 1 FROM information_schema.TABLES",
    "EXPLAIN SELECT 1 FROM app.users",
]


def test_executable_comments_never_reach_the_primary() -> None:
    for sql in ATTACKS:
        r = answer(sql)
        assert isinstance(r, Lookup), (sql, r)
        assert "SELECT" not in r.sql.split("FROM", 1)[0].replace("SELECT", "", 1), r.sql
        assert "app." not in r.sql and "mysql." not in r.sql, r.sql
        _tables_and_nodes_allowed(r.sql)


def test_what_could_read_data_is_refused() -> None:
    for sql in REFUSED:
        r = answer(sql)
        assert isinstance(r, Err), (sql, r)
        assert r.code in (1064, 1235), (sql, r)


def test_a_shows_where_is_evaluated_here() -> None:
    r = answer("SHOW FULL TABLES FROM app WHERE Table_type = 'VIEW' OR "
                             "Tables_in_app LIKE 'u%'")
    assert isinstance(r, Lookup) and r.sql == "SHOW FULL TABLES FROM `app`", r
    assert r.finish is not None
    defs = [ColumnDef("Tables_in_app", 0xFD), ColumnDef("Table_type", 0xFD)]
    out = r.finish(defs, [[b"users", b"BASE TABLE"], [b"orders", b"BASE TABLE"],
                          [b"v", b"VIEW"]])
    assert isinstance(out, Rows) and [row[0] for row in out.rows] == [b"users", b"v"]


def test_names_are_quoted_by_the_relay() -> None:
    r = answer("SHOW CREATE TABLE `a``b`.`c; DROP TABLE x`")
    assert isinstance(r, Lookup) and r.sql == "SHOW CREATE TABLE `a``b`.`c; DROP TABLE x`"
    r = answer("SHOW TABLES LIKE 'x''; SELECT 1'", database="app")
    assert isinstance(r, Lookup) and r.sql == "SHOW TABLES FROM `app` LIKE 'x''; SELECT 1'"
    r = answer("SHOW KEYS FROM t IN s")
    assert isinstance(r, Lookup) and "information_schema.STATISTICS" in r.sql
    assert r.exists is not None and "'s'" in r.exists and "'t'" in r.exists
    assert isinstance(answer("SHOW TABLES"), Err)  # no database selected


def test_look_ups_are_bounded() -> None:
    r = answer("SELECT TABLE_NAME FROM information_schema.TABLES LIMIT 5")
    assert isinstance(r, Lookup) and r.sql.endswith("LIMIT 5")
    r = answer("SELECT TABLE_NAME FROM information_schema.TABLES LIMIT 99999999")
    assert isinstance(r, Lookup) and r.sql.endswith("LIMIT 10001")


def test_show_where_evaluation() -> None:
    row = {"Database": "app", "Other": None}
    cond = sqlglot.parse_one("SHOW DATABASES WHERE `Database` IN ('x', 'APP') AND NOT "
                             "Other IS NOT NULL", read="mysql").args["where"].this
    assert evaluate(cond, row) is True
    bad = sqlglot.parse_one("SHOW DATABASES WHERE Nope = 1", read="mysql").args["where"].this
    out = evaluate(bad, row)
    assert isinstance(out, Err) and out.code == 1054


@settings(max_examples=1000, deadline=None)
@given(statements())
def test_any_statement_composes_only_allowed_look_ups(sql: str) -> None:
    r = answer(sql, database="app")
    if isinstance(r, Lookup):
        for composed in (r.sql, r.exists):
            if composed is not None:
                _tables_and_nodes_allowed(composed)
                assert not any(t in composed for t in SECRET_TABLES), (sql, composed)
                assert "WHERE" not in composed or "information_schema" in composed, composed
    else:
        assert isinstance(r, Err), (sql, r)
