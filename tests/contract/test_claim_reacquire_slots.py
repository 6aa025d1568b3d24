"""A claim that re-acquires an expired lease row that is still ``leased`` (the expiry loop has not run
yet) moves the slot from the old holder to the new one: each worker's busy counter equals its
``leased`` leases afterwards, whether the new holder is another worker or the same one.

No public path queues a run while its attempt's lease is still ``leased`` today (lease expiry releases
the row before the run goes back to the queue), so the stale candidate is written directly; the claim
must still keep the counters true when it meets one (docs/dispatch.md, "Worker slots")."""

from __future__ import annotations

from typing import Any

import pytest

from ql3.application import lease_claims, lease_results, leases, runs
from ql3.domain.offers import derive_lease_token
from tests.support.databases import Harness
from tests.support.execution_builders import SECRET, busy_and_leased, queued, register

LEASE_MS = 5_000


def _claim(harness: Harness, run_id: str, attempt_id: str, worker_id: str) -> lease_claims.RunClaim:
    (w,) = harness.db.raw("SELECT * FROM workers WHERE worker_id = ?", (worker_id,))
    result: lease_claims.RunClaim = harness.db.transaction(
        lambda tx: lease_claims.claim(
            tx,
            run_id=run_id,
            attempt_id=attempt_id,
            worker_id=worker_id,
            session_id=str(w["session_id"]),
            worker_generation=int(w["generation"]),
            token_for_generation=lambda g: derive_lease_token(SECRET, attempt_id, g),
            lease_ms=LEASE_MS,
        )
    )
    return result


def _stale_claimed_run(harness: Harness) -> tuple[Any, str, str]:
    """w1 holds the attempt's lease, now expired but still ``leased``, and the run is queued again."""
    register(harness.db, "w1", lease_ms=600_000)
    register(harness.db, "w2", lease_ms=600_000)
    project, _, (run,) = queued(harness.db)
    attempt = harness.db.transaction(lambda tx: runs.latest_attempt(tx, run.id), write=False)
    assert _claim(harness, run.id, attempt.id, "w1").status == "claimed"
    harness.db.raw("UPDATE runs SET status = 'queued' WHERE id = ?", (run.id,))
    harness.advance_clock(LEASE_MS)
    return project, run.id, attempt.id


@pytest.mark.parametrize("new_holder", ["w1", "w2"])
def test_reacquiring_an_expired_leased_row_moves_the_slot_to_the_new_holder(
    harness: Harness, new_holder: str
) -> None:
    # Given w1's expired, still-leased claim of a queued run
    _project, run_id, attempt_id = _stale_claimed_run(harness)
    assert busy_and_leased(harness.db) == [("w1", 1, 1), ("w2", 0, 0)]

    # When a worker claims it again (another worker, or w1 itself)
    result = _claim(harness, run_id, attempt_id, new_holder)

    # Then the row is the next generation of the new holder, and every busy counter equals the
    # worker's leased leases: one slot, the new holder's, none left behind with w1
    assert result.status == "claimed" and result.lease is not None
    assert (result.lease.worker_id, result.lease.lease_generation) == (new_holder, 2)
    busy = {worker_id: (n, leased) for worker_id, n, leased in busy_and_leased(harness.db)}
    assert busy == {w: (1, 1) if w == new_holder else (0, 0) for w in ("w1", "w2")}


def test_a_reacquired_row_ends_with_every_slot_free(harness: Harness) -> None:
    # Given w1's expired claim re-acquired by w2, and the run started and completed by w2
    _project, run_id, attempt_id = _stale_claimed_run(harness)
    result = _claim(harness, run_id, attempt_id, "w2")
    assert result.lease is not None
    fence = leases.fence_of(result.lease, derive_lease_token(SECRET, attempt_id, 2))
    harness.db.transaction(lambda tx: lease_results.ack_starting(tx, fence))
    harness.db.transaction(lambda tx: lease_results.ack_start_failure(tx, fence, error_code="ENOENT"))

    # Then no slot is busy anywhere: the ending freed w2's, and w1's went with the re-acquire
    assert busy_and_leased(harness.db) == [("w1", 0, 0), ("w2", 0, 0)]
