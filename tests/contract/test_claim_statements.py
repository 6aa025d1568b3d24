"""The claim path's folded statements (docs/dispatch.md), on both databases: a first lease and a
reacquired one each move the worker's slot counter exactly once, an attempt that is no longer the
run's latest is never leased, and two dispatchers on two real connections racing over the same
runs leave every worker's counter equal to its live leases."""

from __future__ import annotations

from typing import Any

from ql3.application import lease_claims, lease_expiry
from ql3.domain.ids import new_id
from ql3.domain.offers import derive_lease_token
from tests.support.databases import Harness
from tests.support.execution_builders import SECRET, dispatcher, queued, race_two_dispatchers, register

RACE_RUNS = 200


def _counters(harness: Harness) -> dict[str, int]:
    return {r["worker_id"]: int(r["active_leases"]) for r in harness.db.raw("SELECT * FROM workers")}


def _live_leases(harness: Harness) -> dict[str, int]:
    rows = harness.db.raw(
        "SELECT worker_id, count(*) AS n FROM run_leases WHERE status = 'leased' GROUP BY worker_id"
    )
    return {r["worker_id"]: int(r["n"]) for r in rows}


def test_a_first_lease_and_a_reacquired_one_each_take_one_slot(harness: Harness) -> None:
    # Given one worker and one queued run
    register(harness.db, "w1", slots=4, lease_ms=600_000)
    queued(harness.db)
    d = dispatcher(harness.db, lease_ms=5_000)

    # When the run is claimed (its attempt's first lease)
    first = d.dispatch_once().offer

    # Then the lease is generation 1 and the worker's counter moved once
    assert first is not None and first.fence.lease_generation == 1
    assert _counters(harness) == {"w1": 1} == _live_leases(harness)

    # When the unstarted claim expires and the run is claimed again (the lease row is reacquired)
    harness.advance_clock(5_001)
    assert (
        harness.db.transaction(lambda tx: lease_expiry.expire_lease(tx, first.fence.attempt_id)) == "released"
    )
    assert _counters(harness) == {"w1": 0}
    again = d.dispatch_once().offer

    # Then it is the same attempt at generation 2, one lease row, and the counter moved once more
    assert again is not None and again.fence.attempt_id == first.fence.attempt_id
    assert again.fence.lease_generation == 2
    assert _counters(harness) == {"w1": 1} == _live_leases(harness)
    assert harness.db.raw("SELECT count(*) AS n FROM run_leases")[0]["n"] == 1


def test_a_live_lease_is_not_taken_again_and_takes_no_slot(harness: Harness) -> None:
    # Given a run whose attempt holds a live lease on w1
    register(harness.db, "w1", slots=4, lease_ms=600_000)
    register(harness.db, "w2", slots=4, lease_ms=600_000)
    _, _, (run,) = queued(harness.db)
    offer = dispatcher(harness.db, lease_ms=600_000).dispatch_once().offer
    assert offer is not None
    holder = offer.fence.worker_id
    other = "w2" if holder == "w1" else "w1"
    w = harness.db.raw("SELECT * FROM workers WHERE worker_id = ?", (other,))[0]
    harness.db.raw("UPDATE runs SET status = 'queued' WHERE id = ?", (run.id,))  # a stale candidate

    # When a claim for the same attempt reaches the lease statement for the other worker
    result = harness.db.transaction(
        lambda tx: lease_claims.claim(
            tx,
            run_id=run.id,
            attempt_id=offer.fence.attempt_id,
            worker_id=other,
            session_id=w["session_id"],
            worker_generation=int(w["generation"]),
            token_for_generation=lambda g: derive_lease_token(SECRET, offer.fence.attempt_id, g),
            lease_ms=600_000,
        )
    )

    # Then it is refused as leased, the lease is untouched and no slot of the other worker is taken
    assert result.status == "leased" and result.lease is None
    lease = harness.db.raw("SELECT * FROM run_leases")[0]
    assert lease["worker_id"] == holder and int(lease["lease_generation"]) == 1
    assert _counters(harness) == {holder: 1, other: 0}


def test_an_attempt_that_is_not_the_latest_is_not_leased(harness: Harness) -> None:
    # Given a queued run whose attempt 1 is claimed, and then a newer attempt 2 of the same run
    register(harness.db, "w1", slots=4, lease_ms=600_000)
    _, _, (run,) = queued(harness.db)
    old = harness.db.raw("SELECT * FROM run_attempts WHERE run_id = ?", (run.id,))[0]
    newer = new_id()
    harness.db.raw(
        "INSERT INTO run_attempts (id, run_id, attempt, status, executor_type, created_at_ms)"
        " VALUES (?, ?, 2, 'claimed', ?, ?)",
        (newer, run.id, old["executor_type"], int(old["created_at_ms"])),
    )
    w = harness.db.raw("SELECT * FROM workers")[0]

    def claim(attempt_id: str) -> Any:
        return harness.db.transaction(
            lambda tx: lease_claims.claim(
                tx,
                run_id=run.id,
                attempt_id=attempt_id,
                worker_id="w1",
                session_id=w["session_id"],
                worker_generation=int(w["generation"]),
                token_for_generation=lambda g: derive_lease_token(SECRET, attempt_id, g),
                lease_ms=600_000,
            )
        )

    # When the old attempt is claimed, then it is not eligible and nothing is written
    assert claim(old["id"]).status == "not_eligible"
    assert harness.db.raw("SELECT count(*) AS n FROM run_leases")[0]["n"] == 0
    assert _counters(harness) == {"w1": 0}

    # And the latest attempt is claimed normally
    latest = claim(newer)
    assert latest.status == "claimed" and latest.lease is not None and latest.lease.attempt_id == newer
    assert _counters(harness) == {"w1": 1}


def test_two_dispatchers_racing_leave_every_counter_equal_to_its_live_leases(harness: Harness) -> None:
    # Given runs for two workers with room for all of them
    register(harness.db, "w1", slots=1024, lease_ms=600_000)
    register(harness.db, "w2", slots=1024, lease_ms=600_000)
    queued(harness.db, n=RACE_RUNS)
    # When two dispatchers on two real connections claim concurrently
    claimed = race_two_dispatchers(harness)

    # Then every run was claimed once and each worker's counter equals its live leases
    assert len(claimed) == RACE_RUNS == len(set(claimed))
    counters = _counters(harness)
    assert counters == _live_leases(harness) and sum(counters.values()) == RACE_RUNS
