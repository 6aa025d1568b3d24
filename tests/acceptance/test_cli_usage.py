"""Exit codes: 0 success, 1 error, 64 usage; errors as ``error: <code>: <message>`` on stderr."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.server import Server, free_port, run_cli

pytestmark = pytest.mark.slow


def test_help_documents_exit_codes_env_vars_and_examples(tmp_path: Path) -> None:
    done = run_cli("--help", home=tmp_path)

    assert done.returncode == 0
    for text in ("exit codes:", "64", "QL3_URL", "QL3_TOKEN", "QL3_HOME", "examples:", "ql3 run start"):
        assert text in done.stdout


def test_no_arguments_print_the_help_and_exit_0(tmp_path: Path) -> None:
    done = run_cli(home=tmp_path)

    assert done.returncode == 0
    assert done.stdout.startswith("usage: ql3") and "examples:" in done.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["frobnicate"],
        ["task"],
        ["task", "add", "x"],
        ["task", "add", "x", "--command", "true", "--overlap", "sometimes"],
        ["task", "add", "x", "--command", "true", "--timeout", "soon"],
        ["run", "list", "--limit", "0"],
        ["token", "create", "--role", "root"],
    ],
    ids=[
        "unknown-command",
        "no-action",
        "missing-command",
        "bad-choice",
        "bad-number",
        "bad-limit",
        "bad-role",
    ],
)
def test_argument_errors_exit_64(tmp_path: Path, args: list[str]) -> None:
    done = run_cli(*args, home=tmp_path)

    assert done.returncode == 64
    assert "usage:" in done.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["task", "add", "x", "--command", "true", "--env", "NOEQUALS"],
        ["task", "add", "x", "--command", "true", "--require", "=v"],
        ["task", "add", "x", "--command", "true", "--timeout", "-1"],
        ["task", "edit", "x"],
        ["serve", "--listen", "nowhere"],
    ],
    ids=["env-syntax", "require-syntax", "negative-timeout", "empty-edit", "bad-listen"],
)
def test_local_validation_errors_exit_64_before_any_request(tmp_path: Path, args: list[str]) -> None:
    # Given no server and no credentials at all: a request would fail with exit 1, not 64
    done = run_cli(*args, home=tmp_path)

    assert done.returncode == 64
    assert done.stderr.startswith("error: usage:")


def test_input_the_api_rejects_as_invalid_exits_64(shared_server: Server) -> None:
    done = shared_server.cli("task", "add", "badcron", "--command", "true", "--cron", "every day")

    assert done.returncode == 64
    assert done.stderr.startswith(
        "error: validation_failed: --cron 'every day': a cron expression has 5 fields"
    )


def test_a_bad_env_flag_writes_nothing(shared_server: Server) -> None:
    done = shared_server.cli("task", "add", "not-made", "--command", "true", "--env", "BROKEN")

    assert done.returncode == 64
    names = [t["name"] for t in shared_server.cli_json("task", "list")["items"]]
    assert "not-made" not in names


def test_an_api_refusal_exits_1_with_its_code(shared_server: Server) -> None:
    done = shared_server.cli("run", "show", "01a22d6c-0942-71ad-b0a5-4738104dd590")

    assert done.returncode == 1
    assert done.stderr == (
        "error: not_found: run '01a22d6c-0942-71ad-b0a5-4738104dd590' not found (see: ql3 run list)\n"
    )


def test_without_credentials_the_cli_exits_1(tmp_path: Path) -> None:
    done = run_cli("task", "list", home=tmp_path / "empty")

    assert done.returncode == 1
    assert done.stderr.startswith("error: not_configured:")


def test_an_unreachable_server_exits_1(tmp_path: Path) -> None:
    env = {"QL3_URL": f"http://127.0.0.1:{free_port()}", "QL3_TOKEN": "ql3_whatever"}

    done = run_cli("task", "list", home=tmp_path, env=env)

    assert done.returncode == 1
    assert done.stderr.startswith("error: unreachable:")


def test_env_vars_win_over_the_credentials_file(shared_server: Server) -> None:
    # Given a valid credentials file but a wrong token in QL3_TOKEN
    done = shared_server.cli("task", "list", env={"QL3_TOKEN": "ql3_wrong"})

    # Then the env token is the one used
    assert done.returncode == 1
    assert done.stderr.startswith("error: unauthenticated:")
