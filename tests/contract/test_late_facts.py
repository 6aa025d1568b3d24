"""Late facts and stop causes (docs/contracts.md §2.4), on both databases: a receipt that reaches the
control plane after its lease expired is still its attempt's fact. With no later attempt started the
run takes it (a retry admitted but not started is withdrawn, a run failed by the loss is corrected);
with a later attempt started it is recorded on the old attempt only. The authority is the callback
token and the holder's identity. ``stop_cause``: the host stopped the command itself."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from ql3.application import cancellation, lease_expiry, lease_results, leases, runs
from ql3.domain.errors import FenceConflict, ValidationFailed
from ql3.domain.offers import LeaseFence
from tests.support.builders import count
from tests.support.databases import Harness
from tests.support.execution_builders import dispatcher, queued, register, run_of, start

LEASE_MS = 60_000
RETRY = {"max_attempts": 3, "retry_safe": True}


def _running(harness: Harness, **spec: Any) -> tuple[Any, LeaseFence]:
    register(harness.db, lease_ms=10 * LEASE_MS)
    project, _, _ = queued(harness.db, **spec)
    offer = dispatcher(harness.db, lease_ms=LEASE_MS).dispatch_once().offer
    assert offer is not None
    return project, start(harness.db, offer)


def _lost(harness: Harness, **spec: Any) -> tuple[Any, LeaseFence]:
    """A run whose attempt 1 was ACKed running, then lost when its lease expired."""
    project, fence = _running(harness, **spec)
    harness.advance_clock(LEASE_MS + 1)
    assert harness.db.transaction(lambda tx: lease_expiry.expire_lease(tx, fence.attempt_id)) == "lost"
    return project, fence


def _complete(
    harness: Harness,
    fence: LeaseFence,
    *,
    code: int = 5,
    token: str = "cb-token",
    stop_cause: Any = None,
) -> Any:
    return harness.db.transaction(
        lambda tx: lease_results.complete(
            tx, fence, callback_sequence=1, callback_token=token, exit_code=code, stop_cause=stop_cause
        )
    )


def _events(harness: Harness, run_id: str) -> list[Any]:
    return list(harness.db.transaction(lambda tx: runs.list_events(tx, run_id, after=0, limit=200)))


def _attempts(harness: Harness, run_id: str) -> list[tuple[int, str, Any, Any]]:
    rows = harness.db.raw(
        "SELECT attempt, status, exit_code, error_code FROM run_attempts WHERE run_id = ? ORDER BY attempt",
        (run_id,),
    )
    return [(r["attempt"], r["status"], r["exit_code"], r["error_code"]) for r in rows]


def _retry_cursor(harness: Harness, run_id: str) -> Any:
    return harness.db.raw("SELECT next_retry_at_ms FROM run_retry_policies WHERE run_id = ?", (run_id,))[0][
        "next_retry_at_ms"
    ]


def _admitted(harness: Harness, fence: LeaseFence) -> str:
    harness.advance_clock(LEASE_MS)
    attempt_id = harness.db.transaction(lambda tx: lease_expiry.admit_retry(tx, fence.run_id))
    assert attempt_id is not None
    return str(attempt_id)


def _state(harness: Harness) -> list[Any]:
    return [
        count(harness.db, "run_events"),
        harness.db.raw("SELECT id, status, exit_code, callback_sequence FROM run_attempts ORDER BY id"),
        harness.db.raw("SELECT id, status, version, exit_code FROM runs ORDER BY id"),
        harness.db.raw("SELECT attempt_id, status, version FROM run_leases ORDER BY attempt_id"),
        harness.db.raw("SELECT next_retry_at_ms FROM run_retry_policies"),
        harness.db.raw("SELECT active_leases FROM workers ORDER BY worker_id"),
    ]


# -- no later attempt started: the run takes the fact ------------------------------------------------


def test_a_late_fact_ends_a_run_waiting_for_its_retry_and_withdraws_the_retry(harness: Harness) -> None:
    # Given attempt 1 lost and the run waiting for its retry
    project, fence = _lost(harness, **RETRY)
    assert run_of(harness.db, project, fence.run_id).status == "retry_wait"
    assert _retry_cursor(harness, fence.run_id) is not None
    before = len(_events(harness, fence.run_id))

    # When attempt 1's receipt arrives late with exit code 5
    assert _complete(harness, fence, code=5) == ("applied", "failed")

    # Then the run failed with the real exit code, the retry is withdrawn and never admitted
    run = run_of(harness.db, project, fence.run_id)
    assert (run.status, run.exit_code, run.error_code) == ("failed", 5, "EXIT_NONZERO")
    assert run.finished_at_ms is not None
    assert _retry_cursor(harness, fence.run_id) is None
    assert _attempts(harness, fence.run_id) == [(1, "lost", 5, "LEASE_EXPIRED")]
    new = _events(harness, fence.run_id)[before:]
    assert [e.type for e in new] == ["attempt.late_fact_recorded", "run.failed"]
    assert new[0].payload == {"attempt": 1, "exit_code": 5, "outcome": "failed"}
    assert (new[0].actor_type, new[0].actor_id, new[0].attempt_id) == ("worker", "w1", fence.attempt_id)
    harness.advance_clock(LEASE_MS)
    assert harness.db.transaction(lambda tx: lease_expiry.admit_retry(tx, fence.run_id)) is None
    assert count(harness.db, "run_attempts") == 1


def test_a_late_fact_withdraws_a_retry_admitted_but_not_claimed(harness: Harness) -> None:
    # Given attempt 2 admitted (the run queued again, attempt 2 claimed with no lease)
    project, fence = _lost(harness, **RETRY)
    _admitted(harness, fence)
    assert run_of(harness.db, project, fence.run_id).status == "queued"

    # When attempt 1's receipt arrives late with exit code 0
    assert _complete(harness, fence, code=0) == ("applied", "succeeded")

    # Then the run succeeded and attempt 2 ended without ever starting
    run = run_of(harness.db, project, fence.run_id)
    assert (run.status, run.exit_code, run.error_code) == ("succeeded", 0, None)
    assert _attempts(harness, fence.run_id) == [
        (1, "lost", 0, "LEASE_EXPIRED"),
        (2, "cancelled", None, "RETRY_WITHDRAWN"),
    ]
    types = [e.type for e in _events(harness, fence.run_id)]
    assert types[-3:] == ["attempt.late_fact_recorded", "attempt.cancelled", "run.succeeded"]
    # and the dispatcher finds nothing to place
    assert dispatcher(harness.db, lease_ms=LEASE_MS).dispatch_once().offer is None


def test_a_late_fact_withdraws_a_retry_offered_but_not_started_and_frees_its_slot(harness: Harness) -> None:
    # Given attempt 2 admitted and claimed by the worker (its lease live), not ACKed starting
    project, fence = _lost(harness, **RETRY)
    _admitted(harness, fence)
    offer = dispatcher(harness.db, lease_ms=LEASE_MS).dispatch_once().offer
    assert offer is not None and offer.fence.run_id == fence.run_id
    assert harness.db.raw("SELECT active_leases FROM workers")[0]["active_leases"] == 1

    # When attempt 1's receipt arrives late
    assert _complete(harness, fence, code=7) == ("applied", "failed")

    # Then the run failed with it, attempt 2's lease is over and its slot free
    run = run_of(harness.db, project, fence.run_id)
    assert (run.status, run.exit_code) == ("failed", 7)
    assert _attempts(harness, fence.run_id)[1] == (2, "cancelled", None, "RETRY_WITHDRAWN")
    lease = harness.db.raw("SELECT status FROM run_leases WHERE attempt_id = ?", (offer.fence.attempt_id,))
    assert lease[0]["status"] == "completed"
    assert harness.db.raw("SELECT active_leases FROM workers")[0]["active_leases"] == 0
    # and the withdrawn offer can never start
    with pytest.raises(FenceConflict) as caught:
        harness.db.transaction(lambda tx: lease_results.ack_starting(tx, offer.fence))
    assert caught.value.details["reason"] == "not_leased"


def test_a_late_fact_corrects_a_run_that_failed_only_because_its_attempt_was_lost(harness: Harness) -> None:
    # Given a task without retries whose run failed LEASE_EXPIRED when its lease expired
    project, fence = _lost(harness)
    run = run_of(harness.db, project, fence.run_id)
    assert (run.status, run.error_code, run.exit_code) == ("failed", "LEASE_EXPIRED", None)
    finished = run.finished_at_ms

    # When the receipt arrives late with exit code 0
    assert _complete(harness, fence, code=0) == ("applied", "succeeded")

    # Then the run is what its command did, and keeps the time it ended
    run = run_of(harness.db, project, fence.run_id)
    assert (run.status, run.error_code, run.exit_code) == ("succeeded", None, 0)
    assert run.finished_at_ms == finished
    types = [e.type for e in _events(harness, fence.run_id)]
    assert types[-2:] == ["attempt.late_fact_recorded", "run.succeeded"]


def test_a_late_fact_of_an_attempt_whose_lease_expired_unnoticed_ends_it_as_usual(harness: Harness) -> None:
    # Given a running attempt whose lease and worker session expired, not yet scanned
    project, fence = _running(harness)
    harness.advance_clock(20 * LEASE_MS)

    # When its receipt arrives
    assert _complete(harness, fence, code=5) == ("applied", "failed")

    # Then the run took it, as a live completion
    run = run_of(harness.db, project, fence.run_id)
    assert (run.status, run.exit_code, run.error_code) == ("failed", 5, "EXIT_NONZERO")
    assert _attempts(harness, fence.run_id) == [(1, "failed", 5, "EXIT_NONZERO")]
    assert harness.db.raw("SELECT active_leases FROM workers")[0]["active_leases"] == 0


# -- a later attempt started: the fact is recorded on the old attempt only ---------------------------


@pytest.mark.parametrize("step", ["starting", "running"])
def test_a_late_fact_after_a_later_attempt_started_is_recorded_on_the_old_attempt_only(
    harness: Harness, step: str
) -> None:
    # Given attempt 2 admitted, claimed and started
    project, fence = _lost(harness, **RETRY)
    _admitted(harness, fence)
    offer = dispatcher(harness.db, lease_ms=LEASE_MS).dispatch_once().offer
    assert offer is not None
    if step == "starting":
        harness.db.transaction(lambda tx: lease_results.ack_starting(tx, offer.fence))
    else:
        start(harness.db, offer, token="cb-2")
    status = run_of(harness.db, project, fence.run_id).status
    before = len(_events(harness, fence.run_id))

    # When attempt 1's receipt arrives late
    assert _complete(harness, fence, code=0) == ("recorded", "lost")

    # Then the run goes on unchanged, and attempt 1 holds its exit code
    assert run_of(harness.db, project, fence.run_id).status == status
    assert _attempts(harness, fence.run_id)[0] == (1, "lost", 0, "LEASE_EXPIRED")
    assert _attempts(harness, fence.run_id)[1][1] == step
    new = _events(harness, fence.run_id)[before:]
    assert [e.type for e in new] == ["attempt.late_fact_recorded"]
    assert new[0].payload == {"attempt": 1, "exit_code": 0}


def test_a_late_fact_of_a_run_cancelled_while_waiting_for_its_retry_keeps_the_cancel(
    harness: Harness,
) -> None:
    # Given attempt 1 lost and the run cancelled by a user while waiting for its retry
    project, fence = _lost(harness, **RETRY)
    harness.db.transaction(
        lambda tx: cancellation.request_cancel(
            tx, project.id, fence.run_id, reason="user", actor_type="user", actor_id="u1"
        )
    )
    assert run_of(harness.db, project, fence.run_id).status == "cancelled"

    # When attempt 1's receipt arrives late
    assert _complete(harness, fence, code=0) == ("recorded", "lost")

    # Then the cancel stands; the fact is on the attempt
    assert run_of(harness.db, project, fence.run_id).status == "cancelled"
    assert _attempts(harness, fence.run_id)[0][2] == 0


# -- authority and replays ---------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["retry_wait", "failed", "expired_unnoticed"])
def test_a_late_fact_with_a_wrong_callback_token_is_refused_and_writes_nothing(
    harness: Harness, state: str
) -> None:
    if state == "expired_unnoticed":
        _, fence = _running(harness)
        harness.advance_clock(20 * LEASE_MS)
    else:
        _, fence = _lost(harness, **(RETRY if state == "retry_wait" else {}))
    before = _state(harness)

    with pytest.raises(FenceConflict) as caught:
        _complete(harness, fence, token="forged")

    assert caught.value.details["reason"] == "callback_token_mismatch"
    assert _state(harness) == before


@pytest.mark.parametrize(
    ("part", "reason"),
    [
        ("lease_token", "lease_token_mismatch"),
        ("lease_generation", "lease_generation_mismatch"),
        ("session_id", "worker_session_mismatch"),
    ],
)
def test_a_late_fact_from_another_holder_is_refused_and_writes_nothing(
    harness: Harness, part: str, reason: str
) -> None:
    _, fence = _lost(harness, **RETRY)
    other: dict[str, Any] = {
        "lease_token": "0" * len(fence.lease_token),
        "lease_generation": fence.lease_generation + 1,
        "session_id": "01a00000-0000-7000-8000-0000000000cc",
    }
    before = _state(harness)

    with pytest.raises(FenceConflict) as caught:
        _complete(harness, replace(fence, **{part: other[part]}))

    assert caught.value.details["reason"] == reason
    assert _state(harness) == before


@pytest.mark.parametrize("retry", [True, False], ids=["withdrawn", "corrected"])
def test_a_replayed_late_fact_changes_nothing(harness: Harness, retry: bool) -> None:
    project, fence = _lost(harness, **(RETRY if retry else {}))
    assert _complete(harness, fence, code=5) == ("applied", "failed")
    before = _state(harness)

    assert _complete(harness, fence, code=5) == ("already_terminal", "lost")
    assert _complete(harness, fence, code=0) == ("already_terminal", "lost")

    assert _state(harness) == before
    assert run_of(harness.db, project, fence.run_id).exit_code == 5


def test_a_replayed_late_fact_recorded_on_the_old_attempt_changes_nothing(harness: Harness) -> None:
    _, fence = _lost(harness, **RETRY)
    _admitted(harness, fence)
    offer = dispatcher(harness.db, lease_ms=LEASE_MS).dispatch_once().offer
    assert offer is not None
    start(harness.db, offer, token="cb-2")
    assert _complete(harness, fence, code=3) == ("recorded", "lost")
    before = _state(harness)

    assert _complete(harness, fence, code=3) == ("already_terminal", "lost")
    assert _state(harness) == before


# -- stop causes -------------------------------------------------------------------------------------


def test_a_timeout_stop_ends_the_run_timed_out_with_its_exit_code(harness: Harness) -> None:
    project, fence = _running(harness, timeout_ms=60_000)

    assert _complete(harness, fence, code=143, stop_cause="timeout") == ("applied", "timed_out")

    run = run_of(harness.db, project, fence.run_id)
    assert (run.status, run.exit_code, run.error_code) == ("timed_out", 143, "EXECUTION_TIMED_OUT")
    assert _attempts(harness, fence.run_id) == [(1, "timed_out", 143, "EXECUTION_TIMED_OUT")]


def test_a_late_timeout_stop_ends_a_run_waiting_for_its_retry_timed_out(harness: Harness) -> None:
    project, fence = _lost(harness, timeout_ms=60_000, **RETRY)

    assert _complete(harness, fence, code=137, stop_cause="timeout") == ("applied", "timed_out")

    run = run_of(harness.db, project, fence.run_id)
    assert (run.status, run.exit_code, run.error_code) == ("timed_out", 137, "EXECUTION_TIMED_OUT")
    assert _retry_cursor(harness, fence.run_id) is None


@pytest.mark.parametrize("state", ["running", "lost"])
def test_a_timeout_stop_of_an_attempt_without_a_deadline_is_refused_and_writes_nothing(
    harness: Harness, state: str
) -> None:
    _, fence = _running(harness) if state == "running" else _lost(harness, **RETRY)
    before = _state(harness)

    with pytest.raises(ValidationFailed) as caught:
        _complete(harness, fence, code=143, stop_cause="timeout")

    assert caught.value.details["reason"] == "no_deadline"
    assert _state(harness) == before


def test_an_unknown_stop_cause_is_refused(harness: Harness) -> None:
    _, fence = _running(harness)
    before = _state(harness)

    with pytest.raises(ValidationFailed):
        _complete(harness, fence, stop_cause="crash")

    assert _state(harness) == before


@pytest.mark.parametrize("retry", [True, False], ids=["retry_wait", "failed"])
def test_a_fence_stop_of_a_lost_attempt_is_recorded_and_never_changes_the_run(
    harness: Harness, retry: bool
) -> None:
    project, fence = _lost(harness, **(RETRY if retry else {}))
    run = run_of(harness.db, project, fence.run_id)

    assert _complete(harness, fence, code=143, stop_cause="fence") == ("recorded", "lost")

    after = run_of(harness.db, project, fence.run_id)
    assert (after.status, after.exit_code, after.error_code) == (run.status, None, "LEASE_EXPIRED")
    assert _attempts(harness, fence.run_id) == [(1, "lost", 143, "LEASE_EXPIRED")]
    if retry:
        assert _retry_cursor(harness, fence.run_id) is not None


@pytest.mark.parametrize(("retry", "status"), [(True, "retry_wait"), (False, "failed")])
def test_a_fence_stop_under_a_live_lease_makes_the_attempt_lost_never_failed(
    harness: Harness, retry: bool, status: str
) -> None:
    project, fence = _running(harness, **(RETRY if retry else {}))

    assert _complete(harness, fence, code=143, stop_cause="fence") == ("applied", status)

    run = run_of(harness.db, project, fence.run_id)
    # A run that fails of the loss keeps the exit code its host reported; a retried one waits for it.
    assert (run.status, run.exit_code, run.error_code) == (
        status,
        143 if status == "failed" else None,
        "LEASE_FENCED",
    )
    assert _attempts(harness, fence.run_id) == [(1, "lost", 143, "LEASE_FENCED")]
    assert harness.db.raw("SELECT active_leases FROM workers")[0]["active_leases"] == 0
    # a replay of the same receipt changes nothing
    before = _state(harness)
    assert _complete(harness, fence, code=143, stop_cause="fence") == ("already_terminal", "lost")
    assert _state(harness) == before


@pytest.mark.parametrize("stop_cause", ["timeout", "fence", None])
def test_a_users_cancel_committed_first_still_wins(harness: Harness, stop_cause: Any) -> None:
    project, fence = _running(harness, timeout_ms=60_000, **RETRY)
    harness.db.transaction(
        lambda tx: cancellation.request_cancel(
            tx, project.id, fence.run_id, reason="user", actor_type="user", actor_id="u1"
        )
    )

    assert _complete(harness, fence, code=143, stop_cause=stop_cause) == ("applied", "cancelled")

    run = run_of(harness.db, project, fence.run_id)
    assert (run.status, run.exit_code, run.error_code) == ("cancelled", 143, "EXECUTION_CANCELLED")


# -- the expiry scanner after a pause of its own process ---------------------------------------------


def test_after_a_pause_the_scanner_defers_its_own_workers_expired_lease_by_one_lease(
    harness: Harness,
) -> None:
    # Given a running attempt of worker w1 whose lease expired while the whole process was paused
    project, fence = _running(harness)
    harness.advance_clock(LEASE_MS + 1)
    own = lease_expiry.PauseDeferral(worker_id="w1", lease_ms=LEASE_MS)

    # When the scanner, having noticed the pause, reaches it
    answer = harness.db.transaction(lambda tx: lease_expiry.expire_lease(tx, fence.attempt_id, defer=own))

    # Then the lease is given one more lease from now, its version kept: the worker's renewal applies
    assert answer == "deferred"
    lease = harness.db.raw("SELECT status, version, expires_at_ms FROM run_leases")[0]
    assert (lease["status"], lease["version"]) == ("leased", fence.lease_version)
    assert lease["expires_at_ms"] > harness.now_ms()
    assert run_of(harness.db, project, fence.run_id).status == "running"
    renewed = harness.db.transaction(lambda tx: leases.renew(tx, fence, LEASE_MS))
    assert renewed.version == fence.lease_version + 1


def test_after_a_pause_the_scanner_expires_other_workers_leases_as_usual(harness: Harness) -> None:
    project, fence = _running(harness)
    harness.advance_clock(LEASE_MS + 1)
    other = lease_expiry.PauseDeferral(worker_id="embedded-elsewhere", lease_ms=LEASE_MS)

    answer = harness.db.transaction(lambda tx: lease_expiry.expire_lease(tx, fence.attempt_id, defer=other))

    assert answer == "lost"
    assert run_of(harness.db, project, fence.run_id).status == "failed"
