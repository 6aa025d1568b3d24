"""The approved-actions repository's own compare-and-set writes: a write from a stale read of an
execution or its recovery control, or on one in the wrong state, changes nothing and says so (the
use cases read both rows under their locks first, so only these tests reach the refusals)."""

from __future__ import annotations

from dataclasses import replace

from ql3.domain.approvals import Execution
from ql3.repositories import actions as action_store
from tests.support.approval_builders import dispatched, execution, started, world
from tests.support.databases import Harness

DIGEST = "0" * 64


def _rows(harness: Harness, dispatch_id: str) -> list[dict[str, object]]:
    found = harness.db.raw("SELECT * FROM approved_action_executions WHERE dispatch_id = ?", (dispatch_id,))
    control = harness.db.raw("SELECT * FROM approved_action_recovery WHERE dispatch_id = ?", (dispatch_id,))
    return [dict(r) for r in found] + [dict(r) for r in control]


def test_execution_writes_from_a_stale_read_or_in_the_wrong_state_change_nothing(harness: Harness) -> None:
    # Given an execution read while pending@0, then claimed and started (executing@2)
    w = world(harness.db)
    dispatch = dispatched(w)
    pending = execution(harness.db, dispatch.id)
    started(harness.db, dispatch)
    current = execution(harness.db, dispatch.id)
    assert (pending.status, pending.version, current.status, current.version) == (
        "pending",
        0,
        "executing",
        2,
    )
    before = _rows(harness, dispatch.id)
    now = harness.db.transaction(lambda tx: tx.now_ms(), write=False)
    later = now + 60_000

    # When every execution write is tried from the stale read, and the pre-barrier ones on the
    # executing row at its own version
    def writes(ex: Execution) -> tuple[bool, ...]:
        answers: tuple[bool, ...] = harness.db.transaction(
            lambda tx: (
                action_store.claim_execution(
                    tx,
                    ex,
                    lease_owner="other",
                    lease_token_digest=DIGEST,
                    lease_expires_at_ms=later,
                    now_ms=now,
                ),
                action_store.renew_leased(tx, ex, lease_expires_at_ms=later, now_ms=now),
                action_store.start_execution(tx, ex, now_ms=now),
                action_store.release_execution(
                    tx,
                    ex,
                    status="blocked",
                    next_attempt_at_ms=None,
                    result_mutation_id="m-stale",
                    result_code="stale",
                    completed_at_ms=now,
                    now_ms=now,
                ),
            )
        )
        return answers

    stale = writes(pending)
    stale_finish = harness.db.transaction(
        lambda tx: (
            action_store.renew_executing(tx, pending, lease_expires_at_ms=later, now_ms=now),
            action_store.finish_execution(
                tx,
                pending,
                status="failed",
                result_mutation_id="m-stale",
                result_code="stale",
                result_digest=None,
                now_ms=now,
            ),
        )
    )
    wrong_state = writes(current)

    # Then each refuses and nothing moved
    assert stale == (False, False, False, False)
    assert stale_finish == (False, False)
    assert wrong_state == (False, False, False, False)
    assert _rows(harness, dispatch.id) == before

    # And the finish at the current version applies
    finished = harness.db.transaction(
        lambda tx: action_store.finish_execution(
            tx,
            current,
            status="failed",
            result_mutation_id="m-now",
            result_code="done",
            result_digest=None,
            now_ms=now,
        )
    )
    assert finished and execution(harness.db, dispatch.id).status == "failed"


def test_recovery_writes_need_the_control_version_and_the_resolver_lease(harness: Harness) -> None:
    # Given a started execution whose recovery control is armed@0 and not leased to any resolver
    w = world(harness.db)
    dispatch = dispatched(w)
    started(harness.db, dispatch)
    control = harness.db.transaction(lambda tx: action_store.lock_recovery(tx, dispatch.id))
    assert control is not None and (control.status, control.version) == ("armed", 0)
    before = _rows(harness, dispatch.id)
    now = harness.db.transaction(lambda tx: tx.now_ms(), write=False)

    # When it is acquired from a stale version, or a finding is written without the resolver lease
    refused = harness.db.transaction(
        lambda tx: (
            action_store.acquire_recovery(
                tx,
                replace(control, version=1),
                resolver_owner="resolver-a",
                resolver_token_digest=DIGEST,
                resolver_lease_expires_at_ms=now + 30_000,
                now_ms=now,
            ),
            action_store.record_recovery_finding(
                tx,
                dispatch.id,
                expected_version=0,
                resolver_token_digest=DIGEST,
                last_finding="missing",
                next_scan_at_ms=now + 30_000,
                now_ms=now,
            ),
            action_store.recovery_to_manual(
                tx,
                dispatch.id,
                expected_version=0,
                resolver_token_digest=DIGEST,
                last_finding="conflict",
                now_ms=now,
            ),
        )
    )

    # Then each refuses and nothing moved
    assert refused == (False, False, False)
    assert _rows(harness, dispatch.id) == before

    # And under the lease it takes, the finding is written once, at the next version only
    assert harness.db.transaction(
        lambda tx: action_store.acquire_recovery(
            tx,
            control,
            resolver_owner="resolver-a",
            resolver_token_digest=DIGEST,
            resolver_lease_expires_at_ms=now + 30_000,
            now_ms=now,
        )
    )
    written = harness.db.transaction(
        lambda tx: tuple(
            action_store.record_recovery_finding(
                tx,
                dispatch.id,
                expected_version=1,
                resolver_token_digest=DIGEST,
                last_finding="missing",
                next_scan_at_ms=now + 30_000,
                now_ms=now,
            )
            for _ in range(2)
        )
    )
    assert written == (True, False)
