"""Execution control (ADR-0032): due scan, fenced claim/renew/start/release/complete, recovery_required."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import pytest

from ql3.application import approved_actions
from ql3.application.approved_actions import ExecutionClaim
from ql3.domain.approvals import ExecutionFence
from ql3.domain.errors import Conflict, FenceConflict, ValidationFailed
from ql3.domain.ids import new_id
from tests.support.approval_builders import (
    LEASE_MS,
    action,
    approved,
    claim,
    complete,
    consume,
    dispatched,
    due_ids,
    execution,
    leased,
    recovery_row,
    started,
    token,
    world,
)
from tests.support.databases import Harness


def _start(db: Any, dispatch: Any, fence: ExecutionFence, **kw: Any) -> ExecutionFence:
    args = {
        "approval_request_id": dispatch.approval_request_id,
        "action_digest": dispatch.action_digest,
        **kw,
    }
    result: ExecutionFence = db.transaction(lambda tx: approved_actions.start(tx, fence, **args))
    return result


def _release(db: Any, fence: ExecutionFence, **kw: Any) -> Any:
    kw.setdefault("mutation_id", new_id())
    kw.setdefault("result_code", "handler_missing")
    return db.transaction(lambda tx: approved_actions.release_before_start(tx, fence, **kw))


# -- due scan -----------------------------------------------------------------------------------


def test_the_due_scan_is_a_capped_keyset_over_eligible_time(harness: Harness) -> None:
    # Given five dispatches made one second apart
    w = world(harness.db)
    made = []
    for _ in range(5):
        made.append(dispatched(w).id)
        harness.advance_clock(1_000)

    # When the due scan pages two at a time
    first = harness.db.transaction(lambda tx: approved_actions.due_page(tx, limit=2), write=False)
    cursor = (first[-1].eligible_at_ms, first[-1].dispatch_id)
    second = harness.db.transaction(
        lambda tx: approved_actions.due_page(tx, limit=2, after=cursor), write=False
    )

    # Then the pages follow (eligible_at, dispatch_id) without overlap, and pages over 64 are refused
    assert [r.dispatch_id for r in first + second] == made[:4]
    assert due_ids(harness.db, limit=64) == made
    with pytest.raises(ValidationFailed):
        due_ids(harness.db, limit=65)
    with pytest.raises(ValidationFailed):
        due_ids(harness.db, limit=0)


def test_the_due_scan_never_returns_executing_or_terminal_rows(harness: Harness) -> None:
    # Given one pending, one live-leased, one executing and one succeeded dispatch
    w = world(harness.db)
    pending = dispatched(w)
    live = dispatched(w)
    leased(harness.db, live.id)
    executing = dispatched(w)
    started(harness.db, executing)
    done = dispatched(w)
    complete(harness.db, started(harness.db, done), outcome="failed", result_code="exit_nonzero")

    # Then only the pending one is due
    assert due_ids(harness.db) == [pending.id]

    # When every lease has expired, the abandoned lease is due again but executing is not
    harness.advance_clock(LEASE_MS)
    assert set(due_ids(harness.db)) == {pending.id, live.id}
    assert executing.id not in due_ids(harness.db) and done.id not in due_ids(harness.db)


# -- claim --------------------------------------------------------------------------------------


def test_claim_leases_a_pending_row_and_sets_eligibility_to_the_expiry(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)

    result = claim(harness.db, dispatch.id, owner="replica-a")

    ex = execution(harness.db, dispatch.id)
    assert result.outcome == "claimed" and result.fence is not None
    assert (ex.status, ex.version, ex.attempt_count, ex.lease_owner) == ("leased", 1, 1, "replica-a")
    assert ex.eligible_at_ms == ex.lease_expires_at_ms == result.now_ms + LEASE_MS
    assert (result.fence.version, result.fence.attempt) == (1, 1)


def test_the_same_owner_and_token_replay_a_live_claim_and_another_token_sees_the_lease(
    harness: Harness,
) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    tok = token()
    first = claim(harness.db, dispatch.id, tok=tok)

    replay = claim(harness.db, dispatch.id, tok=tok)
    other = claim(harness.db, dispatch.id, owner="replica-b")

    assert replay.outcome == "idempotent" and replay.fence == first.fence
    assert other.outcome == "leased" and other.fence is None
    assert execution(harness.db, dispatch.id).version == 1


def test_two_connections_racing_for_one_row_make_exactly_one_claim(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    other = harness.second_connection()
    barrier = threading.Barrier(2)
    results: list[ExecutionClaim | None] = [None, None]

    def race(i: int, db: Any) -> None:
        barrier.wait()
        results[i] = claim(db, dispatch.id, owner=f"replica-{i}")

    threads = [threading.Thread(target=race, args=(i, db)) for i, db in enumerate([harness.db, other])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    other.close()

    outcomes = sorted(r.outcome for r in results if r is not None)
    assert outcomes == ["claimed", "leased"]
    ex = execution(harness.db, dispatch.id)
    assert (ex.version, ex.attempt_count) == (1, 1)


def test_an_expired_lease_before_the_barrier_is_taken_over_with_a_new_token(harness: Harness) -> None:
    # Given replica A leased the row and went silent
    w = world(harness.db)
    dispatch = dispatched(w)
    stale = leased(harness.db, dispatch.id, owner="replica-a")
    harness.advance_clock(LEASE_MS)

    # When replica B claims it after expiry
    takeover = claim(harness.db, dispatch.id, owner="replica-b")

    # Then B holds attempt 2 and A's fence is dead for start, renew and release
    assert takeover.outcome == "claimed" and takeover.fence is not None
    assert (takeover.fence.attempt, takeover.fence.version) == (2, 2)
    with pytest.raises(FenceConflict):
        _start(harness.db, dispatch, stale)
    with pytest.raises(FenceConflict):
        harness.db.transaction(lambda tx: approved_actions.renew(tx, stale))
    with pytest.raises(FenceConflict):
        _release(harness.db, stale)
    assert _start(harness.db, dispatch, takeover.fence).version == 3


def test_an_expired_lease_is_not_taken_over_under_the_same_token(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    tok = token()
    leased(harness.db, dispatch.id, tok=tok)
    harness.advance_clock(LEASE_MS)

    assert claim(harness.db, dispatch.id, tok=tok).outcome == "stale_token"
    assert claim(harness.db, dispatch.id).outcome == "claimed"


def test_an_expired_executing_row_is_only_recovery_required(harness: Harness) -> None:
    # Given an execution that crossed the start barrier and whose lease then lapsed
    w = world(harness.db)
    dispatch = dispatched(w)
    started(harness.db, dispatch)
    assert claim(harness.db, dispatch.id).outcome == "executing"
    harness.advance_clock(LEASE_MS)

    # Then it is never due, never claimable, and its effective state is recovery_required
    assert claim(harness.db, dispatch.id).outcome == "recovery_required"
    assert dispatch.id not in due_ids(harness.db)
    ex = execution(harness.db, dispatch.id)
    assert (ex.status, ex.version, ex.attempt_count) == ("executing", 2, 1)
    view = action(harness.db, w.project, dispatch.id)
    assert (view["status"], view["effective_status"]) == ("executing", "recovery_required")


def test_a_retry_wait_row_is_not_claimed_before_its_time(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = leased(harness.db, dispatch.id)
    now = harness.now_ms()
    _release(harness.db, fence, retry_at_ms=now + 5_000)

    assert claim(harness.db, dispatch.id).outcome == "not_due"
    assert dispatch.id not in due_ids(harness.db)
    harness.advance_clock(5_000)
    again = claim(harness.db, dispatch.id)
    assert again.outcome == "claimed" and again.fence is not None and again.fence.attempt == 2


# -- start barrier ------------------------------------------------------------------------------


def test_start_binds_the_approval_the_action_digest_and_the_exact_fence(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = leased(harness.db, dispatch.id)

    for bad in (
        {"approval_request_id": new_id()},
        {"action_digest": "f" * 64},
        {"action_digest": "not-a-digest"},
    ):
        with pytest.raises(FenceConflict):
            _start(harness.db, dispatch, fence, **bad)
    for stale in (
        replace(fence, token=token()),
        replace(fence, owner="replica-z"),
        replace(fence, version=fence.version + 1),
        replace(fence, attempt=2),
    ):
        with pytest.raises(FenceConflict):
            _start(harness.db, dispatch, stale)
    assert execution(harness.db, dispatch.id).status == "leased"
    assert recovery_row(harness.db, dispatch.id) is None

    went = _start(harness.db, dispatch, fence)

    ex = execution(harness.db, dispatch.id)
    assert (ex.status, ex.version, ex.eligible_at_ms, ex.started_at_ms) == (
        "executing",
        2,
        None,
        went.started_at_ms,
    )
    control = recovery_row(harness.db, dispatch.id)
    assert control is not None and control["status"] == "armed"
    assert (control["execution_version"], control["next_scan_at_ms"]) == (2, ex.lease_expires_at_ms)


def test_start_is_refused_once_the_lease_expired(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = leased(harness.db, dispatch.id)
    harness.advance_clock(LEASE_MS)

    with pytest.raises(FenceConflict):
        _start(harness.db, dispatch, fence)
    assert execution(harness.db, dispatch.id).status == "leased"
    assert recovery_row(harness.db, dispatch.id) is None


# -- renew --------------------------------------------------------------------------------------


def test_renew_extends_only_the_current_fence_before_expiry(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = leased(harness.db, dispatch.id)
    harness.advance_clock(30_000)

    renewed = harness.db.transaction(lambda tx: approved_actions.renew(tx, fence, lease_ms=LEASE_MS))

    ex = execution(harness.db, dispatch.id)
    assert renewed.version == fence.version + 1 == ex.version
    assert ex.eligible_at_ms == ex.lease_expires_at_ms and ex.lease_expires_at_ms >= harness.now_ms() + 29_000
    with pytest.raises(FenceConflict):
        harness.db.transaction(lambda tx: approved_actions.renew(tx, fence))
    harness.advance_clock(LEASE_MS)
    with pytest.raises(FenceConflict):
        harness.db.transaction(lambda tx: approved_actions.renew(tx, renewed))
    with pytest.raises(ValidationFailed):
        harness.db.transaction(lambda tx: approved_actions.renew(tx, renewed, lease_ms=600_001))


def test_an_executing_renew_moves_the_recovery_control_with_it(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = started(harness.db, dispatch)
    before = recovery_row(harness.db, dispatch.id)
    assert before is not None
    harness.advance_clock(30_000)

    renewed = harness.db.transaction(lambda tx: approved_actions.renew(tx, fence, lease_ms=LEASE_MS))

    ex = execution(harness.db, dispatch.id)
    after = recovery_row(harness.db, dispatch.id)
    assert after is not None and ex.status == "executing" and renewed.version == ex.version == 3
    assert after["execution_version"] == 3 and after["version"] == before["version"] + 1
    assert after["next_scan_at_ms"] == ex.lease_expires_at_ms > before["next_scan_at_ms"]


# -- release (pre-start) ------------------------------------------------------------------------


def test_the_preflight_budget_ends_in_blocked(harness: Harness) -> None:
    # Given a dispatch allowed two attempts
    w = world(harness.db)
    dispatch = consume(w, approved(w).id, max_attempts=2)

    # When each attempt is released before the barrier with a retry time
    first = _release(harness.db, leased(harness.db, dispatch.id), retry_at_ms=harness.now_ms())
    assert (first.status, first.attempt_count, first.result_code) == ("retry_wait", 1, "handler_missing")
    second = _release(harness.db, leased(harness.db, dispatch.id), retry_at_ms=harness.now_ms())

    # Then the exhausted budget ends in blocked, which is terminal and never claimed again
    assert (second.status, second.attempt_count, second.started_at_ms) == ("blocked", 2, None)
    assert second.completed_at_ms == second.updated_at_ms
    assert claim(harness.db, dispatch.id).outcome == "terminal"
    assert dispatch.id not in due_ids(harness.db)


def test_a_release_without_a_retry_time_blocks(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)

    done = _release(harness.db, leased(harness.db, dispatch.id), result_code="invalid_plan")

    assert (done.status, done.result_code) == ("blocked", "invalid_plan")


def test_an_abandoned_lease_on_the_last_attempt_is_blocked_by_the_next_claim(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = consume(w, approved(w).id, max_attempts=1)
    leased(harness.db, dispatch.id)
    harness.advance_clock(LEASE_MS)

    assert claim(harness.db, dispatch.id).outcome == "exhausted"
    ex = execution(harness.db, dispatch.id)
    assert (ex.status, ex.result_code, ex.started_at_ms) == ("blocked", "attempts_exhausted", None)


def test_a_release_replays_exactly_by_mutation_id(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = leased(harness.db, dispatch.id)
    mutation_id = new_id()
    retry_at = harness.now_ms() + 10_000

    first = _release(harness.db, fence, mutation_id=mutation_id, retry_at_ms=retry_at)

    assert _release(harness.db, fence, mutation_id=mutation_id, retry_at_ms=retry_at) == first
    with pytest.raises(Conflict):
        _release(harness.db, fence, mutation_id=mutation_id, result_code="other")
    with pytest.raises(FenceConflict):
        _release(harness.db, fence, mutation_id=new_id())


# -- complete -----------------------------------------------------------------------------------


def test_results_are_fenced_and_replayed_exactly(harness: Harness) -> None:
    # Given an executing action
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = started(harness.db, dispatch)
    mutation_id = new_id()
    digest = "d" * 64

    # When a stale fence reports, it is refused without a change
    for stale in (replace(fence, token=token()), replace(fence, version=fence.version - 1)):
        with pytest.raises(FenceConflict):
            complete(harness.db, stale, outcome="succeeded", result_code="ok", result_digest=digest)

    # Then the holder's result lands once and replays exactly; any other result for it conflicts
    done = complete(
        harness.db,
        fence,
        mutation_id=mutation_id,
        outcome="succeeded",
        result_code="ok",
        result_digest=digest,
    )
    assert (done.status, done.result_code, done.result_digest, done.lease_owner) == (
        "succeeded",
        "ok",
        digest,
        None,
    )
    again = complete(
        harness.db,
        fence,
        mutation_id=mutation_id,
        outcome="succeeded",
        result_code="ok",
        result_digest=digest,
    )
    assert again == done
    with pytest.raises(Conflict):
        complete(harness.db, fence, mutation_id=mutation_id, outcome="failed", result_code="ok")
    with pytest.raises(Conflict):
        complete(harness.db, fence, outcome="succeeded", result_code="ok", result_digest=digest)
    control = recovery_row(harness.db, dispatch.id)
    assert control is not None
    assert (control["status"], control["resolution_mutation_id"], control["last_finding"]) == (
        "resolved",
        mutation_id,
        "completed",
    )


def test_result_shapes_are_checked_before_any_write(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = started(harness.db, dispatch)

    with pytest.raises(ValidationFailed):
        complete(harness.db, fence, outcome="succeeded", result_code="ok")
    with pytest.raises(ValidationFailed):
        complete(harness.db, fence, outcome="failed", result_code="exit_1", result_digest="d" * 64)
    with pytest.raises(ValidationFailed):
        complete(harness.db, fence, outcome="indeterminate", result_code="lost", result_digest="d" * 64)
    with pytest.raises(ValidationFailed):
        complete(harness.db, fence, outcome="retry", result_code="lost")
    assert execution(harness.db, dispatch.id).status == "executing"


def test_an_indeterminate_result_blocks(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)

    done = complete(
        harness.db, started(harness.db, dispatch), outcome="indeterminate", result_code="lost_reply"
    )

    assert (done.status, done.result_code, done.result_digest) == ("blocked", "lost_reply", None)


def test_a_trusted_late_result_lands_after_the_lease_expired(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = started(harness.db, dispatch)
    harness.advance_clock(LEASE_MS * 3)

    done = complete(harness.db, fence, outcome="failed", result_code="exit_nonzero")

    assert done.status == "failed" and done.started_at_ms == fence.started_at_ms
    assert action(harness.db, w.project, dispatch.id)["effective_status"] == "failed"


def test_complete_is_only_for_executing_rows(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = leased(harness.db, dispatch.id)

    with pytest.raises(Conflict):
        complete(harness.db, fence, outcome="failed", result_code="exit_nonzero")
    assert execution(harness.db, dispatch.id).status == "leased"
