"""A cancellation result names why it is fenced when it names another run's attempt, an earlier attempt
of its run, or a run whose dispatch was never claimed, or loses its compare-and-set; a settled result
answers its dispatch's new state, names the attempt on its event and wakes the supervisors only for a
retry."""

from __future__ import annotations

from typing import Any

import pytest

from ql3.application import cancellation, lease_expiry
from ql3.domain.errors import FenceConflict
from ql3.ports.storage import Params, Transaction
from tests.support.builders import count
from tests.support.cancellation_builders import claim, dispatch_row, events, new_token, request, running_runs
from tests.support.databases import Harness
from tests.support.execution_builders import StatementLog, dispatcher, queued, register, start


def _record(harness: Harness, **args: Any) -> None:
    base: dict[str, Any] = {
        "owner": "sup-a",
        "token": new_token(),
        "expected_version": 1,
        "result": "termination_requested",
        "controller_ran": True,
    }
    harness.db.transaction(lambda tx: cancellation.record_result(tx, **(base | args)))


def test_a_result_naming_another_runs_attempt_is_a_run_mismatch(harness: Harness) -> None:
    project, (target, other) = running_runs(harness.db, 2)
    request(harness.db, project, target.run_id)
    held = claim(harness.db, target.run_id, owner="sup-a")
    n_events = len(events(harness.db, target.run_id))

    with pytest.raises(FenceConflict) as err:
        _record(harness, run_id=target.run_id, attempt_id=other.attempt_id, token=held.token)

    assert err.value.details["reason"] == "run_mismatch"
    assert len(events(harness.db, target.run_id)) == n_events


def test_a_result_for_a_dispatch_never_claimed_is_missing(harness: Harness) -> None:
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)

    with pytest.raises(FenceConflict) as err:
        _record(harness, run_id=fence.run_id, attempt_id=fence.attempt_id)

    assert err.value.details["reason"] == "missing"
    assert count(harness.db, "cancellation_dispatches") == 0


def test_a_result_naming_an_earlier_attempt_of_the_run_is_an_attempt_mismatch(harness: Harness) -> None:
    # Given a run whose first attempt was lost and whose second runs, with its stop claimed
    register(harness.db, lease_ms=600_000)
    project, _, (run,) = queued(harness.db, max_attempts=2, retry_safe=True)
    d = dispatcher(harness.db)
    first = d.dispatch_once().offer
    assert first is not None
    start(harness.db, first)
    assert harness.db.transaction(
        lambda tx: lease_expiry.mark_lost(tx, run.id, first.fence.attempt_id, error_code="X")
    )
    harness.advance_clock(3_600_000)
    assert harness.db.transaction(lambda tx: lease_expiry.admit_retry(tx, run.id)) is not None
    register(harness.db, lease_ms=600_000)  # the worker's session lapsed meanwhile: a new one
    second = d.dispatch_once().offer
    assert second is not None and second.fence.attempt_id != first.fence.attempt_id
    start(harness.db, second)
    request(harness.db, project, run.id)
    held = claim(harness.db, run.id, owner="sup-a")
    assert held.attempt_id == second.fence.attempt_id

    # When a result arrives naming the first attempt, under the holder's own lease
    with pytest.raises(FenceConflict) as err:
        _record(
            harness,
            run_id=run.id,
            attempt_id=first.fence.attempt_id,
            token=held.token,
            expected_version=held.dispatch_version,
        )

    # Then the dispatch, bound to the second attempt, fences it
    assert err.value.details["reason"] == "attempt_mismatch"


@pytest.mark.parametrize(
    ("result", "status", "channels"),
    [
        ("dispatch_error", "retry_wait", ["cancellations"]),
        ("termination_requested", "dispatched", []),
        ("identity_mismatch", "blocked", []),
    ],
)
def test_a_settled_result_answers_its_dispatch_and_names_the_attempt_on_its_event(
    harness: Harness, result: str, status: str, channels: list[str]
) -> None:
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    held = claim(harness.db, fence.run_id, owner="sup-a")
    seen: list[StatementLog] = []

    def settle(tx: Transaction) -> Any:
        logged = StatementLog(tx)
        seen.append(logged)
        return cancellation.record_result(
            logged,
            run_id=fence.run_id,
            attempt_id=held.attempt_id,
            owner="sup-a",
            token=held.token,
            expected_version=held.dispatch_version,
            result=result,
            controller_ran=True,
        )

    settled = harness.db.transaction(settle)

    row = dispatch_row(harness.db, fence.run_id)
    assert (settled.status, settled.dispatch_version, settled.dispatch_count) == (status, 2, 1)
    assert settled.next_attempt_at_ms == row["next_attempt_at_ms"]
    assert (settled.next_attempt_at_ms is not None) == (status == "retry_wait")
    assert events(harness.db, fence.run_id)[-1]["attempt_id"] == fence.attempt_id
    # only a retry wakes the supervisors again (the backoff is theirs to wait out)
    assert [c for c in seen[-1].channels if c == "cancellations"] == channels


def test_a_result_that_loses_its_compare_and_set_is_a_version_mismatch(harness: Harness) -> None:
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    held = claim(harness.db, fence.run_id, owner="sup-a")

    def another_settles_first(tx: Transaction, params: Params) -> None:
        assert tx.run("cancel_dispatch_settle", params) == 1

    with pytest.raises(FenceConflict) as err:
        harness.db.transaction(
            lambda tx: cancellation.record_result(
                StatementLog(tx, {"cancel_dispatch_settle": another_settles_first}),
                run_id=fence.run_id,
                attempt_id=held.attempt_id,
                owner="sup-a",
                token=held.token,
                expected_version=held.dispatch_version,
                result="termination_requested",
                controller_ran=True,
            )
        )

    assert err.value.details["reason"] == "version_mismatch"
    assert dispatch_row(harness.db, fence.run_id)["status"] == "leased"


def test_a_terminal_run_is_not_eligible_for_a_claim_even_with_its_attempt_still_active(
    harness: Harness,
) -> None:
    # Given a run with an intent that an operator's repair ended while its attempt still runs
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    harness.db.raw("UPDATE runs SET status = 'cancelled', finished_at_ms = 1 WHERE id = ?", (fence.run_id,))

    outcome = claim(harness.db, fence.run_id, owner="sup-a")

    # Then nothing is leased: the answer names the run and carries nothing else
    assert outcome == cancellation.DispatchClaim(status="not_eligible", run_id=fence.run_id)
    assert count(harness.db, "cancellation_dispatches") == 0


def test_a_run_whose_latest_attempt_already_ended_is_not_eligible_for_a_claim(harness: Harness) -> None:
    # Given a running run with an intent whose attempt a repair already ended
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    harness.db.raw(
        "UPDATE run_attempts SET status = 'failed', finished_at_ms = started_at_ms WHERE id = ?",
        (fence.attempt_id,),
    )

    outcome = claim(harness.db, fence.run_id, owner="sup-a")

    assert outcome == cancellation.DispatchClaim(status="not_eligible", run_id=fence.run_id)
    assert count(harness.db, "cancellation_dispatches") == 0
