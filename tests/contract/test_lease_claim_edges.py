"""The edges of the atomic claim (``lease_claims.claim``): the event it writes, each reason a worker cannot
take the run, the instant an earlier lease of the attempt may be taken again, a completed lease that
never is, and the answers to a concurrent writer that got to the lease row first."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ql3.application import lease_claims, lease_expiry, leases, runs
from ql3.domain.errors import NotFound
from ql3.domain.ids import new_id
from ql3.domain.offers import derive_lease_token
from ql3.ports.storage import Params, Transaction
from tests.support.builders import count
from tests.support.databases import Harness
from tests.support.execution_builders import SECRET, StatementLog, queued, register, run_of

LEASE_MS = 5_000


def _queued(harness: Harness, *, session_ms: int = 600_000) -> tuple[Any, str, str]:
    register(harness.db, lease_ms=session_ms)
    project, _, (run,) = queued(harness.db)
    attempt = harness.db.transaction(lambda tx: runs.latest_attempt(tx, run.id), write=False)
    return project, run.id, attempt.id


def _worker(harness: Harness, worker_id: str = "w1") -> dict[str, Any]:
    row: dict[str, Any] = harness.db.raw("SELECT * FROM workers WHERE worker_id = ?", (worker_id,))[0]
    return row


def _claim(
    harness: Harness,
    run_id: str,
    attempt_id: str,
    *,
    worker_id: str = "w1",
    session_id: str | None = None,
    generation: int | None = None,
    first: dict[str, Any] | None = None,
) -> lease_claims.RunClaim:
    w = _worker(harness)
    result: lease_claims.RunClaim = harness.db.transaction(
        lambda tx: lease_claims.claim(
            StatementLog(tx, first) if first else tx,
            run_id=run_id,
            attempt_id=attempt_id,
            worker_id=worker_id,
            session_id=session_id or str(w["session_id"]),
            worker_generation=int(w["generation"]) if generation is None else generation,
            token_for_generation=lambda g: derive_lease_token(SECRET, attempt_id, g),
            lease_ms=LEASE_MS,
        )
    )
    return result


def _lease(harness: Harness) -> dict[str, Any]:
    (row,) = harness.db.raw("SELECT * FROM run_leases")
    return dict(row)


def _expire(harness: Harness, attempt_id: str) -> None:
    harness.advance_clock(LEASE_MS)
    assert harness.db.transaction(lambda tx: lease_expiry.expire_lease(tx, attempt_id)) == "released"


def test_each_claim_writes_one_dispatching_event_naming_the_worker_and_the_lease_generation(
    harness: Harness,
) -> None:
    project, run_id, attempt_id = _queued(harness)
    for generation in (1, 2):  # the first lease, then the same attempt's row reacquired
        version = run_of(harness.db, project, run_id).version
        before = count(harness.db, "run_events")

        result = _claim(harness, run_id, attempt_id)

        assert result.status == "claimed" and result.lease is not None
        assert result.lease.lease_generation == generation
        new = harness.db.transaction(lambda tx: runs.list_events(tx, run_id, after=0, limit=100))[before:]
        assert [(e.type, e.actor_type, e.actor_id, e.attempt_id) for e in new] == [
            ("run.dispatching", "system", None, attempt_id)
        ]
        assert new[0].payload == {
            "from": "queued",
            "to": "dispatching",
            "worker_id": "w1",
            "lease_generation": generation,
        }
        (key,) = harness.db.raw("SELECT dedupe_key FROM run_events WHERE id = ?", (new[0].id,))
        assert key["dedupe_key"] == f"run-transition:{version}:dispatching"
        if generation == 1:
            _expire(harness, attempt_id)  # the unstarted claim returns the run to the queue


@pytest.mark.parametrize("state", ["retry_wait", "waiting_approval", "cancel_requested"])
def test_a_run_that_is_not_a_queued_candidate_is_not_eligible_and_nothing_is_claimed(
    harness: Harness, state: str
) -> None:
    # Given a run whose attempt is claimed and has no lease, but the run is not queued, or is queued
    # with a committed cancel request (the candidate page read before that change committed)
    project, run_id, attempt_id = _queued(harness)
    if state == "cancel_requested":
        harness.db.raw("UPDATE runs SET cancel_requested_at_ms = created_at_ms WHERE id = ?", (run_id,))
    else:
        harness.db.raw("UPDATE runs SET status = ? WHERE id = ?", (state, run_id))
    before = run_of(harness.db, project, run_id)

    # Then the claim answers not_eligible and writes nothing: no lease, no slot, the run as it was
    assert _claim(harness, run_id, attempt_id).status == "not_eligible"
    assert count(harness.db, "run_leases") == 0
    assert run_of(harness.db, project, run_id) == before
    assert int(_worker(harness)["active_leases"]) == 0


@pytest.mark.parametrize("status", ["starting", "lost"])
def test_a_latest_attempt_that_is_not_claimed_is_not_eligible_and_nothing_is_claimed(
    harness: Harness, status: str
) -> None:
    # Given a queued run whose latest attempt has left claimed (the page read it before that committed)
    project, run_id, attempt_id = _queued(harness)
    harness.db.raw("UPDATE run_attempts SET status = ? WHERE id = ?", (status, attempt_id))
    before = run_of(harness.db, project, run_id)

    # Then the claim answers not_eligible (not a conflict) and writes nothing
    assert _claim(harness, run_id, attempt_id).status == "not_eligible"
    assert count(harness.db, "run_leases") == 0
    assert run_of(harness.db, project, run_id) == before
    assert int(_worker(harness)["active_leases"]) == 0


@pytest.mark.parametrize("change", ["missing", "session", "generation", "draining", "offline"])
def test_a_worker_that_may_not_take_work_is_unavailable_and_nothing_is_claimed(
    harness: Harness, change: str
) -> None:
    # Given a queued run and a worker that is not (or no longer) the one asking, or not online
    project, run_id, attempt_id = _queued(harness)
    args: dict[str, Any] = {}
    if change == "missing":
        args["worker_id"] = "w9"
    elif change == "session":
        args["session_id"] = "01a00000-0000-7000-8000-0000000000bb"
    elif change == "generation":
        args["generation"] = int(_worker(harness)["generation"]) + 1
    else:
        harness.db.raw("UPDATE workers SET status = ? WHERE worker_id = 'w1'", (change,))

    # Then the claim answers worker_unavailable and writes nothing
    assert _claim(harness, run_id, attempt_id, **args).status == "worker_unavailable"
    assert count(harness.db, "run_leases") == 0
    assert run_of(harness.db, project, run_id).status == "queued"
    assert int(_worker(harness)["active_leases"]) == 0


def test_a_worker_whose_session_ends_at_that_instant_is_unavailable(harness: Harness) -> None:
    _project, run_id, attempt_id = _queued(harness, session_ms=5_000)
    harness.advance_clock(5_000)  # the session lease's expiry instant
    assert _claim(harness, run_id, attempt_id).status == "worker_unavailable"
    assert count(harness.db, "run_leases") == 0


def _at_the_claims_instant(harness: Harness) -> str:
    """The statement just before which a test moves a row to the claim's own instant: the first the
    claim runs after the run lock (on PostgreSQL the claim is one call of ql3_claim). The PostgreSQL
    clock runs on between transactions, so only a write in the claim's transaction, from its
    ``now_ms()``, lands exactly on that instant."""
    return "attempt_lock_with_latest" if harness.dialect == "sqlite" else "lease_claim"


def test_a_worker_whose_session_ends_exactly_at_the_claims_instant_is_unavailable(harness: Harness) -> None:
    # Given a queued run and a worker whose session lease is moved, in the claim's transaction, to end
    # at that transaction's instant
    project, run_id, attempt_id = _queued(harness)
    w = _worker(harness)

    def session_ends_now(tx: Transaction, _params: Params) -> None:
        now = tx.now_ms()
        ended = {
            "worker_id": "w1",
            "session_id": w["session_id"],
            "generation": int(w["generation"]),
            "expected_version": int(w["version"]),
            "status": "online",
            "last_heartbeat_at_ms": now,
            "lease_expires_at_ms": now,
            "now": now,
        }
        assert tx.run("worker_cas", ended) == 1

    # When it claims the run at that instant
    result = _claim(harness, run_id, attempt_id, first={_at_the_claims_instant(harness): session_ends_now})

    # Then the worker is unavailable (its session is over at its expiry instant) and nothing is claimed
    assert (result.status, result.lease) == ("worker_unavailable", None)
    assert count(harness.db, "run_leases") == 0
    assert run_of(harness.db, project, run_id).status == "queued"


def test_an_unknown_attempt_is_not_found_and_nothing_is_claimed(harness: Harness) -> None:
    project, run_id, _ = _queued(harness)
    with pytest.raises(NotFound) as caught:
        _claim(harness, run_id, new_id())
    assert caught.value.message == "attempt not found"
    assert count(harness.db, "run_leases") == 0
    assert run_of(harness.db, project, run_id).status == "queued"


def test_an_unknown_run_is_not_found_and_nothing_is_claimed(harness: Harness) -> None:
    project, run_id, attempt_id = _queued(harness)
    with pytest.raises(NotFound) as caught:
        _claim(harness, new_id(), attempt_id)
    assert caught.value.message == "run not found"
    assert count(harness.db, "run_leases") == 0
    assert run_of(harness.db, project, run_id).status == "queued"
    assert int(_worker(harness)["active_leases"]) == 0


def _stale_candidate(harness: Harness, run_id: str) -> None:
    """The run is queued again while its attempt's lease row is as the test left it."""
    harness.db.raw("UPDATE runs SET status = 'queued' WHERE id = ?", (run_id,))


def test_a_leased_row_is_taken_again_at_its_expiry_instant_and_not_before(harness: Harness) -> None:
    # Given a claimed attempt whose lease row is still leased, and its run a candidate again
    _project, run_id, attempt_id = _queued(harness)
    assert _claim(harness, run_id, attempt_id).status == "claimed"
    _stale_candidate(harness, run_id)

    if harness.dialect == "sqlite":  # the injected clock stands still: one millisecond before, it is live
        harness.advance_clock(LEASE_MS - 1)
        assert _claim(harness, run_id, attempt_id).status == "leased"
        assert int(_lease(harness)["lease_generation"]) == 1
        harness.advance_clock(1)
    else:  # the database clock runs on: well before the expiry, it is live
        harness.advance_clock(LEASE_MS // 2)
        assert _claim(harness, run_id, attempt_id).status == "leased"
        assert int(_lease(harness)["lease_generation"]) == 1
        harness.advance_clock(LEASE_MS - LEASE_MS // 2)

    # When it is claimed at the lease's expiry instant, the row is reacquired as the next generation
    result = _claim(harness, run_id, attempt_id)
    assert result.status == "claimed" and result.lease is not None
    assert result.lease.lease_generation == 2 == int(_lease(harness)["lease_generation"])


def test_a_leased_row_expiring_exactly_at_the_claims_instant_is_taken_again(harness: Harness) -> None:
    # Given a claimed attempt whose lease row is still leased, its run a candidate again, and the
    # row's expiry moved (in the claim's transaction) to that transaction's instant
    _project, run_id, attempt_id = _queued(harness)
    assert _claim(harness, run_id, attempt_id).status == "claimed"
    _stale_candidate(harness, run_id)
    harness.advance_clock(1)  # a lease must end after it was renewed (run_leases_check)

    def expires_now(tx: Transaction, _params: Params) -> None:
        row = tx.one("lease_get", {"attempt_id": attempt_id})
        assert row is not None
        renewed = {
            "attempt_id": attempt_id,
            "expected_version": int(row["version"]),
            "expires_at_ms": tx.now_ms(),
        }
        assert tx.run("lease_renew", {**renewed, "now": int(row["acquired_at_ms"])}) == 1

    # When it is claimed at that instant
    result = _claim(harness, run_id, attempt_id, first={_at_the_claims_instant(harness): expires_now})

    # Then the row is no longer live: it is reacquired as the next generation
    assert result.status == "claimed" and result.lease is not None
    assert result.lease.lease_generation == 2 == int(_lease(harness)["lease_generation"])


def test_a_claim_changes_no_other_run_or_attempt(harness: Harness) -> None:
    # Given two queued runs at the same version, their attempts claimed at the same callback sequence
    register(harness.db, lease_ms=600_000)
    project, _, (a, b) = queued(harness.db, 2)
    attempt_a = harness.db.transaction(lambda tx: runs.latest_attempt(tx, a.id), write=False)
    attempt_b = harness.db.transaction(lambda tx: runs.latest_attempt(tx, b.id), write=False)
    before = run_of(harness.db, project, b.id)
    assert (a.version, attempt_a.callback_sequence) == (before.version, attempt_b.callback_sequence)

    # When the first is claimed
    assert _claim(harness, a.id, attempt_a.id).status == "claimed"

    # Then the other run and its attempt are exactly as they were (each write names its row)
    assert run_of(harness.db, project, b.id) == before
    assert harness.db.transaction(lambda tx: runs.latest_attempt(tx, b.id), write=False) == attempt_b
    claimed = harness.db.transaction(lambda tx: runs.latest_attempt(tx, a.id), write=False)
    assert claimed.worker_id == "w1" and run_of(harness.db, project, a.id).status == "dispatching"


def test_reacquiring_a_lease_row_changes_no_other_attempts_lease(harness: Harness) -> None:
    # Given run A's lease left to expire (still leased: the expiry loop has not ended it) and run B
    # claimed afterwards, so both lease rows are at version 0, B's live
    register(harness.db, lease_ms=600_000)
    project, _, (a, b) = queued(harness.db, 2)
    attempts = {
        r.id: harness.db.transaction(lambda tx, r=r: runs.latest_attempt(tx, r.id), write=False).id
        for r in (a, b)
    }
    assert _claim(harness, a.id, attempts[a.id]).status == "claimed"
    harness.advance_clock(LEASE_MS)
    assert _claim(harness, b.id, attempts[b.id]).status == "claimed"
    _stale_candidate(harness, a.id)

    def lease_of(attempt_id: str) -> dict[str, Any]:
        (row,) = harness.db.raw("SELECT * FROM run_leases WHERE attempt_id = ?", (attempt_id,))
        return dict(row)

    other = lease_of(attempts[b.id])
    assert int(other["version"]) == int(lease_of(attempts[a.id])["version"]) == 0

    # When A's row is reacquired
    result = _claim(harness, a.id, attempts[a.id])

    # Then only A's row moved to its next generation and version: B's lease is exactly as it was
    assert result.status == "claimed" and result.lease is not None and result.lease.lease_generation == 2
    assert (int(lease_of(attempts[a.id])["version"]), result.lease.version) == (1, 1)
    assert lease_of(attempts[b.id]) == other
    assert run_of(harness.db, project, b.id).status == "dispatching"


def test_a_completed_lease_is_never_taken_again(harness: Harness) -> None:
    # Given an attempt whose lease completed, and its run a candidate again
    project, run_id, attempt_id = _queued(harness)
    assert _claim(harness, run_id, attempt_id).status == "claimed"
    harness.db.raw(
        "UPDATE run_leases SET status = 'completed', completed_at_ms = updated_at_ms, version = version + 1"
    )
    _stale_candidate(harness, run_id)
    before = _lease(harness)

    # Then the attempt is not eligible, at any time, and the lease row is untouched
    assert _claim(harness, run_id, attempt_id).status == "not_eligible"
    harness.advance_clock(LEASE_MS * 2)
    assert _claim(harness, run_id, attempt_id).status == "not_eligible"
    assert _lease(harness) == before
    assert run_of(harness.db, project, run_id).status == "queued"


def test_a_lease_released_before_its_expiry_is_reacquired_at_once(harness: Harness) -> None:
    # Given a lease released early (a declined offer), its expiry still ahead
    _project, run_id, attempt_id = _queued(harness)
    assert _claim(harness, run_id, attempt_id).status == "claimed"
    harness.db.raw(
        "UPDATE run_leases SET status = 'released', released_at_ms = updated_at_ms,"
        " release_reason = 'declined', version = version + 1"
    )
    harness.db.raw("UPDATE workers SET active_leases = 0")
    _stale_candidate(harness, run_id)

    result = _claim(harness, run_id, attempt_id)

    assert result.status == "claimed" and result.lease is not None and result.lease.lease_generation == 2
    assert int(_worker(harness)["active_leases"]) == 1


def test_a_lease_row_that_vanishes_before_it_is_locked_is_answered_leased(harness: Harness) -> None:
    # Given an attempt whose first lease expired unstarted (the row stays, released)
    project, run_id, attempt_id = _queued(harness)
    assert _claim(harness, run_id, attempt_id).status == "claimed"
    _expire(harness, attempt_id)

    # When another writer deletes the row between the claim's insert and its lock of the row (on
    # PostgreSQL the claim is one function call; the row goes between the call that found it and
    # the call that reacquires it)
    def delete(tx: Transaction, params: Params) -> None:
        tx.run("retention_delete_run_leases", {"attempt_ids": json.dumps([params["attempt_id"]])})

    before = "lease_lock" if harness.dialect == "sqlite" else "lease_claim#2"
    result = _claim(harness, run_id, attempt_id, first={before: delete})

    # Then the claim answers leased (someone else's business now) and writes nothing
    assert (result.status, result.lease) == ("leased", None)
    assert count(harness.db, "run_leases") == 0
    assert run_of(harness.db, project, run_id).status == "queued"
    assert int(_worker(harness)["active_leases"]) == 0


def test_a_reacquire_that_loses_its_compare_and_set_is_answered_leased(harness: Harness) -> None:
    # Given an attempt whose first lease expired unstarted, and a second worker
    project, run_id, attempt_id = _queued(harness)
    assert _claim(harness, run_id, attempt_id).status == "claimed"
    _expire(harness, attempt_id)
    register(harness.db, "w2", lease_ms=600_000)
    w2 = _worker(harness, "w2")

    # When w2 reacquires the row first, under the version w1's claim read
    def w2_first(tx: Transaction, params: Params) -> None:
        won = {
            **params,
            "worker_id": "w2",
            "worker_session_id": w2["session_id"],
            "worker_generation": int(w2["generation"]),
        }
        assert tx.one("lease_reacquire_claim", won) is not None

    # On PostgreSQL the claim is one function call that names the generation to derive, then a second
    # that reacquires it: w2 takes the row in between and lets it go again, so the row is free but
    # its next generation is no longer the one w1's token was derived for.
    def w2_between(tx: Transaction, params: Params) -> None:
        now = tx.now_ms()
        row = tx.one("lease_get", {"attempt_id": attempt_id})
        assert row is not None
        won = {
            "attempt_id": attempt_id,
            "run_id": run_id,
            "worker_id": "w2",
            "worker_session_id": w2["session_id"],
            "worker_generation": int(w2["generation"]),
            "expires_at_ms": now + LEASE_MS,
            "now": now,
            "lease_token_digest": leases.lease_digest(derive_lease_token(SECRET, attempt_id, 2)),
            "expected_version": int(row["version"]),
        }
        taken = tx.one("lease_reacquire_claim", won)
        assert taken is not None
        released = {"attempt_id": attempt_id, "expected_version": int(taken["version"]), "now": now}
        assert tx.run("lease_release", {**released, "reason": "declined"}) == 1
        tx.run("worker_leases_adjust", {"worker_id": "w2", "delta": -1})

    if harness.dialect == "sqlite":
        result = _claim(harness, run_id, attempt_id, first={"lease_reacquire_claim": w2_first})
    else:
        result = _claim(harness, run_id, attempt_id, first={"lease_claim#2": w2_between})

    # Then w1's claim answers leased: no lease, no slot, no run transition of its own
    assert (result.status, result.lease) == ("leased", None)
    lease = _lease(harness)
    assert (lease["worker_id"], int(lease["lease_generation"])) == ("w2", 2)
    assert int(_worker(harness)["active_leases"]) == 0
    assert run_of(harness.db, project, run_id).status == "queued"
