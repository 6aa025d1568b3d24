"""The CLI against a real server: define a task, start runs, read everything back as JSON."""

from __future__ import annotations

import json

import pytest

from tests.support.server import Server
from tests.support.waits import wait_for

pytestmark = pytest.mark.slow


def test_task_add_then_task_list_shows_it(shared_server: Server) -> None:
    # Given a task added through the CLI
    added = shared_server.cli_json("task", "add", "nightly", "--command", "echo hi", "--cron", "0 3 * * *")

    # When the tasks are listed
    listed = shared_server.cli_json("task", "list")

    # Then the task is there, enabled, at revision 1
    mine = [t for t in listed["items"] if t["name"] == "nightly"]
    assert len(mine) == 1
    assert {k: mine[0][k] for k in ("id", "name", "revision", "enabled", "cron")} == {
        "id": added["id"],
        "name": "nightly",
        "revision": 1,
        "enabled": True,
        "cron": "0 3 * * *",
    }


def test_run_start_then_run_show_reads_the_run_back(shared_server: Server) -> None:
    task = shared_server.cli_json("task", "add", "report", "--command", "exit 5")

    started = shared_server.cli_json("run", "start", "report")

    def ended() -> dict[str, object] | None:
        shown: dict[str, object] = shared_server.cli_json("run", "show", started["id"])
        return shown if shown["status"] in ("succeeded", "failed") else None

    shown = wait_for(ended, 30, what="the run to end")

    assert started["status"] == "queued" and started["exit_code"] is None
    assert shown["id"] == started["id"]
    assert (shown["task_id"], shown["task_revision"]) == (task["id"], 1)
    assert (shown["status"], shown["exit_code"]) == ("failed", 5)
    assert isinstance(shown["created_at_ms"], int)


def test_run_list_returns_the_tasks_runs_newest_first(shared_server: Server) -> None:
    shared_server.cli_json("task", "add", "listed", "--command", "true")
    first = shared_server.cli_json("run", "start", "listed")
    second = shared_server.cli_json("run", "start", "listed", "--priority", "3")

    page = shared_server.cli_json("run", "list", "--task", "listed")

    assert [r["id"] for r in page["items"]] == [second["id"], first["id"]]
    assert page["next_cursor"] is None


def test_run_list_pages_with_cursor_and_limit(shared_server: Server) -> None:
    shared_server.cli_json("task", "add", "paged", "--command", "true")
    ids = [shared_server.cli_json("run", "start", "paged")["id"] for _ in range(3)]

    first = shared_server.cli_json("run", "list", "--task", "paged", "--limit", "2")
    rest = shared_server.cli_json(
        "run", "list", "--task", "paged", "--limit", "2", "--cursor", first["next_cursor"]
    )

    assert [r["id"] for r in first["items"] + rest["items"]] == list(reversed(ids))


def test_run_start_with_an_idempotency_key_returns_the_same_run(shared_server: Server) -> None:
    shared_server.cli_json("task", "add", "once", "--command", "true")

    first = shared_server.cli_json("run", "start", "once", "--idempotency-key", "k-1")
    again = shared_server.cli_json("run", "start", "once", "--idempotency-key", "k-1")

    assert again["id"] == first["id"]
    assert len(shared_server.cli_json("run", "list", "--task", "once")["items"]) == 1


def test_run_events_show_the_whole_lifecycle(shared_server: Server) -> None:
    shared_server.cli_json("task", "add", "evented", "--command", "true")
    run = shared_server.cli_json("run", "start", "evented", "--wait")

    events = shared_server.cli_json("run", "events", run["id"])

    assert [e["type"] for e in events["items"]] == [
        "run.created",
        "run.queued",
        "run.dispatching",
        "attempt.starting",
        "attempt.running",
        "run.running",
        "attempt.succeeded",
        "run.succeeded",
    ]


def test_task_edit_publishes_a_new_revision(shared_server: Server) -> None:
    shared_server.cli_json("task", "add", "edited", "--command", "true")

    edited = shared_server.cli_json("task", "edit", "edited", "--timeout", "2.5", "--overlap", "skip")

    assert (edited["revision"], edited["timeout_ms"], edited["overlap"]) == (2, 2500, "skip")


def test_task_disable_and_rm(shared_server: Server) -> None:
    shared_server.cli_json("task", "add", "retired", "--command", "true")

    disabled = shared_server.cli_json("task", "disable", "retired")
    removed = shared_server.cli("task", "rm", "retired")
    shown = shared_server.cli("task", "show", "retired")

    assert disabled["enabled"] is False
    assert removed.returncode == 0
    assert shown.returncode == 1
    assert shown.stderr.startswith("error: not_found:")


def test_task_output_never_contains_env_values_and_the_command_only_in_its_field(
    shared_server: Server,
) -> None:
    canary = "CANARY-cli-51d2"
    added = shared_server.cli(
        "task", "add", "quiet", "--command", f"echo {canary}-cmd", "--env", f"TOKEN={canary}", "--json"
    )

    shown = shared_server.cli("task", "show", "quiet", "--json")
    human = shared_server.cli("task", "show", "quiet")

    for done in (added, shown, human):
        assert done.returncode == 0
    # the owner may edit the task, so --json carries its command (docs/console.md), in that field only
    for done in (added, shown):
        body = json.loads(done.stdout)
        assert body["command"] == f"echo {canary}-cmd"
        assert canary not in json.dumps({k: v for k, v in body.items() if k != "command"})
    assert canary not in human.stdout + human.stderr
    assert "TOKEN" in human.stdout  # the env key is public, its value is not


def test_human_output_has_no_ansi_codes(shared_server: Server) -> None:
    shared_server.cli_json("task", "add", "plain", "--command", "true")

    listed = shared_server.cli("task", "list")

    assert listed.returncode == 0
    assert "\x1b" not in listed.stdout
    assert "plain" in listed.stdout
