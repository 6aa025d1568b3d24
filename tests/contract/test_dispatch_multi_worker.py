"""The dispatcher with several registered workers: worker paging reaches a matching worker on a later
page, and losing a capacity race on the best worker moves the claim on to the next one."""

from __future__ import annotations

from typing import Any

from ql3.application import runs
from ql3.application.dispatcher import RunDispatcher
from ql3.domain.model import Project, Task
from ql3.domain.workers import WorkerSnapshot
from tests.support.builders import seed_project, seed_task
from tests.support.databases import Harness
from tests.support.execution_builders import dispatcher, register


def _one_run(db: Any, project: Project, task: Task, priority: int = 0) -> str:
    run, _ = db.transaction(
        lambda tx: runs.create_run(tx, runs.CreateRun(project_id=project.id, task=task, priority=priority))
    )
    return str(run.id)


def test_worker_paging_reaches_the_only_matching_worker_on_the_last_page(harness: Harness) -> None:
    # Given ten workers, of which only the last by id has gpu=yes, and pages of four workers
    for i in range(9):
        register(harness.db, f"w{i:02d}")
    register(harness.db, "w09", labels={"gpu": "yes"})
    project = seed_project(harness.db)
    _one_run(harness.db, project, seed_task(harness.db, project, name="gpu", require={"gpu": "yes"}))

    # When one cycle runs
    result = dispatcher(harness.db, worker_page=4, worker_pages=3).dispatch_once()

    # Then it read all three worker pages and placed the run on w09
    assert result.reason == "claimed" and result.offer is not None
    assert result.offer.fence.worker_id == "w09"
    assert result.worker_calls == 3


def test_the_first_worker_page_starts_below_every_worker_id(harness: Harness) -> None:
    # Given the one worker, whose id starts with a digit (sorting before every letter, either case)
    register(harness.db, "0edge")
    project = seed_project(harness.db)
    _one_run(harness.db, project, seed_task(harness.db, project))

    # When one cycle runs
    result = dispatcher(harness.db).dispatch_once()

    # Then the first page found it, and the run is placed there
    assert result.reason == "claimed" and result.offer is not None
    assert (result.offer.fence.worker_id, result.worker_calls) == ("0edge", 1)


def test_a_matching_worker_beyond_the_worker_budget_is_not_used(harness: Harness) -> None:
    for i in range(4):
        register(harness.db, f"w{i:02d}")
    register(harness.db, "w04", labels={"gpu": "yes"})
    project = seed_project(harness.db)
    _one_run(harness.db, project, seed_task(harness.db, project, name="gpu", require={"gpu": "yes"}))

    result = dispatcher(harness.db, worker_page=2, worker_pages=2).dispatch_once()

    assert (result.reason, result.worker_calls, result.offer) == ("no_match", 2, None)


def test_losing_the_capacity_race_on_the_best_worker_moves_on_to_the_next(harness: Harness) -> None:
    # Given a preferred one-slot worker "a", a plain worker "b", and two runs
    register(harness.db, "a", slots=1, labels={"zone": "us"})
    register(harness.db, "b", slots=1)
    project = seed_project(harness.db)
    task = seed_task(harness.db, project, prefer=[{"labels": {"zone": "us"}, "weight": 10}])
    first = _one_run(harness.db, project, task, priority=5)
    _one_run(harness.db, project, task)
    d = dispatcher(harness.db)
    other = harness.second_connection()
    rival = RunDispatcher(other, lease_secret=b"r" * 32, incarnation_started_ms=0)

    # When, right after our cycle read the worker snapshot, another dispatcher on another connection
    # fills "a" with the second run
    real_workers = d._workers

    def snapshot_then_rival_claims(tx: Any) -> tuple[list[WorkerSnapshot], int]:
        snapshot = real_workers(tx)
        rival._scan_cursor = None
        rival_result = rival.dispatch_once()
        assert rival_result.offer is not None and rival_result.offer.fence.worker_id == "a"
        return snapshot

    d._workers = snapshot_then_rival_claims  # type: ignore[method-assign]
    rival_view = rival._candidates

    def rival_candidates(tx: Any, cursor: Any) -> Any:
        # the rival takes the second run: ours is mid-claim in our cycle
        return [c for c in rival_view(tx, cursor) if c.run_id != first]

    rival._candidates = rival_candidates  # type: ignore[method-assign]
    try:
        result = d.dispatch_once()
    finally:
        other.close()

    # Then our claim on "a" met capacity_exhausted and went on to "b" in the same cycle
    assert result.reason == "claimed" and result.offer is not None
    assert result.offer.fence.run_id == first and result.offer.fence.worker_id == "b"
    assert result.claim_calls == 2
    busy = {r["worker_id"]: int(r["active_leases"]) for r in harness.db.raw("SELECT * FROM workers")}
    assert busy == {"a": 1, "b": 1}


def test_a_best_worker_gone_unavailable_after_the_snapshot_moves_the_claim_on_to_the_next(
    harness: Harness,
) -> None:
    # Given a preferred worker "a", a plain worker "b", and one run
    register(harness.db, "a", slots=1, labels={"zone": "us"})
    register(harness.db, "b", slots=1)
    project = seed_project(harness.db)
    task = seed_task(harness.db, project, prefer=[{"labels": {"zone": "us"}, "weight": 10}])
    run_id = _one_run(harness.db, project, task)
    d = dispatcher(harness.db)
    other = harness.second_connection()

    # When, right after our cycle read the worker snapshot, "a" starts draining (another connection)
    real_workers = d._workers

    def snapshot_then_a_drains(tx: Any) -> tuple[list[WorkerSnapshot], int]:
        snapshot = real_workers(tx)
        other.raw("UPDATE workers SET status = 'draining' WHERE worker_id = 'a'")
        return snapshot

    d._workers = snapshot_then_a_drains  # type: ignore[method-assign]
    try:
        result = d.dispatch_once()
    finally:
        other.close()

    # Then our claim on "a" met worker_unavailable and went on to "b" in the same cycle
    assert result.reason == "claimed" and result.offer is not None
    assert result.offer.fence.run_id == run_id and result.offer.fence.worker_id == "b"
    assert result.claim_calls == 2


def test_a_scan_whose_only_worker_went_unavailable_after_the_snapshot_reports_no_match(
    harness: Harness,
) -> None:
    # Given one worker "a" and one run
    register(harness.db, "a", slots=1)
    project = seed_project(harness.db)
    task = seed_task(harness.db, project)
    _one_run(harness.db, project, task)
    d = dispatcher(harness.db)
    other = harness.second_connection()

    # When "a" starts draining right after our cycle read the worker snapshot
    real_workers = d._workers

    def snapshot_then_a_drains(tx: Any) -> tuple[list[WorkerSnapshot], int]:
        snapshot = real_workers(tx)
        other.raw("UPDATE workers SET status = 'draining' WHERE worker_id = 'a'")
        return snapshot

    d._workers = snapshot_then_a_drains  # type: ignore[method-assign]
    try:
        result = d.dispatch_once()
    finally:
        other.close()

    # Then nothing is offered, and the cycle says no worker matched (not a raced claim)
    assert result.offer is None
    assert (result.reason, result.claim_calls, result.truncated) == ("no_match", 1, False)
