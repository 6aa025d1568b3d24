"""What the console needs from the API: run filters, the raw log, run facts, the command rule."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from ql3.application import runs
from ql3.storage.sqlite.adapter import SqliteDatabase

RUNS = "/api/v1/projects/default/runs"
TASKS = "/api/v1/projects/default/tasks"


def _fail(db: SqliteDatabase, run: dict[str, Any]) -> None:
    def unit(tx: Any) -> None:
        moved = runs.transition(tx, run["id"], run["version"], "dispatching", actor_type="system")
        runs.transition(tx, run["id"], moved.version, "failed", actor_type="system")

    db.transaction(unit)


def test_status_filter_is_applied_not_ignored(
    client: Any, owner: Any, make_task: Any, db: SqliteDatabase
) -> None:
    # Given a failed run and a queued one
    make_task("job")
    failed = client.post(f"{TASKS}/job/runs", headers=owner).json()
    _fail(db, failed)
    queued = client.post(f"{TASKS}/job/runs", headers=owner).json()

    # When runs are listed by status
    only_failed = client.get(RUNS, params={"status": "failed"}, headers=owner).json()["items"]
    both = client.get(RUNS, params={"status": "failed,queued"}, headers=owner).json()["items"]

    assert [r["id"] for r in only_failed] == [failed["id"]]
    assert [r["id"] for r in both] == [queued["id"], failed["id"]]


def test_task_trigger_and_time_filters_over_http(client: Any, owner: Any, make_task: Any) -> None:
    make_task("job")
    make_task("other")
    first = client.post(f"{TASKS}/job/runs", headers=owner).json()
    rerun = client.post(f"{TASKS}/job/runs", json={"rerun_of": first["id"]}, headers=owner).json()
    other = client.post(f"{TASKS}/other/runs", headers=owner).json()

    def ids(**params: Any) -> list[str]:
        resp = client.get(RUNS, params=params, headers=owner)
        assert resp.status_code == 200, resp.text
        return [r["id"] for r in resp.json()["items"]]

    assert rerun["trigger"] == "retry" and first["trigger"] == "manual"
    assert ids(task="job") == [rerun["id"], first["id"]]
    assert ids(trigger="retry") == [rerun["id"]]
    assert ids(trigger="manual", task="other") == [other["id"]]
    assert ids(since=other["created_at_ms"] + 1) == []
    assert set(ids(until=other["created_at_ms"] + 1)) == {first["id"], rerun["id"], other["id"]}


def test_filtered_pages_follow_the_cursor(
    client: Any, owner: Any, make_task: Any, db: SqliteDatabase
) -> None:
    make_task("job")
    failed = []
    for i in range(5):
        run = client.post(f"{TASKS}/job/runs", headers=owner).json()
        if i != 2:
            _fail(db, run)
            failed.append(run["id"])
    seen: list[str] = []
    params: dict[str, Any] = {"status": "failed", "limit": 3}
    for _ in range(5):
        page = client.get(RUNS, params=params, headers=owner).json()
        seen += [r["id"] for r in page["items"]]
        if not page["next_cursor"]:
            break
        params["cursor"] = page["next_cursor"]
    assert sorted(seen) == sorted(failed) and len(seen) == 4


@pytest.mark.parametrize(
    "params",
    [
        {"status": "done"},
        {"status": "failed,"},
        {"trigger": "webhook"},
        {"since": -1},
        {"since": "yesterday"},
        {"since": 10, "until": 5},
    ],
)
def test_bad_filter_values_are_422_with_a_stable_code(
    client: Any, owner: Any, make_task: Any, params: dict[str, Any]
) -> None:
    make_task("job")
    client.post(f"{TASKS}/job/runs", headers=owner)

    resp = client.get(RUNS, params=params, headers=owner)

    assert resp.status_code == 422
    assert resp.json()["error"]["code"] == "validation_failed"


def test_runs_carry_task_name_trigger_and_attempt(client: Any, owner: Any, make_task: Any) -> None:
    make_task("nightly")
    started = client.post(f"{TASKS}/nightly/runs", headers=owner).json()

    listed = client.get(RUNS, headers=owner).json()["items"][0]
    shown = client.get(f"{RUNS}/{started['id']}", headers=owner).json()

    for body in (started, listed, shown):
        assert (body["task_name"], body["trigger"], body["attempt"]) == ("nightly", "manual", 1)
        assert "started_at_ms" in body and "finished_at_ms" in body


def test_a_rerun_must_name_a_run_of_the_same_task(
    client: Any, owner: Any, make_task: Any, counts: Any
) -> None:
    make_task("job")
    make_task("other")
    other_run = client.post(f"{TASKS}/other/runs", headers=owner).json()
    before = counts()

    for bad in (other_run["id"], "not-a-run", "0190a0a0-0000-7000-8000-000000000000"):
        resp = client.post(f"{TASKS}/job/runs", json={"rerun_of": bad}, headers=owner)
        assert resp.status_code == 422, bad
        assert resp.json()["error"]["code"] == "validation_failed"
    assert counts() == before


def test_the_raw_log_is_the_whole_file_as_text_plain(
    logs_client: Any, owner: Any, started_run: Any, logs_root: Path
) -> None:
    # Given a log larger than one JSON page, with ANSI escapes and bytes that are not UTF-8
    run = started_run()
    content = b"\x1b[32mgreen\x1b[0m\n" + b"x" * (300 * 1024) + b"\n\xff tail\n"
    (logs_root / f"{run['attempt_id']}.log").write_bytes(content)

    resp = logs_client.get(f"{RUNS}/{run['id']}/logs/raw", headers=owner)

    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    assert resp.headers["content-disposition"] == f'attachment; filename="run-{run["id"]}.log"'
    assert resp.content == content


def test_the_raw_log_of_a_run_that_wrote_nothing_is_empty(
    logs_client: Any, owner: Any, started_run: Any
) -> None:
    run = started_run()

    resp = logs_client.get(f"{RUNS}/{run['id']}/logs/raw", headers=owner)

    assert resp.status_code == 200 and resp.content == b""


def test_the_raw_log_needs_a_token_and_the_project(
    logs_client: Any, owner: Any, started_run: Any, make_token: Any
) -> None:
    run = started_run()
    outsider = make_token("admin", project="elsewhere")

    assert logs_client.get(f"{RUNS}/{run['id']}/logs/raw").status_code == 401
    assert logs_client.get(f"{RUNS}/{run['id']}/logs/raw", headers=outsider).status_code == 404


@pytest.mark.parametrize(
    ("role", "sees"), [("viewer", False), ("operator", True), ("approver", True), ("admin", True)]
)
def test_the_command_is_shown_only_to_roles_that_edit_or_approve(
    client: Any, owner: Any, make_token: Any, role: str, sees: bool
) -> None:
    # Given a task with a command, a working directory and an env value, edited once
    body = {"name": "deploy", "command": "./deploy.sh --prod", "cwd": "/srv/app", "env": {"K": "v-secret"}}
    assert client.post(TASKS, json=body, headers=owner).status_code == 201
    client.patch(f"{TASKS}/deploy", json={"command": "./deploy.sh --prod --fast"}, headers=owner)
    headers = make_token(role)

    # When the role reads the task, the list and the revisions
    shown = client.get(f"{TASKS}/deploy", headers=headers).json()
    listed = client.get(TASKS, headers=headers).json()["items"][0]
    revisions = client.get(f"{TASKS}/deploy/revisions", headers=headers).json()["items"]

    # Then the command and cwd are there for editors and approvers, absent for a viewer; never env values
    assert [r["revision"] for r in revisions] == [2, 1]
    for task in (shown, listed):
        assert task["command_visible"] is sees
        assert task["command"] == ("./deploy.sh --prod --fast" if sees else None)
        assert task["cwd"] == ("/srv/app" if sees else None)
    assert [r["spec"].get("command") for r in revisions] == (
        ["./deploy.sh --prod --fast", "./deploy.sh --prod"] if sees else [None, None]
    )
    for text in (str(shown), str(listed), str(revisions)):
        assert "v-secret" not in text
        assert sees or "deploy.sh" not in text


def test_cli_run_list_filters_and_keeps_them_in_the_next_page_hint(
    client: Any, owner: Any, make_task: Any, db: SqliteDatabase, cli_main: Any
) -> None:
    make_task("job")
    ids = []
    for _ in range(3):
        run = client.post(f"{TASKS}/job/runs", headers=owner).json()
        _fail(db, run)
        ids.append(run["id"])
    queued = client.post(f"{TASKS}/job/runs", headers=owner).json()

    code, out, err = cli_main(
        "run",
        "list",
        "--status",
        "failed",
        "--since",
        "24h",
        "--task",
        "job",
        "--trigger",
        "manual",
        "--limit",
        "2",
        "-q",  # whole ids, one a line (tables show short ones)
    )

    assert code == 0, err
    assert ids[2] in out and ids[1] in out and queued["id"] not in out
    hint = next(line for line in (out + err).splitlines() if line.startswith("more:"))
    assert "--status failed" in hint and "--task job" in hint and "--trigger manual" in hint
    assert "--limit 2" in hint and "--since " in hint
    # following the hint lists the one failed run left, not the queued one
    args = hint.removeprefix("more: ql3 ").split()
    code, out, err = cli_main(*args, *([] if "-q" in args else ["-q"]))
    assert code == 0, err
    assert ids[0] in out and queued["id"] not in out and ids[2] not in out


@pytest.mark.parametrize(
    "args",
    [("--status", "done"), ("--trigger", "webhook"), ("--since", "yesterday"), ("--until", "3 fortnights")],
)
def test_cli_run_list_refuses_bad_filters_as_usage_errors(cli_main: Any, args: tuple[str, str]) -> None:
    code, _, _ = cli_main("run", "list", *args)

    assert code == 64
    assert cli_main.requests == []


def test_a_cron_tasks_page_lists_its_next_fires(client: Any, owner: Any) -> None:
    client.post(TASKS, json={"name": "quarterly", "command": "true", "cron": "0 * * * *"}, headers=owner)
    client.post(TASKS, json={"name": "manual", "command": "true"}, headers=owner)

    shown = client.get(f"{TASKS}/quarterly", headers=owner).json()
    plain = client.get(f"{TASKS}/manual", headers=owner).json()

    fires = shown["next_fires_at_ms"]
    assert len(fires) == 5 and fires[0] == shown["next_fire_at_ms"]
    assert [b - a for a, b in itertools.pairwise(fires)] == [3_600_000] * 4
    assert plain["next_fires_at_ms"] == []
