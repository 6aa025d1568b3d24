"""A QingLong user's daily workflow through ``ql3`` in-process against the app (issue 30): crons in
the project's time zone, shown in the task's zone and the viewer's; task names in Chinese; durations
such as 1h30m; plain project variables; bad input exits 64 and changes nothing. The run that gets
the variables and a secret is in tests/acceptance/test_cli_daily_workflow.py (a real server)."""

from __future__ import annotations

import json
from typing import Any


def _json(cli_main: Any, *args: str) -> Any:
    code, out, err = cli_main(*args, "--json")
    assert code == 0, (args, err)
    return json.loads(out)


def test_a_project_zone_makes_a_migrated_cron_fire_in_that_zone(cli_main: Any) -> None:
    # Given the project's zone set to China's, as a QingLong panel's
    _json(cli_main, "project", "set", "--tz", "Asia/Shanghai")

    # When a migrated 08:00 cron is added
    task = _json(cli_main, "task", "add", "checkin", "--command", "true", "--cron", "0 8 * * *")
    code, shown, _ = cli_main("task", "show", "checkin", "--utc")
    settings = _json(cli_main, "project", "show")

    # Then it fires at 08:00 in Shanghai, shown in the viewer's zone (UTC here) and the task's
    assert (task["cron"], task["tz"]) == ("CRON_TZ=Asia/Shanghai 0 8 * * *", "Asia/Shanghai")
    assert settings == {"default_tz": "Asia/Shanghai"}
    assert code == 0 and "0 8 * * * (Asia/Shanghai)" in shown
    assert "00:00:00 UTC (" in shown and "08:00:00 Asia/Shanghai)" in shown
    assert _json(cli_main, "project", "set", "--no-tz") == {"default_tz": None}


def test_a_task_zone_and_six_fields_from_the_command_line(cli_main: Any) -> None:
    task = _json(
        cli_main,
        "task",
        "add",
        "sixfield",
        "--command",
        "true",
        "--cron",
        "30 0 8 * * *",
        "--tz",
        "Europe/Berlin",
    )
    moved = _json(cli_main, "task", "edit", "sixfield", "--tz", "Asia/Tokyo")

    assert task["cron"] == "CRON_TZ=Europe/Berlin 30 0 8 * * *"
    assert (moved["cron"], moved["revision"]) == ("CRON_TZ=Asia/Tokyo 30 0 8 * * *", 2)


def test_a_chinese_name_with_durations_in_units(cli_main: Any) -> None:
    added = _json(
        cli_main, "task", "add", "京东 签到", "--command", "true", "--timeout", "1h30m", "--grace", "10s"
    )
    edited = _json(cli_main, "task", "edit", "京东 签到", "--timeout", "10m")
    code, shown, _ = cli_main("task", "show", "京东 签到")
    recent = _json(cli_main, "run", "list", "--since", "1h30m")

    assert (added["name"], added["timeout_ms"], added["grace_ms"]) == ("京东 签到", 5_400_000, 10_000)
    assert edited["timeout_ms"] == 600_000
    assert code == 0 and "10m" in shown and "京东 签到" in shown
    assert recent["items"] == []


def test_plain_variables_are_set_listed_imported_and_removed(cli_main: Any, tmp_path: Any) -> None:
    export = tmp_path / "envs.json"
    export.write_text('[{"name": "JD_COOKIE", "value": "pt_key=1;", "remarks": "账号一", "status": 0}]')

    _json(cli_main, "env", "set", "REGION", "cn", "--note", "where")
    imported = _json(cli_main, "env", "import", str(export))
    code, listed, _ = cli_main("env", "list")
    _json(cli_main, "env", "rm", "REGION")

    assert imported == {"imported": 1, "names": ["JD_COOKIE"]}
    assert code == 0 and "REGION" in listed and "cn" in listed and "账号一" in listed
    assert [v["name"] for v in _json(cli_main, "env", "list")["items"]] == ["JD_COOKIE"]


def test_bad_input_exits_64_and_changes_nothing(cli_main: Any, tmp_path: Any) -> None:
    broken = tmp_path / "broken.env"
    broken.write_text("A=1\nno equals sign\n")
    bad = [
        ["task", "add", "badzone", "--command", "true", "--timeout", "90 minutes"],
        ["task", "add", "bad/zone", "--command", "true"],
        ["task", "add", "badzone", "--command", "true", "--cron", "0 8 * * *", "--tz", "Mars/Olympus"],
        ["task", "add", "badzone", "--command", "true", "--cron", "*/5 * * * * *"],
        ["project", "set", "--tz", "../../etc/passwd"],
        ["project", "set"],
        ["env", "set", "1BAD", "x"],
        ["env", "import", str(broken)],
    ]

    done = [cli_main(*args) for args in bad]

    assert [code for code, _, _ in done] == [64] * len(bad), [err for _, _, err in done]
    errors = [err for _, _, err in done]
    assert "1h30m" in errors[0]
    assert "without '/'" in errors[1]
    assert "unknown time zone 'Mars/Olympus'" in errors[2]
    assert "every 10 s" in errors[3]
    assert "line 2" in errors[7]
    assert _json(cli_main, "task", "list")["items"] == []
    assert _json(cli_main, "project", "show")["default_tz"] is None
    assert _json(cli_main, "env", "list")["items"] == []
