"""Cancellation results: classification, atomic Run CAS + dispatch + event, durable capped backoff."""

from __future__ import annotations

import pytest

from ql3.application import lease_results
from ql3.domain.errors import Conflict, ValidationFailed
from tests.support.cancellation_builders import (
    claim,
    dispatch_row,
    events,
    record,
    request,
    running_runs,
)
from tests.support.databases import Harness


def _run_row(harness: Harness, run_id: str) -> dict[str, object]:
    return dict(harness.db.raw("SELECT status, version, event_sequence FROM runs WHERE id = ?", (run_id,))[0])


@pytest.mark.parametrize(
    ("result", "status", "event_type"),
    [
        ("termination_requested", "dispatched", "run.cancel_dispatched"),
        ("already_exited", "dispatched", "run.cancel_dispatched"),
        ("identity_mismatch", "blocked", "run.cancel_dispatch_blocked"),
        ("pid_mismatch", "blocked", "run.cancel_dispatch_blocked"),
        ("unsupported", "blocked", "run.cancel_dispatch_blocked"),
        ("invalid", "blocked", "run.cancel_dispatch_blocked"),
        ("controller_missing", "retry_wait", "run.cancel_dispatch_failed"),
        ("handle_missing", "retry_wait", "run.cancel_dispatch_failed"),
        ("dispatch_error", "retry_wait", "run.cancel_dispatch_failed"),
    ],
)
def test_each_result_settles_the_dispatch_with_one_low_sensitivity_event(
    harness: Harness, result: str, status: str, event_type: str
) -> None:
    # Given a leased dispatch
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    held = claim(harness.db, fence.run_id, owner="sup-a")
    run_before = _run_row(harness, fence.run_id)

    # When its holder records the controller's result
    settled = record(harness.db, held, result)

    # Then the dispatch moved (v+1, lease cleared), the Run got exactly one CAS and one event
    row = dispatch_row(harness.db, fence.run_id)
    assert settled.status == status and row["status"] == status
    assert (row["version"], row["dispatch_count"], row["last_result"]) == (2, 1, result)
    assert (row["lease_owner"], row["lease_token_digest"], row["lease_expires_at_ms"]) == (None, None, None)
    assert (row["next_attempt_at_ms"] is not None) == (status == "retry_wait")
    assert row["last_dispatched_at_ms"] == row["updated_at_ms"]
    run_after = _run_row(harness, fence.run_id)
    assert run_after["status"] == run_before["status"] == "running"
    assert run_after["version"] == int(str(run_before["version"])) + 1
    last = events(harness.db, fence.run_id)[-1]
    assert last["sequence"] == run_after["event_sequence"]
    assert (last["type"], last["actor_type"], last["actor_id"]) == (event_type, "worker", "sup-a")
    assert last["dedupe_key"] == f"cancel-dispatch:{fence.attempt_id}:1"
    assert last["payload"] == {"attempt_id": fence.attempt_id, "dispatch_count": 1, "result": result}


def test_a_result_without_a_controller_run_keeps_last_dispatched_at_empty(harness: Harness) -> None:
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    held = claim(harness.db, fence.run_id)

    record(harness.db, held, "controller_missing", controller_ran=False)

    assert dispatch_row(harness.db, fence.run_id)["last_dispatched_at_ms"] is None


def test_an_unknown_result_is_rejected_before_any_write(harness: Harness) -> None:
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    held = claim(harness.db, fence.run_id)
    before = dispatch_row(harness.db, fence.run_id)

    with pytest.raises(ValidationFailed):
        record(harness.db, held, "killed_it_anyway")

    assert dispatch_row(harness.db, fence.run_id) == before


def test_a_failed_event_append_rolls_back_the_run_version_and_the_dispatch(harness: Harness) -> None:
    # Given a conflicting event already occupying the Run's next sequence number
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    held = claim(harness.db, fence.run_id)
    run_before = _run_row(harness, fence.run_id)
    dispatch_before = dispatch_row(harness.db, fence.run_id)
    harness.db.raw(
        "INSERT INTO run_events (id, run_id, sequence, type, actor_type, payload_json, created_at_ms)"
        " VALUES ('planted', ?, ?, 'run.planted', 'system', '{}', 0)",
        (fence.run_id, int(str(run_before["event_sequence"])) + 1),
    )

    # When the holder records its result
    with pytest.raises(Conflict):
        record(harness.db, held, "termination_requested")

    # Then neither the Run nor the dispatch moved: still leased to the same holder
    assert _run_row(harness, fence.run_id) == run_before
    assert dispatch_row(harness.db, fence.run_id) == dispatch_before
    assert not [e for e in events(harness.db, fence.run_id) if e["type"].startswith("run.cancel_dispatch")]


def test_retryable_results_back_off_durably_and_retry_wait_is_not_claimed_early(harness: Harness) -> None:
    # Given a first dispatch that failed with a retryable result and a 10 s base backoff
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    first = claim(harness.db, fence.run_id)
    record(harness.db, first, "handle_missing", retry_base_ms=10_000, retry_max_ms=60_000)
    row = dispatch_row(harness.db, fence.run_id)
    assert row["status"] == "retry_wait"
    assert row["next_attempt_at_ms"] == row["updated_at_ms"] + 10_000  # persisted absolute time

    # When a supervisor comes back before it is due
    harness.advance_clock(5_000)
    early = claim(harness.db, fence.run_id, owner="sup-b")

    # Then it is not due and nothing changed
    assert early.status == "not_due" and early.token is None
    assert dispatch_row(harness.db, fence.run_id) == row

    # And once due, the claim succeeds and the dispatch count increments
    harness.advance_clock(5_000)
    second = claim(harness.db, fence.run_id, owner="sup-b")
    assert second.status == "claimed" and second.dispatch_count == 2
    record(harness.db, second, "dispatch_error", owner="sup-b", retry_base_ms=10_000, retry_max_ms=60_000)
    again = dispatch_row(harness.db, fence.run_id)
    assert again["next_attempt_at_ms"] == again["updated_at_ms"] + 20_000


def test_backoff_doubles_up_to_its_cap(harness: Harness) -> None:
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    delays: list[int] = []

    for _ in range(8):
        held = claim(harness.db, fence.run_id)
        assert held.status == "claimed"
        record(harness.db, held, "dispatch_error", retry_base_ms=1_000, retry_max_ms=60_000)
        row = dispatch_row(harness.db, fence.run_id)
        delays.append(int(row["next_attempt_at_ms"]) - int(row["updated_at_ms"]))
        harness.advance_clock(60_000)

    assert delays == [1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 60_000, 60_000]
    assert dispatch_row(harness.db, fence.run_id)["dispatch_count"] == 8


@pytest.mark.parametrize("result", ["termination_requested", "identity_mismatch"])
def test_dispatched_and_blocked_are_never_claimed_again(harness: Harness, result: str) -> None:
    # Given a dispatch that settled as dispatched or blocked
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    record(harness.db, claim(harness.db, fence.run_id), result)
    settled = dispatch_row(harness.db, fence.run_id)

    # When supervisors come back much later
    harness.advance_clock(86_400_000)
    outcome = claim(harness.db, fence.run_id, owner="sup-b")

    # Then the status is reported as-is and no lease is taken
    assert outcome.status == settled["status"] and outcome.token is None
    assert dispatch_row(harness.db, fence.run_id) == settled


def test_a_result_after_the_completion_committed_settles_the_dispatch_without_touching_the_run(
    harness: Harness,
) -> None:
    # Given the process exited on TERM and its completion committed before the result
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    held = claim(harness.db, fence.run_id)
    harness.db.transaction(
        lambda tx: lease_results.complete(
            tx, fence, callback_sequence=1, callback_token="cb-token", exit_code=143
        )
    )
    run_before = _run_row(harness, fence.run_id)

    # When the supervisor records its result
    settled = record(harness.db, held, "termination_requested")

    # Then the terminal Run is immutable and the dispatch is no longer leased
    assert settled.run_terminal and run_before["status"] == "cancelled"
    assert _run_row(harness, fence.run_id) == run_before
    assert dispatch_row(harness.db, fence.run_id)["status"] == "dispatched"
