"""Which rows the lease paths lock, and in which order (docs/dispatch.md: Run -> Attempt -> worker ->
lease). On PostgreSQL a ``*_lock`` statement is ``SELECT ... FOR UPDATE``; a plain ``*_get`` takes no
lock. A fence read without its row lock, or a lease locked before its run, is a race (or a deadlock)
on PostgreSQL, so the statements themselves are checked here, on both databases; the two-connection
race tests show what they protect."""

from __future__ import annotations

from typing import Any

import pytest

from ql3.application import lease_claims, lease_expiry, lease_results, leases
from ql3.domain.errors import FenceConflict
from ql3.domain.offers import LeaseFence, Offer, derive_lease_token
from ql3.ports.storage import Params, Transaction
from ql3.repositories import leases as lease_repo
from tests.support.databases import Harness
from tests.support.execution_builders import SECRET, StatementLog, dispatcher, queued, register, start


def _offer(harness: Harness, lease_ms: int = 5_000) -> Offer:
    register(harness.db, lease_ms=600_000)
    queued(harness.db)
    offer = dispatcher(harness.db, lease_ms=lease_ms).dispatch_once().offer
    assert offer is not None
    return offer


def _claimed(harness: Harness) -> LeaseFence:
    return _offer(harness).fence


def test_the_fence_is_read_under_the_lease_row_lock(harness: Harness) -> None:
    fence = _claimed(harness)
    log: list[StatementLog] = []

    def renew(tx: Transaction) -> Any:
        log.append(StatementLog(tx))
        return leases.renew(log[0], fence, 5_000)

    harness.db.transaction(renew)

    # (fence_lock: the lease row locked and the worker read, in one statement)
    assert log[0].locks()[0] == "fence_lock"
    assert "lease_get" not in log[0].names[: log[0].names.index("lease_renew")]


def test_a_claim_locks_run_attempt_worker_then_the_lease_row_it_reacquires(sqlite_harness: Harness) -> None:
    # On PostgreSQL the claim is one statement (the ql3_claim function): the same order is proven by
    # blocking each of its four rows in turn (tests/contract/test_pg_round_trips.py).
    harness = sqlite_harness
    # Given an attempt whose first lease expired unstarted (its row stays, released)
    fence = _claimed(harness)
    harness.advance_clock(5_000)
    assert harness.db.transaction(lambda tx: lease_expiry.expire_lease(tx, fence.attempt_id)) == "released"
    w = harness.db.raw("SELECT * FROM workers WHERE worker_id = 'w1'")[0]
    log: list[StatementLog] = []

    def claim(tx: Transaction) -> lease_claims.RunClaim:
        log.append(StatementLog(tx))
        return lease_claims.claim(
            log[0],
            run_id=fence.run_id,
            attempt_id=fence.attempt_id,
            worker_id="w1",
            session_id=w["session_id"],
            worker_generation=int(w["generation"]),
            token_for_generation=lambda g: derive_lease_token(SECRET, fence.attempt_id, g),
            lease_ms=5_000,
        )

    assert harness.db.transaction(claim).status == "claimed"

    names = log[0].names
    assert log[0].locks()[:4] == ["run_lock", "attempt_lock_with_latest", "worker_lock", "lease_lock"]
    assert names.index("lease_insert_claim") < names.index("lease_lock")
    assert names.index("lease_lock") < names.index("lease_reacquire_claim")


@pytest.mark.parametrize("stage", ["claimed", "running"])
def test_expiry_peeks_at_the_lease_then_locks_run_attempt_and_lease_in_order(
    harness: Harness, stage: str
) -> None:
    offer = _offer(harness, lease_ms=600_000 if stage == "running" else 5_000)
    fence = offer.fence
    if stage == "running":
        start(harness.db, offer)
    harness.advance_clock(600_000)
    log: list[StatementLog] = []

    def expire(tx: Transaction) -> str:
        log.append(StatementLog(tx))
        return lease_expiry.expire_lease(log[0], fence.attempt_id)

    assert harness.db.transaction(expire) == ("released" if stage == "claimed" else "lost")

    # The first read takes no lock (the run is not locked yet); the lease is locked after its run
    assert log[0].locks()[:4] == ["lease_get", "run_lock", "attempt_lock", "lease_lock"]


def test_a_renewal_that_loses_its_compare_and_set_is_fenced_as_a_version_mismatch(harness: Harness) -> None:
    # Given a live lease
    fence = _claimed(harness)

    # When another renewal of the same version commits between the fence check and this renewal's write
    def renewed_first(tx: Transaction, params: Params) -> None:
        assert tx.run("lease_renew", params) == 1

    with pytest.raises(FenceConflict) as caught:
        harness.db.transaction(
            lambda tx: leases.renew(StatementLog(tx, {"lease_renew": renewed_first}), fence, 5_000)
        )

    # Then this renewal is refused with the version reason and nothing of it stands (the stand-in for
    # the other writer shares this transaction, so it is rolled back with it)
    assert caught.value.details == {"reason": "version_mismatch"}
    (lease,) = harness.db.raw("SELECT version, expires_at_ms FROM run_leases")
    assert int(lease["version"]) == fence.lease_version


@pytest.mark.parametrize("ending", ["complete", "start_failure"])
def test_an_ending_reads_its_lease_once_under_the_row_lock_and_frees_the_slot(
    harness: Harness, ending: str
) -> None:
    # Given a running attempt (or, for a start failure, one that is starting)
    offer = _offer(harness, lease_ms=600_000)
    fence = offer.fence
    if ending == "complete":
        start(harness.db, offer)
    else:
        harness.db.transaction(lambda tx: lease_results.ack_starting(tx, fence))
    log: list[StatementLog] = []

    def end(tx: Transaction) -> Any:
        log.append(StatementLog(tx))
        if ending == "complete":
            return lease_results.complete(
                log[0], fence, callback_sequence=1, callback_token="cb-token", exit_code=0
            )
        return lease_results.ack_start_failure(log[0], fence, error_code="spawn_failed")

    # When it ends
    harness.db.transaction(end)

    # Then the fence's read of the lease under its lock (with the Run and the Attempt before it, in one
    # statement) is the only one: the lease is completed from it
    names = log[0].names
    assert names.count("fence_lock") == 1, names
    assert "lease_lock" not in names and "lease_get" not in names, names
    assert names.index("fence_lock") < names.index("lease_complete")
    (lease,) = harness.db.raw("SELECT status FROM run_leases WHERE attempt_id = ?", (fence.attempt_id,))
    assert lease["status"] == "completed"
    (worker,) = harness.db.raw("SELECT active_leases FROM workers WHERE worker_id = ?", (fence.worker_id,))
    assert int(worker["active_leases"]) == 0


@pytest.mark.parametrize("ending", ["complete", "lost"])
def test_an_ending_whose_lease_compare_and_set_loses_frees_no_slot_of_its_own(
    harness: Harness, ending: str
) -> None:
    # Given a running attempt holding one slot of its worker
    offer = _offer(harness, lease_ms=600_000)
    fence = offer.fence
    start(harness.db, offer)
    statement = "lease_complete" if ending == "complete" else "lease_release"

    # When another writer ends the same lease version (and frees its slot) just before this ending's
    # compare-and-set on the lease row
    def ended_first(tx: Transaction, params: Params) -> None:
        if statement == "lease_complete":  # which frees the slot itself on PostgreSQL
            row = tx.one(statement, params)
            assert row is not None
            if not int(row["slot_freed"]):
                lease_repo.adjust_active_leases(tx, fence.worker_id, -1)
            return
        assert tx.run(statement, params) == 1
        lease_repo.adjust_active_leases(tx, fence.worker_id, -1)  # a no-op on SQLite: its trigger did

    def end(tx: Transaction) -> Any:
        log = StatementLog(tx, {statement: ended_first})
        if ending == "complete":
            return lease_results.complete(
                log, fence, callback_sequence=1, callback_token="cb-token", exit_code=0
            )
        return lease_expiry.mark_lost(log, fence.run_id, fence.attempt_id, error_code="LEASE_EXPIRED")

    harness.db.transaction(end)

    # Then the slot is freed once, by the writer whose compare-and-set applied, never a second time
    (worker,) = harness.db.raw("SELECT active_leases FROM workers WHERE worker_id = ?", (fence.worker_id,))
    assert int(worker["active_leases"]) == 0
    (lease,) = harness.db.raw("SELECT status FROM run_leases WHERE attempt_id = ?", (fence.attempt_id,))
    assert lease["status"] == ("completed" if ending == "complete" else "released")
