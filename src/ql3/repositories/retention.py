"""Retention policies and the pruner's pages (application/retention.py): the candidates a policy lets
go, and the deletes of a page of runs with every row that refers to them, children first. A page of
ids travels to the database as one JSON array."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Final

from ql3.domain.retention import RetentionPolicy
from ql3.ports.storage import Row, Transaction

# Rows of a run besides its leases (deleted by attempt id first), children before parents.
_CHILD_DELETES: Final = (
    "retention_delete_cancellation_audit",
    "retention_delete_cancellation_dispatches",
    "retention_delete_run_retry_policies",
    "retention_delete_run_events",
    "retention_delete_run_attempts",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyWithCursor:
    """A policy and how far its log capping got: the last attempt capped, by (finished_at_ms, id)."""

    policy: RetentionPolicy
    log_cursor_ms: int
    log_cursor_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RunPosition:
    created_at_ms: int
    id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class FinishedAttempt:
    id: str
    finished_at_ms: int


def _policy(row: Row) -> RetentionPolicy:
    return RetentionPolicy(
        project_id=row["project_id"],
        keep_days=row["keep_days"],
        runs_per_task=row["runs_per_task"],
        log_bytes_per_run=row["log_bytes_per_run"],
        version=int(row["version"]),
        updated_at_ms=int(row["updated_at_ms"]),
    )


def _ids(values: list[str]) -> str:
    return json.dumps(values)


# -- policies ------------------------------------------------------------------------------------------


def get_policy(tx: Transaction, project_id: str) -> RetentionPolicy | None:
    row = tx.one("retention_get", {"project_id": project_id})
    return _policy(row) if row else None


def upsert_policy(
    tx: Transaction,
    *,
    project_id: str,
    keep_days: int | None,
    runs_per_task: int | None,
    log_bytes_per_run: int | None,
    now: int,
) -> None:
    """Create the project's policy, or replace its limits and bump its version."""
    params = {
        "project_id": project_id,
        "keep_days": keep_days,
        "runs_per_task": runs_per_task,
        "log_bytes_per_run": log_bytes_per_run,
        "now": now,
    }
    tx.run("retention_upsert", params)


def list_policies(tx: Transaction, *, after: str, limit: int) -> list[PolicyWithCursor]:
    """Policies by project id after ``after``, at most ``limit``."""
    return [
        PolicyWithCursor(
            policy=_policy(r), log_cursor_ms=int(r["log_cursor_ms"]), log_cursor_id=str(r["log_cursor_id"])
        )
        for r in tx.all("retention_policy_page", {"after": after, "limit": limit})
    ]


def update_log_cursor(tx: Transaction, *, project_id: str, cursor_ms: int, cursor_id: str) -> None:
    params = {"project_id": project_id, "cursor_ms": cursor_ms, "cursor_id": cursor_id}
    tx.run("retention_log_cursor", params)


# -- candidates ------------------------------------------------------------------------------------------


def list_old_run_ids(tx: Transaction, *, project_id: str, before_ms: int, limit: int) -> list[str]:
    """Terminal runs of the project created before ``before_ms`` that no approved action's receipt
    refers to, oldest first."""
    params = {"project_id": project_id, "before_ms": before_ms, "limit": limit}
    return [str(r["id"]) for r in tx.all("retention_old_runs", params)]


def list_task_ids(tx: Transaction, *, project_id: str, after: str, limit: int) -> list[str]:
    params = {"project_id": project_id, "after": after, "limit": limit}
    return [str(r["id"]) for r in tx.all("retention_task_page", params)]


def get_task_boundary(tx: Transaction, *, task_id: str, keep: int) -> RunPosition | None:
    """The newest run of the task beyond the ``keep`` newest (None: the task has at most ``keep``)."""
    row = tx.one("retention_task_boundary", {"task_id": task_id, "keep": keep})
    return None if row is None else RunPosition(created_at_ms=int(row["created_at_ms"]), id=str(row["id"]))


def list_task_run_ids_up_to(tx: Transaction, *, task_id: str, boundary: RunPosition, limit: int) -> list[str]:
    """Terminal runs of the task up to and including ``boundary`` that no receipt refers to, oldest first."""
    params = {
        "task_id": task_id,
        "before_ms": boundary.created_at_ms,
        "before_id": boundary.id,
        "limit": limit,
    }
    return [str(r["id"]) for r in tx.all("retention_task_runs_before", params)]


def list_finished_attempts(
    tx: Transaction, *, project_id: str, after_ms: int, after_id: str, limit: int
) -> list[FinishedAttempt]:
    """Finished attempts of the project after the ``(after_ms, after_id)`` cursor, in that order."""
    params = {"project_id": project_id, "after_ms": after_ms, "after_id": after_id, "limit": limit}
    return [
        FinishedAttempt(id=str(r["id"]), finished_at_ms=int(r["finished_at_ms"]))
        for r in tx.all("retention_finished_attempts", params)
    ]


def list_attempt_ids(tx: Transaction, run_ids: list[str]) -> list[str]:
    """The attempts of the runs (at most 10,000)."""
    return [str(r["id"]) for r in tx.all("retention_attempt_ids", {"ids": _ids(run_ids)})]


# -- deletes -----------------------------------------------------------------------------------------------


def delete_log_chunks(tx: Transaction, attempt_ids: list[str], *, limit: int) -> int:
    """At most ``limit`` shipped log chunks of the attempts; the number deleted."""
    return tx.run("retention_delete_log_chunks", {"attempt_ids": _ids(attempt_ids), "limit": limit})


def delete_runs(tx: Transaction, run_ids: list[str], attempt_ids: list[str]) -> int:
    """The runs' shipped log heads, leases, audit, dispatch, retry, event and attempt rows, then the
    terminal runs themselves; the number of runs deleted."""
    attempts = _ids(attempt_ids)
    ids = _ids(run_ids)
    tx.run("retention_delete_attempt_logs", {"attempt_ids": attempts})
    tx.run("retention_delete_run_leases", {"attempt_ids": attempts})
    for query in _CHILD_DELETES:
        tx.run(query, {"ids": ids})
    return tx.run("retention_delete_runs", {"ids": ids})


def delete_outbox_page(tx: Transaction, *, before_ms: int, limit: int) -> int:
    """At most ``limit`` delivered or dead notifications last updated before ``before_ms``."""
    return tx.run("retention_outbox_prune", {"before_ms": before_ms, "limit": limit})


def delete_cron_skips_page(tx: Transaction, *, project_id: str, before_ms: int, limit: int) -> int:
    """At most ``limit`` of the project's skipped-occurrence records written before ``before_ms``."""
    return tx.run(
        "retention_cron_skips_prune", {"project_id": project_id, "before_ms": before_ms, "limit": limit}
    )
