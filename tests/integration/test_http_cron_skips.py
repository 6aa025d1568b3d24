"""Skipped cron occurrences and the cron settings over HTTP, in the CLI and in /metrics (docs/cron.md)."""

from __future__ import annotations

from typing import Any

from ql3.application.cron import CronScheduler
from ql3.storage.sqlite.adapter import SqliteDatabase

TASKS = "/api/v1/projects/default/tasks"
MINUTE = 60_000


def _miss_three(db: SqliteDatabase, task_id: str) -> int:
    """Move the task's cursor 3 minutes into the past (as after an outage) and run one cron cycle."""
    now = db.transaction(lambda tx: tx.now_ms(), write=False)
    first = (now // MINUTE - 5) * MINUTE
    db.raw(
        "UPDATE task_schedules SET next_fire_at_ms = ?, next_occurrence_ms = ? WHERE task_id = ?",
        (first, first, task_id),
    )
    CronScheduler(db).schedule_once()
    return first


def test_skipped_occurrences_show_on_the_task_its_listing_the_cli_and_metrics(
    client: Any, owner: Any, db: SqliteDatabase, cli_main: Any
) -> None:
    body = {"name": "tick", "command": "true", "cron": "* * * * *", "misfire_grace_ms": 0}
    task = client.post(TASKS, json=body, headers=owner).json()
    first = _miss_three(db, task["id"])

    shown = client.get(f"{TASKS}/tick", headers=owner).json()
    listed = client.get(f"{TASKS}/tick/skipped", params={"limit": 5}, headers=owner).json()
    code, out, _ = cli_main("task", "show", "tick", "--utc")
    metrics = client.get("/metrics").text

    [skip] = shown["skipped_occurrences"]
    assert (skip["reason"], skip["occurrence_ms"], skip["task_revision"]) == ("misfire", first, 1)
    assert skip["occurrences"] >= 5 and skip["last_occurrence_ms"] >= first + 4 * MINUTE
    assert listed["items"] == shown["skipped_occurrences"]
    assert code == 0 and "skipped occurrences" in out and "misfire" in out
    assert f'ql3_cron_skipped_occurrences{{reason="misfire"}} {float(skip["occurrences"])}' in metrics
    assert 'ql3_cron_skipped_occurrences{reason="overlap"} 0.0' in metrics
    assert task["id"] not in metrics


def test_the_cli_sets_the_grace_random_delay_and_start_trigger(
    client: Any, owner: Any, cli_main: Any
) -> None:
    client.post(TASKS, json={"name": "job", "command": "true", "cron": "0 3 * * *"}, headers=owner)

    code, _, _ = cli_main(
        "task", "edit", "job", "--misfire-grace", "90s", "--random-delay", "0-300s", "--on-start"
    )
    task = client.get(f"{TASKS}/job", headers=owner).json()

    assert code == 0
    assert (task["misfire_grace_ms"], task["random_delay_ms"], task["on_start"]) == (90_000, 300_000, True)
    # the next fires carry each occurrence's seeded delay: within 5 minutes after 03:00
    assert all(0 <= ms % 86_400_000 - 3 * 3_600_000 <= 300_000 for ms in task["next_fires_at_ms"])
    assert task["next_fires_at_ms"][0] == task["next_fire_at_ms"]


def test_bad_cron_settings_are_refused_and_nothing_is_written(
    client: Any, owner: Any, cli_main: Any, counts: Any
) -> None:
    before = counts()
    for flags in (("--misfire-grace", "2h"), ("--random-delay", "soon"), ("--misfire-grace", "-5s")):
        code, _, err = cli_main("task", "add", "x", "--command", "true", "--cron", "* * * * *", *flags)
        assert code == 64, (flags, err)
    for body in ({"misfire_grace_ms": 3_600_001}, {"random_delay_ms": -1}, {"on_start": "yes"}):
        resp = client.post(TASKS, json={"name": "x", "command": "true", **body}, headers=owner)
        assert resp.status_code == 422 and resp.json()["error"]["code"] == "validation_failed", body
    assert client.get(f"{TASKS}/nope/skipped", headers=owner).status_code == 404
    assert counts() == before
