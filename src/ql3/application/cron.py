"""Cron admission (docs/cron.md): a persisted cursor per task keyed by occurrence, explicit misfire
policy and grace, idempotent runs, every skipped occurrence recorded, one write per page of due tasks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Final

from ql3.application import notifications
from ql3.application.parking import ItemGuard, is_transient
from ql3.application.schedules import Decision, admit, decide_due, decide_page, start_key
from ql3.domain.errors import NotFound, ValidationFailed
from ql3.domain.model import Task, TaskSchedule
from ql3.domain.tasks import TaskSpec, build_spec
from ql3.ports.storage import Database, Savepoints, Transaction
from ql3.repositories import tasks as task_store
from ql3.repositories.tasks import DueSchedule

HARD_PAGE: Final = 1024
ON_START_PAGE: Final = 256
LATE_PAGE: Final = 256
LATE_LOOKBACK_MS: Final = 60 * 60 * 1000  # how far back a new server looks for late cron runs


@dataclass(slots=True)
class ScheduleReport:
    admitted: int = 0
    skipped_overlap: int = 0
    skipped_misfire: int = 0
    raced: int = 0
    parked: int = 0
    decisions: list[str] = field(default_factory=list)
    more: bool = False  # a task stopped at its step bound with occurrences still due

    def add(self, decision: Decision) -> None:
        self.admitted += decision.admitted
        self.skipped_overlap += decision.skipped.get("overlap", 0)
        self.skipped_misfire += decision.skipped.get("misfire", 0)
        self.more = self.more or decision.more
        if decision.admitted:
            self.decisions.append("admitted")
        elif decision.skipped.get("overlap"):
            self.decisions.append("skipped_overlap")
        elif decision.skipped:
            self.decisions.append("skipped_misfire")
        else:
            self.raced += 1
            self.decisions.append("raced")


class CronScheduler:
    """``schedule_once()`` decides one bounded page of due schedules in one write transaction (each
    task in its own savepoint, so one bad task is parked and the others commit); it never creates
    timers."""

    def __init__(self, db: Database, *, page: int = 256, guard: ItemGuard | None = None) -> None:
        if not 1 <= page <= HARD_PAGE:
            raise ValidationFailed(f"cron page must be 1-{HARD_PAGE}", field="page")
        self._db = db
        self._page = page
        self._guard = guard

    def schedule_once(self) -> ScheduleReport:
        report = ScheduleReport()
        failed: list[tuple[str, Exception]] = []
        decided: list[str] = []

        def page(tx: Transaction, isolate: bool) -> list[Decision]:
            failed.clear()
            decided.clear()
            out: list[Decision] = []
            moves: list[task_store.CursorMove] = []
            items = task_store.lock_due_page(tx, now_ms=tx.now_ms(), limit=self._page)
            if not isolate:
                out = _decide_page(tx, items, moves)
                decided.extend(item.schedule.task_id for item in items)
                task_store.move_schedules(tx, moves)
                return out
            for item in items:
                task_id = item.schedule.task_id
                mine: list[task_store.CursorMove] = []  # queued only once the task's decision stands
                try:
                    out.append(_in_savepoint(tx, partial(_decide, item=item, moves=mine)))
                except Exception as exc:
                    if is_transient(exc):
                        raise
                    failed.append((task_id, exc))
                    continue
                moves.extend(mine)
                decided.append(task_id)
            task_store.move_schedules(tx, moves)
            return out

        try:
            # The fast path: the whole page in one transaction, no savepoint per task.
            decisions = self._db.transaction(partial(page, isolate=False))
        except Exception as exc:
            if self._guard is None or is_transient(exc):
                raise
            # One task failed and undid the page: again, each task in its own savepoint, so the bad
            # one is parked and the others commit (a failed task's cursor move is never queued).
            decisions = self._db.transaction(partial(page, isolate=True))
        for decision in decisions:
            report.add(decision)
        if self._guard is not None:
            for task_id, failure in failed:
                self._guard.park_failure("schedule", task_id, failure)
                report.parked += 1
                report.decisions.append("parked")
            for task_id in decided:
                self._guard.recovered("schedule", task_id)
        return report

    def notify_late(self, late_after_ms: int, watermark: tuple[int, str] | None) -> tuple[int, str]:
        """``cron_late`` notifications for cron runs still queued ``late_after_ms`` after they were
        admitted. Each run is looked at once, as its wait crosses the bound: the caller keeps the
        returned ``(created_at_ms, id)`` watermark (a new server looks an hour back; the outbox's
        outcome key dedupes a second look). Bounded: a page a call."""

        def unit(tx: Transaction, notify: bool) -> tuple[tuple[int, str], bool]:
            now = tx.now_ms()
            through = now - late_after_ms
            after = (through - LATE_LOOKBACK_MS, "") if watermark is None else watermark
            found = task_store.late_cron_runs(tx, after=after, through_ms=through, limit=LATE_PAGE)
            for row in found if notify else ():
                run_id, created = str(row["id"]), int(row["created_at_ms"])
                notifications.on_cron_late(
                    tx, run_id, str(row["project_id"]), str(row["task_id"]), now - created
                )
            if len(found) == LATE_PAGE:
                return (int(found[-1]["created_at_ms"]), str(found[-1]["id"])), True
            return max(after, (through, "\uffff")), bool(found)

        # A read first: an idle cycle (no late run) writes nothing.
        moved, any_late = self._db.transaction(partial(unit, notify=False), write=False)
        if any_late:
            moved, _ = self._db.transaction(partial(unit, notify=True))
        return moved

    def begin_start(self) -> int:
        """This server's start epoch (docs/cron.md): new after a clean stop, the same after a crash."""
        return int(self._db.transaction(task_store.begin_start_epoch))

    def clean_stop(self) -> None:
        """This server stops cleanly: the next start opens a new epoch (``--on-start`` fires again)."""
        self._db.transaction(task_store.stop_start_epoch)

    def fire_on_start(self, start_epoch: int) -> int:
        """One run per live enabled ``--on-start`` task for this server start epoch (idempotent: a
        second call, another replica or a restart after a crash in the same epoch creates none)."""
        created = 0
        after = ""
        while True:
            page = partial(task_store.on_start_task_ids, after=after, limit=ON_START_PAGE)
            ids = self._db.transaction(page, write=False)
            if not ids:
                return created
            created += self._db.transaction(
                partial(_fire_on_start_page, task_ids=ids, start_epoch=start_epoch)
            )
            after = ids[-1]


def _fire_on_start_page(tx: Transaction, task_ids: list[str], start_epoch: int) -> int:
    created = 0
    for task_id in task_ids:
        task = task_store.get_live_task(tx, task_id)
        if task is None or not task.enabled:
            continue
        revision = task_store.get_revision(tx, task.id, task.revision)
        if revision is None:
            continue
        spec = build_spec(revision.spec)
        key = start_key(task.id, start_epoch)
        if spec.on_start and admit(tx, task, spec, tx.now_ms(), key=key) == "admitted":
            created += 1
    return created


def _in_savepoint(tx: Transaction, fn: Callable[[Transaction], Decision]) -> Decision:
    return tx.savepoint(fn) if isinstance(tx, Savepoints) else fn(tx)


def _decide_page(
    tx: Transaction, items: list[DueSchedule], moves: list[task_store.CursorMove]
) -> list[Decision]:
    """A page at once (``decide_page``): a deleted task's schedule goes, a missing revision fails the
    page (decided again task by task, so that one task is parked)."""
    out: list[Decision | None] = []
    live: list[tuple[TaskSchedule, Task, TaskSpec]] = []
    for item in items:
        if item.task is None:
            task_store.delete_schedule(tx, item.schedule.task_id)
            out.append(Decision())
            continue
        if item.spec is None:
            raise NotFound("task revision not found")
        live.append((item.schedule, item.task, build_spec(item.spec)))
        out.append(None)
    decided = iter(decide_page(tx, live, moves))
    return [next(decided) if d is None else d for d in out]


def _decide(tx: Transaction, item: DueSchedule, moves: list[task_store.CursorMove]) -> Decision:
    """One task's due occurrences, with the cursor, task and spec read with the page."""
    task = item.task
    if task is None:  # deleted since the page was read: its schedule goes (delete_task records it)
        task_store.delete_schedule(tx, item.schedule.task_id)
        return Decision()
    if item.spec is None:
        raise NotFound("task revision not found")
    return decide_due(tx, item.schedule, task, build_spec(item.spec), moves)
