"""Row -> record mapping for the named queries' result columns, for the modules that still run
queries themselves; a repository maps the rows it reads (tasks: ``repositories/tasks.py``,
projects: ``repositories/projects.py``)."""

from __future__ import annotations

import json

from ql3.domain.model import Attempt, Run, RunEvent
from ql3.ports.storage import Row


def run(row: Row) -> Run:
    return Run(
        id=row["id"],
        project_id=row["project_id"],
        task_id=row["task_id"],
        task_revision=int(row["task_revision"]),
        trigger_type=row["trigger_type"],
        status=row["status"],
        version=int(row["version"]),
        event_sequence=int(row["event_sequence"]),
        priority=int(row["priority"]),
        idempotency_key=row["idempotency_key"],
        created_at_ms=int(row["created_at_ms"]),
        queued_at_ms=row["queued_at_ms"],
        started_at_ms=row["started_at_ms"],
        finished_at_ms=row["finished_at_ms"],
        cancel_requested_at_ms=row["cancel_requested_at_ms"],
        cancel_reason=row["cancel_reason"],
        error_code=row["error_code"],
        exit_code=row["exit_code"],
        scheduled_for_ms=row["scheduled_for_ms"],
        request_id=row["request_id"],
    )


def attempt(row: Row) -> Attempt:
    return Attempt(
        id=row["id"],
        run_id=row["run_id"],
        attempt=int(row["attempt"]),
        status=row["status"],
        executor_type=row["executor_type"],
        worker_id=row["worker_id"],
        pid=row["pid"],
        executor_handle=row["executor_handle"],
        log_artifact_id=row["log_artifact_id"],
        deadline_at_ms=row["deadline_at_ms"],
        callback_token_hash=row["callback_token_hash"],
        callback_sequence=int(row["callback_sequence"]),
        created_at_ms=int(row["created_at_ms"]),
        started_at_ms=row["started_at_ms"],
        finished_at_ms=row["finished_at_ms"],
        exit_code=row["exit_code"],
        error_code=row["error_code"],
    )


def event(row: Row) -> RunEvent:
    return RunEvent(
        id=row["id"],
        run_id=row["run_id"],
        sequence=int(row["sequence"]),
        type=row["type"],
        actor_type=row["actor_type"],
        actor_id=row["actor_id"],
        attempt_id=row["attempt_id"],
        payload=json.loads(row["payload_json"]),
        created_at_ms=int(row["created_at_ms"]),
    )
