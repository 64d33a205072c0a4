import os
import pathlib

import pytest

from relay.cli import main

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for command in ("run", "check-config", "status", "demo", "inspect-log"):
        assert command in out


def test_check_config_ok(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", os.path.join(ROOT, "config.toml")]) == 0
    assert "OK" in capsys.readouterr().out


def test_check_config_names_the_bad_key(tmp_path: pathlib.Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[upstream]\nsource = ['mysql://a@b']\n")
    assert main(["check-config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "upstream.source: unknown key; did you mean 'sources'?" in err


def test_sandbox_without_mariadb_says_what_to_do(tmp_path: pathlib.Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("relay.testing.mariadb.shutil.which", lambda *a, **k: None)
    assert main(["run", "--data-dir", str(tmp_path)]) == 5
    err = capsys.readouterr().err
    assert "apt-get install mariadb-server" in err and "[upstream] sources" in err


def test_inspect_log_on_an_empty_directory(tmp_path: pathlib.Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect-log", str(tmp_path)]) == 1
    assert "no relay log" in capsys.readouterr().out
