"""Retention prunes terminal runs with every row that belongs to them, in bounded pages, by age and by
runs per task, removes their log files and caps the logs of the runs it keeps. SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ql3.application import retention
from ql3.application.retention import DAY_MS, RetentionPruner
from ql3.execution.log_retention import LogDirectory
from tests.support.builders import count, seed_history, seed_project, seed_task

ROW_TABLES = ("runs", "run_attempts", "run_events", "run_leases")


def _policy(db: Any, project: Any, **limits: Any) -> None:
    values = {"keep_days": None, "runs_per_task": None, "log_bytes_per_run": None, **limits}
    db.transaction(lambda tx: retention.set_policy(tx, project, **values))


def _drain(pruner: RetentionPruner) -> list[retention.PruneReport]:
    reports = [pruner.prune_once()]
    while reports[-1].more and len(reports) < 100:
        reports.append(pruner.prune_once())
    return reports


def test_runs_older_than_the_policy_go_with_all_their_rows_in_bounded_pages(harness: Any) -> None:
    project = seed_project(harness.db)
    task = seed_task(harness.db, project, "minutely")
    now = harness.now_ms()
    old = seed_history(harness.db, project, task, 25, start_ms=now - 40 * DAY_MS, step_ms=60_000)
    recent = seed_history(harness.db, project, task, 5, start_ms=now - DAY_MS, step_ms=60_000)
    _policy(harness.db, project, keep_days=30)
    pruner = RetentionPruner(harness.db, None, page=4, max_pages=3)

    # One cycle deletes at most max_pages * page runs and says more is left
    first = pruner.prune_once()
    assert first.runs_deleted == 12 and first.more
    assert count(harness.db, "runs") == 30 - 12

    reports = _drain(pruner)
    assert sum(r.runs_deleted for r in reports) == 13 and not reports[-1].more
    kept = {r["id"] for r in harness.db.raw("SELECT id FROM runs")}
    assert kept == {run_id for run_id, _ in recent}
    for table in ROW_TABLES:
        assert (
            count(harness.db, table)
            == {"runs": 5, "run_attempts": 5, "run_events": 10, "run_leases": 5}[table]
        )
    assert not kept & {run_id for run_id, _ in old}


def test_live_runs_are_never_pruned(harness: Any) -> None:
    project = seed_project(harness.db)
    task = seed_task(harness.db, project, "stuck")
    now = harness.now_ms()
    seed_history(harness.db, project, task, 3, start_ms=now - 90 * DAY_MS, step_ms=1, status="running")
    _policy(harness.db, project, keep_days=1, runs_per_task=1)

    _drain(RetentionPruner(harness.db, None))

    assert count(harness.db, "runs") == 3


def test_runs_per_task_keeps_the_newest_of_each_task(harness: Any) -> None:
    project = seed_project(harness.db)
    a = seed_task(harness.db, project, "a")
    b = seed_task(harness.db, project, "b")
    now = harness.now_ms()
    runs_a = seed_history(harness.db, project, a, 12, start_ms=now - 1000, step_ms=1)
    runs_b = seed_history(harness.db, project, b, 3, start_ms=now - 1000, step_ms=1)
    _policy(harness.db, project, runs_per_task=5)

    reports = _drain(RetentionPruner(harness.db, None, page=3, max_pages=1))

    assert sum(r.runs_deleted for r in reports) == 7
    kept = {r["id"] for r in harness.db.raw("SELECT id FROM runs")}
    assert kept == {r for r, _ in runs_a[-5:]} | {r for r, _ in runs_b}


def test_log_files_go_with_their_runs_and_kept_logs_are_capped(harness: Any, tmp_path: Path) -> None:
    project = seed_project(harness.db)
    task = seed_task(harness.db, project, "chatty")
    now = harness.now_ms()
    old = seed_history(harness.db, project, task, 3, start_ms=now - 10 * DAY_MS, step_ms=1)
    kept = seed_history(harness.db, project, task, 2, start_ms=now - 1000, step_ms=1)
    logs = tmp_path / "logs"
    logs.mkdir()
    for _, attempt_id in old + kept:
        (logs / f"{attempt_id}.log").write_bytes(b"x" * 5000)
    _policy(harness.db, project, keep_days=7, log_bytes_per_run=1024)

    reports = _drain(RetentionPruner(harness.db, LogDirectory(logs)))

    assert sum(r.runs_deleted for r in reports) == 3
    for _, attempt_id in old:
        assert not (logs / f"{attempt_id}.log").exists()
    for _, attempt_id in kept:
        data = (logs / f"{attempt_id}.log").read_bytes()
        assert data.startswith(b"x" * 1024) and b"truncated at 1024 bytes" in data and len(data) < 1200
    assert sum(r.logs_capped for r in reports) == 2
    assert sum(r.log_bytes_freed for r in reports) > 3 * 5000


def test_no_policy_keeps_everything(harness: Any) -> None:
    project = seed_project(harness.db)
    task = seed_task(harness.db, project, "kept")
    seed_history(harness.db, project, task, 4, start_ms=harness.now_ms() - 400 * DAY_MS, step_ms=1)

    report = RetentionPruner(harness.db, None).prune_once()

    assert report.runs_deleted == 0 and count(harness.db, "runs") == 4


def test_a_policy_is_replaced_and_validated(harness: Any) -> None:
    project = seed_project(harness.db)
    _policy(harness.db, project, keep_days=30, runs_per_task=1000)
    _policy(harness.db, project, keep_days=None, runs_per_task=10)
    found = harness.db.transaction(lambda tx: retention.get_policy(tx, project))
    assert (found.keep_days, found.runs_per_task, found.version) == (None, 10, 2)


def test_skipped_cron_occurrences_older_than_the_policy_go(harness: Any) -> None:
    project = seed_project(harness.db)
    task = seed_task(harness.db, project, "minutely", cron="* * * * *")
    now = harness.now_ms()
    for i, at in enumerate((now - 40 * DAY_MS, now - 35 * DAY_MS, now - DAY_MS)):
        harness.db.raw(
            "INSERT INTO cron_skips (task_id, occurrence_ms, project_id, task_revision, last_occurrence_ms,"
            " occurrences, reason, created_at_ms) VALUES (?, ?, ?, 1, ?, 1, 'overlap', ?)",
            (task.id, at, project.id, at, at + i),
        )
    _policy(harness.db, project, keep_days=30)

    _drain(RetentionPruner(harness.db, None, page=4, max_pages=3))

    assert [r["created_at_ms"] for r in harness.db.raw("SELECT created_at_ms FROM cron_skips")] == [
        now - DAY_MS + 2
    ]
