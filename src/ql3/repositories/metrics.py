"""The monitoring read model: counts and timestamps across aggregates, for ``/metrics`` only
(application/metrics.py, application/outcome_metrics.py). Every read is an aggregate or a bounded page."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from ql3.ports.storage import Transaction

StatusFamily = Literal["runs", "workers", "cancellation_dispatches", "approved_actions"]

_BY_STATUS: Final[dict[StatusFamily, str]] = {
    "runs": "metrics_runs_by_status",
    "workers": "metrics_workers_by_status",
    "cancellation_dispatches": "metrics_cancellations_by_status",
    "approved_actions": "metrics_actions_by_status",
}
STATUS_FAMILIES: Final[tuple[StatusFamily, ...]] = tuple(_BY_STATUS)


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskFinishTimes:
    """The newest finish of a live task's runs, per outcome (None: no such run)."""

    project: str
    task: str
    last_success_ms: int | None
    last_failed_ms: int | None
    last_timed_out_ms: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class FinishedRun:
    id: str
    started_at_ms: int | None
    finished_at_ms: int


def _ms(value: Any) -> int | None:
    return None if value is None else int(value)


def count_by_status(tx: Transaction, family: StatusFamily) -> dict[str, int]:
    """``{status: rows}`` of one family (GROUP BY status: one row per status)."""
    return {str(r["status"]): int(r["n"]) for r in tx.all(_BY_STATUS[family])}


def count_outbox_by_status(tx: Transaction) -> dict[str, int]:
    """Notification outbox rows by delivery status."""
    return {str(r["status"]): int(r["n"]) for r in tx.all("notify_outbox_counts")}


def count_queued_runs(tx: Transaction) -> int:
    row = tx.one("metrics_queue_depth")
    return 0 if row is None else int(row["n"])


def list_task_finish_times(tx: Transaction, *, limit: int) -> list[TaskFinishTimes]:
    """Live tasks ordered by project and task name, at most ``limit``."""
    return [
        TaskFinishTimes(
            project=str(r["project"]),
            task=str(r["task"]),
            last_success_ms=_ms(r["last_success_ms"]),
            last_failed_ms=_ms(r["last_failed_ms"]),
            last_timed_out_ms=_ms(r["last_timed_out_ms"]),
        )
        for r in tx.all("metrics_task_outcomes", {"limit": limit})
    ]


def list_finished_since(
    tx: Transaction, *, after_ms: int, after_id: str, until_ms: int, limit: int
) -> list[FinishedRun]:
    """Terminal runs finished after the ``(after_ms, after_id)`` cursor and by ``until_ms``, in
    ``(finished_at_ms, id)`` order, at most ``limit``."""
    params = {"after_ms": after_ms, "after_id": after_id, "until_ms": until_ms, "limit": limit}
    return [
        FinishedRun(
            id=str(r["id"]), started_at_ms=_ms(r["started_at_ms"]), finished_at_ms=int(r["finished_at_ms"])
        )
        for r in tx.all("metrics_finished_since", params)
    ]


@dataclass(frozen=True, slots=True, kw_only=True)
class QueuedRevision:
    task_id: str
    task_revision: int
    queued: int


def count_queued_by_revision(tx: Transaction, *, limit: int) -> list[QueuedRevision]:
    """Queued runs per task revision, the revisions with the most queued runs first."""
    return [
        QueuedRevision(
            task_id=str(row["task_id"]), task_revision=int(row["task_revision"]), queued=int(row["n"])
        )
        for row in tx.all("metrics_queued_by_revision", {"limit": limit})
    ]
