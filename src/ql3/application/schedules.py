"""The cron cursor of each task, kept in step with task changes (written in the same transaction)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ql3.domain.tasks import next_fire_ms
from ql3.ports import channels
from ql3.ports.storage import Transaction
from ql3.repositories import tasks as task_store

if TYPE_CHECKING:
    from ql3.application.tasks import TaskView


def cron_key(task_id: str, revision: int, scheduled_for_ms: int) -> str:
    return f"ql3:cron:v1:{task_id}:{revision}:{scheduled_for_ms}"


def sync_schedule(tx: Transaction, view: TaskView) -> None:
    """Keep the task's schedule row in step with its current revision and enabled flag.

    A new or changed schedule starts at the change time: it never invents past occurrences.
    """
    task = view.task
    tx.notify(channels.SCHEDULES)
    if not task.enabled or view.spec.cron is None:
        task_store.delete_schedule(tx, task.id)
        return
    current = task_store.get_schedule(tx, task.id)
    if current is not None and current.task_revision == task.revision and current.next_fire_at_ms:
        return
    task_store.upsert_schedule(
        tx,
        task_id=task.id,
        project_id=task.project_id,
        task_revision=task.revision,
        cron_expr=view.spec.cron,
        next_fire_at_ms=next_fire_ms(view.spec.cron, tx.now_ms()),
    )


def earliest_fire_at(tx: Transaction) -> int | None:
    """The next due time over all schedules (one index lookup), for the scheduler's idle wait."""
    return task_store.earliest_fire_at(tx)


def next_fire_at(tx: Transaction, task_id: str) -> int | None:
    schedule = task_store.get_schedule(tx, task_id)
    return None if schedule is None else schedule.next_fire_at_ms
