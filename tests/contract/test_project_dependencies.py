"""A project's dependency set and its install run (docs/dependencies.md). Runs on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest

from ql3.application import auth, dependencies, tasks
from ql3.domain.dependencies import INSTALL_TASK
from ql3.domain.errors import NotFound, ValidationFailed
from ql3.domain.model import Principal, Project
from ql3.repositories import runs as run_store
from ql3.repositories import tasks as task_store
from tests.support.builders import count


def _owner(db: Any) -> tuple[Project, Principal]:
    issued = db.transaction(auth.bootstrap_owner)
    assert issued is not None
    return issued.project, issued.principal


def _install_task_command(db: Any, project: Project) -> str:
    def unit(tx: Any) -> str:
        view = tasks.view(tx, tasks.find_task(tx, project.id, INSTALL_TASK))
        return view.spec.command

    result: str = db.transaction(unit, write=False)
    return result


def _run_status(tx: Any, run_id: str) -> str:
    run = run_store.get_run(tx, run_id)
    assert run is not None
    return run.status


def test_add_stores_the_entry_and_queues_an_install_run_of_the_whole_set(harness: Any) -> None:
    db = harness.db
    project, owner = _owner(db)

    first = db.transaction(lambda tx: dependencies.add(tx, project, owner, "python", "Requests==2.32.*"))
    second = db.transaction(lambda tx: dependencies.add(tx, project, owner, "node", "@scope/pkg@^1.2"))

    listed = db.transaction(lambda tx: dependencies.list_set(tx, project), write=False)
    assert [(d.kind, d.name, d.spec) for d in listed] == [
        ("node", "@scope/pkg", "@scope/pkg@^1.2"),
        ("python", "requests", "Requests==2.32.*"),
    ]
    assert first.run is not None and second.run is not None
    first_id, second_id = first.run.id, second.run.id
    assert first_id != second_id
    command = _install_task_command(db, project)
    assert "'Requests==2.32.*'" in command and "'@scope/pkg@^1.2'" in command
    # The newest set wins: the first install run (still queued) was cancelled by the second change.
    assert db.transaction(lambda tx: _run_status(tx, first_id), write=False) == "cancelled"
    assert db.transaction(lambda tx: _run_status(tx, second_id), write=False) == "queued"


def test_the_same_spec_again_changes_nothing_and_a_new_version_replaces_the_old(harness: Any) -> None:
    db = harness.db
    project, owner = _owner(db)
    db.transaction(lambda tx: dependencies.add(tx, project, owner, "python", "requests==2.31"))
    runs_before = count(db, "runs")

    again = db.transaction(lambda tx: dependencies.add(tx, project, owner, "python", "requests==2.31"))
    assert again.run is None and count(db, "runs") == runs_before

    db.transaction(lambda tx: dependencies.add(tx, project, owner, "python", "requests>=2.32"))
    listed = db.transaction(lambda tx: dependencies.list_set(tx, project), write=False)
    assert [d.spec for d in listed] == ["requests>=2.32"]
    assert "'requests>=2.32'" in _install_task_command(db, project)
    assert "2.31" not in _install_task_command(db, project)


def test_remove_installs_the_remaining_set_and_an_unknown_name_is_not_found(harness: Any) -> None:
    db = harness.db
    project, owner = _owner(db)
    db.transaction(lambda tx: dependencies.add(tx, project, owner, "python", "requests"))
    db.transaction(lambda tx: dependencies.add(tx, project, owner, "python", "rich"))

    removed = db.transaction(lambda tx: dependencies.remove(tx, project, owner, "python", "REQUESTS"))

    assert removed.run is not None
    assert [d.name for d in db.transaction(lambda tx: dependencies.list_set(tx, project), write=False)] == [
        "rich"
    ]
    assert "requests" not in _install_task_command(db, project)
    with pytest.raises(NotFound):
        db.transaction(lambda tx: dependencies.remove(tx, project, owner, "node", "axios"))


BAD_SPECS = [
    ("python", "requests @ https://example.invalid/r.whl"),
    ("python", "--index-url=https://example.invalid"),
    ("python", "requests; rm -rf /"),
    ("node", "Axios"),
    ("node", "../evil"),
    ("node", "axios@$(id)"),
    ("ruby", "rails"),
]


def test_bad_specs_are_refused_and_write_nothing(harness: Any) -> None:
    db = harness.db
    project, owner = _owner(db)
    runs_before, tasks_before = count(db, "runs"), count(db, "tasks")

    for kind, spec in BAD_SPECS:
        with pytest.raises(ValidationFailed):
            db.transaction(lambda tx, k=kind, s=spec: dependencies.add(tx, project, owner, k, s))

    assert count(db, "project_dependencies") == 0
    assert (count(db, "runs"), count(db, "tasks")) == (runs_before, tasks_before)
    assert (
        db.transaction(lambda tx: task_store.get_task_by_name(tx, project.id, INSTALL_TASK), write=False)
        is None
    )
