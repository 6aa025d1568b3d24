"""Project variables and a secret reach a real run through the CLI against one real server (issue 30):
the task's own value wins, and the secret is in no listing, no server log line and no database file.
The rest of the daily workflow (zones, names, durations, bad input) runs in-process in
tests/integration/test_cli_daily_workflow.py."""

from __future__ import annotations

import pytest

from tests.support.server import Server

pytestmark = pytest.mark.slow


def test_project_variables_and_a_secret_reach_a_run_and_the_secret_is_never_shown(
    shared_server: Server,
) -> None:
    # Given a variable, a secret and a task whose own env overrides one of them
    shared_server.cli_json("env", "set", "GREETING", "你好", "--note", "shown")
    shared_server.cli_json("env", "set", "REGION", "project")
    shared_server.cli_json("env", "set", "JD_COOKIE", "pt_key=s3cr3t;", "--secret")
    shared_server.cli_json(
        "task", "add", "签到", "--command", 'echo "$GREETING $REGION $JD_COOKIE"', "--env", "REGION=task"
    )

    # When it runs
    run = shared_server.cli_json("run", "start", "签到", "--wait")
    logs = shared_server.cli("run", "logs", run["id"])
    listed = shared_server.cli("env", "list")
    listed_json = shared_server.cli_json("env", "list")

    # Then it saw the project's values under its own (the run's log file has them: the command
    # printed them), the logs the server serves mask the secret, and no listing shows it
    assert run["status"] == "succeeded", run
    assert "你好 task ***" in logs.stdout and "s3cr3t" not in logs.stdout
    log_files = list((shared_server.home / "worker" / "logs").rglob("*.log"))
    assert any(b"pt_key=s3cr3t;" in f.read_bytes() for f in log_files)
    assert "s3cr3t" not in listed.stdout and "(secret)" in listed.stdout
    assert "s3cr3t" not in str(listed_json)
    key = shared_server.home / "variables.key"
    assert key.stat().st_mode & 0o777 == 0o600 and key.stat().st_size == 32
    for stored in shared_server.home.glob("ql3.db*"):  # the database, its WAL: sealed only
        assert b"s3cr3t" not in stored.read_bytes(), stored
    assert "s3cr3t" not in shared_server.log_path.read_text(errors="replace")
