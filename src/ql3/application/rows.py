"""Row -> record mapping for the named queries' result columns, for the modules that still run
queries themselves; a repository maps the rows it reads (tasks: ``repositories/tasks.py``,
projects: ``repositories/projects.py``, attempts: ``repositories/runs.py``)."""

from __future__ import annotations

import json

from ql3.domain.model import Run, RunEvent
from ql3.ports.storage import Row
from ql3.repositories.runs import attempt_from_row


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


# The attempt mapping lives in its repository; this name keeps the modules not yet migrated working.
attempt = attempt_from_row
