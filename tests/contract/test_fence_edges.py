"""The edges of the run-lease fence (``leases.check_fence``) and of the claim's eligibility: each
refusal with its exact reason, the expiry instants of the lease and of the worker's session, and the
draining worker that may still renew what it holds."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from ql3.application import lease_claims, lease_expiry, lease_results, leases, runs, workers
from ql3.domain.errors import FenceConflict
from ql3.domain.offers import LeaseFence
from tests.support.builders import count
from tests.support.databases import Harness
from tests.support.execution_builders import SECRET, dispatcher, queued, register, run_of, start

RUN_LEASE_MS = 30_000


def _claimed(harness: Harness, *, session_ms: int = 600_000) -> tuple[Any, LeaseFence]:
    register(harness.db, lease_ms=session_ms)
    project, _, _ = queued(harness.db)
    offer = dispatcher(harness.db).dispatch_once().offer
    assert offer is not None
    return project, offer.fence


def _renew_reason(harness: Harness, fence: LeaseFence) -> str:
    with pytest.raises(FenceConflict) as caught:
        harness.db.transaction(lambda tx: leases.renew(tx, fence, RUN_LEASE_MS))
    return str(caught.value.details["reason"])


def test_an_unknown_attempt_is_missing(harness: Harness) -> None:
    _, fence = _claimed(harness)
    assert (
        _renew_reason(harness, replace(fence, attempt_id="01a00000-0000-7000-8000-0000000000aa")) == "missing"
    )


def test_a_released_lease_is_not_leased(harness: Harness) -> None:
    _, fence = _claimed(harness)
    harness.advance_clock(RUN_LEASE_MS)
    assert harness.db.transaction(lambda tx: lease_expiry.expire_lease(tx, fence.attempt_id)) == "released"
    assert _renew_reason(harness, fence) == "not_leased"


def _ack_reason(harness: Harness, fence: LeaseFence) -> str:
    with pytest.raises(FenceConflict) as caught:
        harness.db.transaction(lambda tx: lease_results.ack_starting(tx, fence))
    return str(caught.value.details["reason"])


def test_a_lease_is_expired_at_its_expiry_instant(harness: Harness) -> None:
    _, fence = _claimed(harness)
    if harness.dialect == "sqlite":  # the injected clock stands still: one millisecond before, it renews
        harness.advance_clock(RUN_LEASE_MS - 1)
        fence = replace(
            fence, lease_version=harness.db.transaction(lambda tx: leases.renew(tx, fence, 5_000)).version
        )
        harness.advance_clock(5_000)
    else:
        harness.advance_clock(RUN_LEASE_MS)
    assert _ack_reason(harness, fence) == "lease_expired"


def test_an_expired_lease_the_scanner_has_not_recovered_renews_while_its_worker_is_live(
    harness: Harness,
) -> None:
    # Given a lease past its expiry, still leased (no scan yet), its worker's session live: a process
    # paused longer than the lease, resumed (docs/reliability.md, "A paused server")
    project, fence = _claimed(harness)
    harness.advance_clock(RUN_LEASE_MS + 1)

    # When its holder renews it
    renewed = harness.db.transaction(lambda tx: leases.renew(tx, fence, RUN_LEASE_MS))

    # Then it is its holder's again, and the scanner finds nothing to expire
    assert renewed.version == fence.lease_version + 1
    assert renewed.expires_at_ms > harness.now_ms()
    assert harness.db.transaction(lambda tx: lease_expiry.expire_lease(tx, fence.attempt_id)) == "noop"
    assert run_of(harness.db, project, fence.run_id).status == "dispatching"


def test_an_expired_lease_of_a_worker_whose_session_lapsed_too_is_not_renewed(harness: Harness) -> None:
    _, fence = _claimed(harness, session_ms=RUN_LEASE_MS)
    harness.advance_clock(RUN_LEASE_MS + 1)
    assert _renew_reason(harness, fence) == "lease_expired"


def test_a_draining_worker_still_renews_what_it_holds(harness: Harness) -> None:
    _, fence = _claimed(harness)
    harness.db.transaction(lambda tx: workers.drain(tx, "w1"))

    renewed = harness.db.transaction(lambda tx: leases.renew(tx, fence, RUN_LEASE_MS))
    assert renewed.version == fence.lease_version + 1


@pytest.mark.parametrize(
    "change",
    [
        "UPDATE workers SET status = 'offline' WHERE worker_id = 'w1'",
        "UPDATE workers SET generation = generation + 1 WHERE worker_id = 'w1'",
        "UPDATE workers SET session_id = '01a00000-0000-7000-8000-0000000000bb' WHERE worker_id = 'w1'",
    ],
    ids=["offline", "generation", "session"],
)
def test_a_worker_that_is_no_longer_the_one_that_claimed_cannot_renew(harness: Harness, change: str) -> None:
    _, fence = _claimed(harness)
    harness.db.raw(change)
    assert _renew_reason(harness, fence) == "worker_unavailable"


def test_a_worker_whose_session_lease_ended_cannot_renew_at_that_instant(harness: Harness) -> None:
    # Given a session lease shorter than the run lease
    _, fence = _claimed(harness, session_ms=5_000)
    harness.advance_clock(5_000)  # the session's expiry instant; the run lease still has 25 s
    assert _renew_reason(harness, fence) == "worker_unavailable"


def _claim(harness: Harness, run_id: str, attempt_id: str) -> str:
    row = harness.db.raw("SELECT session_id, generation FROM workers WHERE worker_id = 'w1'")[0]
    result = harness.db.transaction(
        lambda tx: lease_claims.claim(
            tx,
            run_id=run_id,
            attempt_id=attempt_id,
            worker_id="w1",
            session_id=str(row["session_id"]),
            worker_generation=int(row["generation"]),
            token_for_generation=lambda g: f"token-{g}-" + SECRET.hex(),
            lease_ms=RUN_LEASE_MS,
        )
    )
    return str(result.status)


def _queued(harness: Harness) -> tuple[Any, str, str]:
    register(harness.db)
    project, _, (run,) = queued(harness.db)
    attempt = harness.db.transaction(lambda tx: runs.latest_attempt(tx, run.id), write=False)
    return project, run.id, attempt.id


def test_a_queued_run_is_claimed_once_and_then_not_eligible(harness: Harness) -> None:
    project, run_id, attempt_id = _queued(harness)
    assert _claim(harness, run_id, attempt_id) == "claimed"
    assert _claim(harness, run_id, attempt_id) == "not_eligible"  # dispatching now
    assert run_of(harness.db, project, run_id).status == "dispatching"


def test_a_queued_run_with_a_cancel_request_is_not_eligible(harness: Harness) -> None:
    _project, run_id, attempt_id = _queued(harness)
    harness.db.raw(
        "UPDATE runs SET cancel_requested_at_ms = 1, cancel_reason = 'user' WHERE id = ?", (run_id,)
    )
    assert _claim(harness, run_id, attempt_id) == "not_eligible"
    assert count(harness.db, "run_leases") == 0


@pytest.mark.parametrize("change", ["status", "superseded"])
def test_only_the_latest_claimed_attempt_is_eligible(harness: Harness, change: str) -> None:
    project, run_id, attempt_id = _queued(harness)
    if change == "status":
        harness.db.raw("UPDATE run_attempts SET status = 'lost' WHERE id = ?", (attempt_id,))
    else:  # a newer attempt exists: the old one may never be claimed again
        harness.db.raw(
            "INSERT INTO run_attempts (id, run_id, attempt, status, executor_type, created_at_ms)"
            " SELECT ?, run_id, attempt + 1, 'claimed', executor_type, created_at_ms"
            " FROM run_attempts WHERE id = ?",
            ("01a00000-0000-7000-8000-0000000000cc", attempt_id),
        )
    assert _claim(harness, run_id, attempt_id) == "not_eligible"
    assert count(harness.db, "run_leases") == 0
    assert run_of(harness.db, project, run_id).status == "queued"


def test_a_completion_naming_another_terminal_run_is_a_run_mismatch_not_a_replay(harness: Harness) -> None:
    # Given two running attempts of two runs, the first run already succeeded
    register(harness.db, lease_ms=600_000, slots=4)
    project, _, _ = queued(harness.db, n=2)
    d = dispatcher(harness.db)
    first, second = d.dispatch_once().offer, d.dispatch_once().offer
    assert first is not None and second is not None
    f1, f2 = start(harness.db, first), start(harness.db, second)
    done = harness.db.transaction(
        lambda tx: lease_results.complete(tx, f1, callback_sequence=1, callback_token="cb-token", exit_code=0)
    )
    assert done == ("applied", "succeeded")
    events = count(harness.db, "run_events")

    # When a completion names the second run's attempt under the first (terminal) run's id
    wrong = replace(f2, run_id=f1.run_id)
    with pytest.raises(FenceConflict) as caught:
        harness.db.transaction(
            lambda tx: lease_results.complete(
                tx, wrong, callback_sequence=1, callback_token="cb-token", exit_code=0
            )
        )

    # Then it is refused as a run mismatch before anything else is looked at (not answered as the
    # terminal run's replay), and nothing was written
    assert caught.value.details == {"reason": "run_mismatch"}
    assert count(harness.db, "run_events") == events
    assert run_of(harness.db, project, f2.run_id).status == "running"
