"""The pull's fair scan (docs/cluster.md "Pull") on SQLite and PostgreSQL: each replica keeps where a
worker session's walk of the queue stopped, so a head of runs this worker cannot take never starves
a run behind them that it can; the cursor is only a hint (claims stay fenced), is per session, and
the table of cursors is bounded."""

from __future__ import annotations

import math
from typing import Any

import pytest

from ql3.application import runs
from ql3.cluster import pull
from ql3.cluster.pull import MAX_IMMEDIATE_RETRIES, PullBudget, PullService
from ql3.domain.model import Project, Task
from tests.support.builders import seed_project, seed_task
from tests.support.databases import Harness
from tests.support.execution_builders import live_leases, register, request

# Two candidates a pass, five passes a pull: 10 candidates per pull, so 25 blockers need 3 pulls.
SMALL = PullBudget(candidate_page=2, candidate_pages=1)
PER_PULL = SMALL.candidate_page * SMALL.candidate_pages * (1 + MAX_IMMEDIATE_RETRIES)
BLOCKERS = 25


def _queue(db: Any, project: Project, task: Task, n: int) -> None:
    def fn(tx: Any) -> None:
        for _ in range(n):
            runs.create_run(tx, runs.CreateRun(project_id=project.id, task=task))

    db.transaction(fn)


def _blocked_queue(harness: Harness, plain_runs: int = 1) -> Task:
    """``BLOCKERS`` runs that need gpu=yes at the head of the queue, then ``plain_runs`` plain ones."""
    project = seed_project(harness.db)
    gpu = seed_task(harness.db, project, name="gpu", require={"gpu": "yes"})
    plain = seed_task(harness.db, project, name="plain")
    _queue(harness.db, project, gpu, BLOCKERS)
    harness.advance_clock(5)
    _queue(harness.db, project, plain, plain_runs)
    return plain


def test_successive_pulls_reach_a_placeable_run_behind_more_blockers_than_one_pull_scans(
    harness: Harness,
) -> None:
    # Given a label-less worker, and more gpu-only runs at the head than one pull examines
    session = register(harness.db, "w1")
    plain = _blocked_queue(harness)
    service = PullService(harness.db, budget=SMALL)
    bound = math.ceil((BLOCKERS + 1) / PER_PULL)

    # When the worker pulls again after each empty answer
    results = []
    for _ in range(bound + 2):
        result = service.pull(request(session), wait_ms=0)
        results.append(result)
        if result.offer is not None:
            break

    # Then every empty pull before the claim continued behind the previous one, and the plain run
    # was claimed within the bound (without the cursor every pull rescans the same head)
    last = results[-1]
    assert last.reason == "claimed" and last.offer is not None, [r.reason for r in results]
    assert last.offer.spec.task_id == plain.id
    assert len(results) == bound
    assert all(r.truncated and r.reason == "scan_budget_exhausted" for r in results[:-1])
    # And the offer sends the next walk back to the head of the queue
    assert service.resume_cursor(request(session)) is None


def test_a_walk_that_reaches_the_end_starts_again_at_the_head(harness: Harness) -> None:
    # Given only runs the worker cannot take
    session = register(harness.db, "w1")
    project = seed_project(harness.db)
    gpu = seed_task(harness.db, project, name="gpu", require={"gpu": "yes"})
    _queue(harness.db, project, gpu, 13)
    service = PullService(harness.db, budget=SMALL)

    # When it pulls once (10 examined, stopped by the budget) and again (the last 3, the end)
    first = service.pull(request(session), wait_ms=0)
    assert first.truncated and service.resume_cursor(request(session)) is not None
    second = service.pull(request(session), wait_ms=0)

    # Then the second one reports the end without a claim, and the next walk starts at the head
    assert (second.reason, second.truncated, second.walked_to_end) == ("no_match", False, True)
    assert service.resume_cursor(request(session)) is None
    assert service.pull(request(session), wait_ms=0).truncated
    assert live_leases(harness.db) == 0


def test_a_new_session_of_the_worker_walks_from_the_head(harness: Harness) -> None:
    # Given a walk stopped part-way for one session
    old = register(harness.db, "w1")
    _blocked_queue(harness)
    service = PullService(harness.db, budget=SMALL)
    assert service.pull(request(old), wait_ms=0).truncated
    assert service.resume_cursor(request(old)) is not None

    # When the worker registers a new session (a restart)
    new = register(harness.db, "w1")

    # Then that session starts at the head: its first pull examines the same blockers again and
    # stops where the old one did, not past it
    assert service.resume_cursor(request(new)) is None
    first = service.pull(request(new), wait_ms=0)
    assert first.truncated and first.cursor is not None
    old_cursor = service.resume_cursor(request(new))
    assert old_cursor is not None and old_cursor.run_id == first.cursor.run_id


def test_a_cursor_is_only_a_hint_when_two_replicas_serve_one_worker(harness: Harness) -> None:
    # Given two replicas (two connections, two services) and a worker that pulls from both
    session = register(harness.db, "w1", slots=1)
    _blocked_queue(harness, plain_runs=1)
    a = PullService(harness.db, budget=SMALL)
    other = harness.second_connection()
    try:
        b = PullService(other, budget=SMALL)
        # When replica A walks part of the queue, replica B walks to the plain run and claims it
        assert a.pull(request(session), wait_ms=0).truncated
        claimed = None
        for _ in range(math.ceil((BLOCKERS + 1) / PER_PULL)):
            claimed = b.pull(request(session), wait_ms=0)
            if claimed.offer is not None:
                break
        assert claimed is not None and claimed.reason == "claimed"

        # Then A's stale cursor claims nothing more: the worker's only slot is taken
        assert a.pull(request(session), wait_ms=0).reason == "no_capacity"
        assert a.resume_cursor(request(session)) is not None  # a full worker keeps its place
    finally:
        other.close()
    assert live_leases(harness.db) == 1


def test_the_cursor_table_is_bounded_and_evicts_the_oldest_walk(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a cap of two cursors and three workers whose walks stop part-way
    monkeypatch.setattr(pull, "MAX_SCAN_CURSORS", 2)
    sessions = [register(harness.db, f"w{i}") for i in range(3)]
    _blocked_queue(harness)
    service = PullService(harness.db, budget=SMALL)

    # When each pulls once, in order
    for session in sessions:
        assert service.pull(request(session), wait_ms=0).truncated

    # Then the oldest walk was forgotten (it starts at the head again), the two newest are kept
    assert service.resume_cursor(request(sessions[0])) is None
    assert service.resume_cursor(request(sessions[1])) is not None
    assert service.resume_cursor(request(sessions[2])) is not None


def test_a_long_poll_stopped_by_the_budget_answers_at_once_and_one_at_the_end_waits(
    harness: Harness,
) -> None:
    # Given a long-polling worker behind more blockers than one pull examines, and a wait we record
    session = register(harness.db, "w1")
    project = seed_project(harness.db)
    gpu = seed_task(harness.db, project, name="gpu", require={"gpu": "yes"})
    _queue(harness.db, project, gpu, 13)
    waits: list[float] = []

    def wait_past(marks: dict[str, int], remaining_s: float) -> bool:
        waits.append(remaining_s)
        return False

    service = PullService(harness.db, budget=SMALL, counters=lambda channels: {}, wait_past=wait_past)

    # When it pulls with a long wait while its walk is not at the end
    first = service.pull(request(session), wait_ms=20_000)

    # Then the pull answers without waiting, so the worker's next pull continues the walk
    assert first.truncated and waits == []
    # And the pull whose walk reaches the end waits for a wake-up before it looks again from the
    # head (the recorded wait returns at once, as a wake-up would; that look is stopped by the
    # budget again and answers)
    second = service.pull(request(session), wait_ms=20_000)
    assert len(waits) == 1 and second.truncated
    assert live_leases(harness.db) == 0
