"""The console's bounded reads are served by their indexes on both databases (migrations 0025 / 0033;
bench/README.md "Console at 10,000 tasks and 1,000,000 runs"): a plan that falls back to reading a
project's whole run history or every schedule fails here, not only in the benchmark."""

from __future__ import annotations

from typing import Any

import pytest

from ql3.repositories.runs import STATUS_SLOTS
from ql3.storage.queries import catalogue
from tests.support.builders import seed_project, seed_task, start_run
from tests.support.databases import Harness


def _plan(harness: Harness, name: str, params: dict[str, Any]) -> str:
    sql = catalogue(harness.dialect)[name]
    if harness.dialect == "sqlite":
        rows = [str(dict(r)) for r in harness.db._conn().execute("EXPLAIN QUERY PLAN " + sql, params)]
    else:
        with harness.db.pool.connection() as conn:
            conn.execute("SET enable_seqscan = off")
            rows = [str(r) for r in conn.execute(("EXPLAIN " + sql).encode(), params)]
            conn.execute("RESET enable_seqscan")
    return "\n".join(rows)


def _filter_params(project_id: str, task_id: str | None, statuses: tuple[str, ...]) -> dict[str, Any]:
    slots = list(statuses) + [None] * (STATUS_SLOTS - len(statuses))
    return {
        "project_id": project_id,
        "task_id": task_id,
        "any_status": 0 if statuses else 1,
        **{f"s{i}": value for i, value in enumerate(slots)},
        "trigger": None,
        "since_ms": None,
        "until_ms": None,
        "cursor_ms": None,
        "cursor_id": None,
        "limit": 21,
    }


@pytest.mark.parametrize(
    ("query", "task", "statuses", "index"),
    [
        ("run_filter_live_page", False, ("running", "dispatching"), "runs_project_live"),
        ("run_filter_task_page", True, (), "runs_task_created"),
        ("run_filter_task_page", True, ("failed",), "runs_task_created"),
    ],
    ids=["live-statuses", "one-task", "one-task-failed"],
)
def test_run_filters_read_their_index(
    harness: Harness, query: str, task: bool, statuses: tuple[str, ...], index: str
) -> None:
    project = seed_project(harness.db)
    found = seed_task(harness.db, project)
    start_run(harness.db, project, found)

    plan = _plan(harness, query, _filter_params(project.id, found.id if task else None, statuses))

    assert index in plan, plan


def test_next_fires_read_the_project_schedule_index(harness: Harness) -> None:
    project = seed_project(harness.db)
    seed_task(harness.db, project, cron="0 3 * * *")

    plan = _plan(harness, "task_next_fires", {"project_id": project.id, "limit": 10})

    assert "task_schedules_project_due" in plan, plan
