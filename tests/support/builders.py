"""Builders shared by the suite: a project, tasks, runs, a finished run history, and row counts."""

from __future__ import annotations

from typing import Any

from ql3.application import auth, runs, tasks
from ql3.domain.ids import new_id
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


def seed_history(
    db: Any, project: Any, task: Any, n: int, *, start_ms: int, step_ms: int, status: str = "succeeded"
) -> list[tuple[str, str]]:
    """``n`` finished runs of ``task`` (run, attempt, two events, a completed lease), oldest first."""
    out: list[tuple[str, str]] = []
    for i in range(n):
        run_id, attempt_id = new_id(), new_id()
        at = start_ms + i * step_ms
        db.raw(
            "INSERT INTO runs (id, project_id, task_id, task_revision, trigger_type, status, version,"
            " event_sequence, created_at_ms, queued_at_ms, started_at_ms, finished_at_ms, exit_code,"
            " updated_at_ms)"
            " VALUES (?, ?, ?, 1, 'cron', ?, 4, 2, ?, ?, ?, ?, 0, ?)",
            (run_id, project.id, task.id, status, at, at, at + 10, at + 20, at + 20),
        )
        db.raw(
            "INSERT INTO run_attempts (id, run_id, attempt, status, executor_type, worker_id, created_at_ms,"
            " started_at_ms, finished_at_ms, exit_code, callback_sequence)"
            " VALUES (?, ?, 1, ?, 'local_process', 'w1', ?, ?, ?, 0, 3)",
            (attempt_id, run_id, status, at, at + 10, at + 20),
        )
        for seq in (1, 2):
            db.raw(
                "INSERT INTO run_events (id, run_id, sequence, type, actor_type, payload_json, created_at_ms)"
                " VALUES (?, ?, ?, 'run.x', 'system', '{}', ?)",
                (new_id(), run_id, seq, at),
            )
        db.raw(
            "INSERT INTO run_leases (attempt_id, run_id, status, version, lease_generation, worker_id,"
            " worker_session_id, worker_generation, lease_token_digest, acquired_at_ms, renewed_at_ms,"
            " expires_at_ms, completed_at_ms, updated_at_ms)"
            " VALUES (?, ?, 'completed', 1, 1, 'w1', 's1', 1, ?, ?, ?, ?, ?, ?)",
            (attempt_id, run_id, "0" * 64, at, at, at + 30_000, at + 20, at + 20),
        )
        out.append((run_id, attempt_id))
    return out
