import os

import pytest

from relay.config import Config, SyncMode, load_config, parse_duration, parse_size
from relay.errors import ConfigError

ISSUE_EXAMPLE = """
[relay]
server_id = 4242
data_dir = "/var/lib/relay"

[upstream]
sources = ["mysql://repl:secret@10.0.0.5:3306"]
start = "current"

[relaylog]
segment_size = "256MiB"
sync = "transaction"

[downstream]
listen = "0.0.0.0:3307"
[[downstream.users]]
name = "repl"
password = "secret"

[metrics]
listen = "127.0.0.1:9104"
"""


def _load(tmp_path: object, text: str) -> Config:
    path = os.path.join(str(tmp_path), "config.toml")
    with open(path, "w") as f:
        f.write(text)
    return load_config(path)


def test_issue_example_loads(tmp_path: object) -> None:
    c = _load(tmp_path, ISSUE_EXAMPLE)
    assert c.relay.server_id == 4242 and c.relaylog.segment_size == 256 << 20
    assert c.relaylog.sync_policy.mode is SyncMode.TRANSACTION
    assert c.downstream.users[0].resolve_password() == "secret"


def test_shipped_config_toml_is_valid() -> None:
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    c = load_config(os.path.join(root, "config.toml"))
    assert c.relay.server_id == 4242


def test_unknown_key_names_key_and_suggests(tmp_path: object) -> None:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, "[relaylog]\nsegment_sise = '1MiB'\n")
    msg = str(info.value)
    assert "relaylog.segment_sise: unknown key" in msg and "did you mean 'segment_size'" in msg


def test_each_section_s_error_is_named(tmp_path: object) -> None:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, "[relay]\nserver_id = 0\n[upstream]\nstart = 'x'\n[relayy]\n"
                        "[[rules]]\nname = 'r'\nat = 'send'\n")
    lines = str(info.value).splitlines()[1:]
    assert [line.split(":")[0].strip() for line in lines] == \
        ["relay.server_id", "upstream.start", "relayy", "rules[0]"]


def test_unknown_section(tmp_path: object) -> None:
    with pytest.raises(ConfigError, match="relayy: unknown key; did you mean 'relay'"):
        _load(tmp_path, "[relayy]\nserver_id = 1\n")


@pytest.mark.parametrize("text,needle", [
    ("[relaylog]\nsync = 'sometimes'\n", "relaylog.sync: unknown sync policy 'sometimes'"),
    ("[upstream]\nstart = 'yesterday'\n", "upstream.start: not a GTID position"),
    ("[relay]\nserver_id = 'x'\n", "relay.server_id"),
    ("[relay]\nserver_id = 0\n", "relay.server_id: expected an integer >= 1 (got 0)"),
    ("[upstream]\nsources = ['http://h']\n", "must start with mysql://"),
    ("[relaylog]\nsegment_size = 'huge'\n", "is not a size"),
    ("[upstream]\nheartbeat_period = '10s'\nread_timeout = '5s'\n", "read_timeout must be"),
    ("[relay\n", "is not valid TOML"),
    ("[upstream]\nsources = ['mysql://a:b@h:3306', 'mysql://c@h:3306']\n",
     "h:3306 is listed twice"),
    ("[upstream]\non_divergence = 'ignore'\n", "upstream.on_divergence: use one of wait, stop"),
    ("[[rules]]\nname = 'r'\nat = 'send'\n[[rules.mask]]\ncolumn = 'a.b.c'\nwith = 'hush'\n",
     "rules[0].mask[0].with: use one of null, constant, hash (got 'hush')"),
    ("[[rules]]\nname = 'r'\nat = 'send'\nrename_schema = { a = 'b', app = 1 }\n",
     "rules[0].rename_schema.app: expected a string (got 1)"),
    ("[downstream]\ntls = 'cert.pem'\n", "downstream.tls: expected a table (got 'cert.pem')"),
    ("[relaylog]\nretention_check_interval = nan\n",
     "relaylog.retention_check_interval: nan is not a duration"),
    ("[relaylog]\nsegment_size = 100\n", "relaylog.segment_size: must be at least 65536 bytes"),
    ("[upstream]\nsemi_sync = true\nsemi_sync_wait_for_replicas = 1\n",
     "set upstream.semi_sync = true and downstream.semi_sync = true"),
])
def test_bad_values_are_explained(tmp_path: object, text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, text)
    assert needle in str(info.value)


@pytest.mark.parametrize("text", [
    "[upstream]\nsources = ['mysql://u:topsecret@h:notaport']\n",
    "[upstream]\nsources = ['mysql://u:top@secret@h:notaport']\n",   # an @ in the password
    "[upstream]\nsources = ['mysql://u:topsecret@[::1:3306']\n",
    "[upstream]\nstart = 'mysql://u:topsecret@h:3306'\n",            # in our own check's text
    "[relaylog]\nsegment_size = 'mysql://u:topsecret@h:3306'\n",     # in a unit parser's
    "downstream = [{ name = 'r', password = 'topsecret' }]\n",        # a table is not shown
])
def test_password_is_redacted_in_errors(tmp_path: object, text: str) -> None:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, text)
    assert "secret" not in str(info.value)


def test_values_keep_their_units_and_types(tmp_path: object) -> None:
    c = _load(tmp_path, "[relaylog]\nsegment_size = '1MiB'\nretention_age = '2h'\n"
                        "[[rules]]\nname = 'm'\nat = 'send'\n[[rules.mask]]\n"
                        "column = 'a.b.c'\nwith = 'constant'\nvalue = false\n")
    assert c.relaylog.segment_size == 1 << 20 and isinstance(c.relaylog.segment_size, int)
    assert c.relaylog.retention_age == 7200.0
    value = c.rules[0].mask[0].value   # a BOOL column is a TINYINT: false is 0
    assert value == 0 and type(value) is int


def test_password_env(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    c = _load(tmp_path, "[[downstream.users]]\nname = 'r'\npassword_env = 'RELAY_TEST_PW'\n")
    monkeypatch.setenv("RELAY_TEST_PW", "from-env")
    assert c.downstream.users[0].resolve_password() == "from-env"
    monkeypatch.delenv("RELAY_TEST_PW")
    with pytest.raises(ConfigError, match="RELAY_TEST_PW"):
        c.downstream.users[0].resolve_password()


def test_units() -> None:
    assert parse_size("64KiB") == 65536 and parse_size(10) == 10 and parse_size("1GiB") == 1 << 30
    assert parse_duration("250ms") == 0.25 and parse_duration("2m") == 120.0


def test_shipped_config_toml_documents_every_setting() -> None:
    """Each key of each section appears in config.toml, set or in a comment."""
    import re

    from msgspec import Struct
    from msgspec.structs import fields

    from relay.config import Config, DownstreamUser, MaskEntry, RuleEntry, TlsSection

    root = os.path.join(os.path.dirname(__file__), "..", "..")
    with open(os.path.join(root, "config.toml")) as f:
        text = f.read()
    models: list[type[Struct]] = [DownstreamUser, RuleEntry, MaskEntry, TlsSection]
    for section in fields(Config):
        if isinstance(section.type, type) and issubclass(section.type, Struct):
            models.append(section.type)
    missing = []
    for model in models:
        for field in fields(model):
            key = field.encode_name
            k = re.escape(key)
            if not re.search(rf"^#?\s*({k}\s*=|\[\[?\w+\.{k}\]\]?)", text, re.MULTILINE):
                missing.append(f"{model.__name__}.{key}")
    assert not missing, f"config.toml does not document {missing}"


# --- no secret in any message -----------------------------------------------------------------

# Passwords with each character that ends a URL part, quotes, escapes, unicode: each is
# "pA" + the characters + "ssW0rd", so a leak of any piece after them shows "ssW0rd".
SPECIALS = ["/", "'", '"', "@", ":", "?", "#", "%", " ", "\\", "Ü€", "%41", "/'\"@:?# \\%ñ"]
PASSWORDS = [f"pA{c}ssW0rd" for c in SPECIALS]


def _toml_string(text: str) -> str:
    """A TOML basic string holding `text` (JSON's escapes are TOML's)."""
    import json

    return json.dumps(text, ensure_ascii=False)


def _url_error_paths(pw: str) -> list[str]:
    """config.toml texts whose error must not show the source password `pw`."""
    def sources(*urls: str) -> str:
        return "[upstream]\nsources = [" + ", ".join(_toml_string(u) for u in urls) + "]\n"
    return [
        sources(f"mysql://repl:{pw}@db1:3306x"),                      # bad port
        sources(f"mysql://repl:{pw}@db1:99999"),
        sources(f"http://repl:{pw}@db1:3306"),                        # bad scheme
        sources(f"mysql:/repl:{pw}@db1:3306"),
        sources(f"repl:{pw}@db1:3306"),
        sources(f"mysql://repl:{pw}@"),                               # no host
        sources(f"mysql://repl:{pw}@:3306"),
        sources(f"mysql://repl:{pw}@db1:3306?sslmode=REQUIRED"),      # unknown parameter
        sources(f"mysql://repl:{pw}@db1:3306?ssl-mode=SOMETIMES"),    # bad ssl-mode
        sources(f"mysql://repl:{pw}@db1:3306?ssl-cert=/c.pem"),       # cert without key
        sources(f"mysql://repl:{pw}@[::1:3306"),                      # unclosed IPv6 host
        sources(f"mysql://repl:{pw}@db1:3306", f"mysql://other:{pw}@db1:3306"),  # twice
        "[upstream]\nsources = " + _toml_string(f"mysql://repl:{pw}@db1") + "\n",  # no list
        "[upstream]\nstart = " + _toml_string(f"mysql://repl:{pw}@db1:3306") + "\n",
        "[relaylog]\nsegment_size = " + _toml_string(f"mysql://repl:{pw}@db1") + "\n",
    ]


def _user_error_paths(pw: str) -> list[str]:
    """config.toml texts whose error must not show the user password `pw`."""
    p = _toml_string(pw)
    out = []
    for table in ("downstream.users", "tap.users"):
        user = f"[[{table}]]\nname = \"r\"\n"
        out += [
            f"{user}password = {p}\nadmn = true\n",                   # unknown key
            f"{user}password = {p}\npasword = {p}\n",                 # ... a misspelt one
            f"{user}password = {p}\npassword_env = \"X\"\n",          # both
            f"{user}password = [{p}]\n",                              # wrong types
            f"{user}password = {{ value = {p} }}\n",
            f"[{table.split('.')[0]}]\nusers = [{p}]\n",
            f"[{table.split('.')[0]}]\nusers = {p}\n",
            f"[[{table}]]\nname = 1\npassword = {p}\n",
            f"{user}password = {p}\nallow_empty_password = \"yes\"\n",
            f"{user}password = {p} trailing\n",                       # TOML errors
            f"{user}password = {p}\npassword = {p}\n",
        ]
    down = "[[downstream.users]]\nname = \"r\"\n"
    out += [
        f"{down}password = {p}\npassword_hash = \"*00\"\n",
        f"{down}password = {p}\nnetworks = [\"bogus\"]\n",
        f"{down}password = {p}\nrequire_tls = true\n",
        f"{down}password = {p}\nplugin = \"sha3\"\n",
        f"{down}password = {p}\nmax_connections = -1\n",
    ]
    return out


@pytest.mark.parametrize("pw", PASSWORDS)
def test_no_password_in_any_config_error(tmp_path: object, pw: str) -> None:
    texts = _url_error_paths(pw) + _user_error_paths(pw)
    for text in texts:
        with pytest.raises(ConfigError) as info:
            _load(tmp_path, text)
        msg = str(info.value)
        assert pw not in msg and "ssW0rd" not in msg, (text, msg)


@pytest.mark.parametrize("text", [
    "[[downstream.users]]\nname = 'r'\npassword = 98765432\n",
    "[[tap.users]]\nname = 'r'\npassword = 98765432\n",
    "[[tap.users]]\nname = 'r'\npassword = 98765432.5\n",
    "[upstream]\nsources = ['mysql://repl:98765432@db1:3306x']\n",
    "[upstream]\nsources = ['mysql://repl:98765432']\n",       # no host: a port, "98765432"?
    "[upstream]\nsources = ['mysql://repl:9876/5432@db1:3306']\n",
])
def test_a_numeric_password_is_not_echoed(tmp_path: object, text: str) -> None:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, text)
    assert "98765432" not in str(info.value) and "5432" not in str(info.value), \
        str(info.value)


@pytest.mark.parametrize("pw", PASSWORDS)
def test_no_password_through_check_config_and_relay_changes(
        tmp_path: object, pw: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The same through the commands: `relay check-config` (exit 2) and `relay changes`
    of a URL that does not parse (exit 2)."""
    from relay.cli import main

    path = os.path.join(str(tmp_path), "bad.toml")
    for text in (_url_error_paths(pw) + _user_error_paths(pw))[::4]:
        with open(path, "w") as f:
            f.write(text)
        assert main(["check-config", path]) == 2
        out = capsys.readouterr()
        assert pw not in out.out + out.err and "ssW0rd" not in out.out + out.err, out
    for url in (f"mysql://repl:{pw}@db1:3306x", f"mysql://repl:{pw}@db1:3306?ssl-mode=x",
                f"mysq://repl:{pw}@db1:3306", f"mysql://repl:{pw}@[db1:3306",
                f"relay://repl:{pw}@/no/such/dir"):
        assert main(["changes", url]) == 2
        out = capsys.readouterr()
        assert "ssW0rd" not in out.out + out.err, out


def test_redaction_parses_instead_of_matching() -> None:
    from relay.config import Source, redact, redact_url

    assert redact_url("mysql://repl:a/b'c d@e@db1:3306?ssl-mode=REQUIRED") == \
        "mysql://repl:***@db1:3306?ssl-mode=REQUIRED"
    assert redact_url("mysql://repl@db1:3306") == "mysql://repl@db1:3306"
    assert redact_url("mysql://db1:3306") == "mysql://db1:3306"
    assert redact_url("repl:pw@db1") == "***@db1"          # no scheme: all before the @
    assert redact("source 'mysql://u:it's a secret@db1:33x' has a bad port") == \
        "source 'mysql://u:***@db1:33x' has a bad port"
    assert redact("a mysql://u:p/q@h and mariadb://v:w?x@k\nthen mysql://z@h") == \
        "a mysql://u:***@k\nthen mysql://z@h"             # too much masked, never too little
    source = Source.parse("mysql://repl:pa%2Fss@db1:3306")
    assert source.password == "pa/ss"                       # percent-encoded: accepted
    assert "pa/ss" not in repr(source) and "pa/ss" not in str(source)


def test_a_raw_slash_in_a_password_is_refused_with_the_fix() -> None:
    from relay.config import Source

    for pw in ("pa/ss", "pa?ss", "pa#ss", "/pass"):
        with pytest.raises(ValueError) as info:
            Source.parse(f"mysql://repl:{pw}@db1:3306")
        assert "percent-encode" in str(info.value) and pw not in str(info.value)


def test_users_repr_hides_the_password() -> None:
    from relay.config import DownstreamUser, TapUser

    for user in (DownstreamUser(name="r", password="hunter2"),
                 TapUser(name="t", password="hunter2")):
        assert "hunter2" not in repr(user) and "name='" in repr(user)


# --- secure defaults ------------------------------------------------------------------------


@pytest.mark.parametrize("host,loopback", [
    ("127.0.0.1", True), ("127.9.8.7", True), ("::1", True), ("[::1]", True),
    ("localhost", True), ("LOCALHOST", True), ("::ffff:127.0.0.1", True),
    ("0.0.0.0", False), ("::", False), ("[::]", False), ("10.0.0.5", False),
    ("db1.example", False), ("::ffff:10.0.0.1", False),
])
def test_loopback(host: str, loopback: bool) -> None:
    from relay.config import is_loopback

    assert is_loopback(host) is loopback


@pytest.mark.parametrize("text", [
    "[[downstream.users]]\nname = 'r'\n",
    "[[downstream.users]]\nname = 'r'\npassword = ''\n",
    "[[tap.users]]\nname = 'r'\n",
    "[[tap.users]]\nname = 'r'\npassword = ''\n",
])
def test_a_user_needs_a_password(tmp_path: object, text: str) -> None:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, text)
    msg = str(info.value)
    assert "users[0].password: user 'r' has" in msg and "allow_empty_password = true" in msg
    assert "password_env" in msg
    c = _load(tmp_path, text + "allow_empty_password = true\n")
    from relay.config import security_problems, security_warnings

    assert security_problems(c) == []
    assert [w for w in security_warnings(c) if "'r': no password" in w]


def test_an_empty_password_env_is_refused(tmp_path: object,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from relay.config import check_security

    c = _load(tmp_path, "[[tap.users]]\nname = 'r'\npassword_env = 'RELAY_TEST_PW'\n")
    monkeypatch.setenv("RELAY_TEST_PW", "")
    with pytest.raises(ConfigError, match=r"RELAY_TEST_PW \(its password_env\) is empty"):
        check_security(c)
    with pytest.raises(ConfigError, match="allow_empty_password"):
        c.tap.users[0].resolve_password()
    monkeypatch.setenv("RELAY_TEST_PW", "pw")
    assert check_security(c) == [] and c.tap.users[0].resolve_password() == "pw"


@pytest.mark.parametrize("text,section,missing", [
    ("[downstream]\nlisten = '0.0.0.0:3307'\n", "downstream", ["[downstream.tls]"]),
    ("[downstream]\nlisten = '[::]:3307'\n", "downstream", ["[downstream.tls]"]),
    ("[downstream]\nlisten = '10.1.2.3:3307'\n", "downstream", ["[downstream.tls]"]),
    ("[downstream]\nlisten = 'db1.example:3307'\n", "downstream", ["[downstream.tls]"]),
    ("[tap]\nlisten = '0.0.0.0:4000'\n", "tap", ["[tap.tls]", "[[tap.users]]"]),
    ("[tap]\nlisten = '0.0.0.0:4000'\n[[tap.users]]\nname = 's'\npassword_env = 'P'\n", "tap",
     ["[tap.tls]"]),
    ("[metrics]\nlisten = '0.0.0.0:9104'\n", "metrics",
     ["credentials (token_file, token_env or basic_user)", "[metrics.tls]"]),
    ("[metrics]\nlisten = '0.0.0.0:9104'\ntoken_env = 'T'\n", "metrics", ["[metrics.tls]"]),
])
def test_a_listener_beyond_loopback_is_refused_unless_allowed(
        tmp_path: object, text: str, section: str, missing: list[str]) -> None:
    from relay.config import check_security, exposure_warnings

    c = _load(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        check_security(c)
    msg = str(info.value)
    assert f"{section}.listen = " in msg and f"[{section}] allow_insecure = true" in msg
    assert all(m in msg for m in missing), msg
    head, sep, rest = text.partition(f"[{section}]\n")
    allowed = _load(tmp_path, f"{head}{sep}allow_insecure = true\n{rest}")
    warnings = check_security(allowed)
    assert warnings == exposure_warnings(allowed) and len(warnings) == 1
    assert all(m in warnings[0] for m in missing) and "allow_insecure = true" in warnings[0]


def test_loopback_listeners_and_protected_ones_pass(tmp_path: object) -> None:
    from relay.config import check_security

    for text in ("", "[downstream]\nlisten = 'localhost:3307'\n[tap]\nlisten = '[::1]:4000'\n"
                     "[metrics]\nlisten = '127.0.0.2:9104'\n"):
        assert check_security(_load(tmp_path, text)) == []
    assert Config().downstream.listen == "127.0.0.1:3307"


def test_rules_hiding_data_from_a_server_id_get_a_warning(tmp_path: object) -> None:
    from relay.config import security_warnings

    c = _load(tmp_path, """
[[rules]]
name = "by-id"
at = "send"
clients = ["shop", 3001]
[[rules.mask]]
column = "shop.users.email"
with = "null"
[[rules]]
name = "by-user"
at = "send"
clients = ["shop"]
ignore_tables = ["shop.audit"]
[[rules]]
name = "routing"
at = "send"
clients = [3002]
rename_schema = { shop = "shop2" }
""")
    assert security_warnings(c) == [
        "rules 'by-id' names clients by server_id (3001): a client chooses its own "
        "server_id: this rule routes, it does not protect; name users for rules that hide "
        "data"]
