"""Fair scanning: runs no worker can take never block the placeable ones behind them, and a cycle
that makes no progress says so, so the dispatcher loop waits instead of spinning."""

from __future__ import annotations

import math
from typing import Any

from ql3.application import runs
from ql3.domain.model import Project, Task
from tests.support.builders import seed_project, seed_task
from tests.support.databases import Harness
from tests.support.execution_builders import dispatcher, register


def _queue(db: Any, project: Project, task: Task, n: int) -> None:
    def fn(tx: Any) -> None:
        for _ in range(n):
            runs.create_run(tx, runs.CreateRun(project_id=project.id, task=task))

    db.transaction(fn)


def test_a_placeable_run_behind_a_thousand_unplaceable_ones_is_placed_in_bounded_cycles(
    harness: Harness,
) -> None:
    # Given a label-less worker, 1,000 queued runs that need gpu=yes, then one plain run
    register(harness.db, slots=4)
    project = seed_project(harness.db)
    gpu = seed_task(harness.db, project, name="gpu", require={"gpu": "yes"})
    plain = seed_task(harness.db, project, name="plain")
    _queue(harness.db, project, gpu, 1000)
    harness.advance_clock(5)
    _queue(harness.db, project, plain, 1)
    d = dispatcher(harness.db)
    per_cycle = d.budget.candidate_page * d.budget.candidate_pages
    bound = math.ceil(1001 / per_cycle) + 1

    # When the dispatcher runs cycle after cycle while they report more work
    results = []
    for _ in range(bound):
        result = d.dispatch_once()
        results.append(result)
        if result.offer is not None or not result.truncated:
            break

    # Then every unproductive cycle before it continued past the previous one, and the plain run
    # was placed within the bound
    last = results[-1]
    assert last.reason == "claimed" and last.offer is not None, [r.reason for r in results]
    assert last.offer.spec.task_id == plain.id
    assert all(r.truncated and r.reason == "scan_budget_exhausted" for r in results[:-1])
    assert len(results) == math.ceil(1001 / per_cycle)


def test_a_scan_that_reaches_the_end_without_placing_reports_no_progress(harness: Harness) -> None:
    # Given 20 runs no worker can take (more than one cycle's budget of 16)
    register(harness.db)
    project = seed_project(harness.db)
    gpu = seed_task(harness.db, project, name="gpu", require={"gpu": "yes"})
    _queue(harness.db, project, gpu, 20)
    d = dispatcher(harness.db)

    # When the dispatcher scans: a budget-stopped cycle, then one that reaches the end of the queue
    first = d.dispatch_once()
    second = d.dispatch_once()

    # Then the first asks for another cycle now, the second continues past it and reports no
    # progress (so the loop waits), and the next lap starts again at the head
    assert (first.reason, first.truncated) == ("scan_budget_exhausted", True)
    assert (second.reason, second.truncated) == ("no_match", False)
    assert second.plan_calls == 4  # only the 4 runs the first cycle had not examined
    third = d.dispatch_once()
    assert (third.reason, third.truncated, third.plan_calls) == ("scan_budget_exhausted", True, 16)


def test_an_offer_sends_the_next_scan_back_to_the_head_of_the_queue(harness: Harness) -> None:
    # Given unplaceable runs ahead of two plain ones
    register(harness.db)
    project = seed_project(harness.db)
    gpu = seed_task(harness.db, project, name="gpu", require={"gpu": "yes"})
    plain = seed_task(harness.db, project, name="plain")
    _queue(harness.db, project, gpu, 20)
    harness.advance_clock(5)
    _queue(harness.db, project, plain, 2)
    d = dispatcher(harness.db)

    # When the first scan places one plain run
    assert d.dispatch_once().truncated
    placed = d.dispatch_once()
    assert placed.reason == "claimed"

    # Then the next cycle scans from the head again (priority order), not from the placed run
    after = d.dispatch_once()
    assert after.reason == "scan_budget_exhausted" and after.plan_calls == 16


def test_an_offering_cycle_that_started_behind_the_head_asks_for_the_next_cycle_now(harness: Harness) -> None:
    # Given 20 unplaceable runs ahead of one plain run, and a dispatcher that may offer several
    register(harness.db)
    project = seed_project(harness.db)
    gpu = seed_task(harness.db, project, name="gpu", require={"gpu": "yes"})
    plain = seed_task(harness.db, project, name="plain")
    _queue(harness.db, project, gpu, 20)
    harness.advance_clock(5)
    _queue(harness.db, project, plain, 1)
    d = dispatcher(harness.db, max_offers_per_cycle=8)

    # When the second cycle, continuing behind the first, places the plain run at the end of the queue
    assert d.dispatch_once().truncated
    placed = d.dispatch_once()

    # Then it does not claim to have seen the whole queue (it started behind the head): the loop
    # looks again at once, from the head
    assert placed.reason == "claimed" and len(placed.offers) == 1
    assert (placed.truncated, placed.drained) == (True, False)
    assert d.dispatch_once().plan_calls == 16
