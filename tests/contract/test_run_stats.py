"""The overview's pictures read bounded aggregates: finished runs per UTC-aligned bucket by outcome
and mean busy slots per bucket from runs' start and end times (running ones up to now), for one
project only. A known data set gives known buckets on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from ql3.application import stats
from ql3.domain.errors import ValidationFailed
from ql3.domain.ids import new_id
from ql3.domain.model import Project, Task
from tests.support.builders import seed_project, seed_task
from tests.support.databases import Harness
from tests.support.execution_builders import register

MIN = 60_000
HOUR = 60 * MIN


def _run(
    harness: Harness, project: Project, task: Task, status: str, started: int, finished: int | None
) -> None:
    harness.db.raw(
        "INSERT INTO runs (id, project_id, task_id, task_revision, trigger_type, status, version,"
        " event_sequence, created_at_ms, queued_at_ms, started_at_ms, finished_at_ms, updated_at_ms)"
        " VALUES (?, ?, ?, 1, 'manual', ?, 4, 2, ?, ?, ?, ?, ?)",
        (new_id(), project.id, task.id, status, started, started, started, finished, finished or started),
    )


def _stats(harness: Harness, project: Project, range_name: str) -> stats.RunStats:
    got: stats.RunStats = harness.db.transaction(
        lambda tx: stats.run_stats(tx, project.id, range_name), write=False
    )
    return got


def _now(harness: Harness) -> int:
    now: int = harness.db.transaction(lambda tx: tx.now_ms(), write=False)
    return now


def _overlap(lo: int, hi: int, b_lo: int, b_hi: int) -> int:
    return max(0, min(hi, b_hi) - max(lo, b_lo))


def test_runs_fall_in_the_hour_they_finished_by_outcome_and_busy_time_is_split(harness: Harness) -> None:
    harness.freeze_clock()
    project = seed_project(harness.db)
    task = seed_task(harness.db, project)
    other = seed_project(harness.db, "other")
    now = _now(harness)
    start, bucket, count = stats.window("24h", now)
    assert bucket == HOUR and count == 24 and start + 23 * HOUR <= now < start + 24 * HOUR
    # Given a known set of runs around the window's start, one running now and one of another project
    _run(harness, project, task, "succeeded", start + 10 * MIN, start + 20 * MIN)
    _run(harness, project, task, "failed", start + 50 * MIN, start + 70 * MIN)
    _run(harness, project, task, "succeeded", start + 80 * MIN, start + 90 * MIN)
    _run(harness, project, task, "timed_out", start - 10 * MIN, start + 5 * MIN)
    _run(harness, project, task, "succeeded", start - 40 * MIN, start - 30 * MIN)  # before the window
    _run(harness, project, task, "running", now - 90 * MIN, None)
    _run(harness, other, seed_task(harness.db, other), "failed", start + 10 * MIN, start + 20 * MIN)

    got = _stats(harness, project, "24h")

    # Then each run is counted once, in the bucket it finished in, by its outcome
    assert [b.start_ms for b in got.buckets] == [start + i * HOUR for i in range(24)]
    assert got.buckets[0].counts == {"succeeded": 1, "timed_out": 1}
    assert got.buckets[1].counts == {"failed": 1, "succeeded": 1}
    assert all(b.counts == {} for b in got.buckets[2:])
    # and busy slots are the run time inside each bucket over its length (its elapsed part for now's)
    assert got.buckets[0].busy_slots == round(25 * MIN / HOUR, 3)
    assert got.buckets[1].busy_slots == round(20 * MIN / HOUR, 3)
    for i in range(2, 24):
        b_lo = start + i * HOUR
        elapsed = max(1, min(HOUR, now - b_lo))
        expected = round(_overlap(now - 90 * MIN, now, b_lo, b_lo + HOUR) / elapsed, 3)
        assert got.buckets[i].busy_slots == expected, i
    assert got.buckets[23].busy_slots == 1.0 or now - (start + 23 * HOUR) == 0
    assert got.start_ms == start and got.end_ms == start + 24 * HOUR and got.range == "24h"


def test_seven_days_are_28_buckets_of_six_hours_with_the_same_totals(harness: Harness) -> None:
    harness.freeze_clock()
    project = seed_project(harness.db)
    task = seed_task(harness.db, project)
    now = _now(harness)
    start, bucket, count = stats.window("7d", now)
    assert bucket == 6 * HOUR and count == 28
    finished = [start + 1, start + 6 * HOUR - 1, start + 6 * HOUR, now - 1, start - 1]
    for at in finished:
        _run(harness, project, task, "failed", at - MIN if at - MIN > start - HOUR else at, at)

    got = _stats(harness, project, "7d")

    assert len(got.buckets) == 28 and got.bucket_ms == 6 * HOUR
    assert got.buckets[0].counts == {"failed": 2}
    assert got.buckets[1].counts == {"failed": 1}
    assert got.buckets[(now - 1 - start) // (6 * HOUR)].counts == {"failed": 1}
    assert sum(sum(b.counts.values()) for b in got.buckets) == 4  # the run before the window is out


def test_capacity_is_the_slots_of_online_workers(harness: Harness) -> None:
    project = seed_project(harness.db)
    assert _stats(harness, project, "24h").capacity == 0
    register(harness.db, "w1", slots=4)
    register(harness.db, "w2", slots=2)

    assert _stats(harness, project, "24h").capacity == 6


def test_an_unknown_range_is_refused(harness: Harness) -> None:
    project = seed_project(harness.db)
    with pytest.raises(ValidationFailed):
        _stats(harness, project, "1y")
