"""Lost retry: a new attempt per policy, persisted backoff, never a replayed one."""

from __future__ import annotations

from typing import Any

from ql3.application import lease_expiry
from tests.support.builders import count
from tests.support.databases import Harness
from tests.support.execution_builders import dispatcher, queued, register, run_of, start


def _lost_run(harness: Harness, max_attempts: int) -> tuple[Any, Any]:
    register(harness.db, lease_ms=600_000)
    project, _, (run,) = queued(harness.db, max_attempts=max_attempts, retry_safe=max_attempts > 1)
    offer = dispatcher(harness.db).dispatch_once().offer
    assert offer is not None
    start(harness.db, offer)
    harness.advance_clock(30_001)
    harness.db.transaction(lambda tx: lease_expiry.expire_lease(tx, offer.fence.attempt_id))
    return project, run


def test_lost_with_attempts_left_waits_then_creates_attempt_two(harness: Harness) -> None:
    project, run = _lost_run(harness, max_attempts=3)
    assert run_of(harness.db, project, run.id).status == "retry_wait"

    # not due yet: nothing happens
    assert harness.db.transaction(lambda tx: lease_expiry.admit_retry(tx, run.id)) is None
    harness.advance_clock(60_000)
    attempt_id = harness.db.transaction(lambda tx: lease_expiry.admit_retry(tx, run.id))

    assert attempt_id is not None
    assert run_of(harness.db, project, run.id).status == "queued"
    assert count(harness.db, "run_attempts") == 2
    # a replay never creates attempt three
    assert harness.db.transaction(lambda tx: lease_expiry.admit_retry(tx, run.id)) is None
    assert count(harness.db, "run_attempts") == 2


def test_retry_is_dispatched_as_a_new_attempt(harness: Harness) -> None:
    _project, run = _lost_run(harness, max_attempts=2)
    harness.advance_clock(60_000)
    harness.db.transaction(lambda tx: lease_expiry.admit_retry(tx, run.id))
    register(harness.db, lease_ms=600_000)

    offer = dispatcher(harness.db).dispatch_once().offer

    assert offer is not None and offer.fence.run_id == run.id
    attempts = harness.db.raw("SELECT attempt, status FROM run_attempts ORDER BY attempt")
    assert [(a["attempt"], a["status"]) for a in attempts] == [(1, "lost"), (2, "claimed")]


def test_exhausted_policy_fails_the_run(harness: Harness) -> None:
    project, run = _lost_run(harness, max_attempts=1)

    assert run_of(harness.db, project, run.id).status == "failed"


def test_the_last_attempt_lost_fails_the_run_instead_of_waiting_for_a_retry(harness: Harness) -> None:
    # Given a run allowed two attempts whose first was lost and retried
    project, run = _lost_run(harness, max_attempts=2)
    harness.advance_clock(60_000)
    assert harness.db.transaction(lambda tx: lease_expiry.admit_retry(tx, run.id)) is not None
    offer = dispatcher(harness.db).dispatch_once().offer
    assert offer is not None and offer.fence.run_id == run.id
    start(harness.db, offer)

    # When its second (last) attempt is lost too
    harness.advance_clock(30_001)
    assert harness.db.transaction(lambda tx: lease_expiry.expire_lease(tx, offer.fence.attempt_id)) == "lost"

    # Then the run fails: no retry is scheduled beyond the policy
    assert run_of(harness.db, project, run.id).status == "failed"
    policy = harness.db.raw("SELECT next_retry_at_ms FROM run_retry_policies WHERE run_id = ?", (run.id,))
    assert policy[0]["next_retry_at_ms"] is None
