"""The edges of lease expiry and lost-retry admission: the exact expiry instant, what each branch
writes (lease row, slot counter, event, wake-up), and the re-checks admission makes when it is due."""

from __future__ import annotations

import threading
from typing import Any

from ql3.application import lease_expiry, lease_results, runs
from ql3.domain.offers import LeaseFence
from tests.support.builders import count
from tests.support.databases import Harness
from tests.support.execution_builders import dispatcher, queued, register, run_of, start

LEASE_MS = 30_000  # the dispatcher's default run lease


def _claimed(harness: Harness, **spec: Any) -> tuple[Any, LeaseFence]:
    register(harness.db, lease_ms=600_000)
    project, _, _ = queued(harness.db, **spec)
    offer = dispatcher(harness.db).dispatch_once().offer
    assert offer is not None
    return project, offer.fence


def _lease(harness: Harness, attempt_id: str) -> dict[str, Any]:
    rows = harness.db.raw(
        "SELECT status, version, release_reason FROM run_leases WHERE attempt_id = ?", (attempt_id,)
    )
    return dict(rows[0])


def _active(harness: Harness) -> int:
    return int(harness.db.raw("SELECT active_leases FROM workers WHERE worker_id = 'w1'")[0]["active_leases"])


def _expire(harness: Harness, attempt_id: str) -> str:
    return str(harness.db.transaction(lambda tx: lease_expiry.expire_lease(tx, attempt_id)))


def _events(harness: Harness, run_id: str) -> list[Any]:
    return list(harness.db.transaction(lambda tx: runs.list_events(tx, run_id, after=0, limit=100)))


def _woken(harness: Harness, channel: str, action: Any) -> bool:
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(harness.db.wait_for(channel, 10)))
    harness.db.wait_for(channel, 0)  # drop anything pending
    waiter.start()
    action()
    waiter.join(timeout=15)
    return woke == [True]


def test_a_lease_is_live_until_its_expiry_instant_and_expires_at_it(harness: Harness) -> None:
    _, fence = _claimed(harness)
    if harness.dialect == "sqlite":  # the injected clock stands still; PostgreSQL's own clock moves on
        harness.advance_clock(LEASE_MS - 1)
        assert _expire(harness, fence.attempt_id) == "noop"
        harness.advance_clock(1)
    else:
        assert _expire(harness, fence.attempt_id) == "noop"
        harness.advance_clock(LEASE_MS)
    assert _expire(harness, fence.attempt_id) == "released"


def test_an_unknown_attempt_is_missing(harness: Harness) -> None:
    register(harness.db)
    assert _expire(harness, "01a00000-0000-7000-8000-000000000000") == "missing"


def test_an_expired_claim_releases_its_lease_and_slot_and_requeues_the_run_with_an_event(
    harness: Harness,
) -> None:
    project, fence = _claimed(harness)
    assert _active(harness) == 1
    before = len(_events(harness, fence.run_id))
    harness.advance_clock(LEASE_MS)

    assert _woken(harness, "runs", lambda: _expire(harness, fence.attempt_id))

    assert _lease(harness, fence.attempt_id) == {
        "status": "released",
        "version": fence.lease_version + 1,
        "release_reason": "lease_expired",
    }
    assert _active(harness) == 0
    assert run_of(harness.db, project, fence.run_id).status == "queued"
    new = _events(harness, fence.run_id)[before:]
    assert [(e.type, e.actor_type, e.attempt_id) for e in new] == [("run.queued", "system", fence.attempt_id)]
    assert new[0].payload == {"from": "dispatching", "to": "queued", "reason": "lease_expired"}
    keys = harness.db.raw(
        "SELECT dedupe_key FROM run_events WHERE run_id = ? AND type = 'run.queued'", (fence.run_id,)
    )
    assert f"run-transition:{_version_before_requeue(harness, fence.run_id)}:queued" in [
        k["dedupe_key"] for k in keys
    ]


def test_a_leased_row_whose_attempt_already_ended_is_released_without_touching_the_run(
    harness: Harness,
) -> None:
    # Given a lease still marked leased while its attempt is already over (a repair case)
    project, fence = _claimed(harness)
    harness.db.raw("UPDATE run_attempts SET status = 'released' WHERE id = ?", (fence.attempt_id,))
    status = run_of(harness.db, project, fence.run_id).status
    harness.advance_clock(LEASE_MS)

    # When expiry reaches it, then the lease and the slot are freed and nothing else changes
    assert _expire(harness, fence.attempt_id) == "released"
    assert _lease(harness, fence.attempt_id)["release_reason"] == "lease_expired"
    assert _active(harness) == 0
    assert run_of(harness.db, project, fence.run_id).status == status


def _retry_wait(harness: Harness, max_attempts: int = 3) -> tuple[Any, Any]:
    project, fence = _claimed(harness, max_attempts=max_attempts, retry_safe=True)
    start(harness.db, _as_offer(fence))
    harness.advance_clock(LEASE_MS)
    assert _expire(harness, fence.attempt_id) == "lost"
    run = run_of(harness.db, project, fence.run_id)
    assert run.status == "retry_wait"
    return project, run


def _as_offer(fence: LeaseFence) -> Any:
    class _Offer:
        pass

    offer = _Offer()
    offer.fence = fence  # type: ignore[attr-defined]
    return offer


def _due_at(harness: Harness, run_id: str) -> int:
    return int(
        harness.db.raw("SELECT next_retry_at_ms FROM run_retry_policies WHERE run_id = ?", (run_id,))[0][
            "next_retry_at_ms"
        ]
    )


def _admit(harness: Harness, run_id: str) -> str | None:
    result: str | None = harness.db.transaction(lambda tx: lease_expiry.admit_retry(tx, run_id))
    return result


def test_a_retry_is_admitted_at_its_due_instant_with_a_new_attempt_and_an_event(harness: Harness) -> None:
    project, run = _retry_wait(harness)
    due = _due_at(harness, run.id)
    assert _admit(harness, run.id) is None
    harness.advance_clock(due - harness.now_ms())  # exactly due on SQLite, a few ms later on PostgreSQL
    before = len(_events(harness, run.id))

    admitted: list[str | None] = []
    assert _woken(harness, "runs", lambda: admitted.append(_admit(harness, run.id)))

    attempt_id = admitted[0]
    assert attempt_id is not None
    after = run_of(harness.db, project, run.id)
    assert (after.status, after.error_code) == ("queued", None)
    assert after.queued_at_ms is not None and after.queued_at_ms >= due
    if harness.dialect == "sqlite":
        assert after.queued_at_ms == due
    new = _events(harness, run.id)[before:]
    assert [(e.type, e.actor_type, e.attempt_id) for e in new] == [("run.queued", "system", attempt_id)]
    assert new[0].payload == {"from": "retry_wait", "to": "queued", "attempt": 2}
    keys = harness.db.raw(
        "SELECT dedupe_key FROM run_events WHERE run_id = ? AND type = 'run.queued' AND attempt_id = ?",
        (run.id, attempt_id),
    )
    assert [k["dedupe_key"] for k in keys] == [f"run-transition:{run.version}:queued"]


def test_a_cancel_requested_while_waiting_for_the_retry_is_never_admitted(harness: Harness) -> None:
    project, run = _retry_wait(harness)
    harness.db.raw(
        "UPDATE runs SET cancel_requested_at_ms = 1, cancel_reason = 'user' WHERE id = ?", (run.id,)
    )
    harness.advance_clock(_due_at(harness, run.id) - harness.now_ms())
    attempts = count(harness.db, "run_attempts")

    assert _admit(harness, run.id) is None

    assert count(harness.db, "run_attempts") == attempts
    assert run_of(harness.db, project, run.id).status == "retry_wait"


def test_admission_re_checks_the_attempt_budget_when_it_is_due(harness: Harness) -> None:
    # Given a run waiting for attempt 2 whose policy now allows only the one attempt it had
    _project, run = _retry_wait(harness, max_attempts=3)
    harness.db.raw("UPDATE run_retry_policies SET max_attempts = 1 WHERE run_id = ?", (run.id,))
    harness.advance_clock(_due_at(harness, run.id) - harness.now_ms())

    assert _admit(harness, run.id) is None
    assert count(harness.db, "run_attempts") == 1


def test_admission_needs_the_latest_attempt_to_be_lost(harness: Harness) -> None:
    _project, run = _retry_wait(harness)
    harness.db.raw("UPDATE run_attempts SET status = 'failed' WHERE run_id = ?", (run.id,))
    harness.advance_clock(_due_at(harness, run.id) - harness.now_ms())

    assert _admit(harness, run.id) is None
    assert count(harness.db, "run_attempts") == 1


def test_a_run_that_left_retry_wait_is_never_admitted(harness: Harness) -> None:
    # Given a run whose retry became due after it had already ended some other way
    project, run = _retry_wait(harness)
    harness.db.raw("UPDATE runs SET status = 'failed', finished_at_ms = 1 WHERE id = ?", (run.id,))
    harness.advance_clock(_due_at(harness, run.id) - harness.now_ms())

    assert _admit(harness, run.id) is None
    assert count(harness.db, "run_attempts") == 1
    assert run_of(harness.db, project, run.id).status == "failed"


def _version_before_requeue(harness: Harness, run_id: str) -> int:
    return int(harness.db.raw("SELECT version FROM runs WHERE id = ?", (run_id,))[0]["version"]) - 1


def test_an_attempt_that_only_acknowledged_starting_is_lost_when_its_lease_expires(harness: Harness) -> None:
    project, fence = _claimed(harness)
    harness.db.transaction(lambda tx: lease_results.ack_starting(tx, fence))
    harness.advance_clock(LEASE_MS)

    assert _expire(harness, fence.attempt_id) == "lost"
    run = run_of(harness.db, project, fence.run_id)
    assert (run.status, run.error_code) == ("failed", "LEASE_EXPIRED")
    assert _active(harness) == 0


def test_a_completed_lease_listed_as_expired_is_left_alone(harness: Harness) -> None:
    project, fence = _claimed(harness)
    start(harness.db, _as_offer(fence))
    harness.db.transaction(
        lambda tx: lease_results.complete(
            tx, fence, callback_sequence=1, callback_token="cb-token", exit_code=0
        )
    )
    harness.advance_clock(LEASE_MS * 2)
    before = len(_events(harness, fence.run_id))

    assert _expire(harness, fence.attempt_id) == "noop"

    assert _lease(harness, fence.attempt_id)["status"] == "completed"
    assert run_of(harness.db, project, fence.run_id).status == "succeeded"
    assert len(_events(harness, fence.run_id)) == before
