"""Creating approval requests (ADR-0031): only under the require-approval policy, exact replay, no secrets."""

from __future__ import annotations

import json

import pytest

from ql3.application import approvals, tasks
from ql3.domain.approvals import build_run_create_plan
from ql3.domain.digests import sha256_hex
from ql3.domain.errors import IdempotencyConflict, PermissionDenied, ValidationFailed
from ql3.domain.ids import new_id
from tests.support.approval_builders import HOUR, consume, decide, request, user, world
from tests.support.builders import count, seed_task
from tests.support.databases import Harness

CANARY = "canary-secret-7f3a9"


def test_a_task_that_requires_approval_gets_a_pending_request_bound_to_its_revision(harness: Harness) -> None:
    # Given a task whose pinned revision says approval is required
    w = world(harness.db)
    before = harness.now_ms()

    # When the operator asks to run it
    req = request(w, priority=7)

    # Then a pending@1 request binds the canonical run.create plan of that exact revision
    assert (req.state, req.version, req.risk, req.permission) == ("pending", 1, "medium", "run.create")
    assert req.action_type == "run.create" and req.action_ref == w.task.id
    revision = harness.db.transaction(lambda tx: tasks.get_revision(tx, w.task.id, 1), write=False)
    plan = build_run_create_plan(
        project_id=w.project.id,
        task_id=w.task.id,
        task_revision=1,
        priority=7,
        task_name="deploy",
        task_snapshot_ref=revision.content_digest,
    )
    assert req.action_plan == plan.canonical()
    assert req.action_digest == plan.digest() == sha256_hex(req.action_plan)
    assert list(json.loads(req.action_plan)) == [
        "schemaVersion",
        "actionType",
        "actionRef",
        "projectId",
        "taskId",
        "taskRevision",
        "executorType",
        "priority",
        "taskName",
        "taskSnapshotRef",
        "inputRef",
    ]
    assert req.expires_at_ms - req.requested_at_ms == HOUR and req.requested_at_ms >= before
    assert req.requested_by == w.requester.id and req.decision is None and req.dispatch_id is None


def test_a_task_without_the_approval_policy_cannot_create_a_request(harness: Harness) -> None:
    w = world(harness.db)
    plain = seed_task(harness.db, w.project, name="plain")

    with pytest.raises(ValidationFailed):
        harness.db.transaction(
            lambda tx: approvals.request_run_approval(
                tx, project_id=w.project.id, task_ref=plain.name, requested_by=w.requester
            )
        )

    assert count(harness.db, "approval_requests") == 0


def test_the_lifetime_is_capped_at_24_hours(harness: Harness) -> None:
    w = world(harness.db)

    with pytest.raises(ValidationFailed):
        request(w, ttl_ms=24 * HOUR + 1)
    with pytest.raises(ValidationFailed):
        request(w, ttl_ms=0)
    assert request(w, ttl_ms=24 * HOUR).expires_at_ms - harness.now_ms() <= 24 * HOUR


def test_the_default_lifetime_is_one_hour(harness: Harness) -> None:
    w = world(harness.db)

    req = harness.db.transaction(
        lambda tx: approvals.request_run_approval(
            tx, project_id=w.project.id, task_ref=w.task.id, requested_by=w.requester
        )
    )

    assert req.expires_at_ms - req.requested_at_ms == HOUR


def test_an_exact_replay_by_id_returns_the_stored_request_and_drift_conflicts(harness: Harness) -> None:
    # Given a request made with a client-supplied id
    w = world(harness.db)
    approval_id = new_id()
    first = request(w, approval_id=approval_id, priority=1)
    harness.advance_clock(5_000)

    # When the same request is replayed, it returns the stored row unchanged
    assert request(w, approval_id=approval_id, priority=1) == first

    # Then any drift in content is a conflict, and nothing new was written
    with pytest.raises(IdempotencyConflict):
        request(w, approval_id=approval_id, priority=2)
    with pytest.raises(IdempotencyConflict):
        request(w, approval_id=approval_id, priority=1, ttl_ms=2 * HOUR)
    assert count(harness.db, "approval_requests") == 1


def test_a_replay_after_the_task_was_edited_is_drift(harness: Harness) -> None:
    w = world(harness.db)
    approval_id = new_id()
    request(w, approval_id=approval_id)
    harness.db.transaction(lambda tx: tasks.edit_task(tx, w.project.id, w.task.name, {"command": "echo v2"}))

    with pytest.raises(IdempotencyConflict):
        request(w, approval_id=approval_id)


def test_only_a_principal_allowed_to_create_runs_may_request(harness: Harness) -> None:
    w = world(harness.db)
    viewer = user(harness.db, w.project, "viewer")
    approver_only = user(harness.db, w.project, "approver")

    for who in (viewer, approver_only):
        with pytest.raises(PermissionDenied):
            harness.db.transaction(
                lambda tx, who=who: approvals.request_run_approval(
                    tx, project_id=w.project.id, task_ref=w.task.name, requested_by=who
                )
            )
    assert count(harness.db, "approval_requests") == 0


def test_no_command_environment_or_secret_is_stored_with_the_approval(harness: Harness) -> None:
    # Given a task whose command and environment carry a canary secret
    w = world(harness.db, command=f"deploy --password {CANARY}", env={"TOKEN": CANARY})

    # When it is requested, approved and consumed
    dispatch = consume(w, decide(w, request(w).id).id)

    # Then neither the approval, the dispatch nor the execution control holds the secret or the command
    for table in ("approval_requests", "approved_action_dispatches", "approved_action_executions"):
        rows = harness.db.raw(f"SELECT * FROM {table}")
        assert (
            rows
            and CANARY not in json.dumps(rows, default=str)
            and "deploy --password" not in json.dumps(rows)
        )
    assert dispatch.action_type == "run.create"
