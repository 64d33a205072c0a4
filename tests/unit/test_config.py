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
    ("[upstream]\nstart = 'yesterday'\n", "upstream.start: not a MariaDB GTID"),
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
