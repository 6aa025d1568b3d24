"""Every answer of a cancellation claim that leases nothing names the dispatch as it stands: the attempt
it is bound to, its version, its count and its times (docs/contracts.md §4.2), and carries no token. A
claim whose lease loses its compare-and-set answers ``leased``, never ``claimed``."""

from __future__ import annotations

from typing import Any

import pytest

from ql3.application import cancellation
from ql3.ports.storage import Params, Transaction
from tests.support.cancellation_builders import claim, dispatch_row, new_token, record, request, running_runs
from tests.support.databases import Harness
from tests.support.execution_builders import StatementLog


def _as_answered(row: dict[str, Any], status: str, **fields: Any) -> cancellation.DispatchClaim:
    """The answer that names ``row`` (a ``cancellation_dispatches`` row) with ``status``."""
    return cancellation.DispatchClaim(
        status=status,  # type: ignore[arg-type]
        run_id=row["run_id"],
        attempt_id=row["attempt_id"],
        dispatch_version=row["version"],
        dispatch_count=row["dispatch_count"],
        next_attempt_at_ms=row["next_attempt_at_ms"],
        **fields,
    )


@pytest.mark.parametrize(
    ("result", "status"), [("termination_requested", "dispatched"), ("identity_mismatch", "blocked")]
)
def test_a_settled_dispatch_answers_its_state_and_is_never_leased_again(
    harness: Harness, result: str, status: str
) -> None:
    # Given a dispatch whose result settled it for good
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    record(harness.db, claim(harness.db, fence.run_id, owner="sup-a"), result)
    row = dispatch_row(harness.db, fence.run_id)
    assert (row["status"], row["version"], row["dispatch_count"]) == (status, 2, 1)

    # When another supervisor claims it
    outcome = claim(harness.db, fence.run_id, owner="sup-b")

    # Then the answer is the settled row itself, without a token, and nothing moved
    assert outcome == _as_answered(row, status)
    assert dispatch_row(harness.db, fence.run_id) == row


def test_a_live_lease_answers_the_holders_version_count_and_expiry(harness: Harness) -> None:
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    claim(harness.db, fence.run_id, owner="sup-a")
    row = dispatch_row(harness.db, fence.run_id)

    outcome = claim(harness.db, fence.run_id, owner="sup-b")

    assert outcome == _as_answered(row, "leased", lease_expires_at_ms=row["lease_expires_at_ms"])
    assert outcome.next_attempt_at_ms is None and outcome.lease_expires_at_ms is not None
    assert dispatch_row(harness.db, fence.run_id) == row


def test_a_dispatch_waiting_out_its_backoff_answers_when_it_is_due(harness: Harness) -> None:
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    record(harness.db, claim(harness.db, fence.run_id), "dispatch_error", retry_base_ms=10_000)
    row = dispatch_row(harness.db, fence.run_id)

    outcome = claim(harness.db, fence.run_id, owner="sup-b")

    assert outcome == _as_answered(row, "not_due")
    assert outcome.next_attempt_at_ms == row["updated_at_ms"] + 10_000
    assert dispatch_row(harness.db, fence.run_id) == row


def test_a_dispatch_bound_to_another_attempt_answers_that_attempt_and_nothing_else(harness: Harness) -> None:
    # Given a dispatch row whose binding no longer matches the Run's active Attempt
    project, (fence, other) = running_runs(harness.db, 2)
    request(harness.db, project, fence.run_id)
    claim(harness.db, fence.run_id)
    harness.db.raw(
        "UPDATE cancellation_dispatches SET attempt_id = ? WHERE run_id = ?", (other.attempt_id, fence.run_id)
    )

    outcome = claim(harness.db, fence.run_id, owner="sup-b")

    assert outcome == cancellation.DispatchClaim(
        status="binding_conflict", run_id=fence.run_id, attempt_id=other.attempt_id
    )


def test_a_claim_that_loses_its_compare_and_set_answers_leased_without_a_token(harness: Harness) -> None:
    # Given a due dispatch that another supervisor leases just before this claim's own lease write
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    record(harness.db, claim(harness.db, fence.run_id), "dispatch_error", retry_base_ms=1_000)
    harness.advance_clock(1_000)
    due = dispatch_row(harness.db, fence.run_id)
    assert due["status"] == "retry_wait"

    def another_leases_first(tx: Transaction, params: Params) -> None:
        assert tx.run("cancel_dispatch_lease", {**params, "owner": "sup-b"}) == 1

    outcome = harness.db.transaction(
        lambda tx: cancellation.claim(
            StatementLog(tx, {"cancel_dispatch_lease": another_leases_first}),
            run_id=fence.run_id,
            owner="sup-a",
            token=new_token(),
            lease_ms=30_000,
        )
    )

    # Then the claim answers the dispatch as it read it, leased, and the other's lease stands
    assert outcome == _as_answered(due, "leased")
    row = dispatch_row(harness.db, fence.run_id)
    assert (row["status"], row["lease_owner"], row["version"]) == ("leased", "sup-b", due["version"] + 1)


def test_a_claim_after_the_backoff_answers_its_new_lease_and_no_due_time(harness: Harness) -> None:
    # Given a dispatch in retry_wait whose backoff is over (its due time is still on the row)
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    record(harness.db, claim(harness.db, fence.run_id), "dispatch_error", retry_base_ms=1_000)
    harness.advance_clock(1_000)
    assert dispatch_row(harness.db, fence.run_id)["next_attempt_at_ms"] is not None
    token = new_token()

    outcome = claim(harness.db, fence.run_id, owner="sup-b", token=token)

    # Then the answer is the leased row: the due time is gone with the backoff, the token is the caller's
    row = dispatch_row(harness.db, fence.run_id)
    assert (row["status"], row["version"], row["dispatch_count"]) == ("leased", 3, 2)
    assert outcome == _as_answered(
        row, "claimed", lease_expires_at_ms=row["lease_expires_at_ms"], token=token
    )
    assert outcome.next_attempt_at_ms is None
