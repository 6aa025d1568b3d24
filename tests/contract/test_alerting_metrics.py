"""The alerting reads behind /metrics on both databases: last outcomes per task, queue depth, and the
duration histogram's cursor over finished runs."""

from __future__ import annotations

from typing import Any

from ql3.application import outcome_metrics, runs
from ql3.application.outcome_metrics import DurationHistogram
from tests.support.builders import seed_project, seed_task, start_run


def _finish(db: Any, project: Any, task: Any, to: str, duration_ms: int) -> int:
    run, _ = start_run(db, project, task)

    def unit(tx: Any) -> int:
        now = int(tx.now_ms())
        current = runs.transition(tx, run.id, run.version, "dispatching", actor_type="system")
        current = runs.transition(
            tx, current.id, current.version, "running", actor_type="system", started_at_ms=now - duration_ms
        )
        runs.transition(tx, current.id, current.version, to, actor_type="system", finished_at_ms=now)
        return now

    return int(db.transaction(unit))


def test_last_outcomes_queue_depth_and_durations(harness: Any) -> None:
    project = seed_project(harness.db)
    task = seed_task(harness.db, project, "backup")
    histogram = DurationHistogram(settle_ms=0)
    harness.db.transaction(histogram.refresh, write=False)
    harness.advance_clock(10)

    ok_at = _finish(harness.db, project, task, "succeeded", 2000)
    harness.advance_clock(10)
    failed_at = _finish(harness.db, project, task, "failed", 40_000)
    start_run(harness.db, project, task)
    harness.advance_clock(10)

    outcomes = harness.db.transaction(outcome_metrics.task_outcomes, write=False)
    depth = harness.db.transaction(outcome_metrics.queue_depth, write=False)
    harness.db.transaction(histogram.refresh, write=False)
    harness.db.transaction(histogram.refresh, write=False)

    assert [(o.task, o.last_success_ms, o.last_failure_ms) for o in outcomes] == [
        ("backup", ok_at, failed_at)
    ]
    assert depth == 1
    assert histogram.total == 2 and histogram.sum_s == 42.0
    assert dict(histogram.cumulative())["5.0"] == 1 and dict(histogram.cumulative())["60.0"] == 2
