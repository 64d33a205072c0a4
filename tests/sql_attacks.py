"""Statements a downstream user might send to read what its rules hide, for hypothesis:
SELECTs and SHOWs built from harmless and hostile parts (subqueries, functions that leak
through errors or time, variables, unions, executable and plain comments of every kind
at any place). Used by tests/unit/test_lookups.py (what the relay composes) and
tests/integration/test_security_sql.py (what a real primary answers)."""

from __future__ import annotations

from hypothesis import strategies as st

SECRET_TABLES = ("app.users", "app.secrets", "mysql.user")
_ITEMS = ["1", "TABLE_NAME", "'x'", "COUNT(*)", "CONCAT(TABLE_SCHEMA, '.', TABLE_NAME)",
          "LOWER(TABLE_NAME)", "GROUP_CONCAT(TABLE_NAME)", "(SELECT email FROM app.users LIMIT 1)",
          "(SELECT group_concat(card) FROM app.secrets)", "SLEEP(0.01)", "@@hostname", "@a",
          "EXTRACTVALUE(1, CONCAT(0x7e, (SELECT email FROM app.users LIMIT 1)))",
          "LOAD_FILE('/etc/hostname')", "DATABASE()", "USER()",
          "(SELECT Password FROM mysql.user LIMIT 1)"]
_TABLES = ["information_schema.TABLES", "information_schema.COLUMNS",
           "information_schema.SCHEMATA", "app.users", "mysql.user",
           "information_schema.PROCESSLIST", "(SELECT email FROM app.users) AS x",
           "information_schema.TABLES t JOIN app.secrets s ON 1 = 1"]
_CONDITIONS = ["TABLE_SCHEMA = 'app'", "TABLE_NAME LIKE 'u%'", "1 = 1",
               "TABLE_NAME IN (SELECT email FROM app.users)",
               "EXISTS (SELECT 1 FROM app.secrets WHERE card LIKE '4%')",
               "TABLE_NAME = (SELECT card FROM app.secrets LIMIT 1)",
               "EXTRACTVALUE(1, CONCAT(0x7e, (SELECT email FROM app.users LIMIT 1)))",
               "(SELECT COUNT(*) FROM mysql.user) > 0", "Table_type = 'VIEW'",
               "`Database` LIKE 'a%'"]
_COMMENTS = ["", "/*!, (SELECT group_concat(email, phone) FROM app.users) */",
             "/*M!, (SELECT group_concat(User, Password) FROM mysql.user) */",
             "/*!50000 , (SELECT card FROM app.secrets LIMIT 1) */", "/* plain */",
             "-- line\n", "# hash\n", "/*!*/", "/*+ hint */"]
_SHOWS = ["DATABASES", "SCHEMAS", "FULL TABLES FROM app", "TABLES IN app",
          "COLUMNS FROM app.users", "FULL FIELDS FROM users FROM app", "INDEX FROM app.users",
          "KEYS FROM users IN app", "CREATE TABLE app.users", "TABLE STATUS FROM app",
          "CREATE DATABASE app", "COLLATION", "CHARACTER SET"]


@st.composite
def _select(draw: st.DrawFn) -> str:
    items = draw(st.lists(st.sampled_from(_ITEMS), min_size=1, max_size=3))
    sql = f"SELECT {', '.join(items)} FROM {draw(st.sampled_from(_TABLES))}"
    if draw(st.booleans()):
        sql += f" WHERE {draw(st.sampled_from(_CONDITIONS))}"
    if draw(st.booleans()):
        sql += " UNION SELECT email, phone FROM app.users"
    if draw(st.booleans()):
        sql += " LIMIT 5"
    return sql


@st.composite
def _show(draw: st.DrawFn) -> str:
    sql = f"SHOW {draw(st.sampled_from(_SHOWS))}"
    tail = draw(st.sampled_from(["", "like", "where"]))
    if tail == "like":
        sql += " LIKE 'u%'"
    elif tail == "where":
        sql += f" WHERE {draw(st.sampled_from(_CONDITIONS))}"
    return sql


@st.composite
def statements(draw: st.DrawFn) -> str:
    """A statement with a comment put between two of its words."""
    sql = draw(st.one_of(_select(), _show()))
    words = sql.split(" ")
    at = draw(st.integers(min_value=1, max_value=len(words)))
    words.insert(at, draw(st.sampled_from(_COMMENTS)))
    return " ".join(words)
