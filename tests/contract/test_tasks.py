"""Tasks publish immutable revisions; runs pin them."""

from __future__ import annotations

import pytest

from ql3.application import tasks
from ql3.domain.errors import NameTaken, NotFound, TaskDisabled, ValidationFailed
from tests.support.builders import count, seed_project, seed_task, start_run
from tests.support.databases import Harness


def test_edit_publishes_a_new_revision_and_keeps_history(harness: Harness) -> None:
    project = seed_project(harness.db)
    task = seed_task(harness.db, project, command="echo one")
    run, _ = start_run(harness.db, project, task)

    edited = harness.db.transaction(
        lambda tx: tasks.edit_task(tx, project.id, "job", {"command": "echo two"})
    )

    assert edited.task.revision == 2
    first = harness.db.transaction(lambda tx: tasks.get_revision(tx, task.id, 1))
    assert first.spec["command"] == "echo one"
    assert edited.revision.content_digest != first.content_digest
    assert run.task_revision == 1


def test_edit_without_a_change_publishes_nothing(harness: Harness) -> None:
    project = seed_project(harness.db)
    seed_task(harness.db, project, command="echo one")

    same = harness.db.transaction(lambda tx: tasks.edit_task(tx, project.id, "job", {"command": "echo one"}))

    assert same.task.revision == 1 and count(harness.db, "task_revisions") == 1


def test_duplicate_name_is_refused_and_writes_nothing(harness: Harness) -> None:
    project = seed_project(harness.db)
    seed_task(harness.db, project)

    with pytest.raises(NameTaken):
        seed_task(harness.db, project)
    assert count(harness.db, "tasks") == 1 and count(harness.db, "task_revisions") == 1


def test_deleted_name_can_be_reused_and_old_runs_keep_their_revision(harness: Harness) -> None:
    project = seed_project(harness.db)
    old = seed_task(harness.db, project)
    start_run(harness.db, project, old)

    harness.db.transaction(lambda tx: tasks.delete_task(tx, project.id, "job"))
    new = seed_task(harness.db, project)

    assert new.id != old.id
    with pytest.raises(NotFound):
        harness.db.transaction(lambda tx: tasks.find_task(tx, project.id, old.id))


def test_invalid_spec_writes_nothing(harness: Harness) -> None:
    project = seed_project(harness.db)

    with pytest.raises(ValidationFailed):
        seed_task(harness.db, project, cron="61 * * * *")
    with pytest.raises(ValidationFailed):
        seed_task(harness.db, project, surprise=True)
    assert count(harness.db, "tasks") == 0 and count(harness.db, "task_revisions") == 0


def test_task_of_another_project_is_not_found(harness: Harness) -> None:
    a = seed_project(harness.db)
    b = seed_project(harness.db, "b")
    task = seed_task(harness.db, a)

    with pytest.raises(NotFound):
        harness.db.transaction(lambda tx: tasks.find_task(tx, b.id, task.id))


def test_a_disabled_task_cannot_be_started_by_hand(harness: Harness) -> None:
    project = seed_project(harness.db)
    seed_task(harness.db, project)
    disabled = harness.db.transaction(lambda tx: tasks.set_enabled(tx, project.id, "job", False)).task

    with pytest.raises(TaskDisabled):
        start_run(harness.db, project, disabled)
    assert count(harness.db, "runs") == 0
