"""Tasks, their immutable revisions and their cron cursors (``task_schedules``).

The use cases in ``application/tasks.py``, ``task_revisions.py``, ``schedules.py`` and ``cron.py``
reach these tables only through the functions here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ql3.domain.auth import ROLES, Role
from ql3.domain.model import Project, Task, TaskRevision, TaskSchedule
from ql3.ports.storage import Row, Transaction
from ql3.repositories.mapping import one_of, opt_int

# -- tasks --------------------------------------------------------------------------------------


def task_from_row(row: Row) -> Task:
    return Task(
        id=row["id"],
        project_id=row["project_id"],
        name=row["name"],
        enabled=bool(row["enabled"]),
        revision=int(row["revision"]),
        created_at_ms=int(row["created_at_ms"]),
        updated_at_ms=int(row["updated_at_ms"]),
    )


def get_task(tx: Transaction, project_id: str, task_id: str) -> Task | None:
    """The live (not deleted) task with this id in the project."""
    row = tx.one("task_get_by_id", {"project_id": project_id, "ref": task_id})
    return None if row is None else task_from_row(row)


def get_task_by_name(tx: Transaction, project_id: str, name: str) -> Task | None:
    """The live task with this name in the project (names are unique among live tasks)."""
    row = tx.one("task_get_by_name", {"project_id": project_id, "ref": name})
    return None if row is None else task_from_row(row)


def get_live_task(tx: Transaction, task_id: str) -> Task | None:
    """The task with this id in any project, or None when there is none or it is deleted."""
    row = tx.one("task_get_any", {"id": task_id})
    if row is None or row["deleted_at_ms"] is not None:
        return None
    return task_from_row(row)


def _like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _ascii_lower(text: str) -> str:
    # both dialects agree on lowering ASCII letters only (SQLite's LOWER leaves the rest alone)
    return "".join(c.lower() if c.isascii() else c for c in text)


def _search_params(search: str | None) -> dict[str, str | None]:
    if not search:
        return {"name_like": None, "id_like": None}
    return {
        "name_like": "%" + _like_escape(_ascii_lower(search)) + "%",
        "id_like": _like_escape(search.lower()) + "%",
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class ListedTask:
    """A task as a list shows it: with its current revision and its next fire time, read in one query."""

    task: Task
    revision: TaskRevision
    next_fire_at_ms: int | None


def _listed(row: Row) -> ListedTask:
    revision = TaskRevision(
        task_id=row["id"],
        revision=int(row["revision"]),
        spec=json.loads(row["spec_json"]),
        content_digest=row["content_digest"],
        created_at_ms=int(row["revision_created_at_ms"]),
    )
    return ListedTask(
        task=task_from_row(row), revision=revision, next_fire_at_ms=opt_int(row["next_fire_at_ms"])
    )


def list_tasks(
    tx: Transaction, *, project_id: str, after: str, limit: int, search: str | None = None
) -> list[ListedTask]:
    """Live tasks of the project by name, after ``after``; with ``search``, only those whose name
    contains it (ASCII letters compared without case) or whose id starts with it."""
    params = {"project_id": project_id, "after": after, "limit": limit, **_search_params(search)}
    return [_listed(row) for row in tx.all("task_list", params)]


def list_tasks_before(
    tx: Transaction, *, project_id: str, before: str, limit: int, search: str | None = None
) -> list[ListedTask]:
    """The ``limit`` live tasks just before the name ``before`` (same search as ``list_tasks``),
    in name order."""
    params = {"project_id": project_id, "before": before, "limit": limit, **_search_params(search)}
    return [_listed(row) for row in reversed(tx.all("task_list_before", params))]


@dataclass(frozen=True, slots=True, kw_only=True)
class NextFire:
    task_id: str
    task_name: str
    next_fire_at_ms: int


def list_next_fires(tx: Transaction, *, project_id: str, limit: int) -> list[NextFire]:
    """The enabled live tasks of the project that fire soonest, earliest first (at most ``limit``)."""
    found = tx.all("task_next_fires", {"project_id": project_id, "limit": limit})
    return [
        NextFire(task_id=r["id"], task_name=r["name"], next_fire_at_ms=int(r["next_fire_at_ms"]))
        for r in found
    ]


def insert_task(tx: Transaction, *, task_id: str, project_id: str, name: str, enabled: bool) -> bool:
    """A new task at revision 1; False when a live task of the project already has the name."""
    params = {"id": task_id, "project_id": project_id, "name": name, "enabled": int(enabled)}
    return tx.run("task_insert", {**params, "now": tx.now_ms()}) == 1


def update_task(tx: Transaction, current: Task, *, enabled: bool, revision: int) -> bool:
    """Compare-and-set on the revision and enabled flag the caller read; False when either moved."""
    count = tx.run(
        "task_update",
        {
            "id": current.id,
            "enabled": int(enabled),
            "revision": revision,
            "expected_revision": current.revision,
            "expected_enabled": int(current.enabled),
            "now": tx.now_ms(),
        },
    )
    return count == 1


def delete_task(tx: Transaction, task_id: str) -> None:
    """Soft delete: the row stays for the runs that pin its revisions."""
    tx.run("task_delete", {"id": task_id, "now": tx.now_ms()})


def tasks_with_active_runs(tx: Transaction, task_ids: list[str]) -> set[str]:
    """Which of the tasks have a run that has not ended (the overlap policy of a page, one statement)."""
    if not task_ids:
        return set()
    found = tx.all("task_active_page", {"task_ids": json.dumps(task_ids)})
    return {str(row["task_id"]) for row in found}


def active_run_ids(tx: Transaction, task_id: str, *, limit: int) -> list[str]:
    """Ids of the task's runs that have not ended, oldest first (for the cron overlap policy)."""
    return [str(row["id"]) for row in tx.all("task_active_runs", {"task_id": task_id, "limit": limit})]


# -- revisions ----------------------------------------------------------------------------------


def revision_from_row(row: Row) -> TaskRevision:
    spec: dict[str, Any] = json.loads(row["spec_json"])
    return TaskRevision(
        task_id=row["task_id"],
        revision=int(row["revision"]),
        spec=spec,
        content_digest=row["content_digest"],
        created_at_ms=int(row["created_at_ms"]),
    )


def get_revision(tx: Transaction, task_id: str, revision: int) -> TaskRevision | None:
    row = tx.one("task_revision_get", {"task_id": task_id, "revision": revision})
    return None if row is None else revision_from_row(row)


def list_revisions(tx: Transaction, task_id: str, *, limit: int) -> list[TaskRevision]:
    """Newest first."""
    found = tx.all("task_revision_list", {"task_id": task_id, "limit": limit})
    return [revision_from_row(row) for row in found]


def insert_revision(
    tx: Transaction, *, task_id: str, revision: int, spec: Mapping[str, Any], content_digest: str
) -> None:
    """Store one immutable revision; ``spec`` is stored as compact JSON."""
    tx.run(
        "task_revision_insert",
        {
            "task_id": task_id,
            "revision": revision,
            "spec_json": json.dumps(spec, separators=(",", ":")),
            "content_digest": content_digest,
            "now": tx.now_ms(),
        },
    )


# -- schedules (the cron cursor of a task) ------------------------------------------------------


def schedule_from_row(row: Row) -> TaskSchedule:
    return TaskSchedule(
        task_id=row["task_id"],
        project_id=row["project_id"],
        task_revision=int(row["task_revision"]),
        cron_expr=str(row["cron_expr"]),
        next_fire_at_ms=opt_int(row["next_fire_at_ms"]),
        last_scheduled_at_ms=opt_int(row["last_scheduled_at_ms"]),
        state_version=int(row["state_version"]),
        updated_at_ms=int(row["updated_at_ms"]),
        next_occurrence_ms=opt_int(row["next_occurrence_ms"]),
    )


def get_schedule(tx: Transaction, task_id: str) -> TaskSchedule | None:
    row = tx.one("schedule_get", {"task_id": task_id})
    return None if row is None else schedule_from_row(row)


def lock_schedule(tx: Transaction, task_id: str) -> TaskSchedule | None:
    """The schedule read under the row lock the scheduler's decision holds until it commits."""
    row = tx.one("schedule_lock", {"task_id": task_id})
    return None if row is None else schedule_from_row(row)


def write_schedule(
    tx: Transaction,
    *,
    task_id: str,
    project_id: str,
    task_revision: int,
    cron_expr: str,
    next_occurrence_ms: int,
    next_fire_at_ms: int | None,
    last_scheduled_at_ms: int | None = None,
) -> None:
    """Create or move the task's cron cursor: the occurrence it waits for and when that is due (None:
    paused while the task is disabled). ``last_scheduled_at_ms`` None keeps the stored one."""
    tx.run(
        "schedule_write",
        {
            "task_id": task_id,
            "project_id": project_id,
            "task_revision": task_revision,
            "cron_expr": cron_expr,
            "next_fire_at_ms": next_fire_at_ms,
            "next_occurrence_ms": next_occurrence_ms,
            "last_scheduled_at_ms": last_scheduled_at_ms,
            "now": tx.now_ms(),
        },
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class CursorMove:
    """One cursor's new position, written with the others of its page by ``move_schedules``."""

    task_id: str
    task_revision: int
    next_occurrence_ms: int
    next_fire_at_ms: int
    last_scheduled_at_ms: int


def move_schedules(tx: Transaction, moves: list[CursorMove]) -> int:
    """Move a page of cursors (their rows held by this transaction) in one statement."""
    if not moves:
        return 0
    body = json.dumps(
        [
            {
                "task_id": m.task_id,
                "task_revision": m.task_revision,
                "next_occurrence_ms": m.next_occurrence_ms,
                "next_fire_at_ms": m.next_fire_at_ms,
                "last_scheduled_at_ms": m.last_scheduled_at_ms,
            }
            for m in moves
        ]
    )
    return tx.run("schedule_move_page", {"moves": body, "now": tx.now_ms()})


@dataclass(frozen=True, slots=True, kw_only=True)
class DueSchedule:
    """A due cursor read (and row-locked on PostgreSQL) with its task and the current revision's spec."""

    schedule: TaskSchedule
    task: Task | None  # None when the task is deleted
    spec: dict[str, Any] | None


def lock_due_page(tx: Transaction, *, now_ms: int, limit: int) -> list[DueSchedule]:
    """A page of due schedules, earliest first, each with its task row and current spec, in one read;
    on PostgreSQL the schedule rows stay locked until the transaction ends and rows another admitter
    holds are skipped."""
    out: list[DueSchedule] = []
    for row in tx.all("schedule_lock_due_page", {"now": now_ms, "limit": limit}):
        task = None
        if row["t__deleted_at_ms"] is None:
            task = Task(
                id=row["task_id"],
                project_id=row["t__project_id"],
                name=row["t__name"],
                enabled=bool(row["t__enabled"]),
                revision=int(row["t__revision"]),
                created_at_ms=int(row["t__created_at_ms"]),
                updated_at_ms=int(row["t__updated_at_ms"]),
            )
        spec = None if row["r__spec_json"] is None else json.loads(row["r__spec_json"])
        out.append(DueSchedule(schedule=schedule_from_row(row), task=task, spec=spec))
    return out


# -- skipped cron occurrences -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class CronSkip:
    """Occurrences of a task that did not become runs: one, or a range skipped together for one reason."""

    task_id: str
    project_id: str
    task_revision: int
    occurrence_ms: int
    last_occurrence_ms: int
    occurrences: int
    reason: str
    created_at_ms: int


def _skip_from_row(row: Row) -> CronSkip:
    return CronSkip(
        task_id=row["task_id"],
        project_id=row["project_id"],
        task_revision=int(row["task_revision"]),
        occurrence_ms=int(row["occurrence_ms"]),
        last_occurrence_ms=int(row["last_occurrence_ms"]),
        occurrences=int(row["occurrences"]),
        reason=str(row["reason"]),
        created_at_ms=int(row["created_at_ms"]),
    )


def last_skip(tx: Transaction, task_id: str) -> CronSkip | None:
    row = tx.one("cron_skip_last", {"task_id": task_id})
    return None if row is None else _skip_from_row(row)


def insert_skip(tx: Transaction, skip: CronSkip) -> None:
    params = {
        "task_id": skip.task_id,
        "occurrence_ms": skip.occurrence_ms,
        "project_id": skip.project_id,
        "task_revision": skip.task_revision,
        "last_occurrence_ms": skip.last_occurrence_ms,
        "occurrences": skip.occurrences,
        "reason": skip.reason,
        "now": skip.created_at_ms,
    }
    tx.run("cron_skip_insert", params)


def extend_skip(
    tx: Transaction, last: CronSkip, *, last_occurrence_ms: int, occurrences: int, task_revision: int
) -> None:
    params = {
        "task_id": last.task_id,
        "occurrence_ms": last.occurrence_ms,
        "last_occurrence_ms": last_occurrence_ms,
        "occurrences": occurrences,
        "task_revision": task_revision,
        "now": tx.now_ms(),
    }
    tx.run("cron_skip_extend", params)


def trim_skips(tx: Transaction, task_id: str, *, keep: int) -> None:
    tx.run("cron_skip_trim", {"task_id": task_id, "keep": keep})


def list_skips(tx: Transaction, task_id: str, *, before_ms: int, limit: int) -> list[CronSkip]:
    """Newest first."""
    found = tx.all("cron_skip_list", {"task_id": task_id, "before": before_ms, "limit": limit})
    return [_skip_from_row(row) for row in found]


def skip_totals(tx: Transaction) -> dict[str, int]:
    """Skipped occurrences recorded, by reason."""
    return {str(row["reason"]): int(row["occurrences"]) for row in tx.all("cron_skip_totals")}


def on_start_task_ids(tx: Transaction, *, after: str, limit: int) -> list[str]:
    """Live enabled tasks whose current revision asks for a run at each server start, by id."""
    # The spec is stored as compact JSON (insert_revision): the flag reads exactly so, and a string
    # value cannot fake it (its quotes would be escaped).
    params = {"after": after, "limit": limit, "pattern": '%"on_start":true%'}
    return [str(row["id"]) for row in tx.all("cron_on_start_tasks", params)]


def begin_start_epoch(tx: Transaction) -> int:
    """Record a server start; the epoch it belongs to (unchanged after a crash, new after a clean stop)."""
    tx.run("start_epoch_begin", {"now": tx.now_ms()})
    row = tx.one("start_epoch_get")
    assert row is not None  # written just now
    return int(row["epoch"])


def stop_start_epoch(tx: Transaction) -> None:
    """Record a clean server stop."""
    tx.run("start_epoch_stop", {"now": tx.now_ms()})


def late_cron_runs(tx: Transaction, *, after: tuple[int, str], through_ms: int, limit: int) -> list[Row]:
    """Cron runs still queued created after the ``(created_at_ms, id)`` cursor up to ``through_ms``."""
    params = {"after_ms": after[0], "after_id": after[1], "through_ms": through_ms, "limit": limit}
    return tx.all("cron_late_runs", params)


def delete_schedule(tx: Transaction, task_id: str) -> None:
    tx.run("schedule_delete", {"task_id": task_id})


def earliest_fire_at(tx: Transaction) -> int | None:
    """The next due time over all schedules (one index lookup)."""
    row = tx.one("schedule_earliest")
    return None if row is None else opt_int(row["next_fire_at_ms"])


# -- the API's run creation ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class RunCreateTarget:
    """What the API's run creation reads before it writes (``run_create_target``): the project, the
    caller's role binding there, the live task and its current revision, each None when missing."""

    project: Project
    role: Role | None
    task: Task | None
    revision: TaskRevision | None


def get_run_create_target(
    tx: Transaction, *, principal_id: str, project_ref: str, task_ref: str, task_id: str | None
) -> RunCreateTarget | None:
    """One read for ``project_get``, ``binding_get``, the task by id (``task_id``, None when the ref
    is no id) or else by name, and ``task_revision_get``; None when there is no such project."""
    row = tx.one(
        "run_create_target",
        {"principal_id": principal_id, "project": project_ref, "task": task_ref, "task_id": task_id},
    )
    if row is None:
        return None
    project = Project(
        id=row["project_id"],
        name=row["project_name"],
        version=int(row["project_version"]),
        created_at_ms=row["project_created_at_ms"],
    )
    task = None
    if row["task_id"] is not None:
        task = Task(
            id=row["task_id"],
            project_id=project.id,
            name=row["task_name"],
            enabled=bool(row["task_enabled"]),
            revision=int(row["task_revision"]),
            created_at_ms=int(row["task_created_at_ms"]),
            updated_at_ms=int(row["task_updated_at_ms"]),
        )
    revision = None
    if task is not None and row["revision"] is not None:
        revision = TaskRevision(
            task_id=task.id,
            revision=int(row["revision"]),
            spec=json.loads(row["spec_json"]),
            content_digest=row["content_digest"],
            created_at_ms=int(row["revision_created_at_ms"]),
        )
    role = None if row["role"] is None else one_of(row["role"], ROLES, "role_bindings.role")
    return RunCreateTarget(project=project, role=role, task=task, revision=revision)
