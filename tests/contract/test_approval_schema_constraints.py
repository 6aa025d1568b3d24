"""The migration owns the shape of every approval and execution state: impossible rows are refused."""

from __future__ import annotations

import sqlite3
from typing import Any

import psycopg
import pytest

from tests.support.approval_builders import (
    approved,
    dispatched,
    request,
    started,
    world,
)
from tests.support.databases import Harness

DB_ERRORS = (sqlite3.IntegrityError, psycopg.IntegrityError)


def _refused(harness: Harness, sql: str, params: tuple[Any, ...]) -> None:
    with pytest.raises(DB_ERRORS):
        harness.db.raw(sql, params)


def test_an_approval_lifetime_over_24_hours_is_refused(harness: Harness) -> None:
    w = world(harness.db)
    req = request(w)

    _refused(
        harness,
        "UPDATE approval_requests SET expires_at_ms = requested_at_ms + 86400001 WHERE id = ?",
        (req.id,),
    )
    harness.db.raw(
        "UPDATE approval_requests SET expires_at_ms = requested_at_ms + 86400000 WHERE id = ?", (req.id,)
    )


@pytest.mark.parametrize(
    "assignment",
    [
        # a state without its tuple, or with half of it
        "state = 'approved', version = 2",
        "state = 'approved', version = 2, decision = 'approve'",
        # the wrong version for the state
        "state = 'pending', version = 2",
        # the requester deciding their own request
        "state = 'approved', version = 2, decision_id = 'd', decision = 'approve', reason_code = 'ok',"
        " decided_by = requested_by, decided_at_ms = requested_at_ms, decision_fence = '{}'",
        # a decision at the expiry instant
        "state = 'approved', version = 2, decision_id = 'd', decision = 'approve', reason_code = 'ok',"
        " decided_by = :approver, decided_at_ms = expires_at_ms, decision_fence = '{}'",
        # a reason code outside ^[a-z][a-z0-9_]{0,63}$
        "state = 'approved', version = 2, decision_id = 'd', decision = 'approve', reason_code = 'Not OK',"
        " decided_by = :approver, decided_at_ms = requested_at_ms, decision_fence = '{}'",
    ],
)
def test_approval_state_shapes_are_enforced(harness: Harness, assignment: str) -> None:
    w = world(harness.db)
    req = request(w)
    params: tuple[Any, ...] = (req.id,)
    if ":approver" in assignment:
        assignment = assignment.replace(":approver", "?")
        params = (w.approver.id, req.id)

    _refused(harness, f"UPDATE approval_requests SET {assignment} WHERE id = ?", params)


def test_a_consumed_approval_needs_its_whole_consumption_tuple(harness: Harness) -> None:
    w = world(harness.db)
    req = approved(w)

    _refused(
        harness,
        "UPDATE approval_requests SET state = 'consumed', version = 3, consumption_id = 'c' WHERE id = ?",
        (req.id,),
    )


def test_dispatches_are_immutable(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)

    _refused(
        harness, "UPDATE approved_action_dispatches SET action_ref = 'other' WHERE id = ?", (dispatch.id,)
    )


@pytest.mark.parametrize(
    "assignment",
    [
        # pending is v0 with no attempts
        "attempt_count = 1",
        # leased: eligible_at must equal the lease expiry
        "status = 'leased', version = 1, attempt_count = 1, lease_owner = 'o', lease_token_digest = :hex,"
        " lease_expires_at_ms = updated_at_ms + 1000, eligible_at_ms = updated_at_ms + 999",
        # a lease more than 10 minutes ahead
        "status = 'leased', version = 1, attempt_count = 1, lease_owner = 'o', lease_token_digest = :hex,"
        " lease_expires_at_ms = updated_at_ms + 600001, eligible_at_ms = updated_at_ms + 600001",
        # leased but already started
        "status = 'leased', version = 1, attempt_count = 1, lease_owner = 'o', lease_token_digest = :hex,"
        " lease_expires_at_ms = updated_at_ms + 1000, eligible_at_ms = updated_at_ms + 1000,"
        " started_at_ms = updated_at_ms",
        # executing without a start time
        "status = 'executing', version = 2, attempt_count = 1, lease_owner = 'o', lease_token_digest = :hex,"
        " lease_expires_at_ms = updated_at_ms + 1000, eligible_at_ms = NULL",
        # executing but still due
        "status = 'executing', version = 2, attempt_count = 1, lease_owner = 'o', lease_token_digest = :hex,"
        " lease_expires_at_ms = updated_at_ms + 1000, eligible_at_ms = updated_at_ms + 1000,"
        " started_at_ms = updated_at_ms",
        # retry_wait with no attempts left
        "status = 'retry_wait', version = 5, attempt_count = 5, next_attempt_at_ms = eligible_at_ms,"
        " result_code = 'handler_missing'",
        # succeeded without a start or a digest
        "status = 'succeeded', version = 2, attempt_count = 1, eligible_at_ms = NULL, result_code = 'ok',"
        " result_mutation_id = 'm', completed_at_ms = updated_at_ms",
        # a terminal row still holding a lease
        "status = 'blocked', version = 2, attempt_count = 1, eligible_at_ms = NULL, result_code = 'x',"
        " result_mutation_id = 'm', completed_at_ms = updated_at_ms, lease_owner = 'o',"
        " lease_token_digest = :hex, lease_expires_at_ms = updated_at_ms + 1000",
        # more attempts than allowed
        "max_attempts = 17",
    ],
)
def test_execution_state_shapes_are_enforced(harness: Harness, assignment: str) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    params: tuple[Any, ...] = (dispatch.id,)
    if ":hex" in assignment:
        assignment = assignment.replace(":hex", "?")
        params = ("a" * 64, dispatch.id)

    _refused(harness, f"UPDATE approved_action_executions SET {assignment} WHERE dispatch_id = ?", params)


def test_an_executing_row_cannot_become_due_again(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    started(harness.db, dispatch)

    _refused(
        harness,
        "UPDATE approved_action_executions SET eligible_at_ms = lease_expires_at_ms WHERE dispatch_id = ?",
        (dispatch.id,),
    )
    row = harness.db.raw(
        "SELECT status, eligible_at_ms FROM approved_action_executions WHERE dispatch_id = ?", (dispatch.id,)
    )[0]
    assert (row["status"], row["eligible_at_ms"]) == ("executing", None)


def test_lease_tokens_are_stored_only_as_digests(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = started(harness.db, dispatch)

    rows = harness.db.raw("SELECT * FROM approved_action_executions")
    assert fence.token not in str(rows)
    _refused(
        harness,
        "UPDATE approved_action_executions SET lease_token_digest = ? WHERE dispatch_id = ?",
        (fence.token, dispatch.id),
    )
