"""The bounded approved-action dispatcher: claim -> inspect -> start barrier -> execute -> complete."""

from __future__ import annotations

from typing import Any

import pytest

from ql3.application import approved_actions, tasks
from ql3.application.approved_action_handlers import HandlerResult, InspectBlocked, RunCreateHandler
from ql3.application.approved_action_runner import ApprovedActionDispatcher
from ql3.domain.approvals import Dispatch, ExecutionFence
from ql3.domain.errors import ValidationFailed
from ql3.ports.storage import Database, Transaction
from tests.support.approval_builders import (
    LEASE_MS,
    CountingHandler,
    approved,
    consume,
    dispatched,
    execution,
    recovery_row,
    runs_for,
    world,
)
from tests.support.builders import count
from tests.support.databases import Harness


def _dispatcher(db: Any, *handlers: Any, **kw: Any) -> ApprovedActionDispatcher:
    return ApprovedActionDispatcher(db, list(handlers) or [RunCreateHandler()], "replica-a", **kw)


def _tamper_plan(harness: Harness, dispatch_id: str, plan: str) -> None:
    """Simulate storage tampering behind the immutability trigger (a test-only DDL detour)."""
    if harness.dialect == "sqlite":
        harness.db.raw("DROP TRIGGER approved_action_dispatches_immutable")
    else:
        harness.db.raw(
            "ALTER TABLE approved_action_dispatches DISABLE TRIGGER approved_action_dispatches_immutable"
        )
    harness.db.raw(
        "UPDATE approved_action_dispatches SET action_plan_json = ? WHERE id = ?", (plan, dispatch_id)
    )


def test_a_batch_creates_the_approved_run_once_with_its_receipt(harness: Harness) -> None:
    # Given a consumed approval to run a task
    w = world(harness.db)
    dispatch = dispatched(w, priority=3)

    # When one dispatcher batch runs
    report = _dispatcher(harness.db).dispatch_batch()

    # Then exactly one queued Run exists, bound to the dispatch and approval, with a receipt
    assert report.scanned == 1 and [i.outcome for i in report.items] == ["succeeded"]
    made = runs_for(harness.db, dispatch.id)
    assert len(made) == 1
    run = made[0]
    assert (run["trigger_type"], run["request_id"], run["status"], run["priority"]) == (
        "approved_action",
        dispatch.approval_request_id,
        "queued",
        3,
    )
    assert (run["task_id"], run["task_revision"]) == (w.task.id, 1)
    receipts = harness.db.raw("SELECT * FROM approved_run_action_receipts")
    assert len(receipts) == 1 and receipts[0]["resource_id"] == run["id"]
    ex = execution(harness.db, dispatch.id)
    assert (ex.status, ex.result_code, ex.result_digest) == (
        "succeeded",
        "approved_run_created",
        receipts[0]["evidence_digest"],
    )
    control = recovery_row(harness.db, dispatch.id)
    assert control is not None and control["status"] == "resolved"

    # And later batches find nothing to do
    assert _dispatcher(harness.db).dispatch_batch().scanned == 0
    assert len(runs_for(harness.db, dispatch.id)) == 1


def test_the_run_pins_the_approved_revision_not_the_latest(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    harness.db.transaction(lambda tx: tasks.edit_task(tx, w.project.id, w.task.name, {"command": "echo v2"}))

    _dispatcher(harness.db).dispatch_batch()

    assert [r["task_revision"] for r in runs_for(harness.db, dispatch.id)] == [1]


def test_a_drifted_plan_digest_blocks_before_any_side_effect(harness: Harness) -> None:
    # Given a handler whose inspection of the plan yields another digest than the approved one
    w = world(harness.db)
    dispatch = dispatched(w)
    handler = CountingHandler(digest="e" * 64)

    # When the dispatcher processes it
    report = _dispatcher(harness.db, handler).dispatch_batch()

    # Then it is blocked before the barrier, execute never ran, and no Run exists
    assert [i.outcome for i in report.items] == ["blocked"]
    ex = execution(harness.db, dispatch.id)
    assert (ex.status, ex.result_code, ex.started_at_ms) == ("blocked", "action_digest_drift", None)
    assert (handler.inspected, handler.executed) == (1, 0)
    assert count(harness.db, "runs") == 0 and recovery_row(harness.db, dispatch.id) is None


def test_a_tampered_stored_plan_blocks_before_any_side_effect(harness: Harness) -> None:
    # Given the stored plan was altered (priority raised) after approval
    w = world(harness.db)
    dispatch = dispatched(w)
    _tamper_plan(harness, dispatch.id, dispatch.action_plan.replace('"priority":0', '"priority":9'))
    handler = CountingHandler()

    # When the dispatcher processes it
    _dispatcher(harness.db, handler).dispatch_batch()

    # Then the recomputed digest no longer matches: blocked, execute never ran, no Run
    ex = execution(harness.db, dispatch.id)
    assert (ex.status, ex.result_code) == ("blocked", "action_digest_drift")
    assert handler.executed == 0 and count(harness.db, "runs") == 0


def test_an_invalid_plan_is_blocked_with_the_handlers_reason(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    _tamper_plan(
        harness, dispatch.id, dispatch.action_plan.replace('{"schemaVersion":1', '{"schemaVersion":2')
    )

    _dispatcher(harness.db).dispatch_batch()

    ex = execution(harness.db, dispatch.id)
    assert (ex.status, ex.result_code) == ("blocked", "invalid_plan")
    assert count(harness.db, "runs") == 0


def test_a_missing_handler_retries_before_the_barrier_until_the_budget_ends(harness: Harness) -> None:
    # Given a dispatch with three attempts and a dispatcher without a run.create handler
    w = world(harness.db)
    dispatch = consume(w, approved(w).id, max_attempts=3)
    other_type = type("ToolHandler", (), {"action_type": "tool.call", "recovery_mode": "manual_only"})()
    d = _dispatcher(harness.db, other_type)

    # When batches run as each retry comes due
    outcomes = []
    for _ in range(3):
        outcomes += [i.outcome for i in d.dispatch_batch().items]
        ex = execution(harness.db, dispatch.id)
        if ex.eligible_at_ms is not None:
            harness.advance_clock(ex.eligible_at_ms - harness.now_ms())

    # Then two retries were scheduled with backoff and the third attempt blocked
    assert outcomes == ["retry_wait", "retry_wait", "blocked"]
    ex = execution(harness.db, dispatch.id)
    assert (ex.status, ex.attempt_count, ex.result_code) == ("blocked", 3, "handler_missing")
    assert count(harness.db, "runs") == 0


def test_a_transient_inspect_failure_is_retried_later(harness: Harness) -> None:
    class Flaky(CountingHandler):
        def inspect(self, tx: Transaction, dispatch: Dispatch) -> str:
            self.inspected += 1
            if self.inspected == 1:
                raise ConnectionError("artifact store unavailable")
            return super().inspect(tx, dispatch)

    w = world(harness.db)
    dispatch = dispatched(w)
    handler = Flaky()
    d = _dispatcher(harness.db, handler)

    assert [i.outcome for i in d.dispatch_batch().items] == ["retry_wait"]
    ex = execution(harness.db, dispatch.id)
    assert ex.result_code == "inspect_unavailable" and ex.eligible_at_ms is not None
    assert d.dispatch_batch().scanned == 0
    harness.advance_clock(ex.eligible_at_ms - harness.now_ms())
    assert [i.outcome for i in d.dispatch_batch().items] == ["succeeded"]
    assert len(runs_for(harness.db, dispatch.id)) == 1 and handler.executed == 1


def test_an_explicit_block_from_inspect_never_executes(harness: Harness) -> None:
    class Refusing(CountingHandler):
        def inspect(self, tx: Transaction, dispatch: Dispatch) -> str:
            raise InspectBlocked("policy_refused")

    w = world(harness.db)
    dispatch = dispatched(w)
    handler = Refusing()

    _dispatcher(harness.db, handler).dispatch_batch()

    assert (execution(harness.db, dispatch.id).status, handler.executed) == ("blocked", 0)


def test_a_handler_that_throws_after_the_barrier_is_blocked_and_never_retried(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    handler = CountingHandler(explode=True)
    d = _dispatcher(harness.db, handler)

    report = d.dispatch_batch()
    harness.advance_clock(LEASE_MS * 2)
    d.dispatch_batch()

    assert [i.outcome for i in report.items] == ["blocked"]
    ex = execution(harness.db, dispatch.id)
    assert (ex.status, ex.result_code, ex.attempt_count) == ("blocked", "handler_error", 1)
    assert handler.executed == 1


def test_an_unprovable_result_is_indeterminate(harness: Harness) -> None:
    class Unprovable(CountingHandler):
        def execute(self, db: Database, dispatch: Dispatch, fence: ExecutionFence) -> HandlerResult:
            self.executed += 1
            return HandlerResult(outcome="succeeded", result_code="ok")  # no digest: cannot be proven

    w = world(harness.db)
    dispatch = dispatched(w)

    _dispatcher(harness.db, Unprovable()).dispatch_batch()

    ex = execution(harness.db, dispatch.id)
    assert (ex.status, ex.result_code) == ("blocked", "unprovable_result")


def test_a_crash_after_the_barrier_is_never_executed_again(harness: Harness) -> None:
    # Given the dispatcher dies right after committing the start barrier
    w = world(harness.db)
    dispatch = dispatched(w)
    handler = CountingHandler()

    def crash(point: str) -> None:
        if point == "after_start_barrier":
            raise SystemExit("power loss")

    with pytest.raises(SystemExit):
        _dispatcher(harness.db, handler, fault=crash).dispatch_batch()
    assert execution(harness.db, dispatch.id).status == "executing"

    # When the lease lapses and fresh dispatchers keep running
    harness.advance_clock(LEASE_MS)
    for _ in range(3):
        report = _dispatcher(harness.db, handler).dispatch_batch()
        assert report.scanned == 0
        harness.advance_clock(LEASE_MS)

    # Then the action is recovery_required and was never executed
    assert handler.executed == 0 and count(harness.db, "runs") == 0
    view = approved_actions.get_action
    shown = harness.db.transaction(lambda tx: view(tx, w.project.id, dispatch.id), write=False)
    assert shown["effective_status"] == "recovery_required"


def test_a_failed_completion_write_leaves_the_row_for_recovery_without_retry(harness: Harness) -> None:
    # Given a handler that renews its lease mid-flight but loses the renewed fence before completion
    class Renewing(CountingHandler):
        def execute(self, db: Database, dispatch: Dispatch, fence: ExecutionFence) -> HandlerResult:
            db.transaction(lambda tx: approved_actions.renew(tx, fence, lease_ms=LEASE_MS))
            return super().execute(db, dispatch, fence)

    w = world(harness.db)
    dispatch = dispatched(w)
    handler = Renewing()

    # When the batch runs, the completion write is fenced out
    report = _dispatcher(harness.db, handler).dispatch_batch()

    # Then the row stays executing (the Run exists exactly once) and is never executed again
    assert [i.outcome for i in report.items] == ["completion_failed"]
    assert execution(harness.db, dispatch.id).status == "executing"
    harness.advance_clock(LEASE_MS * 2)
    assert _dispatcher(harness.db, handler).dispatch_batch().scanned == 0
    assert handler.executed == 1 and len(runs_for(harness.db, dispatch.id)) == 1


def test_one_batch_reads_one_capped_page(harness: Harness) -> None:
    w = world(harness.db)
    for _ in range(3):
        dispatched(w)

    report = _dispatcher(harness.db, page=2).dispatch_batch()

    assert report.scanned == 2 and report.next_cursor is not None
    assert count(harness.db, "runs") == 2
    with pytest.raises(ValidationFailed):
        _dispatcher(harness.db, page=65)
    with pytest.raises(ValidationFailed):
        _dispatcher(harness.db, lease_ms=600_001)
    with pytest.raises(ValidationFailed):
        _dispatcher(harness.db, max_attempts=17)
