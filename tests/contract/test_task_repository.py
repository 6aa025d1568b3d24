"""The tasks repository's own promises: its compare-and-set writes and what "live" means."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import pytest

from ql3.application import tasks
from ql3.application.cron import CronScheduler
from ql3.application.tasks import TaskView
from ql3.domain.errors import Conflict
from ql3.repositories import tasks as task_store
from tests.support.builders import count, seed_project, seed_task
from tests.support.databases import Harness

MINUTE = 60_000


def test_a_task_update_from_a_stale_read_changes_nothing(harness: Harness) -> None:
    # Given a task read on one connection, then disabled through a second connection
    project = seed_project(harness.db)
    stale = seed_task(harness.db, project)
    other = harness.second_connection()
    try:
        assert other.transaction(lambda tx: task_store.update_task(tx, stale, enabled=False, revision=1))
    finally:
        other.close()

    # When the first connection writes from what it read
    written = harness.db.transaction(lambda tx: task_store.update_task(tx, stale, enabled=True, revision=2))

    # Then the compare-and-set refuses it and the second write stands
    assert written is False
    now = harness.db.transaction(lambda tx: task_store.get_task(tx, project.id, stale.id), write=False)
    assert now is not None and (now.enabled, now.revision) == (False, 1)


def test_a_task_update_checks_the_revision_it_read(harness: Harness) -> None:
    project = seed_project(harness.db)
    task = seed_task(harness.db, project)
    ahead = replace(task, revision=2)

    written = harness.db.transaction(lambda tx: task_store.update_task(tx, ahead, enabled=False, revision=3))

    assert written is False
    now = harness.db.transaction(lambda tx: task_store.get_task(tx, project.id, task.id), write=False)
    assert now == task


def test_a_deleted_task_is_not_live_and_its_due_schedule_admits_nothing(harness: Harness) -> None:
    # Given a cron task that is soft-deleted while its schedule row is still there (a racing delete)
    project = seed_project(harness.db)
    task = seed_task(harness.db, project, cron="* * * * *")
    harness.db.transaction(lambda tx: task_store.delete_task(tx, task.id))
    harness.advance_clock(2 * MINUTE)

    # When the scheduler reaches its due schedule
    report = CronScheduler(harness.db).schedule_once()

    # Then nothing runs, the schedule is gone, and the task is found by no lookup
    assert report.decisions == ["raced"] and count(harness.db, "runs") == 0
    assert count(harness.db, "task_schedules") == 0
    found = harness.db.transaction(
        lambda tx: (
            task_store.get_live_task(tx, task.id),
            task_store.get_task(tx, project.id, task.id),
            task_store.get_task_by_name(tx, project.id, task.name),
        ),
        write=False,
    )
    assert found == (None, None, None)


def test_a_toggle_racing_an_edit_on_another_connection_is_refused_and_writes_nothing(
    pg_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # PostgreSQL only: SQLite serialises writers (a stale write is retried from scratch there).
    harness = pg_harness
    project = seed_project(harness.db)
    task = seed_task(harness.db, project, command="echo one")
    other = harness.second_connection()
    read = threading.Event()
    edited = threading.Event()
    main = threading.current_thread()
    real_update = task_store.update_task
    outcome: list[BaseException | TaskView] = []

    def update_after_the_edit(tx: Any, current: Any, **kw: Any) -> bool:
        if threading.current_thread() is not main:
            read.set()  # the toggle has read the task and is about to write it
            assert edited.wait(30)
        return real_update(tx, current, **kw)

    monkeypatch.setattr(task_store, "update_task", update_after_the_edit)

    def toggle() -> None:
        try:
            outcome.append(harness.db.transaction(lambda tx: tasks.set_enabled(tx, project.id, "job", False)))
        except BaseException as exc:  # reported by the main thread
            outcome.append(exc)

    # Given a toggle that read revision 1 on one connection
    thread = threading.Thread(target=toggle)
    thread.start()
    try:
        assert read.wait(30)
        # When an edit publishes revision 2 on another connection before the toggle writes
        other.transaction(lambda tx: tasks.edit_task(tx, project.id, "job", {"command": "echo two"}))
    finally:
        edited.set()
        thread.join(30)
        other.close()

    # Then the toggle's compare-and-set refuses it: a conflict, and the edit stands enabled
    assert len(outcome) == 1 and isinstance(outcome[0], Conflict)
    now = harness.db.transaction(lambda tx: task_store.get_task(tx, project.id, task.id), write=False)
    assert now is not None and (now.revision, now.enabled) == (2, True)
