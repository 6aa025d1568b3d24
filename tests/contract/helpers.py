"""Small builders shared by the contract tests."""

from __future__ import annotations

from typing import Any

from ql3.application import auth, runs, tasks
from ql3.domain.model import Project, Run, Task


def seed_project(db: Any, name: str = "default") -> Project:
    def fn(tx: Any) -> Project:
        token = auth.bootstrap_owner(tx)
        if token is not None and name == "default":
            return token.project
        try:
            return auth.resolve_project(tx, name)
        except Exception:
            return auth.create_project(tx, name)

    result: Project = db.transaction(fn)
    return result


def seed_task(db: Any, project: Project, name: str = "job", **spec: Any) -> Task:
    raw = {"command": "echo hello", **spec}
    task: Task = db.transaction(lambda tx: tasks.create_task(tx, project.id, name, raw)).task
    return task


def start_run(db: Any, project: Project, task: Task, key: str | None = None) -> tuple[Run, bool]:
    result: tuple[Run, bool] = db.transaction(
        lambda tx: runs.create_run(tx, runs.CreateRun(project_id=project.id, task=task, idempotency_key=key))
    )
    return result


def count(db: Any, table: str) -> int:
    assert table.isidentifier()
    return int(db.raw(f"SELECT count(*) AS n FROM {table}")[0]["n"])
