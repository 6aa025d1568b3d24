"""The cron cursor of each task and the decision of its due occurrences (docs/cron.md).

Admission is keyed by the occurrence, not by the revision: the cursor holds the next occurrence of the
task's expression (``next_occurrence_ms``) and the instant it is due (``next_fire_at_ms``: the
occurrence plus its random delay). Every occurrence whose due time has come is decided exactly once,
in the transaction that moves the cursor past it: admitted as a run (idempotency key
``ql3:cron:v2:<task>:<occurrence_ms>``) or recorded as a skipped occurrence with its reason. A task
change (edit, disable, delete) first decides the occurrences already due under the task as it was, in
the same transaction, so no edit around a boundary drops an occurrence.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Literal

from ql3.application.cancellation import request_cancel
from ql3.application.runs import CreateRun, create_queued_runs, create_run
from ql3.domain.errors import ValidationFailed
from ql3.domain.model import Task, TaskSchedule
from ql3.domain.tasks import TaskSpec, next_fire_ms, random_delay_ms
from ql3.ports import channels
from ql3.ports.storage import Transaction
from ql3.repositories import tasks as task_store
from ql3.repositories.tasks import CronSkip

if TYPE_CHECKING:
    from ql3.application.tasks import TaskView

log = logging.getLogger("ql3.cron")

SkipReason = Literal["overlap", "misfire", "disabled", "deleted"]
SKIP_REASONS: Final[tuple[SkipReason, ...]] = ("overlap", "misfire", "disabled", "deleted")
# Occurrences one decision walks: past it, the next decision goes on where this one stopped (a long
# outage of a minute schedule is recorded in steps of a week, each one bounded transaction).
MAX_STEPS: Final = 10_000
# Occurrences a disabled period is counted over when the task is enabled again (69 days of minutes).
MAX_DISABLED_STEPS: Final = 100_000
SKIPS_KEPT_PER_TASK: Final = 100
MAX_ACTIVE_SCAN: Final = 64


def cron_key(task_id: str, occurrence_ms: int) -> str:
    """The idempotency key of a cron run: one per task and occurrence, whatever the revision."""
    return f"ql3:cron:v2:{task_id}:{occurrence_ms}"


def start_key(task_id: str, start_epoch: int) -> str:
    """The idempotency key of an ``--on-start`` run: one per task and server start epoch."""
    return f"ql3:cron:v2:{task_id}:start:{start_epoch}"


def due_at(task_id: str, occurrence_ms: int, spec: TaskSpec) -> int:
    """When an occurrence is due: the occurrence plus its random delay (seeded, never re-rolled)."""
    return occurrence_ms + random_delay_ms(task_id, occurrence_ms, spec.random_delay_ms)


def cursor_occurrence(schedule: TaskSchedule) -> int | None:
    """The occurrence the cursor waits for (a row written before the occurrence column: its due time)."""
    return (
        schedule.next_occurrence_ms if schedule.next_occurrence_ms is not None else schedule.next_fire_at_ms
    )


@dataclass(slots=True)
class Decision:
    """What one decision did with a task's due occurrences."""

    admitted: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    more: bool = False  # stopped at MAX_STEPS with occurrences still due

    def skipped_total(self) -> int:
        return sum(self.skipped.values())


def _walk(expr: str, first: int, *, through_ms: int, limit: int) -> Iterator[int]:
    """Occurrences of ``expr`` from ``first`` (an occurrence) up to ``through_ms``, at most ``limit``."""
    occurrence = first
    for _ in range(limit):
        if occurrence > through_ms:
            return
        yield occurrence
        occurrence = next_fire_ms(expr, occurrence)


class _SkipWriter:
    """Records skips, merging consecutive occurrences skipped for the same reason into one row (and
    into the task's latest row when it ends at the occurrence just before), at most
    ``SKIPS_KEPT_PER_TASK`` rows a task."""

    def __init__(self, tx: Transaction, task: Task, previous_occurrence_ms: int | None) -> None:
        self._tx = tx
        self._task = task
        self._previous = previous_occurrence_ms
        self._open: CronSkip | None = None
        self._extends: CronSkip | None = None  # the stored row the open range continues
        self._loaded = False
        self._last_stored: CronSkip | None = None
        self.wrote = False

    def last_stored(self) -> CronSkip | None:
        if not self._loaded:
            self._last_stored = task_store.last_skip(self._tx, self._task.id)
            self._loaded = True
        return self._last_stored

    def continues_misfire(self) -> bool:
        """Whether the task's latest record is a misfire range ending at the occurrence before the
        cursor: the same outage, already walked in part by an earlier decision."""
        last = self.last_stored()
        return (
            last is not None
            and last.reason == "misfire"
            and self._previous is not None
            and last.last_occurrence_ms == self._previous
        )

    def decided(self, occurrence_ms: int, reason: SkipReason | None) -> None:
        """One occurrence decided: admitted (``reason`` None) or skipped for ``reason``."""
        if reason is None:
            self.flush()
        elif self._open is not None and self._open.reason == reason:
            self._open = _extended(self._open, occurrence_ms, 1)
        else:
            self.flush()
            last = self.last_stored() if self._previous is not None else None
            if last is not None and last.reason == reason and last.last_occurrence_ms == self._previous:
                self._extends = last
                self._open = _extended(last, occurrence_ms, 1)
            else:
                self._open = CronSkip(
                    task_id=self._task.id,
                    project_id=self._task.project_id,
                    task_revision=self._task.revision,
                    occurrence_ms=occurrence_ms,
                    last_occurrence_ms=occurrence_ms,
                    occurrences=1,
                    reason=reason,
                    created_at_ms=self._tx.now_ms(),
                )
        self._previous = occurrence_ms

    def range(self, reason: SkipReason, first_ms: int, last_ms: int, occurrences: int) -> None:
        """A range of consecutive occurrences skipped together (counted by the caller)."""
        self.decided(first_ms, reason)
        assert self._open is not None
        self._open = _extended(self._open, last_ms, occurrences - 1)
        self._previous = last_ms

    def flush(self) -> None:
        current, self._open = self._open, None
        if current is None:
            return
        extends, self._extends = self._extends, None
        if extends is not None:
            task_store.extend_skip(
                self._tx,
                extends,
                last_occurrence_ms=current.last_occurrence_ms,
                occurrences=current.occurrences - extends.occurrences,
                task_revision=self._task.revision,
            )
        else:
            task_store.insert_skip(self._tx, current)
            task_store.trim_skips(self._tx, self._task.id, keep=SKIPS_KEPT_PER_TASK)
        self._last_stored = current
        self._loaded = True
        self.wrote = True
        log.info(
            "cron occurrences skipped",
            extra={
                "action": "cron.occurrence_skipped",
                "task_id": self._task.id,
                "reason": current.reason,
                "occurrence_ms": current.occurrence_ms,
                "last_occurrence_ms": current.last_occurrence_ms,
                "occurrences": current.occurrences - (0 if extends is None else extends.occurrences),
            },
        )


def _extended(skip: CronSkip, last_ms: int, more: int) -> CronSkip:
    return CronSkip(
        task_id=skip.task_id,
        project_id=skip.project_id,
        task_revision=skip.task_revision,
        occurrence_ms=skip.occurrence_ms,
        last_occurrence_ms=last_ms,
        occurrences=skip.occurrences + more,
        reason=skip.reason,
        created_at_ms=skip.created_at_ms,
    )


Admission = Literal["admitted", "existing", "overlap"]


def admit(
    tx: Transaction, task: Task, spec: TaskSpec, occurrence_ms: int, *, key: str | None = None
) -> Admission:
    """One cron run for the occurrence, after the overlap policy: ``overlap`` when the policy skips
    it, ``existing`` when its idempotency key already has its run."""
    if spec.overlap == "skip" and task_store.active_run_ids(tx, task.id, limit=1):
        return "overlap"
    if spec.overlap == "cancel_previous":
        # The previous copies get a durable stop intent (reason "policy") in this same transaction.
        for run_id in task_store.active_run_ids(tx, task.id, limit=MAX_ACTIVE_SCAN):
            request_cancel(tx, task.project_id, run_id, reason="policy", actor_type="scheduler")
    _, created = create_run(
        tx,
        CreateRun(
            project_id=task.project_id,
            task=task,
            spec=spec,
            trigger_type="cron",
            trigger_id=task.id,
            idempotency_key=key if key is not None else cron_key(task.id, occurrence_ms),
            scheduled_for_ms=occurrence_ms,
            actor_type="scheduler",
        ),
    )
    return "admitted" if created else "existing"


def decide_due(
    tx: Transaction,
    schedule: TaskSchedule,
    task: Task,
    spec: TaskSpec,
    moves: list[task_store.CursorMove] | None = None,
) -> Decision:
    """Decide every occurrence of the cursor due by now (at most ``MAX_STEPS``) and move the cursor past
    them, in the caller's transaction (which holds the schedule row).

    Of the occurrences due at once, the newest, when it is within the task's misfire grace of its due
    time, is on time and admitted (subject to the overlap policy); the older ones were missed and are
    recorded as skipped ``misfire``, except that ``misfire: fire_once`` admits the oldest missed one
    (once per outage: not again when an earlier decision already walked part of the same outage).
    ``moves``: the cursor move is appended there, for the caller to write with its page's others.
    """
    decision = Decision()
    now = tx.now_ms()
    due, occurrence = _due(task.id, schedule, spec, now)
    if not due:
        return decision
    decision.more = due_at(task.id, occurrence, spec) <= now
    skips = _SkipWriter(tx, task, schedule.last_scheduled_at_ms)
    on_time = [c for c in due if now - due_at(task.id, c, spec) <= spec.misfire_grace_ms]
    chosen = {on_time[-1]} if on_time else set()
    missed = [c for c in due if c not in chosen]
    if missed and spec.misfire == "fire_once" and not skips.continues_misfire():
        chosen.add(missed[0])
    for candidate in due:
        reason: SkipReason | None = "misfire"
        if candidate in chosen:
            reason = "overlap" if admit(tx, task, spec, candidate) == "overlap" else None
        if reason is None:
            decision.admitted += 1
        else:
            decision.skipped[reason] = decision.skipped.get(reason, 0) + 1
        skips.decided(candidate, reason)
    skips.flush()
    if moves is None:
        _move(tx, schedule, task, spec, next_occurrence_ms=occurrence, last_scheduled_at_ms=due[-1])
    else:
        moves.append(
            task_store.CursorMove(
                task_id=task.id,
                task_revision=task.revision,
                next_occurrence_ms=occurrence,
                next_fire_at_ms=due_at(task.id, occurrence, spec),
                last_scheduled_at_ms=due[-1],
            )
        )
    return decision


def _due(task_id: str, schedule: TaskSchedule, spec: TaskSpec, now: int) -> tuple[list[int], int]:
    """The cursor's occurrences due by ``now`` (at most ``MAX_STEPS``) and the occurrence after them."""
    first = cursor_occurrence(schedule)
    if first is None:
        return [], 0
    due: list[int] = []
    occurrence = first
    while len(due) < MAX_STEPS and due_at(task_id, occurrence, spec) <= now:
        due.append(occurrence)
        occurrence = next_fire_ms(schedule.cron_expr, occurrence)
    return due, occurrence


def decide_page(
    tx: Transaction, items: list[tuple[TaskSchedule, Task, TaskSpec]], moves: list[task_store.CursorMove]
) -> list[Decision]:
    """``decide_due`` for a page of tasks (their schedule rows held by the caller's transaction), one
    decision a task in the page's order, each cursor move appended to ``moves``.

    The common case, a task with one occurrence due and on time whose overlap policy lets it run, is
    decided for the whole page at once: one statement reads which of the page's ``overlap: skip`` tasks
    still have a run going, and ``create_queued_runs`` writes every run in a constant number of
    statements. Every other task (several occurrences due, a late one, a running one under ``skip``,
    ``cancel_previous``, an occurrence whose run already exists) is decided alone by ``decide_due``,
    exactly as before: the outcome is the same either way, only the number of statements differs."""
    now = tx.now_ms()
    decisions: list[Decision | None] = [None] * len(items)
    batch: list[tuple[int, int, int]] = []  # (index, occurrence, next occurrence)
    for index, (schedule, task, spec) in enumerate(items):
        due, after = _due(task.id, schedule, spec, now)
        if not due:
            decisions[index] = Decision()
        elif (
            len(due) == 1
            and due_at(task.id, after, spec) > now
            and now - due_at(task.id, due[0], spec) <= spec.misfire_grace_ms
            and spec.overlap != "cancel_previous"
        ):
            batch.append((index, due[0], after))
    busy = task_store.tasks_with_active_runs(
        tx, [items[i][1].id for i, _, _ in batch if items[i][2].overlap == "skip"]
    )
    batch = [entry for entry in batch if items[entry[0]][1].id not in busy]
    created = create_queued_runs(
        tx,
        [
            CreateRun(
                project_id=items[i][1].project_id,
                task=items[i][1],
                spec=items[i][2],
                trigger_type="cron",
                trigger_id=items[i][1].id,
                idempotency_key=cron_key(items[i][1].id, occurrence),
                scheduled_for_ms=occurrence,
                actor_type="scheduler",
            )
            for i, occurrence, _ in batch
        ],
    )
    for (index, occurrence, after), new in zip(batch, created, strict=True):
        if not new:
            continue  # its key has a run already: decided alone below, as create_run answers it
        _, task, spec = items[index]
        decisions[index] = Decision(admitted=1)
        moves.append(
            task_store.CursorMove(
                task_id=task.id,
                task_revision=task.revision,
                next_occurrence_ms=after,
                next_fire_at_ms=due_at(task.id, after, spec),
                last_scheduled_at_ms=occurrence,
            )
        )
    out: list[Decision] = []
    for index, decision in enumerate(decisions):
        if decision is None:
            schedule, task, spec = items[index]
            decision = decide_due(tx, schedule, task, spec, moves)
        out.append(decision)
    return out


def _move(
    tx: Transaction,
    schedule: TaskSchedule,
    task: Task,
    spec: TaskSpec,
    *,
    next_occurrence_ms: int,
    last_scheduled_at_ms: int | None,
) -> None:
    task_store.write_schedule(
        tx,
        task_id=task.id,
        project_id=task.project_id,
        task_revision=task.revision,
        cron_expr=schedule.cron_expr,
        next_occurrence_ms=next_occurrence_ms,
        next_fire_at_ms=due_at(task.id, next_occurrence_ms, spec),
        last_scheduled_at_ms=last_scheduled_at_ms,
    )


def settle_due(tx: Transaction, view: TaskView) -> Decision:
    """Before a change to the task takes effect: decide its occurrences already due, under the task as
    it still is (an edit, a disable). Holds the schedule row from here to the commit."""
    schedule = task_store.lock_schedule(tx, view.task.id)
    if schedule is None or schedule.next_fire_at_ms is None or schedule.next_fire_at_ms > tx.now_ms():
        return Decision()
    decision = Decision(more=True)
    while decision.more:  # a long outage: every step recorded, each bounded
        step = decide_due(tx, schedule, view.task, view.spec)
        decision.admitted += step.admitted
        for reason, n in step.skipped.items():
            decision.skipped[reason] = decision.skipped.get(reason, 0) + n
        decision.more = step.more
        if step.more:
            refreshed = task_store.get_schedule(tx, view.task.id)
            assert refreshed is not None  # written by decide_due in this transaction
            schedule = refreshed
    return decision


def drop_due(tx: Transaction, task: Task, reason: SkipReason) -> None:
    """The task is deleted: its occurrences already due are recorded as skipped for ``reason``, then
    the cursor goes."""
    schedule = task_store.lock_schedule(tx, task.id)
    tx.notify(channels.SCHEDULES)
    if schedule is None:
        return
    first = cursor_occurrence(schedule)
    now = tx.now_ms()
    if schedule.next_fire_at_ms is not None and first is not None and schedule.next_fire_at_ms <= now:
        due = list(_walk(schedule.cron_expr, first, through_ms=now, limit=MAX_DISABLED_STEPS))
        if due:
            skips = _SkipWriter(tx, task, schedule.last_scheduled_at_ms)
            skips.range(reason, due[0], due[-1], len(due))
            skips.flush()
    task_store.delete_schedule(tx, task.id)


def sync_schedule(tx: Transaction, view: TaskView) -> None:
    """Keep the task's cursor in step with its current revision and enabled flag, after a change
    whose due occurrences ``settle_due`` decided.

    A new schedule starts at the change time (it never invents past occurrences); an edit that keeps
    the expression keeps the cursor's occurrence; a disabled task keeps a paused cursor, so that
    enabling it records the occurrences it missed meanwhile as skipped ``disabled``.
    """
    task, spec = view.task, view.spec
    tx.notify(channels.SCHEDULES)
    if spec.cron is None:  # the edit that removed the expression decided what was due (settle_due)
        task_store.delete_schedule(tx, task.id)
        return
    now = tx.now_ms()
    current = task_store.lock_schedule(tx, task.id)
    expr = spec.cron
    occurrence = next_fire_ms(expr, now)
    last_scheduled: int | None = None
    if current is not None and current.cron_expr == expr:
        kept = cursor_occurrence(current)
        if kept is not None:
            occurrence = kept
    paused = current is not None and current.next_fire_at_ms is None
    if current is not None and paused and (task.enabled or current.cron_expr != expr):
        # Enabled again (or rescheduled while disabled): the paused cursor's occurrences up to now
        # were missed while the task was disabled.
        first = cursor_occurrence(current)
        missed = (
            []
            if first is None
            else list(_walk(current.cron_expr, first, through_ms=now, limit=MAX_DISABLED_STEPS))
        )
        if missed:
            skips = _SkipWriter(tx, task, current.last_scheduled_at_ms)
            skips.range("disabled", missed[0], missed[-1], len(missed))
            skips.flush()
            last_scheduled = missed[-1]
        occurrence = next_fire_ms(expr, now)
    task_store.write_schedule(
        tx,
        task_id=task.id,
        project_id=task.project_id,
        task_revision=task.revision,
        cron_expr=expr,
        next_occurrence_ms=occurrence,
        next_fire_at_ms=due_at(task.id, occurrence, spec) if task.enabled else None,
        last_scheduled_at_ms=last_scheduled,
    )


def earliest_fire_at(tx: Transaction) -> int | None:
    """The next due time over all schedules (one index lookup), for the scheduler's idle wait."""
    return task_store.earliest_fire_at(tx)


def next_fire_at(tx: Transaction, task_id: str) -> int | None:
    """When the task's next occurrence is due (its random delay included); None when paused."""
    schedule = task_store.get_schedule(tx, task_id)
    return None if schedule is None else schedule.next_fire_at_ms


def next_occurrence_at(tx: Transaction, task_id: str) -> int | None:
    schedule = task_store.get_schedule(tx, task_id)
    return None if schedule is None or schedule.next_fire_at_ms is None else cursor_occurrence(schedule)


MAX_SKIP_PAGE: Final = 100


def skipped_view(skip: CronSkip) -> dict[str, object]:
    """A skipped-occurrence record as the API shows it (times and counts only)."""
    return {
        "occurrence_ms": skip.occurrence_ms,
        "last_occurrence_ms": skip.last_occurrence_ms,
        "occurrences": skip.occurrences,
        "reason": skip.reason,
        "task_revision": skip.task_revision,
        "recorded_at_ms": skip.created_at_ms,
    }


def list_skipped(
    tx: Transaction, task_id: str, *, before_ms: int | None = None, limit: int = 20
) -> list[CronSkip]:
    """The task's skipped occurrences, newest first (at most ``SKIPS_KEPT_PER_TASK`` are kept)."""
    if isinstance(limit, bool) or not 1 <= limit <= MAX_SKIP_PAGE:
        raise ValidationFailed("limit out of range", field="limit")
    before = before_ms if before_ms is not None else 2**62
    return task_store.list_skips(tx, task_id, before_ms=before, limit=limit)


def skipped_totals(tx: Transaction) -> dict[str, int]:
    """Skipped occurrences on record by reason, every reason present (zero when none), for /metrics."""
    found = task_store.skip_totals(tx)
    return {reason: found.get(reason, 0) for reason in SKIP_REASONS}
