"""Retry safety is explicit: more than one attempt needs ``retry_safe``, and a cancel beats a retry."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from ql3.application import cancellation, lease_expiry, tasks
from ql3.domain.errors import RetrySafetyRequired
from tests.support.builders import count, seed_project, seed_task, start_run
from tests.support.databases import Harness
from tests.support.execution_builders import dispatcher, queued, register, run_of, start

WRITTEN = ("tasks", "task_revisions", "task_schedules")


def _counts(harness: Harness) -> dict[str, int]:
    return {table: count(harness.db, table) for table in WRITTEN}


def test_more_than_one_attempt_without_retry_safe_is_refused_and_writes_nothing(harness: Harness) -> None:
    project = seed_project(harness.db)
    before = _counts(harness)

    with pytest.raises(RetrySafetyRequired) as refused:
        seed_task(harness.db, project, "job", max_attempts=3, cron="0 3 * * *")

    assert refused.value.code == "retry_safety_required" and refused.value.http_status == 422
    assert _counts(harness) == before
    task = seed_task(harness.db, project, "job", max_attempts=3, retry_safe=True)
    assert task.revision == 1


def test_an_edit_cannot_leave_retries_without_retry_safe(harness: Harness) -> None:
    project = seed_project(harness.db)
    seed_task(harness.db, project, "job")

    def edit(**changes: Any) -> tasks.TaskView:
        view: tasks.TaskView = harness.db.transaction(
            lambda tx: tasks.edit_task(tx, project.id, "job", changes)
        )
        return view

    with pytest.raises(RetrySafetyRequired):
        edit(max_attempts=2)
    assert count(harness.db, "task_revisions") == 1

    safe = edit(max_attempts=2, retry_safe=True)
    assert (safe.task.revision, safe.spec.max_attempts, safe.spec.retry_safe) == (2, 2, True)
    with pytest.raises(RetrySafetyRequired):
        edit(retry_safe=False)
    assert count(harness.db, "task_revisions") == 2
    assert edit(max_attempts=1, retry_safe=False).task.revision == 3


def _lose_the_attempt(harness: Harness) -> str:
    register(harness.db, lease_ms=600_000)
    offer = dispatcher(harness.db).dispatch_once().offer
    assert offer is not None
    start(harness.db, offer)
    harness.advance_clock(30_001)
    harness.db.transaction(lambda tx: lease_expiry.expire_lease(tx, offer.fence.attempt_id))
    return offer.fence.run_id


def test_a_stored_revision_whose_safety_is_unknown_is_never_retried(harness: Harness) -> None:
    # Given a revision written before retry safety was explicit: three attempts, no declaration
    project = seed_project(harness.db)
    task = seed_task(harness.db, project, "legacy")
    row = harness.db.raw("SELECT spec_json FROM task_revisions WHERE task_id = ?", (task.id,))[0]
    spec = json.loads(row["spec_json"])
    spec["max_attempts"] = 3
    del spec["retry_safe"]
    harness.db.raw("UPDATE task_revisions SET spec_json = ? WHERE task_id = ?", (json.dumps(spec), task.id))
    view = harness.db.transaction(lambda tx: tasks.view(tx, task), write=False)
    assert (view.spec.max_attempts, view.spec.retry_safe) == (3, False)
    run, _ = start_run(harness.db, project, task)

    # When its attempt is lost
    run_id = _lose_the_attempt(harness)

    # Then the run fails instead of running the command a second time
    assert run_id == run.id
    assert count(harness.db, "run_retry_policies") == 0
    assert run_of(harness.db, project, run.id).status == "failed"
    assert count(harness.db, "run_attempts") == 1


def test_a_retry_safe_task_waits_to_retry_after_a_lost_attempt(harness: Harness) -> None:
    project, _, (run,) = queued(harness.db, max_attempts=2, retry_safe=True)

    _lose_the_attempt(harness)

    assert run_of(harness.db, project, run.id).status == "retry_wait"
    policy = harness.db.raw("SELECT safety, max_attempts FROM run_retry_policies")
    assert [(p["safety"], p["max_attempts"]) for p in policy] == [("idempotent", 2)]


def test_a_cancel_beats_a_pending_retry(harness: Harness) -> None:
    # Given a run waiting for its retry
    project, _, (run,) = queued(harness.db, max_attempts=3, retry_safe=True)
    _lose_the_attempt(harness)
    assert run_of(harness.db, project, run.id).status == "retry_wait"

    # When it is cancelled before the retry is due
    outcome = harness.db.transaction(
        lambda tx: cancellation.request_cancel(tx, project.id, run.id, reason="user", actor_type="user")
    )

    # Then the retry never happens, even once it is due
    harness.advance_clock(120_000)
    due = harness.db.transaction(lambda tx: lease_expiry.retry_due_page(tx, 16), write=False)
    admitted = [harness.db.transaction(lambda tx, r=r: lease_expiry.admit_retry(tx, r)) for r in due]
    assert outcome == "requested" and admitted in ([], [None])
    assert harness.db.transaction(lambda tx: lease_expiry.retry_due_page(tx, 16), write=False) == []
    assert run_of(harness.db, project, run.id).status == "cancelled"
    assert count(harness.db, "run_attempts") == 1
    assert dispatcher(harness.db).dispatch_once().offer is None


def test_a_cancel_racing_a_due_retry_on_two_connections_leaves_nothing_to_run(harness: Harness) -> None:
    # Given a run whose retry is due
    project, _, (run,) = queued(harness.db, max_attempts=3, retry_safe=True)
    _lose_the_attempt(harness)
    harness.advance_clock(120_000)
    other = harness.second_connection()
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def cancel() -> None:
        try:
            barrier.wait(timeout=30)
            harness.db.transaction(
                lambda tx: cancellation.request_cancel(
                    tx, project.id, run.id, reason="user", actor_type="user"
                )
            )
        except BaseException as exc:  # reported below
            errors.append(exc)

    def retry() -> None:
        try:
            barrier.wait(timeout=30)
            other.transaction(lambda tx: lease_expiry.admit_retry(tx, run.id))
        except BaseException as exc:  # reported below
            errors.append(exc)

    # When the cancel and the retry admission race on two connections
    threads = [threading.Thread(target=cancel), threading.Thread(target=retry)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    finally:
        other.close()

    # Then whichever committed first, the run ends cancelled and no attempt is offered
    assert errors == []
    assert run_of(harness.db, project, run.id).status == "cancelled"
    statuses = harness.db.raw("SELECT status FROM run_attempts ORDER BY attempt")
    assert statuses[0]["status"] == "lost" and all(s["status"] != "claimed" for s in statuses[1:])
    assert dispatcher(harness.db).dispatch_once().offer is None
