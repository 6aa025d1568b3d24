"""Consuming an approval: one transaction writes consumed@3, the immutable dispatch and pending@v0."""

from __future__ import annotations

import pytest

from ql3.application import approvals
from ql3.domain.approvals import ApprovalExpired
from ql3.domain.errors import Conflict, FenceConflict, PermissionDenied
from ql3.domain.ids import new_id
from tests.support.approval_builders import (
    approved,
    consume,
    execution,
    refuse_inserts,
    request,
    set_role,
    world,
)
from tests.support.builders import count
from tests.support.databases import Harness


def _approval_row(harness: Harness) -> dict[str, object]:
    row: dict[str, object] = harness.db.raw("SELECT * FROM approval_requests")[0]
    return row


def test_consume_writes_the_approval_the_dispatch_and_the_execution_together(harness: Harness) -> None:
    # Given an approved request
    w = world(harness.db)
    req = approved(w)
    consumption_id = new_id()

    # When the system consumes it
    dispatch = consume(w, req.id, consumption_id=consumption_id)

    # Then the approval is consumed@3 and points at exactly one immutable dispatch and one pending@v0
    row = _approval_row(harness)
    assert (row["state"], row["version"], row["consumption_id"], row["dispatch_id"], row["consumed_by"]) == (
        "consumed",
        3,
        consumption_id,
        dispatch.id,
        "system",
    )
    assert (dispatch.approval_request_id, dispatch.approval_request_version) == (req.id, 3)
    assert (dispatch.action_digest, dispatch.action_plan) == (req.action_digest, req.action_plan)
    assert (dispatch.requested_by, dispatch.approved_by) == (w.requester.id, w.approver.id)
    assert dispatch.expires_at_ms == req.expires_at_ms and dispatch.created_at_ms == row["consumed_at_ms"]
    ex = execution(harness.db, dispatch.id)
    assert (ex.status, ex.version, ex.attempt_count, ex.max_attempts) == ("pending", 0, 0, 5)
    assert ex.eligible_at_ms == dispatch.created_at_ms == ex.created_at_ms
    assert ex.dispatch_digest == dispatch.dispatch_digest and ex.lease_owner is None
    assert (
        count(harness.db, "approved_action_dispatches")
        == count(harness.db, "approved_action_executions")
        == 1
    )


def test_a_repeated_consumption_id_returns_the_same_dispatch(harness: Harness) -> None:
    w = world(harness.db)
    req = approved(w)
    consumption_id = new_id()
    first = consume(w, req.id, consumption_id=consumption_id)
    harness.advance_clock(1_000)

    assert consume(w, req.id, consumption_id=consumption_id) == first
    with pytest.raises(Conflict):
        consume(w, req.id, consumption_id=new_id())
    assert (
        count(harness.db, "approved_action_dispatches")
        == count(harness.db, "approved_action_executions")
        == 1
    )


def test_a_pending_request_cannot_be_consumed(harness: Harness) -> None:
    w = world(harness.db)
    req = request(w)

    with pytest.raises(Conflict):
        consume(w, req.id)

    assert count(harness.db, "approved_action_dispatches") == 0


def test_consume_is_refused_at_the_expiry_instant(harness: Harness) -> None:
    # Given an approval that expires in one minute
    w = world(harness.db)
    req = approved(w, ttl_ms=60_000)

    # When the clock reaches expires_at
    harness.advance_clock(req.expires_at_ms - harness.now_ms())
    assert harness.now_ms() >= req.expires_at_ms

    # Then consuming is refused and nothing was written
    with pytest.raises(ApprovalExpired):
        consume(w, req.id)
    row = _approval_row(harness)
    assert (row["state"], row["version"]) == ("approved", 2)
    assert (
        count(harness.db, "approved_action_dispatches")
        == count(harness.db, "approved_action_executions")
        == 0
    )


def test_policy_is_re_evaluated_for_the_requester_at_consume_time(harness: Harness) -> None:
    # Given an approval whose requester has since lost run.create in the project
    w = world(harness.db)
    req = approved(w)
    set_role(harness.db, w.requester, w.project, "viewer")

    # When it is consumed, the re-evaluated policy denies it and nothing is written
    with pytest.raises(PermissionDenied):
        consume(w, req.id)
    assert (_approval_row(harness)["state"], count(harness.db, "approved_action_dispatches")) == (
        "approved",
        0,
    )

    # Then, once the requester may create runs again, the same approval can be consumed
    set_role(harness.db, w.requester, w.project, "operator")
    assert consume(w, req.id).approval_request_id == req.id


def test_a_different_action_than_the_approved_one_is_refused(harness: Harness) -> None:
    w = world(harness.db)
    req = approved(w)

    with pytest.raises(FenceConflict):
        consume(w, req.id, action_digest="0" * 64)

    assert _approval_row(harness)["state"] == "approved"
    assert consume(w, req.id, action_digest=req.action_digest).action_digest == req.action_digest


def test_a_failing_dispatch_insert_rolls_back_the_whole_consume(harness: Harness) -> None:
    # Given an approved request and a planted dispatch row that already claims that approval
    w = world(harness.db)
    req = approved(w)
    assert req.decided_at_ms is not None
    harness.db.raw(
        "INSERT INTO approved_action_dispatches (id, approval_request_id, approval_request_version,"
        " project_id, action_type, action_ref, action_digest, action_plan_json, requested_by, consumed_by,"
        " approved_by,"
        " approved_at_ms, expires_at_ms, approval_fence, dispatch_digest, created_at_ms)"
        " VALUES (?, ?, 3, ?, 'run.create', ?, ?, ?, ?, 'system', ?, ?, ?, '{}', ?, ?)",
        (
            new_id(),
            req.id,
            w.project.id,
            req.action_ref,
            req.action_digest,
            req.action_plan,
            w.requester.id,
            w.approver.id,
            req.decided_at_ms,
            req.expires_at_ms,
            "a" * 64,
            req.decided_at_ms,
        ),
    )

    # When consume runs, its dispatch insert violates the one-dispatch-per-approval rule
    with pytest.raises(Conflict):
        consume(w, req.id)

    # Then the approval update rolled back too and no execution exists
    row = _approval_row(harness)
    assert (row["state"], row["version"], row["consumption_id"], row["dispatch_id"]) == (
        "approved",
        2,
        None,
        None,
    )
    assert count(harness.db, "approved_action_executions") == 0
    assert count(harness.db, "approved_action_dispatches") == 1


def test_a_failing_execution_insert_rolls_back_the_approval_and_the_dispatch(harness: Harness) -> None:
    # Given an approved request and an execution table that refuses the insert
    w = world(harness.db)
    req = approved(w)
    refuse_inserts(harness, "approved_action_executions")

    # When consume reaches its third write, it fails
    with pytest.raises(Conflict):
        consume(w, req.id)

    # Then the approval and the dispatch written before it rolled back with it
    row = _approval_row(harness)
    assert (row["state"], row["version"], row["dispatch_id"]) == ("approved", 2, None)
    assert (
        count(harness.db, "approved_action_dispatches")
        == count(harness.db, "approved_action_executions")
        == 0
    )


def test_only_system_or_worker_consumers_exist(harness: Harness) -> None:
    w = world(harness.db)
    req = approved(w)

    with pytest.raises(Exception, match="consumer"):
        consume(w, req.id, consumer="user")
    assert consume(w, req.id, consumer="worker").consumed_by == "worker"


def test_the_unconsumed_page_lists_only_live_approved_requests(harness: Harness) -> None:
    w = world(harness.db)
    live = approved(w)
    consumed_one = approved(w)
    consume(w, consumed_one.id)
    request(w)

    ids = harness.db.transaction(lambda tx: approvals.unconsumed_approved(tx, limit=16), write=False)

    assert ids == [live.id]
