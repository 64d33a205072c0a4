"""The seams of the design, checked on the source: no import cycles, and only the relay
log's package reads or writes binlog files (segments, their side files, a server's
binlogs). import-linter (scripts/test) checks the layers; these are what it cannot say."""

from __future__ import annotations

import ast
import pathlib

import grimp

ROOT = pathlib.Path(__file__).resolve().parents[2] / "relay"

# Files outside relay/relaylog that open a file, and which: none of them is a binlog.
OPENS_OTHER_FILES = {
    "relay/config.py": "the config file",
    "relay/buildinfo.py": "the commit the build recorded (relay/_commit.txt)",
    "relay/sandbox.py": "the sandbox's password file",
    "relay/testing/mariadb.py": "a throwaway server's error log",
    "relay/testing/kill_drill.py": "binlog files read from outside, as mysqlbinlog reads them "
                                   "(a test tool may not import relay.relaylog)",
    "relay/tap/mirror.py": "a Spark checkpoint's metadata file (the query id)",
    "relay/tap/server.py": "tap-subscribers.json of an older relay, adopted once",
    "relay/tap/snapshots.py": "the tap's snapshot plans (tap-snapshots/*.msgpack)",
    "relay/tls.py": "the configured certificate (its fingerprint); a generated certificate "
                    "and key, written for the ssl module to load them",
}


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycles() -> None:
    """Every import counts (local ones and those under TYPE_CHECKING too)."""
    assert _cycles(grimp.build_graph("relay")) == []


def _opens(path: pathlib.Path) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if (isinstance(f, ast.Name) and f.id == "open") or (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) \
                and f.value.id in ("os", "io") and f.attr in ("open", "pread", "fdopen")) or (isinstance(f, ast.Attribute) and f.attr in ("read_bytes", "read_text",
                                                         "write_bytes", "write_text")):
            lines.append(node.lineno)
    return lines


def test_only_the_relay_log_package_opens_binlog_files() -> None:
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).as_posix()
        if rel.startswith("relay/relaylog/") or rel in OPENS_OTHER_FILES:
            continue
        offenders += [f"{rel}:{line}" for line in _opens(path)]
    assert offenders == [], ("open files through relay.relaylog (cursors, segment readers, "
                             "relaylog.series) or list the file here with what it opens")


def test_the_allow_list_is_current() -> None:
    for rel in OPENS_OTHER_FILES:
        assert _opens(ROOT.parent / rel), f"{rel} opens nothing any more: drop it from the list"
