"""Cron admission: on time, misfire policies, overlap, idempotency, and no invented history."""

from __future__ import annotations

import threading
from typing import Any

from ql3.application import tasks
from ql3.application.cron import CronScheduler
from ql3.application.schedules import next_fire_at
from ql3.domain.tasks import next_fire_ms
from tests.support.builders import count, seed_project, seed_task
from tests.support.databases import Harness

MINUTE = 60_000


def _runs(harness: Harness) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = harness.db.raw(
        "SELECT trigger_type, scheduled_for_ms, idempotency_key, status FROM runs ORDER BY scheduled_for_ms"
    )
    return rows


def _next_minute(ms: int) -> int:
    return (ms // MINUTE + 1) * MINUTE


def test_a_new_schedule_starts_at_activation_and_invents_no_history(harness: Harness) -> None:
    project = seed_project(harness.db)
    task = seed_task(harness.db, project, cron="* * * * *")

    fire = harness.db.transaction(lambda tx: next_fire_at(tx, task.id))

    assert fire == _next_minute(harness.now_ms())
    assert CronScheduler(harness.db).schedule_once().admitted == 0
    assert count(harness.db, "runs") == 0


def test_an_on_time_occurrence_is_admitted_once_and_the_cursor_moves_past_now(harness: Harness) -> None:
    project = seed_project(harness.db)
    start = harness.now_ms()
    task = seed_task(harness.db, project, cron="* * * * *")
    first = _next_minute(start)
    harness.advance_clock(first - harness.now_ms() + 1_000)

    report = CronScheduler(harness.db).schedule_once()
    again = CronScheduler(harness.db).schedule_once()

    assert report.admitted == 1 and again.admitted == 0
    runs = _runs(harness)
    assert [(r["trigger_type"], r["scheduled_for_ms"]) for r in runs] == [("cron", first)]
    assert runs[0]["idempotency_key"] == f"ql3:cron:v2:{task.id}:{first}"
    assert harness.db.transaction(lambda tx: next_fire_at(tx, task.id)) == first + MINUTE


def test_missed_occurrences_beyond_grace_are_skipped_by_default(harness: Harness) -> None:
    project = seed_project(harness.db)
    start = harness.now_ms()
    seed_task(harness.db, project, cron="* * * * *")
    harness.advance_clock(30 * MINUTE)

    report = CronScheduler(harness.db).schedule_once()

    # The 29 minutes missed are recorded, none run; the current one (due just now) is on time.
    assert report.skipped_misfire == 29 and report.admitted == 1
    assert [r["scheduled_for_ms"] for r in _runs(harness)] == [_next_minute(start) + 29 * MINUTE]


def test_fire_once_admits_only_the_oldest_missed_occurrence(harness: Harness) -> None:
    project = seed_project(harness.db)
    start = harness.now_ms()
    seed_task(harness.db, project, cron="*/7 * * * *", misfire="fire_once")
    harness.freeze_clock()
    harness.advance_clock(30 * MINUTE)
    due = [next_fire_ms("*/7 * * * *", start)]
    while next_fire_ms("*/7 * * * *", due[-1]) <= harness.now_ms():
        due.append(next_fire_ms("*/7 * * * *", due[-1]))

    first = CronScheduler(harness.db).schedule_once()
    second = CronScheduler(harness.db).schedule_once()

    # Four or five occurrences came due: the oldest is the one catch-up run, the newest is on time
    # when it is within the grace; the others are recorded as missed.
    on_time = harness.now_ms() - due[-1] <= 5 * MINUTE
    expected = [due[0], due[-1]] if on_time else [due[0]]
    assert first.admitted == len(expected) and second.admitted == 0
    assert first.skipped_misfire == len(due) - len(expected)
    assert [r["scheduled_for_ms"] for r in _runs(harness)] == expected


def test_overlap_skip_does_not_start_a_second_copy(harness: Harness) -> None:
    project = seed_project(harness.db)
    seed_task(harness.db, project, cron="* * * * *", overlap="skip")
    harness.advance_clock(MINUTE + 1_000)
    assert CronScheduler(harness.db).schedule_once().admitted == 1

    harness.advance_clock(MINUTE)
    report = CronScheduler(harness.db).schedule_once()

    assert report.skipped_overlap == 1 and count(harness.db, "runs") == 1


def test_overlap_allow_starts_another_copy(harness: Harness) -> None:
    project = seed_project(harness.db)
    seed_task(harness.db, project, cron="* * * * *")
    harness.advance_clock(MINUTE + 1_000)
    CronScheduler(harness.db).schedule_once()
    harness.advance_clock(MINUTE)

    assert CronScheduler(harness.db).schedule_once().admitted == 1
    assert count(harness.db, "runs") == 2


def test_disabling_or_removing_the_cron_stops_firing(harness: Harness) -> None:
    project = seed_project(harness.db)
    seed_task(harness.db, project, cron="* * * * *")
    seed_task(harness.db, project, name="other", cron="* * * * *")
    harness.db.transaction(lambda tx: tasks.set_enabled(tx, project.id, "job", False))
    harness.db.transaction(lambda tx: tasks.edit_task(tx, project.id, "other", {"cron": None}))
    harness.advance_clock(MINUTE + 1_000)

    assert CronScheduler(harness.db).schedule_once().admitted == 0
    # The disabled task keeps a paused cursor (no due time); the unscheduled one has none.
    assert harness.db.raw("SELECT next_fire_at_ms FROM task_schedules") == [{"next_fire_at_ms": None}]


def test_an_edit_pins_new_runs_to_the_new_revision(harness: Harness) -> None:
    project = seed_project(harness.db)
    seed_task(harness.db, project, cron="* * * * *")
    harness.db.transaction(lambda tx: tasks.edit_task(tx, project.id, "job", {"command": "echo v2"}))
    harness.advance_clock(MINUTE + 1_000)

    CronScheduler(harness.db).schedule_once()

    assert harness.db.raw("SELECT task_revision FROM runs")[0]["task_revision"] == 2


def test_two_schedulers_racing_admit_each_occurrence_once(harness: Harness) -> None:
    project = seed_project(harness.db)
    for i in range(5):
        seed_task(harness.db, project, name=f"t{i}", cron="* * * * *")
    harness.advance_clock(MINUTE + 1_000)
    other = harness.second_connection()
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def go(db: Any) -> None:
        barrier.wait()
        try:
            CronScheduler(db).schedule_once()
        except BaseException as exc:  # asserted below
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(db,)) for db in (harness.db, other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    other.close()

    assert not errors
    assert count(harness.db, "runs") == 5


def test_overlap_cancel_previous_stops_the_running_copy_and_starts_a_new_one(harness: Harness) -> None:
    # Given a cron task whose previous run is still queued
    project = seed_project(harness.db)
    seed_task(harness.db, project, cron="* * * * *", overlap="cancel_previous")
    harness.advance_clock(MINUTE + 1_000)
    CronScheduler(harness.db).schedule_once()

    # When the next occurrence is admitted
    harness.advance_clock(MINUTE)
    assert CronScheduler(harness.db).schedule_once().admitted == 1

    # Then the previous copy was cancelled by policy and a new one is queued
    rows = harness.db.raw("SELECT status, cancel_reason FROM runs ORDER BY created_at_ms, id")
    assert [(r["status"], r["cancel_reason"]) for r in rows] == [("cancelled", "policy"), ("queued", None)]
