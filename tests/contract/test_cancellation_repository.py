"""The cancellation repository's own compare-and-set writes: a write from a stale read of a dispatch,
or on a dispatch in the wrong state, changes nothing and says so (the use cases read the row under
its lock first, so only these tests reach the refusals)."""

from __future__ import annotations

from ql3.repositories import cancellation as dispatch_store
from tests.support.cancellation_builders import claim, record, request, running_runs
from tests.support.databases import Harness

OWNER = "sup-b"
DIGEST = "0" * 64


def _row(harness: Harness, run_id: str) -> list[object]:
    return [
        dict(r) for r in harness.db.raw("SELECT * FROM cancellation_dispatches WHERE run_id = ?", (run_id,))
    ]


def test_writes_from_a_stale_read_of_a_leased_dispatch_change_nothing(harness: Harness) -> None:
    # Given a dispatch claimed once (leased@1), and the version 0 it had before the claim
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    claimed = claim(harness.db, fence.run_id)
    assert (claimed.status, claimed.dispatch_version) == ("claimed", 1)
    before = _row(harness, fence.run_id)

    now = harness.db.transaction(lambda tx: tx.now_ms(), write=False)

    # When the repository is asked to lease, settle or rearm it at version 0
    results = harness.db.transaction(
        lambda tx: (
            dispatch_store.lease_dispatch(
                tx,
                fence.run_id,
                expected_version=0,
                owner=OWNER,
                lease_token_digest=DIGEST,
                lease_expires_at_ms=now + 30_000,
                now_ms=now,
            ),
            dispatch_store.settle_dispatch(
                tx,
                fence.run_id,
                expected_version=0,
                status="dispatched",
                next_attempt_at_ms=None,
                result="termination_requested",
                last_dispatched_at_ms=now,
                now_ms=now,
            ),
            dispatch_store.rearm_dispatch(
                tx,
                run_id=fence.run_id,
                project_id=project.id,
                expected_version=1,
                expected_last_result="identity_mismatch",
                next_attempt_at_ms=now + 1_000,
                now_ms=now,
            ),
        )
    )

    # Then every compare-and-set refuses and the row is as it was
    assert results == (False, False, False)
    assert _row(harness, fence.run_id) == before


def test_a_blocked_dispatch_is_neither_leased_nor_settled_and_is_rearmed_only_for_its_result(
    harness: Harness,
) -> None:
    # Given a dispatch blocked by an identity mismatch (blocked@2)
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    settled = record(harness.db, claim(harness.db, fence.run_id), "identity_mismatch")
    assert (settled.status, settled.dispatch_version) == ("blocked", 2)
    before = _row(harness, fence.run_id)
    now = harness.db.transaction(lambda tx: tx.now_ms(), write=False)

    # When it is leased or settled at its own version, or rearmed for another result or project
    refused = harness.db.transaction(
        lambda tx: (
            dispatch_store.lease_dispatch(
                tx,
                fence.run_id,
                expected_version=2,
                owner=OWNER,
                lease_token_digest=DIGEST,
                lease_expires_at_ms=now + 30_000,
                now_ms=now,
            ),
            dispatch_store.settle_dispatch(
                tx,
                fence.run_id,
                expected_version=2,
                status="dispatched",
                next_attempt_at_ms=None,
                result="termination_requested",
                last_dispatched_at_ms=now,
                now_ms=now,
            ),
            dispatch_store.rearm_dispatch(
                tx,
                run_id=fence.run_id,
                project_id=project.id,
                expected_version=2,
                expected_last_result="pid_mismatch",
                next_attempt_at_ms=now + 1_000,
                now_ms=now,
            ),
            dispatch_store.rearm_dispatch(
                tx,
                run_id=fence.run_id,
                project_id="another-project",
                expected_version=2,
                expected_last_result="identity_mismatch",
                next_attempt_at_ms=now + 1_000,
                now_ms=now,
            ),
        )
    )

    # Then each refuses and nothing moved
    assert refused == (False, False, False, False)
    assert _row(harness, fence.run_id) == before

    # And the exact rearm applies once, to retry_wait@3 with the result kept
    rearmed = harness.db.transaction(
        lambda tx: dispatch_store.rearm_dispatch(
            tx,
            run_id=fence.run_id,
            project_id=project.id,
            expected_version=2,
            expected_last_result="identity_mismatch",
            next_attempt_at_ms=now + 1_000,
            now_ms=now,
        )
    )
    assert rearmed
    stored = harness.db.transaction(lambda tx: dispatch_store.lock_dispatch(tx, fence.run_id))
    assert stored is not None
    assert (stored.status, stored.version, stored.last_result, stored.next_attempt_at_ms) == (
        "retry_wait",
        3,
        "identity_mismatch",
        now + 1_000,
    )


def test_the_next_wake_is_the_earliest_deadline_backoff_or_lease_expiry(harness: Harness) -> None:
    # Given two running runs with a deadline: one with an intent whose dispatch is leased
    project, (leased, timed) = running_runs(harness.db, 2, timeout_ms=600_000)
    request(harness.db, project, leased.run_id)
    claimed = claim(harness.db, leased.run_id, lease_ms=30_000)
    assert claimed.status == "claimed" and claimed.lease_expires_at_ms is not None
    deadlines = harness.db.raw("SELECT deadline_at_ms FROM run_attempts WHERE id = ?", (timed.attempt_id,))
    deadline = int(deadlines[0]["deadline_at_ms"])
    assert claimed.lease_expires_at_ms < deadline

    # When the next wake is read for any worker and for the attempts' own worker
    anyone = harness.db.transaction(lambda tx: dispatch_store.next_wake(tx, worker_id=None), write=False)
    own = harness.db.transaction(
        lambda tx: dispatch_store.next_wake(tx, worker_id=leased.worker_id), write=False
    )
    other = harness.db.transaction(lambda tx: dispatch_store.next_wake(tx, worker_id="w-none"), write=False)

    # Then the lease expiry and the other run's deadline are there; no dispatch waits for a backoff
    expected = dispatch_store.NextWake(
        next_deadline_ms=deadline, next_dispatch_ms=None, next_lease_ms=claimed.lease_expires_at_ms
    )
    assert anyone == own == expected
    # And another worker's supervisor sees only the deadlines, which any server may act on
    assert other == dispatch_store.NextWake(
        next_deadline_ms=deadline, next_dispatch_ms=None, next_lease_ms=None
    )
