"""``ql3 serve`` refuses bad worker settings as usage errors before it touches anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from ql3.application.settings import ENV_VARS, PROFILES
from ql3.cli.main import main


@pytest.mark.parametrize(
    "args",
    [
        ["--slots", "0"],
        ["--slots", "1025"],
        ["--slots", "many"],
        ["--worker-id", "bad id"],
        ["--worker-id", "-x"],
        ["--notify-allow", "not a host/or net"],
        ["--notify-allow", "10.0.0.0/33"],
    ],
)
def test_bad_worker_settings_exit_64_and_create_nothing(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("QL3_HOME", str(home))

    assert main(["serve", *args]) == 64
    assert not home.exists()


@pytest.mark.parametrize(
    ("env", "args", "named"),
    [
        ({"QL3_RUN_LEASE_MS": "abc"}, [], "QL3_RUN_LEASE_MS"),
        ({"QL3_RUN_LEASE_MS": "1000"}, [], "QL3_RUN_LEASE_MS"),
        ({"QL3_RUN_LEASE_MS": "99999999"}, [], "QL3_RUN_LEASE_MS"),
        ({"QL3_CANCEL_LEASE_MS": "30s"}, [], "QL3_CANCEL_LEASE_MS"),
        ({"QL3_CANCEL_LEASE_MS": "8000"}, [], "QL3_CANCEL_LEASE_MS"),  # not above twice the grace
        ({"QL3_ACTION_LEASE_MS": "-5"}, [], "QL3_ACTION_LEASE_MS"),
        ({"QL3_DATABASE_URL": "mysql://app:hunter2@db/x"}, [], "QL3_DATABASE_URL"),
        ({}, ["--database-url", "sqlite:///"], "--database-url"),
        ({}, ["--profile", "edge", "--slots", "32"], "--slots"),
    ],
)
def test_invalid_configuration_exits_64_naming_the_variable_before_any_file_is_created(
    env: dict[str, str],
    args: list[str],
    named: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Given a fresh QL3_HOME and one invalid setting
    home = tmp_path / "home"
    monkeypatch.setenv("QL3_HOME", str(home))
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    # When the server is started
    code = main(["serve", "--listen", "127.0.0.1:1", *args])

    # Then it refuses with a usage error that names the variable, and neither home nor db exist
    err = capsys.readouterr().err
    assert code == 64
    assert err.startswith("error: configuration_error: ") and named in err
    assert "hunter2" not in err
    assert not home.exists()


def test_serve_help_lists_the_budgets_of_each_profile_and_the_variables(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["serve", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())

    for budgets in PROFILES.values():
        for line in budgets.describe():
            assert " ".join(line.split()) in text
    for var in ENV_VARS:
        assert var.name in text


@pytest.mark.parametrize("command", ["serve", "control"])
def test_the_access_log_is_on_unless_no_access_log_is_given(command: str) -> None:
    from ql3.cli.main import build_parser

    parser = build_parser()
    assert parser.parse_args([command]).access_log is True
    assert parser.parse_args([command, "--no-access-log"]).access_log is False
