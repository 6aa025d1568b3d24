"""Cancel intents, first-commit-wins against completion, finalisation without a receipt, and timeouts."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from ql3.application import cancellation, cancellation_supervisor, lease_results
from ql3.domain.errors import NotFound, ValidationFailed
from tests.support.builders import count, seed_project
from tests.support.cancellation_builders import (
    FakeSignal,
    claimed_runs,
    dispatch_row,
    events,
    request,
    running_runs,
    start_fence,
)
from tests.support.databases import Harness
from tests.support.execution_builders import StatementLog, dispatcher, queued, register


def _status(harness: Harness, run_id: str) -> tuple[str, str]:
    run = harness.db.raw("SELECT status FROM runs WHERE id = ?", (run_id,))[0]
    attempt = harness.db.raw(
        "SELECT status FROM run_attempts WHERE run_id = ? ORDER BY attempt DESC LIMIT 1", (run_id,)
    )[0]
    return str(run["status"]), str(attempt["status"])


def _complete(harness: Harness, fence: Any, exit_code: int = 0) -> Any:
    return harness.db.transaction(
        lambda tx: lease_results.complete(
            tx, fence, callback_sequence=1, callback_token="cb-token", exit_code=exit_code
        )
    )


def _supervise(harness: Harness, signal: FakeSignal) -> Any:
    return cancellation_supervisor.CancellationSupervisor(
        harness.db, signal=signal, owner="sup-a"
    ).run_cycle()


def test_an_intent_on_a_running_run_is_one_cas_and_one_event_with_statuses_unchanged(
    harness: Harness,
) -> None:
    project, (fence,) = running_runs(harness.db)
    before = harness.db.raw("SELECT version, event_sequence FROM runs WHERE id = ?", (fence.run_id,))[0]

    first = request(harness.db, project, fence.run_id, reason="user")
    second = request(harness.db, project, fence.run_id, reason="policy")

    assert (first, second) == ("requested", "already_requested")
    run = harness.db.raw("SELECT * FROM runs WHERE id = ?", (fence.run_id,))[0]
    assert (run["version"], run["event_sequence"]) == (before["version"] + 1, before["event_sequence"] + 1)
    assert run["cancel_reason"] == "user" and run["cancel_requested_at_ms"] is not None
    assert _status(harness, fence.run_id) == ("running", "running")
    last = events(harness.db, fence.run_id)[-1]
    assert (last["type"], last["actor_type"], last["actor_id"], last["attempt_id"], last["payload"]) == (
        "run.cancel_requested",
        "user",
        "alice",
        fence.attempt_id,
        {"reason": "user"},
    )


def test_a_queued_run_is_cancelled_at_once_because_no_process_exists(harness: Harness) -> None:
    # Given a run that was never claimed
    register(harness.db)
    project, _, (run,) = queued(harness.db)

    # When it is cancelled
    assert request(harness.db, project, run.id) == "requested"

    # Then Run and Attempt ended in the same transaction and the dispatcher never offers it
    assert _status(harness, run.id) == ("cancelled", "cancelled")
    tail = events(harness.db, run.id)[-3:]
    assert [e["type"] for e in tail] == ["run.cancel_requested", "attempt.cancelled", "run.cancelled"]
    # the ending is the requester's own
    assert [(e["actor_type"], e["actor_id"]) for e in tail] == [("user", "alice")] * 3
    assert dispatcher(harness.db).dispatch_once().offer is None
    assert count(harness.db, "cancellation_dispatches") == 0


def test_a_queued_run_cancelled_at_once_changes_its_attempt_only_by_the_ending(harness: Harness) -> None:
    # Given a queued run: its first attempt exists but never ran, so nothing of it has a callback to fence
    register(harness.db)
    project, _, (run,) = queued(harness.db)
    before = dict(harness.db.raw("SELECT * FROM run_attempts WHERE run_id = ?", (run.id,))[0])

    request(harness.db, project, run.id)

    # Then the attempt row changed only by its ending: its callback sequence is the one it had
    after = dict(harness.db.raw("SELECT * FROM run_attempts WHERE run_id = ?", (run.id,))[0])
    assert {k for k in after if after[k] != before[k]} == {"status", "finished_at_ms", "error_code"}
    assert (after["status"], after["error_code"]) == ("cancelled", "EXECUTION_CANCELLED")
    assert after["callback_sequence"] == before["callback_sequence"]


def test_an_intent_wakes_the_supervisors_and_a_request_that_writes_nothing_does_not(harness: Harness) -> None:
    project, (fence,) = running_runs(harness.db)
    logs: list[StatementLog] = []

    def requested(tx: Any) -> str:
        logs.append(StatementLog(tx))
        answer: str = cancellation.request_cancel(
            logs[-1], project.id, fence.run_id, reason="user", actor_type="user"
        )
        return answer

    assert harness.db.transaction(requested) == "requested"
    assert harness.db.transaction(requested) == "already_requested"

    assert [c for c in logs[0].channels if c == "cancellations"] == ["cancellations"]
    assert logs[1].channels == []


def test_a_terminal_run_answers_already_terminal_and_writes_nothing(harness: Harness) -> None:
    project, (fence,) = running_runs(harness.db)
    _complete(harness, fence)
    n_events = len(events(harness.db, fence.run_id))

    assert request(harness.db, project, fence.run_id) == "already_terminal"
    assert len(events(harness.db, fence.run_id)) == n_events


def test_intent_inputs_are_validated_and_scoped_to_the_project(harness: Harness) -> None:
    project, (fence,) = running_runs(harness.db)
    stranger = seed_project(harness.db, "other")

    with pytest.raises(ValidationFailed):
        request(harness.db, project, fence.run_id, reason="because")
    with pytest.raises(NotFound) as foreign:
        request(harness.db, stranger, fence.run_id)
    # another project's run is answered exactly like a run that does not exist
    with pytest.raises(NotFound) as missing:
        request(harness.db, stranger, "01a00000-0000-7000-8000-000000000000")
    assert foreign.value.to_dict() == missing.value.to_dict()
    assert harness.db.raw("SELECT cancel_requested_at_ms FROM runs")[0]["cancel_requested_at_ms"] is None


@pytest.mark.parametrize(("reason", "outcome"), [("user", "cancelled"), ("timeout", "timed_out")])
def test_intent_first_turns_a_later_successful_completion_into_the_cancel_outcome(
    harness: Harness, reason: str, outcome: str
) -> None:
    # Given an intent, a dispatched signal, and then the process's receipt with exit 0
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id, reason=reason)
    _supervise(harness, FakeSignal())

    result = _complete(harness, fence, exit_code=0)

    assert result == ("applied", outcome)
    assert _status(harness, fence.run_id) == (outcome, outcome)


def test_completion_first_makes_a_late_cancel_a_no_op_with_zero_signals(harness: Harness) -> None:
    project, (fence,) = running_runs(harness.db)
    _complete(harness, fence, exit_code=0)
    signal = FakeSignal()

    assert request(harness.db, project, fence.run_id) == "already_terminal"
    _supervise(harness, signal)

    assert signal.calls == [] and _status(harness, fence.run_id) == ("succeeded", "succeeded")
    assert count(harness.db, "cancellation_dispatches") == 0


def test_cancel_racing_completion_on_two_connections_resolves_by_commit_order(harness: Harness) -> None:
    project, (fence,) = running_runs(harness.db)
    other = harness.second_connection()
    barrier = threading.Barrier(2)
    answers: dict[str, Any] = {}

    def cancel() -> None:
        barrier.wait()
        answers["cancel"] = other.transaction(
            lambda tx: cancellation.request_cancel(
                tx, project.id, fence.run_id, reason="user", actor_type="user"
            )
        )

    def finish() -> None:
        barrier.wait()
        answers["complete"] = _complete(harness, fence, exit_code=0)

    threads = [threading.Thread(target=cancel), threading.Thread(target=finish)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        other.close()

    status = _status(harness, fence.run_id)
    if answers["cancel"] == "already_terminal":
        assert answers["complete"] == ("applied", "succeeded") and status == ("succeeded", "succeeded")
    else:
        assert answers["cancel"] == "requested"
        assert answers["complete"] == ("applied", "cancelled") and status == ("cancelled", "cancelled")


@pytest.mark.parametrize(("reason", "outcome"), [("user", "cancelled"), ("timeout", "timed_out")])
def test_finalize_stopped_ends_a_dispatched_run_that_will_never_send_a_receipt(
    harness: Harness, reason: str, outcome: str
) -> None:
    # Given a dispatched cancellation whose process group was killed without a receipt
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id, reason=reason)
    _supervise(harness, FakeSignal())

    # When the worker proves the process gone and finalises
    result = harness.db.transaction(lambda tx: cancellation.finalize_stopped(tx, fence.run_id))

    # Then Run and Attempt end with the intent's outcome and the lease is completed
    assert result == outcome and _status(harness, fence.run_id) == (outcome, outcome)
    lease = harness.db.raw("SELECT status FROM run_leases WHERE attempt_id = ?", (fence.attempt_id,))[0]
    assert lease["status"] == "completed"
    # And a receipt that turns up after all (the worker's, deferred by an outage) gives the run its
    # exit code without changing its outcome; a replay of it changes nothing
    assert _complete(harness, fence, exit_code=137) == ("applied", outcome)
    run = harness.db.raw("SELECT status, exit_code FROM runs WHERE id = ?", (fence.run_id,))[0]
    attempt = harness.db.raw("SELECT exit_code FROM run_attempts WHERE id = ?", (fence.attempt_id,))[0]
    assert (run["status"], run["exit_code"], attempt["exit_code"]) == (outcome, 137, 137)
    assert _complete(harness, fence, exit_code=137) == ("already_terminal", outcome)


def test_finalize_stopped_after_the_completion_changes_nothing(harness: Harness) -> None:
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    _supervise(harness, FakeSignal())
    _complete(harness, fence, exit_code=143)
    n_events = len(events(harness.db, fence.run_id))

    result = harness.db.transaction(lambda tx: cancellation.finalize_stopped(tx, fence.run_id))

    assert result == "already_terminal" and len(events(harness.db, fence.run_id)) == n_events


def test_finalize_stopped_refuses_a_dispatch_that_was_not_dispatched(harness: Harness) -> None:
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    cancellation_supervisor.CancellationSupervisor(
        harness.db, signal=None, owner="sup-a"
    ).run_cycle()  # retry_wait

    result = harness.db.transaction(lambda tx: cancellation.finalize_stopped(tx, fence.run_id))

    assert result == "not_eligible" and _status(harness, fence.run_id) == ("running", "running")


def test_the_timeout_scan_commits_a_timeout_intent_before_any_signal(harness: Harness) -> None:
    # Given a started attempt of a task with a one-minute timeout: its deadline is one minute away
    _, (fence,) = claimed_runs(harness.db, timeout_ms=60_000)
    start_fence(harness.db, fence)

    # When the scan runs before the deadline, nothing happens
    early = cancellation.timeout_cycle(harness.db)
    assert early.scanned == 0

    # Then after the deadline it commits the intent with reason timeout, once
    harness.advance_clock(60_000)
    report = cancellation.timeout_cycle(harness.db)
    again = cancellation.timeout_cycle(harness.db)
    run = harness.db.raw("SELECT * FROM runs WHERE id = ?", (fence.run_id,))[0]
    assert (report.requested, again.scanned) == (1, 0)
    assert run["cancel_reason"] == "timeout" and run["status"] == "running"
    assert events(harness.db, fence.run_id)[-1]["payload"] == {"reason": "timeout"}
    assert count(harness.db, "cancellation_dispatches") == 0

    # And only the cancellation lease holder signals, after which the completion is timed_out
    signal = FakeSignal()
    _supervise(harness, signal)
    assert len(signal.calls) == 1
    assert _complete(harness, fence, exit_code=143) == ("applied", "timed_out")
    assert dispatch_row(harness.db, fence.run_id)["status"] == "dispatched"


def test_the_timeout_scan_is_bounded_per_cycle(harness: Harness) -> None:
    _, fences = claimed_runs(harness.db, 3, timeout_ms=1_000)
    for i, fence in enumerate(fences):
        start_fence(harness.db, fence, i)
    harness.advance_clock(1_000)

    first = cancellation.timeout_cycle(harness.db, page=2)
    second = cancellation.timeout_cycle(harness.db, page=2)

    assert (first.requested, first.truncated) == (2, True)
    assert (second.requested, second.truncated) == (1, False)
    for page in (0, 65):
        with pytest.raises(ValidationFailed):
            cancellation.timeout_cycle(harness.db, page=page)
