"""Cron admission (docs/design.md "Cron"): a persisted cursor per task, explicit misfire policy,
idempotent runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Final

from ql3.application import tasks
from ql3.application.cancellation import request_cancel
from ql3.application.parking import ItemGuard, Parked, guarded
from ql3.application.runs import CreateRun, create_run
from ql3.application.schedules import cron_key
from ql3.domain.errors import ValidationFailed
from ql3.domain.model import Task
from ql3.domain.tasks import next_fire_ms
from ql3.ports.storage import Database, Transaction
from ql3.repositories import tasks as task_store

HARD_PAGE: Final = 256
MAX_GRACE_MS: Final = 5 * 60 * 1000
MAX_ACTIVE_SCAN: Final = 64


@dataclass(slots=True)
class ScheduleReport:
    admitted: int = 0
    skipped_overlap: int = 0
    skipped_misfire: int = 0
    raced: int = 0
    parked: int = 0
    decisions: list[str] = field(default_factory=list)


class CronScheduler:
    """``schedule_once()`` handles one bounded page of due schedules; it never creates timers."""

    def __init__(
        self, db: Database, *, page: int = 16, grace_ms: int = MAX_GRACE_MS, guard: ItemGuard | None = None
    ) -> None:
        if not 1 <= page <= HARD_PAGE:
            raise ValidationFailed(f"cron page must be 1-{HARD_PAGE}", field="page")
        if not 0 <= grace_ms <= MAX_GRACE_MS:
            raise ValidationFailed("cron grace must be 0-5 min", field="grace_ms")
        self._db = db
        self._page = page
        self._grace_ms = grace_ms
        self._guard = guard

    def schedule_once(self) -> ScheduleReport:
        report = ScheduleReport()
        due = self._db.transaction(
            lambda tx: task_store.due_schedule_task_ids(tx, now_ms=tx.now_ms(), limit=self._page), write=False
        )
        for task_id in due:
            # A schedule that fails for a reason other than an outage is parked (it leaves the due
            # page until its retry time); the other schedules are decided in this same cycle.
            handled = guarded(
                self._guard,
                "schedule",
                task_id,
                partial(self._db.transaction, partial(self._decide, task_id=task_id)),
            )
            decision = "parked" if isinstance(handled, Parked) else handled
            report.decisions.append(decision)
            if decision == "admitted":
                report.admitted += 1
            elif decision == "skipped_overlap":
                report.skipped_overlap += 1
            elif decision == "skipped_misfire":
                report.skipped_misfire += 1
            elif decision == "parked":
                report.parked += 1
            else:
                report.raced += 1
        return report

    def _decide(self, tx: Transaction, task_id: str) -> str:
        """One atomic decision: re-read everything, then run + cursor move commit together."""
        sched = task_store.lock_schedule(tx, task_id)
        now = tx.now_ms()
        if sched is None or sched.next_fire_at_ms is None or sched.next_fire_at_ms > now:
            return "raced"
        task = task_store.get_live_task(tx, task_id)
        if task is None or not task.enabled:
            task_store.delete_schedule(tx, task_id)
            return "raced"
        if task.revision != sched.task_revision:
            return "raced"
        fire_at = sched.next_fire_at_ms
        view = tasks.view(tx, task)
        on_time = now - fire_at <= self._grace_ms
        admit = on_time or view.spec.misfire == "fire_once"
        decision = "skipped_misfire"
        if admit:
            decision = self._admit(tx, task, view, fire_at)
        # Jump past now: missed occurrences beyond the one admitted are never replayed.
        next_fire_at = next_fire_ms(sched.cron_expr, max(now, fire_at))
        task_store.advance_schedule(tx, sched, next_fire_at_ms=next_fire_at, last_scheduled_at_ms=fire_at)
        return decision

    def _admit(self, tx: Transaction, task: Task, view: tasks.TaskView, fire_at: int) -> str:
        if view.spec.overlap == "skip" and task_store.active_run_ids(tx, task.id, limit=1):
            return "skipped_overlap"
        if view.spec.overlap == "cancel_previous":
            # The previous copies get a durable stop intent (reason "policy") in this same transaction.
            for run_id in task_store.active_run_ids(tx, task.id, limit=MAX_ACTIVE_SCAN):
                request_cancel(tx, task.project_id, run_id, reason="policy", actor_type="scheduler")
        create_run(
            tx,
            CreateRun(
                project_id=task.project_id,
                task=task,
                trigger_type="cron",
                trigger_id=task.id,
                idempotency_key=cron_key(task.id, task.revision, fire_at),
                scheduled_for_ms=fire_at,
                actor_type="scheduler",
            ),
        )
        return "admitted"
