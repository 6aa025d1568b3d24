"""Recovery (ADR-0033/0034): lapsed executing rows are resolved only by evidence or by a person."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from ql3.application import approved_action_recovery, runs
from ql3.application.approved_action_handlers import Evidence, RunCreateHandler
from ql3.application.approved_action_recovery import RecoveryResolver
from ql3.application.approved_action_runner import ApprovedActionDispatcher
from ql3.domain.approvals import Dispatch, Execution
from ql3.domain.errors import Conflict, FenceConflict, PermissionDenied, Ql3Error, ValidationFailed
from ql3.domain.ids import new_id
from ql3.domain.model import Principal
from ql3.ports.storage import Database
from tests.support.approval_builders import (
    LEASE_MS,
    CountingHandler,
    ManualOnlyHandler,
    action,
    claim,
    complete,
    dispatched,
    due_ids,
    execution,
    recovery_row,
    runs_for,
    started,
    user,
    world,
)
from tests.support.builders import count
from tests.support.databases import Harness


def _resolver(db: Any, *providers: Any, owner: str = "resolver-a", **kw: Any) -> RecoveryResolver:
    return RecoveryResolver(db, list(providers) or [RunCreateHandler()], owner, **kw)


def _manual(harness: Harness, w: Any, dispatch_id: str, who: Principal, role: str, **kw: Any) -> Execution:
    kw.setdefault("mutation_id", new_id())
    kw.setdefault("decision", "confirm_failed")
    kw.setdefault("reason_code", "checked_downstream")
    if "expected_execution_version" not in kw:
        kw["expected_execution_version"] = execution(harness.db, dispatch_id).version
    result: Execution = harness.db.transaction(
        lambda tx: approved_action_recovery.resolve_manually(
            tx, dispatch_id=dispatch_id, project_id=w.project.id, principal=who, role=role, **kw
        )
    )
    return result


def _executed_then_crashed(harness: Harness, w: Any) -> tuple[Dispatch, Any]:
    """The handler's transaction committed (Run + receipt) but the completion was never written."""
    dispatch = dispatched(w)
    fence = started(harness.db, dispatch)
    RunCreateHandler().execute(harness.db, dispatch, fence)
    return dispatch, fence


def test_the_resolver_closes_a_lost_run_create_completion_from_its_receipt(harness: Harness) -> None:
    # Given run.create executed but the process died before writing the completion
    w = world(harness.db)
    dispatch, _ = _executed_then_crashed(harness, w)

    # When the lease has not expired yet, the resolver leaves it alone
    assert _resolver(harness.db).resolve_batch().scanned == 0

    # When the lease lapses and the resolver runs
    harness.advance_clock(LEASE_MS)
    report = _resolver(harness.db).resolve_batch()

    # Then the receipt proves success: one transaction wrote the resolution, the terminal state and the
    # closed control, and exactly one Run exists
    assert [i.outcome for i in report.items] == ["resolved_succeeded"]
    ex = execution(harness.db, dispatch.id)
    receipt = harness.db.raw("SELECT * FROM approved_run_action_receipts")[0]
    assert (ex.status, ex.result_code, ex.result_digest) == (
        "succeeded",
        "approved_run_created",
        receipt["evidence_digest"],
    )
    resolution = harness.db.raw("SELECT * FROM approved_action_resolutions")[0]
    assert (resolution["source"], resolution["resolution"], resolution["actor_type"]) == (
        "resolver",
        "verified_succeeded",
        "system",
    )
    assert (
        resolution["mutation_id"] == ex.result_mutation_id and resolution["expected_execution_version"] == 2
    )
    control = recovery_row(harness.db, dispatch.id)
    assert control is not None and (control["status"], control["resolution_mutation_id"]) == (
        "resolved",
        ex.result_mutation_id,
    )
    assert len(runs_for(harness.db, dispatch.id)) == 1
    assert _resolver(harness.db).resolve_batch().scanned == 0


def test_missing_evidence_is_recorded_and_scanned_again_later(harness: Harness) -> None:
    # Given the dispatcher crashed right after the barrier: nothing was executed
    w = world(harness.db)
    dispatch = dispatched(w)
    started(harness.db, dispatch)
    harness.advance_clock(LEASE_MS)

    # When the resolver probes it
    report = _resolver(harness.db).resolve_batch()

    # Then the finding is recorded with a later scan; it stays recovery_required and is never executed
    assert [i.outcome for i in report.items] == ["missing"]
    control = recovery_row(harness.db, dispatch.id)
    assert control is not None and control["status"] == "armed" and control["last_finding"] == "missing"
    assert control["resolver_owner"] is None and control["next_scan_at_ms"] > harness.now_ms()
    assert _resolver(harness.db).resolve_batch().scanned == 0
    assert action(harness.db, w.project, dispatch.id)["effective_status"] == "recovery_required"
    harness.advance_clock(control["next_scan_at_ms"] - harness.now_ms())
    assert [i.outcome for i in _resolver(harness.db).resolve_batch().items] == ["missing"]
    assert recovery_row(harness.db, dispatch.id)["scan_count"] == 2  # type: ignore[index]
    assert count(harness.db, "runs") == 0 and dispatch.id not in due_ids(harness.db)


def test_a_manual_only_handler_waits_for_a_person(harness: Harness) -> None:
    # Given a manual-only action whose completion was lost
    w = world(harness.db)
    dispatch = dispatched(w)
    started(harness.db, dispatch)
    harness.advance_clock(LEASE_MS)
    handler = ManualOnlyHandler()

    # When the resolver sees it, it is handed to the manual queue without probing
    report = _resolver(harness.db, handler).resolve_batch()
    assert [i.outcome for i in report.items] == ["manual"] and handler.probed == 0
    control = recovery_row(harness.db, dispatch.id)
    assert control is not None and (control["status"], control["last_finding"]) == ("manual", "manual_only")
    assert _resolver(harness.db, handler).resolve_batch().scanned == 0
    assert execution(harness.db, dispatch.id).status == "executing"

    # Then an approver resolves it by hand
    done = _manual(harness, w, dispatch.id, w.approver, "approver", decision="confirm_failed")
    assert (done.status, done.result_code) == ("failed", "confirm_failed")
    resolution = harness.db.raw("SELECT * FROM approved_action_resolutions")[0]
    assert (
        resolution["source"],
        resolution["actor_id"],
        resolution["actor_role"],
        resolution["outcome"],
    ) == (
        "manual",
        w.approver.id,
        "approver",
        "failed",
    )
    assert recovery_row(harness.db, dispatch.id)["status"] == "resolved"  # type: ignore[index]
    assert handler.executed == 0


def test_conflicting_evidence_goes_to_the_manual_queue(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    started(harness.db, dispatch)
    harness.db.transaction(
        lambda tx: runs.create_run(
            tx, runs.CreateRun(project_id=w.project.id, task=w.task, idempotency_key=dispatch.id)
        )
    )
    harness.advance_clock(LEASE_MS)

    report = _resolver(harness.db).resolve_batch()

    assert [i.outcome for i in report.items] == ["manual"]
    control = recovery_row(harness.db, dispatch.id)
    assert control is not None and (control["status"], control["last_finding"]) == ("manual", "conflict")
    assert execution(harness.db, dispatch.id).status == "executing"


def test_a_late_completion_beats_a_resolver_that_is_still_probing(harness: Harness) -> None:
    # Given a lapsed execution whose original owner reports while the resolver is probing
    w = world(harness.db)
    dispatch, fence = _executed_then_crashed(harness, w)
    harness.advance_clock(LEASE_MS)
    late = new_id()

    @dataclass
    class Racing:
        inner: RunCreateHandler = field(default_factory=RunCreateHandler)
        action_type: str = "run.create"
        recovery_mode: str = "automatic"

        def probe(self, db: Database, d: Dispatch, ex: Execution) -> Evidence:
            evidence = self.inner.probe(db, d, ex)
            complete(harness.db, fence, mutation_id=late, outcome="failed", result_code="exit_nonzero")
            return evidence

    # When the resolver tries to write its resolution
    report = _resolver(harness.db, Racing()).resolve_batch()

    # Then exactly one result exists: the completion's; the resolver lost the version CAS
    assert [i.outcome for i in report.items] == ["lost_race"]
    ex = execution(harness.db, dispatch.id)
    assert (ex.status, ex.result_mutation_id) == ("failed", late)
    assert count(harness.db, "approved_action_resolutions") == 0
    # and the loser may only replay exactly
    assert complete(harness.db, fence, mutation_id=late, outcome="failed", result_code="exit_nonzero") == ex


def test_a_late_completion_after_the_resolution_is_refused(harness: Harness) -> None:
    w = world(harness.db)
    dispatch, fence = _executed_then_crashed(harness, w)
    harness.advance_clock(LEASE_MS)
    _resolver(harness.db).resolve_batch()
    resolved = execution(harness.db, dispatch.id)

    with pytest.raises(Conflict):
        complete(harness.db, fence, outcome="failed", result_code="exit_nonzero")

    assert execution(harness.db, dispatch.id) == resolved and resolved.status == "succeeded"


def test_completion_and_resolver_racing_on_two_connections_have_one_winner(harness: Harness) -> None:
    w = world(harness.db)
    dispatch, fence = _executed_then_crashed(harness, w)
    harness.advance_clock(LEASE_MS)
    other = harness.second_connection()
    barrier = threading.Barrier(2)
    outcome: dict[str, Any] = {}

    def late_completion() -> None:
        barrier.wait()
        try:
            outcome["complete"] = complete(other, fence, outcome="failed", result_code="exit_nonzero").status
        except Ql3Error as exc:
            outcome["complete"] = exc

    def resolver() -> None:
        barrier.wait()
        outcome["resolver"] = [i.outcome for i in _resolver(harness.db).resolve_batch().items]

    threads = [threading.Thread(target=late_completion), threading.Thread(target=resolver)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    other.close()

    ex = execution(harness.db, dispatch.id)
    completion_won = outcome["complete"] == "failed"
    resolver_won = outcome["resolver"] == ["resolved_succeeded"]
    assert completion_won != resolver_won, outcome
    assert ex.status == ("failed" if completion_won else "succeeded")
    assert count(harness.db, "approved_action_resolutions") == (0 if completion_won else 1)


def test_one_resolver_lease_per_row(harness: Harness) -> None:
    # Given a lapsed execution and a resolver that is probing it
    w = world(harness.db)
    dispatch, _ = _executed_then_crashed(harness, w)
    harness.advance_clock(LEASE_MS)
    seen: list[int] = []

    @dataclass
    class Nested:
        action_type: str = "run.create"
        recovery_mode: str = "automatic"

        def probe(self, db: Database, d: Dispatch, ex: Execution) -> Evidence:
            # a second resolver on another replica looks at the same row meanwhile
            seen.append(_resolver(harness.db, owner="resolver-b").resolve_batch().scanned)
            return Evidence(finding="still_running")

    # When the first resolver probes, the second finds nothing to take
    _resolver(harness.db, Nested()).resolve_batch()

    assert seen == [0]
    control = recovery_row(harness.db, dispatch.id)
    assert control is not None and control["last_finding"] == "still_running"


def test_a_resolver_whose_lease_lapsed_cannot_write_its_result(harness: Harness) -> None:
    # Given resolver A probes so slowly that its resolver lease lapses and resolver B takes the row over
    w = world(harness.db)
    dispatch, _ = _executed_then_crashed(harness, w)
    harness.advance_clock(LEASE_MS)
    inner: list[list[str]] = []

    @dataclass
    class StillRunning:
        action_type: str = "run.create"
        recovery_mode: str = "automatic"

        def probe(self, db: Database, d: Dispatch, ex: Execution) -> Evidence:
            return Evidence(finding="still_running")

    @dataclass
    class Slow:
        inner: RunCreateHandler = field(default_factory=RunCreateHandler)
        action_type: str = "run.create"
        recovery_mode: str = "automatic"

        def probe(self, db: Database, d: Dispatch, ex: Execution) -> Evidence:
            evidence = self.inner.probe(db, d, ex)
            harness.advance_clock(30_000)
            report = _resolver(harness.db, StillRunning(), owner="resolver-b").resolve_batch()
            inner.append([i.outcome for i in report.items])
            return evidence

    # When A finally writes its verified result
    report = _resolver(harness.db, Slow(), lease_ms=30_000).resolve_batch()

    # Then A's write is fenced out and B's finding stands
    assert inner == [["still_running"]] and [i.outcome for i in report.items] == ["lease_lost"]
    assert execution(harness.db, dispatch.id).status == "executing"
    control = recovery_row(harness.db, dispatch.id)
    assert control is not None and (control["status"], control["last_finding"]) == ("armed", "still_running")


def test_unknown_or_unproven_evidence_never_resolves(harness: Harness) -> None:
    @dataclass
    class Liar:
        action_type: str = "run.create"
        recovery_mode: str = "automatic"

        def probe(self, db: Database, d: Dispatch, ex: Execution) -> Evidence:
            return Evidence(finding="verified_succeeded")  # no evidence digest

    w = world(harness.db)
    dispatch = dispatched(w)
    started(harness.db, dispatch)
    harness.advance_clock(LEASE_MS)

    assert [i.outcome for i in _resolver(harness.db, Liar()).resolve_batch().items] == ["manual"]
    assert execution(harness.db, dispatch.id).status == "executing"


def test_recovery_never_reenters_due_claim_or_execute(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    started(harness.db, dispatch)
    handler = CountingHandler()
    harness.advance_clock(LEASE_MS)

    for _ in range(3):
        ApprovedActionDispatcher(harness.db, [handler], "replica-b").dispatch_batch()
        _resolver(harness.db, handler).resolve_batch()
        harness.advance_clock(LEASE_MS * 10)

    assert handler.executed == 0 and handler.inspected == 0
    assert claim(harness.db, dispatch.id).outcome == "recovery_required"
    assert count(harness.db, "runs") == 0


# -- manual resolution --------------------------------------------------------------------------


def test_manual_resolution_rechecks_the_user_the_role_and_the_version(harness: Harness) -> None:
    # Given a recovery_required action
    w = world(harness.db)
    dispatch = dispatched(w)
    started(harness.db, dispatch)
    harness.advance_clock(LEASE_MS)
    version = execution(harness.db, dispatch.id).version

    # When people without approval.recover, with a stale role or with a stale version try, all fail
    for role in ("viewer", "operator"):
        with pytest.raises(PermissionDenied):
            _manual(harness, w, dispatch.id, user(harness.db, w.project, role), role)
    robot = user(harness.db, w.project, "approver", "robot", kind="service")
    with pytest.raises(PermissionDenied):
        _manual(harness, w, dispatch.id, robot, "approver")
    with pytest.raises(FenceConflict):
        _manual(harness, w, dispatch.id, w.approver, "admin")
    with pytest.raises(FenceConflict):
        _manual(harness, w, dispatch.id, w.approver, "approver", expected_execution_version=version - 1)
    with pytest.raises(ValidationFailed):
        _manual(harness, w, dispatch.id, w.approver, "approver", decision="retry")
    assert execution(harness.db, dispatch.id).status == "executing"

    # Then the approver with the exact version resolves it, and an exact replay returns the same row
    mutation_id = new_id()
    done = _manual(
        harness,
        w,
        dispatch.id,
        w.approver,
        "approver",
        mutation_id=mutation_id,
        decision="abandon_unknown",
        expected_execution_version=version,
    )
    assert (done.status, done.result_code, done.result_digest) == ("blocked", "abandon_unknown", None)
    replay = _manual(
        harness,
        w,
        dispatch.id,
        w.approver,
        "approver",
        mutation_id=mutation_id,
        decision="abandon_unknown",
        expected_execution_version=version,
    )
    assert replay == done
    with pytest.raises(Conflict):
        _manual(harness, w, dispatch.id, w.approver, "approver", expected_execution_version=version)

    # And nothing can bring it back: it is terminal, never due, never claimed
    assert claim(harness.db, dispatch.id).outcome == "terminal" and dispatch.id not in due_ids(harness.db)


def test_manual_resolution_is_only_for_recovery_required_rows(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = started(harness.db, dispatch)

    with pytest.raises(Conflict):
        _manual(harness, w, dispatch.id, w.approver, "approver")
    complete(harness.db, fence, outcome="failed", result_code="exit_nonzero")
    harness.advance_clock(LEASE_MS)
    with pytest.raises(Conflict):
        _manual(harness, w, dispatch.id, w.approver, "approver")


def test_confirm_succeeded_maps_to_succeeded_with_a_resolution_digest(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    started(harness.db, dispatch)
    harness.advance_clock(LEASE_MS)
    admin = user(harness.db, w.project, "admin", "admin-2")

    done = _manual(harness, w, dispatch.id, admin, "admin", decision="confirm_succeeded")

    assert done.status == "succeeded" and done.result_digest is not None and len(done.result_digest) == 64
