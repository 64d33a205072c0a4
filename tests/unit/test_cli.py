import gc
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
    monkeypatch.setattr("relay.testing.mariadb.builds", dict)   # no server build found
    assert main(["run", "--data-dir", str(tmp_path)]) == 5
    err = capsys.readouterr().err
    assert "apt-get install mariadb-server" in err and "[upstream] sources" in err


def test_inspect_log_on_an_empty_directory(tmp_path: pathlib.Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect-log", str(tmp_path)]) == 1
    assert "no relay log" in capsys.readouterr().out


def test_check_config_refuses_an_exposed_listener(tmp_path: pathlib.Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "relay.toml"
    config.write_text('[downstream]\nlisten = "0.0.0.0:3307"\n')
    assert main(["check-config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "downstream.listen = '0.0.0.0:3307' is beyond loopback without [downstream.tls]" \
        in err and "[downstream] allow_insecure = true" in err


def test_check_config_warns_and_exits_0(tmp_path: pathlib.Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "relay.toml"
    config.write_text('[downstream]\nlisten = "0.0.0.0:3307"\nallow_insecure = true\n'
                      '[[downstream.users]]\nname = "nopw"\nallow_empty_password = true\n'
                      '[[rules]]\nname = "r"\nat = "send"\nclients = [3001]\n'
                      'ignore_tables = ["shop.secrets"]\n')
    assert main(["check-config", str(config)]) == 0
    out = capsys.readouterr()
    assert f"{config}: OK (3 warnings)" in out.out
    warnings = [line for line in out.err.splitlines() if line.startswith("relay: warning: ")]
    assert len(warnings) == 3, out.err
    assert "plain text" in warnings[0] and "'nopw': no password" in warnings[1]
    assert "a client chooses its own server_id: this rule routes, it does not protect; " \
        "name users for rules that hide data" in warnings[2]


def test_run_refuses_an_exposed_listener_before_starting_anything(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`relay run` (here the sandbox, which would start a MariaDB first) exits 2."""
    config = tmp_path / "relay.toml"
    config.write_text(f'[relay]\ndata_dir = "{tmp_path}/data"\n'
                      '[tap]\nlisten = "0.0.0.0:4000"\n[[tap.users]]\nname = "s"\n'
                      'password_env = "RELAY_NO_SUCH_VAR"\n')
    try:
        assert main(["run", "--config", str(config)]) == 2
    finally:
        gc.enable()   # cmd_run turns collection off until the relay serves
    err = capsys.readouterr().err
    assert "tap.listen = '0.0.0.0:4000' is beyond loopback without [tap.tls]" in err
    assert "[tap] allow_insecure = true" in err
    assert not (tmp_path / "data").exists()
