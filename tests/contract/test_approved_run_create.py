"""The run.create handler (ADR-0034): atomic Run + receipt, exact replay, fencing, receipt evidence."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from ql3.application import approved_actions, runs
from ql3.application.approved_action_handlers import RunCreateHandler
from ql3.domain.approvals import RunActionReceipt
from ql3.domain.errors import Conflict, FenceConflict, IdempotencyConflict, StorageUnavailable
from tests.support.approval_builders import (
    LEASE_MS,
    complete,
    dispatched,
    execution,
    refuse_inserts,
    runs_for,
    started,
    token,
    world,
)
from tests.support.builders import count
from tests.support.databases import Harness


def _receipts(harness: Harness) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = harness.db.raw("SELECT * FROM approved_run_action_receipts")
    return rows


def test_execute_creates_one_run_and_its_receipt_and_a_replay_returns_the_same(harness: Harness) -> None:
    # Given an action that crossed the start barrier
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = started(harness.db, dispatch)
    handler = RunCreateHandler()

    # When the handler executes, then executes again with the same dispatch id
    first = handler.execute(harness.db, dispatch, fence)
    second = handler.execute(harness.db, dispatch, fence)

    # Then there is one Run and one receipt, and the replay reports the same evidence
    assert first == second and first.outcome == "succeeded" and first.result_code == "approved_run_created"
    made = runs_for(harness.db, dispatch.id)
    receipts = _receipts(harness)
    assert len(made) == 1 and len(receipts) == 1
    r = receipts[0]
    assert (r["resource_type"], r["resource_id"], r["idempotency_key"]) == ("run", made[0]["id"], dispatch.id)
    assert (r["approval_request_id"], r["action_digest"], r["execution_attempt"], r["execution_version"]) == (
        dispatch.approval_request_id,
        dispatch.action_digest,
        1,
        2,
    )
    assert r["started_at_ms"] == fence.started_at_ms and r["created_at_ms"] == r["finished_at_ms"]
    assert first.result_digest == r["evidence_digest"]
    events = harness.db.raw(
        "SELECT type, actor_type FROM run_events WHERE run_id = ? ORDER BY sequence", (r["resource_id"],)
    )
    assert [(e["type"], e["actor_type"]) for e in events] == [
        ("run.created", "system"),
        ("run.queued", "system"),
    ]


def test_the_run_and_the_receipt_commit_together_or_not_at_all(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = started(harness.db, dispatch)
    refuse_inserts(harness, "approved_run_action_receipts")

    with pytest.raises(Conflict):
        RunCreateHandler().execute(harness.db, dispatch, fence)

    assert (
        count(harness.db, "runs") == count(harness.db, "run_events") == count(harness.db, "run_attempts") == 0
    )


def test_a_key_already_holding_a_run_without_a_receipt_is_a_conflict(harness: Harness) -> None:
    # Given someone created a Run under the dispatch id as idempotency key, outside the handler
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = started(harness.db, dispatch)
    harness.db.transaction(
        lambda tx: runs.create_run(
            tx, runs.CreateRun(project_id=w.project.id, task=w.task, idempotency_key=dispatch.id)
        )
    )

    # When the handler executes, it refuses to adopt that Run
    with pytest.raises(IdempotencyConflict):
        RunCreateHandler().execute(harness.db, dispatch, fence)

    # Then no receipt was written and no second Run exists
    assert _receipts(harness) == [] and count(harness.db, "runs") == 1


def test_a_stale_handler_is_fenced_before_any_run_write(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = started(harness.db, dispatch)
    handler = RunCreateHandler()

    for stale in (
        replace(fence, token=token()),
        replace(fence, owner="replica-z"),
        replace(fence, attempt=2),
        replace(fence, started_at_ms=(fence.started_at_ms or 0) - 1),
        replace(fence, version=fence.version + 1),
    ):
        with pytest.raises(FenceConflict):
            handler.execute(harness.db, dispatch, stale)
    complete(harness.db, fence, outcome="failed", result_code="gave_up")
    with pytest.raises(FenceConflict):
        handler.execute(harness.db, dispatch, fence)

    assert count(harness.db, "runs") == 0 and _receipts(harness) == []


def test_the_receipt_records_the_version_after_a_renewal(harness: Harness) -> None:
    # Given an executing action whose lease was renewed (version 2 -> 3)
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = started(harness.db, dispatch)
    renewed = harness.db.transaction(lambda tx: approved_actions.renew(tx, fence, lease_ms=LEASE_MS))

    # When a handler still holding the barrier fence executes (the version may only rise)
    result = RunCreateHandler().execute(harness.db, dispatch, fence)

    # Then the receipt is stamped with the real current version and verifies against the snapshot
    assert _receipts(harness)[0]["execution_version"] == renewed.version == 3
    ex = execution(harness.db, dispatch.id)
    evidence = RunCreateHandler().probe(harness.db, dispatch, ex)
    assert (evidence.finding, evidence.evidence_digest) == ("verified_succeeded", result.result_digest)


def test_the_evidence_provider_classifies_receipts_without_side_effects(harness: Harness) -> None:
    w = world(harness.db)
    handler = RunCreateHandler()

    # No receipt and no Run: missing
    none = dispatched(w)
    started(harness.db, none)
    assert handler.probe(harness.db, none, execution(harness.db, none.id)).finding == "missing"

    # A Run under the key but no receipt: conflict (a collision)
    collided = dispatched(w)
    started(harness.db, collided)
    harness.db.transaction(
        lambda tx: runs.create_run(
            tx, runs.CreateRun(project_id=w.project.id, task=w.task, idempotency_key=collided.id)
        )
    )
    assert handler.probe(harness.db, collided, execution(harness.db, collided.id)).finding == "conflict"

    # A receipt that binds everything: verified_succeeded
    good = dispatched(w)
    handler.execute(harness.db, good, started(harness.db, good))
    snapshot = execution(harness.db, good.id)
    before = (count(harness.db, "runs"), count(harness.db, "approved_run_action_receipts"))
    verified = handler.probe(harness.db, good, snapshot)
    assert verified.finding == "verified_succeeded" and verified.result_code == "approved_run_created"
    assert (count(harness.db, "runs"), count(harness.db, "approved_run_action_receipts")) == before

    # Any bound field that differs from the execution or dispatch fails closed as conflict
    for mismatch in (
        replace(snapshot, attempt_count=2),
        replace(snapshot, started_at_ms=(snapshot.started_at_ms or 0) + 1),
        replace(snapshot, version=1),  # the receipt's version may be lower, never higher
    ):
        assert handler.probe(harness.db, good, mismatch).finding == "conflict"
    for other in (
        replace(good, action_digest="0" * 64),
        replace(good, approval_request_id=none.approval_request_id),
    ):
        assert handler.probe(harness.db, other, snapshot).finding == "conflict"


def test_the_evidence_ignores_the_runs_final_status(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    handler = RunCreateHandler()
    handler.execute(harness.db, dispatch, started(harness.db, dispatch))
    run = runs_for(harness.db, dispatch.id)[0]
    harness.db.transaction(
        lambda tx: runs.transition(tx, run["id"], run["version"], "cancelled", actor_type="user")
    )

    assert (
        handler.probe(harness.db, dispatch, execution(harness.db, dispatch.id)).finding
        == "verified_succeeded"
    )


def test_a_database_error_is_unavailable_evidence(harness: Harness) -> None:
    class Down:
        dialect = harness.dialect

        def transaction(self, fn: Any, *, write: bool = True) -> Any:
            raise StorageUnavailable()

    w = world(harness.db)
    dispatch = dispatched(w)
    started(harness.db, dispatch)

    evidence = RunCreateHandler().probe(Down(), dispatch, execution(harness.db, dispatch.id))  # type: ignore[arg-type]

    assert evidence.finding == "unavailable"


def test_the_receipt_evidence_digest_covers_every_bound_field(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    result = RunCreateHandler().execute(harness.db, dispatch, started(harness.db, dispatch))
    row = _receipts(harness)[0]

    receipt = RunActionReceipt(
        dispatch_id=row["dispatch_id"],
        approval_request_id=row["approval_request_id"],
        project_id=row["project_id"],
        action_type=row["action_type"],
        action_digest=row["action_digest"],
        execution_attempt=row["execution_attempt"],
        execution_version=row["execution_version"],
        started_at_ms=row["started_at_ms"],
        idempotency_key=row["idempotency_key"],
        outcome=row["outcome"],
        result_code=row["result_code"],
        resource_type=row["resource_type"],
        resource_id=row["resource_id"],
        finished_at_ms=row["finished_at_ms"],
        created_at_ms=row["created_at_ms"],
    )
    assert receipt.evidence_digest() == row["evidence_digest"] == result.result_digest
    assert (
        replace(receipt, execution_version=receipt.execution_version + 1).evidence_digest()
        != result.result_digest
    )
