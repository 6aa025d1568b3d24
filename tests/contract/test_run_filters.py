"""Filtered run lists (status, task, trigger, time range) with keyset pages, on both dialects."""

from __future__ import annotations

from typing import Any

import pytest

from ql3.application import run_queries, runs
from ql3.application.run_queries import RunFilter
from ql3.domain.errors import ValidationFailed
from ql3.domain.model import Project, Run, Task
from tests.support.builders import seed_project, seed_task, start_run
from tests.support.databases import Harness


def _move(harness: Harness, run: Run, *path: str) -> Run:
    current = run
    for to in path:
        current = harness.db.transaction(
            lambda tx, c=current, t=to: runs.transition(tx, c.id, c.version, t, actor_type="system")
        )
    return current


def _create(harness: Harness, project: Project, task: Task, **fields: Any) -> Run:
    run: Run
    run, _ = harness.db.transaction(
        lambda tx: runs.create_run(tx, runs.CreateRun(project_id=project.id, task=task, **fields))
    )
    return run


def _ids(harness: Harness, project: Project, flt: RunFilter, limit: int = 50) -> list[str]:
    page, _ = harness.db.transaction(
        lambda tx: run_queries.list_filtered(tx, project.id, flt, limit=limit), write=False
    )
    return [row.run.id for row in page]


def test_status_filter_returns_only_those_statuses_newest_first(harness: Harness) -> None:
    # Given runs that failed, were cancelled, timed out and are still queued
    project = seed_project(harness.db)
    task = seed_task(harness.db, project)
    failed = _move(harness, start_run(harness.db, project, task)[0], "dispatching", "failed")
    harness.advance_clock(10)
    cancelled = _move(harness, start_run(harness.db, project, task)[0], "cancelled")
    harness.advance_clock(10)
    timed_out = _move(harness, start_run(harness.db, project, task)[0], "timed_out")
    harness.advance_clock(10)
    queued, _ = start_run(harness.db, project, task)

    # Then each filter returns exactly its runs, newest first
    assert _ids(harness, project, RunFilter(statuses=("failed",))) == [failed.id]
    assert _ids(harness, project, RunFilter(statuses=("failed", "timed_out"))) == [timed_out.id, failed.id]
    assert _ids(harness, project, RunFilter(statuses=("queued",))) == [queued.id]
    assert _ids(harness, project, RunFilter()) == [queued.id, timed_out.id, cancelled.id, failed.id]


def test_task_trigger_and_time_filters_combine(harness: Harness) -> None:
    project = seed_project(harness.db)
    job = seed_task(harness.db, project, "job")
    other = seed_task(harness.db, project, "other")
    manual, _ = start_run(harness.db, project, job)
    harness.advance_clock(1000)
    cron = _create(harness, project, job, trigger_type="cron", scheduled_for_ms=harness.now_ms())
    harness.advance_clock(1000)
    rerun = _create(harness, project, job, retry_of_run_id=manual.id)
    harness.advance_clock(1000)
    elsewhere, _ = start_run(harness.db, project, other)

    assert _ids(harness, project, RunFilter(task_id=job.id)) == [rerun.id, cron.id, manual.id]
    assert _ids(harness, project, RunFilter(trigger="cron")) == [cron.id]
    assert _ids(harness, project, RunFilter(trigger="retry")) == [rerun.id]
    assert _ids(harness, project, RunFilter(trigger="manual")) == [elsewhere.id, manual.id]
    assert _ids(harness, project, RunFilter(trigger="approval")) == []
    # since is inclusive, until exclusive, both on the creation time
    window = RunFilter(since_ms=cron.created_at_ms, until_ms=elsewhere.created_at_ms)
    assert _ids(harness, project, window) == [rerun.id, cron.id]
    assert _ids(harness, project, RunFilter(task_id=other.id, since_ms=cron.created_at_ms)) == [elsewhere.id]


def test_rows_carry_the_task_name_trigger_and_attempt(harness: Harness) -> None:
    project = seed_project(harness.db)
    task = seed_task(harness.db, project, "nightly")
    first, _ = start_run(harness.db, project, task)
    _create(harness, project, task, retry_of_run_id=first.id)

    page, _ = harness.db.transaction(
        lambda tx: run_queries.list_filtered(tx, project.id, RunFilter()), write=False
    )

    assert [(r.task_name, r.trigger, r.attempt) for r in page] == [
        ("nightly", "retry", 1),
        ("nightly", "manual", 1),
    ]
    described = harness.db.transaction(lambda tx: run_queries.describe(tx, first), write=False)
    assert (described.task_name, described.trigger, described.attempt) == ("nightly", "manual", 1)


def test_keyset_pages_of_a_filter_cover_each_match_once(harness: Harness) -> None:
    # Given eight runs, every other one failed, several created in the same millisecond
    project = seed_project(harness.db)
    task = seed_task(harness.db, project)
    failed: list[str] = []
    for i in range(8):
        run, _ = start_run(harness.db, project, task)
        if i % 2:
            failed.append(_move(harness, run, "dispatching", "failed").id)
        if i % 3 == 0:
            harness.advance_clock(5)

    # When the failed ones are read one page of two at a time
    seen: list[str] = []
    cursor: str | None = None
    for _ in range(10):
        page, cursor = harness.db.transaction(
            lambda tx, c=cursor: run_queries.list_filtered(
                tx, project.id, RunFilter(statuses=("failed",)), cursor=c, limit=2
            ),
            write=False,
        )
        seen += [r.run.id for r in page]
        if cursor is None:
            break

    # Then every failed run appears exactly once, in the order of the unpaged list
    assert seen == _ids(harness, project, RunFilter(statuses=("failed",)))
    assert sorted(seen) == sorted(failed) and len(seen) == 4


def test_another_projects_runs_never_match(harness: Harness) -> None:
    a = seed_project(harness.db)
    b = seed_project(harness.db, "b")
    start_run(harness.db, b, seed_task(harness.db, b))

    assert _ids(harness, a, RunFilter()) == []


@pytest.mark.parametrize(
    ("flt", "field"),
    [
        (RunFilter(statuses=("finished",)), "status"),
        (RunFilter(trigger="webhook"), "trigger"),
        (RunFilter(since_ms=-1), "since"),
        (RunFilter(since_ms=10, until_ms=5), "since"),
    ],
)
def test_bad_filters_are_refused_by_field(harness: Harness, flt: RunFilter, field: str) -> None:
    project = seed_project(harness.db)

    with pytest.raises(ValidationFailed) as err:
        _ids(harness, project, flt)
    assert err.value.details["field"] == field


def test_status_lists_are_parsed_strictly() -> None:
    assert run_queries.parse_statuses("failed, timed_out,failed") == ("failed", "timed_out")
    assert run_queries.parse_statuses(None) == ()
    for bad in ("", "failed,", "FAILED", "done"):
        with pytest.raises(ValidationFailed):
            run_queries.parse_statuses(bad)
