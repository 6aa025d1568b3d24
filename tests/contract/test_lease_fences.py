"""Run leases and activation ACKs: every call fenced with the exact reason, replays idempotent."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from ql3.application import lease_expiry, lease_results, leases, runs
from ql3.domain.digests import sha256_hex
from ql3.domain.errors import Conflict, FenceConflict
from ql3.domain.offers import LeaseFence
from tests.support.builders import count
from tests.support.databases import Harness
from tests.support.execution_builders import dispatcher, queued, register, run_of, start


def _claimed(harness: Harness, **spec: Any) -> tuple[Any, LeaseFence]:
    register(harness.db)
    project, _, _ = queued(harness.db, **spec)
    offer = dispatcher(harness.db).dispatch_once().offer
    assert offer is not None
    return project, offer.fence


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"run_id": "01a00000-0000-7000-8000-000000000000"}, "run_mismatch"),
        ({"worker_id": "other"}, "worker_mismatch"),
        ({"session_id": "01a00000-0000-7000-8000-000000000001"}, "worker_session_mismatch"),
        ({"worker_generation": 9}, "worker_generation_mismatch"),
        ({"lease_generation": 9}, "lease_generation_mismatch"),
        ({"lease_token": "x" * 64}, "lease_token_mismatch"),
        ({"lease_version": 7}, "version_mismatch"),
    ],
)
def test_renew_is_fenced_with_the_exact_reason(harness: Harness, change: dict[str, Any], reason: str) -> None:
    _, fence = _claimed(harness)

    with pytest.raises(FenceConflict) as err:
        harness.db.transaction(lambda tx: leases.renew(tx, replace(fence, **change), 30_000))

    assert err.value.details["reason"] == reason


def test_renew_bumps_the_version_and_the_old_version_is_fenced(harness: Harness) -> None:
    _, fence = _claimed(harness)

    renewed = harness.db.transaction(lambda tx: leases.renew(tx, fence, 30_000))

    assert renewed.version == fence.lease_version + 1
    with pytest.raises(FenceConflict) as err:
        harness.db.transaction(lambda tx: leases.renew(tx, fence, 30_000))
    assert err.value.details["reason"] == "version_mismatch"


def test_renew_answers_the_lease_as_it_stored_it(harness: Harness) -> None:
    # Given a claimed run, the database clock frozen a second after the claim
    harness.freeze_clock()
    _, fence = _claimed(harness)
    harness.advance_clock(1_000)
    now = harness.now_ms()

    # When its holder renews it for 30 s
    renewed = harness.db.transaction(lambda tx: leases.renew(tx, fence, 30_000))

    # Then the answer is the stored lease, with the new expiry counted from the database clock
    stored = harness.db.transaction(lambda tx: leases.get_lease(tx, fence.attempt_id), write=False)
    assert renewed == stored
    assert renewed.expires_at_ms == now + 30_000


def test_expired_lease_cannot_be_renewed_and_never_changes_the_run(harness: Harness) -> None:
    project, fence = _claimed(harness)
    harness.advance_clock(30_001)

    with pytest.raises(FenceConflict) as err:
        harness.db.transaction(lambda tx: leases.renew(tx, fence, 30_000))

    assert err.value.details["reason"] == "lease_expired"
    assert run_of(harness.db, project, fence.run_id).status == "dispatching"


def test_running_before_starting_is_rejected(harness: Harness) -> None:
    _, fence = _claimed(harness)

    with pytest.raises(Conflict):
        harness.db.transaction(
            lambda tx: lease_results.ack_running(
                tx,
                fence,
                pid=10,
                handle="h",
                log_artifact_id="a",
                callback_sequence=1,
                callback_token_digest=sha256_hex("t"),
            )
        )


def test_starting_and_running_replays_are_idempotent_and_a_different_handle_is_rejected(
    harness: Harness,
) -> None:
    project, fence = _claimed(harness)
    first = harness.db.transaction(lambda tx: lease_results.ack_starting(tx, fence))[0]
    again = harness.db.transaction(lambda tx: lease_results.ack_starting(tx, fence))[0]

    def running(handle: str) -> Any:
        return harness.db.transaction(
            lambda tx: lease_results.ack_running(
                tx,
                fence,
                pid=10,
                handle=handle,
                log_artifact_id="a",
                callback_sequence=1,
                callback_token_digest=sha256_hex("t"),
            )
        )[0]

    assert (first, again) == ("starting", "already_starting")
    assert running("h1") == "running" and running("h1") == "already_running"
    with pytest.raises(Conflict):
        running("h2")
    events = harness.db.transaction(lambda tx: runs.list_events(tx, fence.run_id, after=0, limit=50))
    assert [e.type for e in events].count("run.running") == 1
    assert run_of(harness.db, project, fence.run_id).status == "running"


def test_start_failure_is_atomic_and_completes_the_lease(harness: Harness) -> None:
    project, fence = _claimed(harness)
    harness.db.transaction(lambda tx: lease_results.ack_starting(tx, fence))

    outcome = harness.db.transaction(
        lambda tx: lease_results.ack_start_failure(tx, fence, error_code="EXECUTOR_START_FAILED")
    )

    assert outcome == "failed"
    assert run_of(harness.db, project, fence.run_id).status == "failed"
    lease = harness.db.transaction(lambda tx: leases.get_lease(tx, fence.attempt_id))
    assert lease is not None and lease.status == "completed" and lease.version == fence.lease_version + 1
    replay = harness.db.transaction(
        lambda tx: lease_results.ack_start_failure(tx, fence, error_code="EXECUTOR_START_FAILED")
    )
    assert replay == "already_terminal"


def test_start_failure_after_a_timeout_intent_is_timed_out(harness: Harness) -> None:
    _project, fence = _claimed(harness)
    harness.db.transaction(lambda tx: lease_results.ack_starting(tx, fence))
    harness.db.raw(
        "UPDATE runs SET cancel_requested_at_ms = 1, cancel_reason = 'timeout' WHERE id = ?", (fence.run_id,)
    )

    outcome = harness.db.transaction(lambda tx: lease_results.ack_start_failure(tx, fence, error_code="X"))

    assert outcome == "timed_out"


def test_completion_applies_once_and_a_replay_is_already_terminal(harness: Harness) -> None:
    project, fence = _claimed(harness)
    start(harness.db, _offer_of(fence))

    first = harness.db.transaction(
        lambda tx: lease_results.complete(
            tx, fence, callback_sequence=1, callback_token="cb-token", exit_code=7
        )
    )
    events_after_first = count(harness.db, "run_events")
    second = harness.db.transaction(
        lambda tx: lease_results.complete(
            tx, fence, callback_sequence=1, callback_token="cb-token", exit_code=7
        )
    )

    assert first == ("applied", "failed") and second == ("already_terminal", "failed")
    assert count(harness.db, "run_events") == events_after_first
    run = run_of(harness.db, project, fence.run_id)
    assert (run.status, run.exit_code) == ("failed", 7)


def test_completion_with_a_wrong_token_changes_nothing(harness: Harness) -> None:
    project, fence = _claimed(harness)
    start(harness.db, _offer_of(fence))

    with pytest.raises(FenceConflict):
        harness.db.transaction(
            lambda tx: lease_results.complete(
                tx, fence, callback_sequence=1, callback_token="forged", exit_code=0
            )
        )
    assert run_of(harness.db, project, fence.run_id).status == "running"


def test_cancel_intent_before_completion_turns_success_into_cancelled(harness: Harness) -> None:
    _project, fence = _claimed(harness)
    start(harness.db, _offer_of(fence))
    harness.db.raw(
        "UPDATE runs SET cancel_requested_at_ms = 1, cancel_reason = 'user' WHERE id = ?", (fence.run_id,)
    )

    result = harness.db.transaction(
        lambda tx: lease_results.complete(
            tx, fence, callback_sequence=1, callback_token="cb-token", exit_code=0
        )
    )

    assert result == ("applied", "cancelled")


def _offer_of(fence: LeaseFence) -> Any:
    class _O:
        pass

    o = _O()
    o.fence = fence  # type: ignore[attr-defined]
    return o


def test_expired_claimed_lease_is_released_and_the_run_is_claimable_again(harness: Harness) -> None:
    project, fence = _claimed(harness)
    harness.advance_clock(30_001)

    assert harness.db.transaction(lambda tx: lease_expiry.expire_lease(tx, fence.attempt_id)) == "released"

    assert run_of(harness.db, project, fence.run_id).status == "queued"
    register(harness.db)  # the old session also went stale; a fresh one takes it
    again = dispatcher(harness.db).dispatch_once().offer
    assert (
        again is not None and again.fence.lease_generation == 2 and again.fence.attempt_id == fence.attempt_id
    )


def test_expired_running_lease_marks_attempt_and_run_lost_then_failed_without_policy(
    harness: Harness,
) -> None:
    project, fence = _claimed(harness)
    start(harness.db, _offer_of(fence))
    harness.advance_clock(30_001)

    assert harness.db.transaction(lambda tx: lease_expiry.expire_lease(tx, fence.attempt_id)) == "lost"

    run = run_of(harness.db, project, fence.run_id)
    assert run.status == "failed" and run.error_code == "LEASE_EXPIRED"
    types = [
        e.type
        for e in harness.db.transaction(lambda tx: runs.list_events(tx, fence.run_id, after=0, limit=50))
    ]
    assert types[-3:] == ["attempt.lost", "run.lost", "run.failed"]


def test_live_lease_expiry_is_a_noop(harness: Harness) -> None:
    _, fence = _claimed(harness)

    assert harness.db.transaction(lambda tx: lease_expiry.expire_lease(tx, fence.attempt_id)) == "noop"


def test_late_completion_after_expiry_is_the_runs_fact(harness: Harness) -> None:
    # Given a run without retries that failed when its only attempt's lease expired
    project, fence = _claimed(harness)
    start(harness.db, _offer_of(fence))
    harness.advance_clock(30_001)
    harness.db.transaction(lambda tx: lease_expiry.expire_lease(tx, fence.attempt_id))
    assert run_of(harness.db, project, fence.run_id).status == "failed"

    # When the attempt's receipt arrives late
    result = harness.db.transaction(
        lambda tx: lease_results.complete(
            tx, fence, callback_sequence=1, callback_token="cb-token", exit_code=0
        )
    )

    # Then the run takes it (docs/contracts.md §2.4)
    assert result == ("applied", "succeeded")
    run = run_of(harness.db, project, fence.run_id)
    assert (run.status, run.exit_code, run.error_code) == ("succeeded", 0, None)


def test_the_active_lease_counter_always_equals_the_leased_rows(harness: Harness) -> None:
    # Given claims, a completion, a start failure and an expiry on one worker
    register(harness.db, slots=8)
    _project, _, _ = queued(harness.db, n=4)
    d = dispatcher(harness.db)
    offers = [d.dispatch_once().offer for _ in range(4)]
    assert all(o is not None for o in offers)
    done, failed, expired, _kept = (o.fence for o in offers if o is not None)
    start(harness.db, _offer_of(done))
    harness.db.transaction(
        lambda tx: lease_results.complete(
            tx, done, callback_sequence=1, callback_token="cb-token", exit_code=0
        )
    )
    harness.db.transaction(lambda tx: lease_results.ack_starting(tx, failed))
    harness.db.transaction(lambda tx: lease_results.ack_start_failure(tx, failed, error_code="X"))

    def counter() -> tuple[int, int]:
        w = harness.db.raw("SELECT active_leases FROM workers WHERE worker_id = 'w1'")[0]["active_leases"]
        n = harness.db.raw("SELECT count(*) AS n FROM run_leases WHERE status = 'leased'")[0]["n"]
        return int(w), int(n)

    assert counter() == (2, 2)

    # When the remaining leases expire
    harness.advance_clock(30_001)
    for fence in (expired, _kept):
        harness.db.transaction(lambda tx, a=fence.attempt_id: lease_expiry.expire_lease(tx, a))

    # Then the counter followed every change
    assert counter() == (0, 0)
