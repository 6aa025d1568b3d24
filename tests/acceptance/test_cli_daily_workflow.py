"""A QingLong user's daily workflow through the CLI against one real server (issue 30): crons in the
project's time zone, shown in the task's zone and the viewer's; task names in Chinese; durations such
as 1h30m; bad input exits 64 and changes nothing."""

from __future__ import annotations

import pytest

from tests.support.server import Server

pytestmark = pytest.mark.slow
UTC_VIEWER = {"TZ": "UTC"}


def test_a_project_zone_makes_a_migrated_cron_fire_in_that_zone(shared_server: Server) -> None:
    # Given the project's zone set to China's, as a QingLong panel's
    shared_server.cli_json("project", "set", "--tz", "Asia/Shanghai")

    # When a migrated 08:00 cron is added
    task = shared_server.cli_json("task", "add", "checkin", "--command", "true", "--cron", "0 8 * * *")
    shown = shared_server.cli("task", "show", "checkin", env=UTC_VIEWER)
    settings = shared_server.cli_json("project", "show")
    shared_server.cli_json("project", "set", "--no-tz")

    # Then it fires at 08:00 in Shanghai, shown in the viewer's zone (UTC here) and the task's
    assert (task["cron"], task["tz"]) == ("CRON_TZ=Asia/Shanghai 0 8 * * *", "Asia/Shanghai")
    assert settings == {"default_tz": "Asia/Shanghai"}
    assert "0 8 * * * (Asia/Shanghai)" in shown.stdout
    assert "00:00:00 UTC (" in shown.stdout and "08:00:00 Asia/Shanghai)" in shown.stdout


def test_a_task_zone_and_six_fields_from_the_command_line(shared_server: Server) -> None:
    task = shared_server.cli_json(
        "task", "add", "sixfield", "--command", "true", "--cron", "30 0 8 * * *", "--tz", "Europe/Berlin"
    )
    moved = shared_server.cli_json("task", "edit", "sixfield", "--tz", "Asia/Tokyo")

    assert task["cron"] == "CRON_TZ=Europe/Berlin 30 0 8 * * *"
    assert (moved["cron"], moved["revision"]) == ("CRON_TZ=Asia/Tokyo 30 0 8 * * *", 2)


def test_a_chinese_name_with_durations_in_units(shared_server: Server) -> None:
    added = shared_server.cli_json(
        "task", "add", "京东 签到", "--command", "true", "--timeout", "1h30m", "--grace", "10s"
    )
    edited = shared_server.cli_json("task", "edit", "京东 签到", "--timeout", "10m")
    shown = shared_server.cli("task", "show", "京东 签到")
    recent = shared_server.cli_json("run", "list", "--since", "1h30m")

    assert (added["name"], added["timeout_ms"], added["grace_ms"]) == ("京东 签到", 5_400_000, 10_000)
    assert edited["timeout_ms"] == 600_000
    assert "10m" in shown.stdout and "京东 签到" in shown.stdout
    assert recent["items"] == []


def test_bad_input_exits_64_and_changes_nothing(shared_server: Server) -> None:
    bad = [
        ["task", "add", "badzone", "--command", "true", "--timeout", "90 minutes"],
        ["task", "add", "bad/zone", "--command", "true"],
        ["task", "add", "badzone", "--command", "true", "--cron", "0 8 * * *", "--tz", "Mars/Olympus"],
        ["task", "add", "badzone", "--command", "true", "--cron", "*/5 * * * * *"],
        ["project", "set", "--tz", "../../etc/passwd"],
        ["project", "set"],
    ]

    done = [shared_server.cli(*args) for args in bad]

    assert [d.returncode for d in done] == [64] * len(bad), [d.stderr for d in done]
    assert "1h30m" in done[0].stderr
    assert "without '/'" in done[1].stderr
    assert "unknown time zone 'Mars/Olympus'" in done[2].stderr
    assert "every 10 s" in done[3].stderr
    names = [t["name"] for t in shared_server.cli_json("task", "list")["items"]]
    assert "badzone" not in names and "bad/zone" not in names
    assert shared_server.cli_json("project", "show")["default_tz"] is None


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

    # Then it saw the project's values under its own, and no listing shows the secret
    assert run["status"] == "succeeded", run
    assert "你好 task pt_key=s3cr3t;" in logs.stdout
    assert "s3cr3t" not in listed.stdout and "(secret)" in listed.stdout
    assert "s3cr3t" not in str(listed_json)
    key = shared_server.home / "variables.key"
    assert key.stat().st_mode & 0o777 == 0o600 and key.stat().st_size == 32
    for stored in shared_server.home.glob("ql3.db*"):  # the database, its WAL: sealed only
        assert b"s3cr3t" not in stored.read_bytes(), stored
    assert "s3cr3t" not in shared_server.log_path.read_text(errors="replace")
