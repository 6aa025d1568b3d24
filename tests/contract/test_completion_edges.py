"""The edges of the one completion path (``lease_results.complete``): the exit-code range, each fence's exact
reason, a late callback for an attempt that already ended, a stale lease version, the error code."""

from __future__ import annotations

from typing import Any

import pytest

from ql3.application import lease_expiry, lease_results, leases, runs
from ql3.domain.egress import EgressPolicy
from ql3.domain.errors import FenceConflict, ValidationFailed
from ql3.domain.offers import LeaseFence
from tests.support.databases import Harness
from tests.support.execution_builders import dispatcher, queued, register, run_of, start


def _running(harness: Harness, **spec: Any) -> tuple[Any, LeaseFence]:
    register(harness.db, lease_ms=600_000)
    project, _, _ = queued(harness.db, **spec)
    offer = dispatcher(harness.db).dispatch_once().offer
    assert offer is not None
    return project, start(harness.db, offer)


def _complete(
    harness: Harness, fence: LeaseFence, *, seq: int = 1, token: str = "cb-token", code: int = 0
) -> Any:
    return harness.db.transaction(
        lambda tx: lease_results.complete(
            tx, fence, callback_sequence=seq, callback_token=token, exit_code=code
        )
    )


def _events(harness: Harness, run_id: str) -> list[Any]:
    return list(harness.db.transaction(lambda tx: runs.list_events(tx, run_id, after=0, limit=100)))


@pytest.mark.parametrize("code", [255, 1])
def test_every_exit_code_up_to_255_fails_the_run_with_exit_nonzero(harness: Harness, code: int) -> None:
    project, fence = _running(harness)

    assert _complete(harness, fence, code=code) == ("applied", "failed")

    run = run_of(harness.db, project, fence.run_id)
    assert (run.status, run.exit_code, run.error_code) == ("failed", code, "EXIT_NONZERO")


def test_exit_zero_succeeds_without_an_error_code(harness: Harness) -> None:
    project, fence = _running(harness)
    before = len(_events(harness, fence.run_id))
    now = harness.now_ms()

    assert _complete(harness, fence, code=0) == ("applied", "succeeded")

    run = run_of(harness.db, project, fence.run_id)
    assert (run.status, run.exit_code, run.error_code) == ("succeeded", 0, None)
    assert run.finished_at_ms is not None and run.finished_at_ms >= now
    if harness.dialect == "sqlite":  # the injected clock: exactly the completion's observation time
        assert run.finished_at_ms == now
    new = _events(harness, fence.run_id)[before:]
    assert new and all((e.actor_type, e.actor_id) == ("worker", fence.worker_id) for e in new)
    attempt = harness.db.raw(
        "SELECT status, callback_sequence, exit_code FROM run_attempts WHERE id = ?", (fence.attempt_id,)
    )[0]
    # the callback sequence moves on, so the same callback again is recognised as a replay
    assert (attempt["status"], attempt["callback_sequence"], attempt["exit_code"]) == ("succeeded", 2, 0)


@pytest.mark.parametrize("code", [256, -1])
def test_an_exit_code_outside_0_255_is_refused_and_changes_nothing(harness: Harness, code: int) -> None:
    project, fence = _running(harness)
    before = len(_events(harness, fence.run_id))

    with pytest.raises(ValidationFailed) as caught:
        _complete(harness, fence, code=code)

    assert caught.value.message == "exit code out of range"
    assert run_of(harness.db, project, fence.run_id).status == "running"
    assert len(_events(harness, fence.run_id)) == before


@pytest.mark.parametrize(
    ("seq", "token", "reason"),
    [(1, "forged", "callback_token_mismatch"), (2, "cb-token", "callback_sequence_mismatch")],
)
def test_a_wrong_callback_is_fenced_with_its_exact_reason(
    harness: Harness, seq: int, token: str, reason: str
) -> None:
    project, fence = _running(harness)
    before = len(_events(harness, fence.run_id))

    with pytest.raises(FenceConflict) as caught:
        _complete(harness, fence, seq=seq, token=token)

    assert caught.value.details["reason"] == reason
    assert run_of(harness.db, project, fence.run_id).status == "running"
    assert len(_events(harness, fence.run_id)) == before


def test_a_callback_before_the_running_ack_is_asked_again_not_refused(harness: Harness) -> None:
    register(harness.db)
    project, _, _ = queued(harness.db)
    offer = dispatcher(harness.db).dispatch_once().offer
    assert offer is not None
    harness.db.transaction(lambda tx: lease_results.ack_starting(tx, offer.fence))

    with pytest.raises(FenceConflict) as caught:
        _complete(harness, offer.fence)

    # no token is on record yet (the running ACK's commit is on its way): the worker keeps its receipt
    # and settles again, where a wrong token is a refusal for good (the test above)
    assert caught.value.details["reason"] == "running_ack_missing"
    assert run_of(harness.db, project, offer.fence.run_id).status == "dispatching"


def test_a_completion_after_a_renewal_still_applies_under_the_older_version(harness: Harness) -> None:
    project, fence = _running(harness)
    harness.db.transaction(lambda tx: leases.renew(tx, fence, 30_000))

    assert _complete(harness, fence, code=3) == ("applied", "failed")
    assert run_of(harness.db, project, fence.run_id).exit_code == 3


def test_a_late_callback_under_another_sequence_for_a_lost_attempt_is_recorded_and_changes_nothing(
    harness: Harness,
) -> None:
    # Given attempt 1 lost (lease expired) and the run waiting for its retry
    project, fence = _running(harness, max_attempts=3, retry_safe=True)
    harness.advance_clock(600_001)
    assert harness.db.transaction(lambda tx: lease_expiry.expire_lease(tx, fence.attempt_id)) == "lost"
    assert run_of(harness.db, project, fence.run_id).status == "retry_wait"
    before = _events(harness, fence.run_id)

    # When a callback of attempt 1 arrives late under a sequence its receipt never had
    result = _complete(harness, fence, seq=2, code=0)

    # Then it is answered as already ended, and only a late-callback event is added (it is no fact:
    # tests/contract/test_late_facts.py has the receipt that is one)
    assert result == ("already_terminal", "lost")
    after = _events(harness, fence.run_id)
    assert [e.type for e in after[len(before) :]] == ["attempt.late_callback_ignored"]
    late = after[-1]
    assert (late.actor_type, late.actor_id, late.attempt_id) == ("worker", fence.worker_id, fence.attempt_id)
    assert late.payload == {"attempt": 1}
    assert run_of(harness.db, project, fence.run_id).status == "retry_wait"


@pytest.mark.parametrize("seq", [1, 2, 4], ids=["below", "just_below", "above"])  # the receipt had 3
def test_a_late_callback_with_another_sequence_for_a_lost_attempt_is_recorded(
    harness: Harness, seq: int
) -> None:
    # Given attempt 1 ACKed running under callback sequence 3, then lost, and the run waiting for its retry
    register(harness.db, lease_ms=600_000)
    project, _, _ = queued(harness.db, max_attempts=3, retry_safe=True)
    offer = dispatcher(harness.db).dispatch_once().offer
    assert offer is not None
    fence = start(harness.db, offer, seq=3)
    harness.advance_clock(600_001)
    assert harness.db.transaction(lambda tx: lease_expiry.expire_lease(tx, fence.attempt_id)) == "lost"
    before = len(_events(harness, fence.run_id))

    # When a callback arrives under a sequence no completion of that attempt ever used
    assert _complete(harness, fence, seq=seq, code=0) == ("already_terminal", "lost")

    # Then it is not mistaken for a replay: the late callback is recorded
    assert [e.type for e in _events(harness, fence.run_id)[before:]] == ["attempt.late_callback_ignored"]
    assert run_of(harness.db, project, fence.run_id).status == "retry_wait"


def test_a_replayed_completion_of_a_finished_run_adds_no_event(harness: Harness) -> None:
    project, fence = _running(harness)
    assert _complete(harness, fence, code=0) == ("applied", "succeeded")
    before = len(_events(harness, fence.run_id))

    assert _complete(harness, fence, code=0) == ("already_terminal", "succeeded")
    assert _complete(harness, fence, seq=5, code=1) == ("already_terminal", "succeeded")

    assert len(_events(harness, fence.run_id)) == before
    assert run_of(harness.db, project, fence.run_id).exit_code == 0


def test_a_completion_for_a_run_that_already_ended_changes_nothing(harness: Harness) -> None:
    # Given a run that ended (for example by an operator's repair) while its attempt still runs
    project, fence = _running(harness)
    harness.db.raw("UPDATE runs SET status = 'cancelled', finished_at_ms = 1 WHERE id = ?", (fence.run_id,))
    before = len(_events(harness, fence.run_id))

    assert _complete(harness, fence, code=0) == ("already_terminal", "running")

    assert len(_events(harness, fence.run_id)) == before
    assert run_of(harness.db, project, fence.run_id).status == "cancelled"


@pytest.mark.parametrize(("code", "event"), [(0, "succeeded"), (3, "failed")])
def test_a_completion_in_a_project_with_a_notification_rule_enqueues_its_outcome_once(
    harness: Harness, code: int, event: str
) -> None:
    """The worker's completion is the outcome's transaction: a project routing run outcomes to a
    channel gets one outbox row with it (on PostgreSQL the one-call result function must defer to
    the path that writes it, never complete the run without it)."""
    from ql3.application import notifications

    project, fence = _running(harness)
    harness.db.transaction(
        lambda tx: notifications.create_channel(
            tx,
            project,
            name="hook",
            kind="webhook",
            url="https://example.invalid/h",
            secret="s" * 32,
            egress=EgressPolicy(),
        )
    )
    harness.db.transaction(
        lambda tx: notifications.create_rule(
            tx, project, channel="hook", task=None, events=["succeeded", "failed"]
        )
    )

    assert _complete(harness, fence, code=code) == ("applied", event)

    rows = harness.db.raw("SELECT event, status, outcome_key FROM notification_outbox")
    assert [(r["event"], r["status"]) for r in rows] == [(event, "pending")]
    assert rows[0]["outcome_key"].startswith(f"run:{fence.run_id}:{event}:")
