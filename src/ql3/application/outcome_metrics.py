"""Metrics for alerting: per-task last success and last failure, queue depth, and run durations.

The only label is the task (``name`` in the default project, ``project/name`` elsewhere), bounded by
the number of live tasks. The duration histogram is cumulative from the first scrape of this process:
each scrape folds in the runs finished since the previous one (a bounded page), so pruning old runs
never makes a counter go backwards.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Final

from ql3.ports.storage import Transaction
from ql3.repositories import metrics as repo

MAX_TASKS: Final = 1000
PAGE: Final = 5000
# Commits can land slightly out of finish order: only fold in runs finished this long ago.
SETTLE_MS: Final = 2000
BUCKETS_S: Final = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 21600.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskOutcome:
    task: str
    last_success_ms: int | None
    last_failure_ms: int | None


def task_label(project: str, task: str) -> str:
    return task if project == "default" else f"{project}/{task}"


def task_outcomes(tx: Transaction, projects: frozenset[str] | None = None) -> list[TaskOutcome]:
    """Each live task's last success and failure; only the tasks of ``projects`` (names) when given."""
    out: list[TaskOutcome] = []
    for times in repo.list_task_finish_times(tx, limit=MAX_TASKS):
        if projects is not None and times.project not in projects:
            continue
        failures = [v for v in (times.last_failed_ms, times.last_timed_out_ms) if v is not None]
        out.append(
            TaskOutcome(
                task=task_label(times.project, times.task),
                last_success_ms=times.last_success_ms,
                last_failure_ms=max(failures) if failures else None,
            )
        )
    return out


def notifications_by_status(tx: Transaction) -> dict[str, int]:
    """Outbox rows by status (``dead`` ones never reached their channel)."""
    return repo.count_outbox_by_status(tx)


def queue_depth(tx: Transaction) -> int:
    return repo.count_queued_runs(tx)


@dataclass
class DurationHistogram:
    """Cumulative bucket counts of run durations (seconds), fed from a cursor over finished runs."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS_S) + 1))
    total: int = 0
    sum_s: float = 0.0
    cursor: tuple[int, str] | None = None
    settle_ms: int = SETTLE_MS
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def observe(self, seconds: float) -> None:
        index = next((i for i, le in enumerate(BUCKETS_S) if seconds <= le), len(BUCKETS_S))
        self.counts[index] += 1
        self.total += 1
        self.sum_s += seconds

    def cumulative(self) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        running = 0
        for le, n in zip((*[str(b) for b in BUCKETS_S], "+Inf"), self.counts, strict=True):
            running += n
            out.append((le, running))
        return out

    def refresh(self, tx: Transaction) -> None:
        """Fold in the runs finished since the cursor (one page); the first call only sets the cursor."""
        with self._lock:
            until = tx.now_ms() - self.settle_ms
            if self.cursor is None:
                self.cursor = (until, "")
                return
            finished = repo.list_finished_since(
                tx, after_ms=self.cursor[0], after_id=self.cursor[1], until_ms=until, limit=PAGE
            )
            for run in finished:
                if run.started_at_ms is not None:
                    self.observe(max(0, run.finished_at_ms - run.started_at_ms) / 1000)
            if finished:
                self.cursor = (finished[-1].finished_at_ms, finished[-1].id)
