"""The docs say only what exists: the generated reference pages are current, every `toml`
block loads with the relay's own config loader, every `python` block compiles, and every
`relay` command (with its options) that a shell block runs exists in the parser.
(`mkdocs build --strict` in scripts/test checks the links and anchors.)"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from functools import cache

import pytest

from relay.cli import build_parser
from relay.config import parse_config
from relay.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = os.path.join(ROOT, "docs")
PAGES = sorted([os.path.join(DOCS, n) for n in os.listdir(DOCS) if n.endswith(".md")]
               + [os.path.join(ROOT, "README.md")])
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(language: str) -> Iterator[tuple[str, str]]:
    """(page:line, text) of each fenced block in that language."""
    for path in PAGES:
        with open(path) as f:
            text = f.read()
        for m in _FENCE.finditer(text):
            if m.group(1) == language:
                line = text.count("\n", 0, m.start()) + 1
                yield f"{os.path.relpath(path, ROOT)}:{line}", m.group(2)


def test_the_reference_pages_are_what_the_code_says() -> None:
    done = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "reference.py"),
                           "--check"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def _env_names(node: object) -> Iterator[str]:
    """The environment variables a config names (`*_env` keys)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key.endswith("_env") and isinstance(value, str):
                yield value
            yield from _env_names(value)
    elif isinstance(node, list):
        for item in node:
            yield from _env_names(item)


def _merged(base: dict[str, object], more: dict[str, object]) -> dict[str, object]:
    out = dict(base)
    for key, value in more.items():
        old = out.get(key)
        if isinstance(old, dict) and isinstance(value, dict):
            out[key] = _merged(old, value)
        elif isinstance(old, list) and isinstance(value, list):
            out[key] = old + value
        else:
            out[key] = value
    return out


def _config_error(data: dict[str, object], where: str) -> str | None:
    """What the loader says of a config; a certificate path of an example (no such file
    here) is no error."""
    try:
        parse_config(data, source=where)
    except ConfigError as exc:
        if "is not a readable file" not in str(exc):
            return str(exc)
    return None


def test_every_toml_block_loads_with_the_config_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fragments as fragments: the tables a block names, with defaults for the rest and
    the environment variables it names set; a block that needs a table an earlier block
    of its page showed (a user requiring TLS, the TLS above) loads with those blocks."""
    seen = 0
    page, earlier = "", dict[str, object]()
    for where, text in blocks("toml"):
        seen += 1
        if where.split(":")[0] != page:
            page, earlier = where.split(":")[0], {}
        data = tomllib.loads(text)
        for name in _env_names(data):
            monkeypatch.setenv(name, "a-value-of-32-bytes-for-the-docs")
        error = _config_error(data, where)
        if error is not None:
            assert _config_error(_merged(earlier, data), where) is None, error
        earlier = _merged(earlier, data)
    assert seen >= 10


def test_every_python_block_compiles() -> None:
    seen = 0
    for where, text in blocks("python"):
        seen += 1
        compile(text, where, "exec")
    assert seen >= 3


@cache
def _help(command: tuple[str, ...]) -> str | None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()), \
            contextlib.suppress(SystemExit):
        build_parser().parse_args([*command, "--help"])
    return out.getvalue() or None


def _commands(text: str) -> Iterator[list[str]]:
    """The arguments of each `relay ...` a shell block runs (after environment
    assignments, `$`, `sudo`, `&&`, `|` or `;`)."""
    for line in text.replace("\\\n", " ").splitlines():
        words = line.split("#", 1)[0].split()
        for i, word in enumerate(words):
            if word == "relay" and all("=" in w or w in ("$", "sudo", "exec", "&&", "|", ";")
                                       for w in words[:i]):
                yield words[i + 1:]


def test_every_relay_command_in_a_shell_block_exists() -> None:
    seen = 0
    for where, text in blocks("sh"):
        for args in _commands(text):
            seen += 1
            command: tuple[str, ...] = ()
            for word in args:   # the longest run of words that is a command
                if word.startswith("-") or _help((*command, word)) is None or \
                        _help((*command, word)) == _help(command):
                    break
                command = (*command, word)
            assert command, f"{where}: relay {' '.join(args)}: no such command"
            text_ = _help(command) or ""
            for option in (a.split("=", 1)[0] for a in args if a.startswith("--")):
                assert re.search(rf"(^|[\s,\[]){re.escape(option)}\b", text_), \
                    f"{where}: relay {' '.join(command)} has no option {option}"
    assert seen >= 5


@pytest.mark.parametrize("command", [("mirror",), ("rules", "check")])
def test_the_command_check_knows_commands_and_options(command: tuple[str, ...]) -> None:
    """The check above can fail: a made-up command has no help, a real one has."""
    assert _help(command) is not None
    assert _help(("no-such-command",)) is None


def test_every_alert_has_a_runbook_on_the_operations_page_and_every_runbook_an_alert() -> None:
    import yaml

    with open(os.path.join(ROOT, "dashboards", "alerts.yml")) as f:
        rules = [r for g in yaml.safe_load(f)["groups"] for r in g["rules"]]
    with open(os.path.join(DOCS, "operations.md")) as f:
        page = f.read()
    section = page.split("## Alerts and what to do", 1)[1].split("\n## ", 1)[0]
    runbooks = {h.lower() for h in re.findall(r"^### (\w+)$", section, re.MULTILINE)}
    alerts = set()
    for rule in rules:
        name = rule["alert"]
        alerts.add(name.lower())
        url = rule["annotations"].get("runbook_url", "")
        assert url == f"https://relay.example/operations/#{name.lower()}", (name, url)
    assert alerts == runbooks, (alerts ^ runbooks)


def test_the_option_table_is_every_option_the_data_source_reads() -> None:
    """relay/tap/options.py (the reference page's source and the data source's check)
    names exactly the options relay/tap/spark.py reads."""
    from relay.tap.options import KNOWN_OPTIONS

    with open(os.path.join(ROOT, "relay", "tap", "spark.py")) as f:
        source = f.read()
    read = set(re.findall(r"""\bo(?:\.get\(|\[|, )["']([a-z]+)["']""", source))
    read |= set(re.findall(r"""["']([a-z]+)["'] (?:not )?in o\b""", source))
    assert read == {k.lower() for k in KNOWN_OPTIONS}, read ^ {k.lower() for k in KNOWN_OPTIONS}
