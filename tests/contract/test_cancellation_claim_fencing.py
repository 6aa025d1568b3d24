"""Cancellation claims: one lease owner, no takeover before expiry, stale owner/token/version fenced."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from ql3.application import cancellation
from ql3.domain.digests import CANCEL_LEASE_DOMAIN, domain_digest
from ql3.domain.errors import FenceConflict, ValidationFailed
from tests.support.builders import count
from tests.support.cancellation_builders import (
    claim,
    dispatch_row,
    events,
    new_token,
    record,
    request,
    running_runs,
)
from tests.support.databases import Harness


def test_first_claim_leases_the_dispatch_and_stores_only_the_token_digest(harness: Harness) -> None:
    # Given a running run with a committed cancel intent
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    token = new_token()
    before = harness.now_ms()

    # When a supervisor claims it
    outcome = claim(harness.db, fence.run_id, owner="sup-a", token=token, lease_ms=30_000)

    # Then it holds a lease computed from database time, and only the domain-separated digest is stored
    assert outcome.status == "claimed" and outcome.token == token
    assert (outcome.attempt_id, outcome.dispatch_version, outcome.dispatch_count) == (fence.attempt_id, 1, 1)
    row = dispatch_row(harness.db, fence.run_id)
    assert (row["status"], row["version"], row["dispatch_count"], row["lease_owner"]) == (
        "leased",
        1,
        1,
        "sup-a",
    )
    assert row["lease_expires_at_ms"] == row["updated_at_ms"] + 30_000 and row["updated_at_ms"] >= before
    assert row["next_attempt_at_ms"] is None
    assert row["lease_token_digest"] == domain_digest(CANCEL_LEASE_DOMAIN, token)
    assert row["project_id"] == project.id and row["attempt_id"] == fence.attempt_id
    assert token not in json.dumps(harness.db.raw("SELECT * FROM cancellation_dispatches"))
    assert token not in repr(outcome)


def test_claim_needs_a_live_run_with_an_intent(harness: Harness) -> None:
    project, (fence,) = running_runs(harness.db)

    assert claim(harness.db, fence.run_id).status == "not_eligible"
    assert count(harness.db, "cancellation_dispatches") == 0

    request(harness.db, project, fence.run_id)
    wrong_time = harness.db.transaction(
        lambda tx: cancellation.claim(
            tx, run_id=fence.run_id, owner="sup-a", token=new_token(), lease_ms=30_000, requested_at_ms=1
        )
    )
    assert wrong_time.status == "not_eligible"
    assert count(harness.db, "cancellation_dispatches") == 0


def test_a_live_lease_is_not_taken_over_until_it_expires(harness: Harness) -> None:
    # Given supervisor A holding a 30 s lease
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    first = claim(harness.db, fence.run_id, owner="sup-a")

    # When B tries shortly before expiry, it is told the dispatch is leased and nothing changes
    harness.advance_clock(28_000)
    early = claim(harness.db, fence.run_id, owner="sup-b")
    assert early.status == "leased" and early.token is None
    assert dispatch_row(harness.db, fence.run_id)["lease_owner"] == "sup-a"

    # Then once the lease has expired, B takes over with a new version and count
    harness.advance_clock(2_000)
    takeover = claim(harness.db, fence.run_id, owner="sup-b")
    assert takeover.status == "claimed"
    assert (takeover.dispatch_version, takeover.dispatch_count) == (first.dispatch_version + 1, 2)
    row = dispatch_row(harness.db, fence.run_id)
    assert (row["lease_owner"], row["version"], row["dispatch_count"]) == ("sup-b", 2, 2)


def test_the_old_holder_is_fenced_after_a_takeover(harness: Harness) -> None:
    # Given A's lease expired and B took over
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    old = claim(harness.db, fence.run_id, owner="sup-a")
    harness.advance_clock(30_000)
    claim(harness.db, fence.run_id, owner="sup-b")
    before = dispatch_row(harness.db, fence.run_id)
    run_version = harness.db.raw("SELECT version FROM runs WHERE id = ?", (fence.run_id,))[0]["version"]

    # When A finally reports its result
    with pytest.raises(FenceConflict) as err:
        record(harness.db, old, "termination_requested")

    # Then it is refused and neither the dispatch nor the Run moved
    assert err.value.details["reason"] == "owner_mismatch"
    assert dispatch_row(harness.db, fence.run_id) == before
    assert (
        harness.db.raw("SELECT version FROM runs WHERE id = ?", (fence.run_id,))[0]["version"] == run_version
    )


def test_a_takeover_by_the_same_owner_bumps_the_version_that_fences_the_old_result(harness: Harness) -> None:
    # Given the same supervisor identity re-claimed after a restart, reusing its old token
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    token = new_token()
    old = claim(harness.db, fence.run_id, owner="sup-a", token=token)
    harness.advance_clock(30_000)
    claim(harness.db, fence.run_id, owner="sup-a", token=token)

    # When the result of the first claim arrives
    with pytest.raises(FenceConflict) as err:
        record(harness.db, old, "termination_requested")

    # Then only the version tells them apart, and it is enough
    assert err.value.details["reason"] == "version_mismatch"
    assert dispatch_row(harness.db, fence.run_id)["status"] == "leased"


def test_lease_expiry_alone_does_not_reject_the_holders_result(harness: Harness) -> None:
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    held = claim(harness.db, fence.run_id)
    harness.advance_clock(45_000)

    settled = record(harness.db, held, "termination_requested")

    assert settled.status == "dispatched" and settled.dispatch_version == 2
    assert dispatch_row(harness.db, fence.run_id)["status"] == "dispatched"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"owner": "sup-x"}, "owner_mismatch"),
        ({"token": "t" * 43}, "lease_token_mismatch"),
        ({"expected_version": 7}, "version_mismatch"),
        ({"attempt_id": "01a00000-0000-7000-8000-000000000000"}, "attempt_mismatch"),
    ],
)
def test_a_stale_result_is_fenced_with_its_reason_and_writes_nothing(
    harness: Harness, change: dict[str, Any], reason: str
) -> None:
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    held = claim(harness.db, fence.run_id, owner="sup-a")
    before = dispatch_row(harness.db, fence.run_id)
    n_events = len(events(harness.db, fence.run_id))
    args: dict[str, Any] = {
        "run_id": fence.run_id,
        "attempt_id": held.attempt_id,
        "owner": "sup-a",
        "token": held.token,
        "expected_version": held.dispatch_version,
        "result": "termination_requested",
        "controller_ran": True,
    } | change

    with pytest.raises(FenceConflict) as err:
        harness.db.transaction(lambda tx: cancellation.record_result(tx, **args))

    assert err.value.details["reason"] == reason
    assert dispatch_row(harness.db, fence.run_id) == before
    assert len(events(harness.db, fence.run_id)) == n_events


def test_a_settled_dispatch_refuses_a_second_result(harness: Harness) -> None:
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    held = claim(harness.db, fence.run_id)
    record(harness.db, held, "already_exited")

    with pytest.raises(FenceConflict) as err:
        record(harness.db, held, "already_exited")

    assert err.value.details["reason"] == "not_leased"
    assert [e["type"] for e in events(harness.db, fence.run_id)].count("run.cancel_dispatched") == 1


def test_a_dispatch_bound_to_another_attempt_fails_closed(harness: Harness) -> None:
    # Given a dispatch row whose binding no longer matches the Run's active Attempt
    project, (fence, other) = running_runs(harness.db, 2)
    request(harness.db, project, fence.run_id)
    claim(harness.db, fence.run_id)
    harness.advance_clock(30_000)
    harness.db.raw(
        "UPDATE cancellation_dispatches SET attempt_id = ? WHERE run_id = ?", (other.attempt_id, fence.run_id)
    )
    before = dispatch_row(harness.db, fence.run_id)

    # When a supervisor claims it, it is never re-bound to the "latest" attempt
    outcome = claim(harness.db, fence.run_id, owner="sup-b")

    assert outcome.status == "binding_conflict" and outcome.token is None
    assert dispatch_row(harness.db, fence.run_id) == before


@pytest.mark.parametrize(
    "args",
    [
        {"lease_ms": 4_999},
        {"lease_ms": 300_001},
        {"owner": ""},
        {"owner": "x" * 129},
        {"token": "short"},
        {"token": "has space " + "a" * 40},
    ],
)
def test_claim_inputs_are_bounded(harness: Harness, args: dict[str, Any]) -> None:
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    params: dict[str, Any] = {"owner": "sup-a", "token": new_token(), "lease_ms": 30_000} | args

    with pytest.raises(ValidationFailed):
        harness.db.transaction(lambda tx: cancellation.claim(tx, run_id=fence.run_id, **params))

    assert count(harness.db, "cancellation_dispatches") == 0


def test_two_supervisors_on_two_connections_exactly_one_claims(harness: Harness) -> None:
    # Given several runs with intents and two real connections
    project, fences = running_runs(harness.db, 4)
    for fence in fences:
        request(harness.db, project, fence.run_id)
    other = harness.second_connection()
    outcomes: dict[str, list[str]] = {f.run_id: [] for f in fences}
    errors: list[BaseException] = []

    def race(db: Any, owner: str, run_id: str, barrier: threading.Barrier) -> None:
        barrier.wait()
        try:
            outcomes[run_id].append(claim(db, run_id, owner=owner).status)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    # When both claim each run at the same moment
    try:
        for fence in fences:
            barrier = threading.Barrier(2)
            threads = [
                threading.Thread(target=race, args=(db, owner, fence.run_id, barrier))
                for db, owner in ((harness.db, "sup-a"), (other, "sup-b"))
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
    finally:
        other.close()

    # Then exactly one of them won each lease; the other saw it leased
    assert not errors
    assert all(sorted(found) == ["claimed", "leased"] for found in outcomes.values())
    rows = harness.db.raw("SELECT version, dispatch_count, status FROM cancellation_dispatches")
    assert [(r["version"], r["dispatch_count"], r["status"]) for r in rows] == [(1, 1, "leased")] * 4
