"""Every refusal of the approved-action execution fence names its exact error, message and reason
(docs/contracts.md §10): renew, start, release before the barrier and complete, for each field of the
fence, the lease's expiry instant, a lost compare-and-set and each malformed input. A refusal writes
nothing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from ql3.application import approved_actions
from ql3.domain.approvals import MAX_APPROVAL_TTL_MS, ExecutionFence
from ql3.domain.errors import Ql3Error
from ql3.domain.ids import new_id
from ql3.ports.storage import Params, Transaction
from tests.support.approval_builders import (
    LEASE_MS,
    approved,
    complete,
    consume,
    dispatched,
    execution,
    leased,
    started,
    token,
    world,
)
from tests.support.databases import Harness
from tests.support.execution_builders import StatementLog

NOT_LEASED = ("FenceConflict", "the approved action is not leased", "not_leased")
EXPIRED = ("FenceConflict", "the lease expired", "lease_expired")
CONCURRENT = ("FenceConflict", "the approved action changed concurrently", "version_mismatch")
REUSED = ("Conflict", "the mutation id was used for a different result", None)


def _refusal(harness: Harness, dispatch_id: str, call: Callable[[], Any]) -> tuple[str, str, Any]:
    """The error ``call`` raises as (class, message, reason or field); the execution row is unchanged."""
    before = execution(harness.db, dispatch_id)
    with pytest.raises(Ql3Error) as caught:
        call()
    assert execution(harness.db, dispatch_id) == before
    details = caught.value.details
    return type(caught.value).__name__, caught.value.message, details.get("reason", details.get("field"))


def _mismatch(reason: str) -> tuple[str, str, str]:
    return ("FenceConflict", "the lease fence does not match", reason)


def _stale(fence: ExecutionFence, field: str) -> ExecutionFence:
    """The fence with one field of the stored authority wrong."""
    if field == "owner":
        return replace(fence, owner="replica-z")
    if field == "token":
        return replace(fence, token=token())
    if field == "attempt":
        return replace(fence, attempt=fence.attempt + 1)
    if field == "version":
        return replace(fence, version=fence.version + 1)
    assert fence.started_at_ms is not None
    return replace(fence, started_at_ms=fence.started_at_ms + 1)


FIELDS = {
    "owner": "owner_mismatch",
    "token": "lease_token_mismatch",
    "attempt": "attempt_mismatch",
    "version": "version_mismatch",
}


def _renew(harness: Harness, fence: ExecutionFence, **kw: Any) -> ExecutionFence:
    renewed: ExecutionFence = harness.db.transaction(
        lambda tx: approved_actions.renew(tx, fence, lease_ms=LEASE_MS, **kw)
    )
    return renewed


def _start(harness: Harness, dispatch: Any, fence: ExecutionFence, **kw: Any) -> ExecutionFence:
    args = {"approval_request_id": dispatch.approval_request_id, "action_digest": dispatch.action_digest}
    args.update(kw)
    went: ExecutionFence = harness.db.transaction(lambda tx: approved_actions.start(tx, fence, **args))
    return went


def _release(harness: Harness, fence: ExecutionFence, **kw: Any) -> Any:
    kw.setdefault("mutation_id", new_id())
    kw.setdefault("result_code", "handler_missing")
    return harness.db.transaction(lambda tx: approved_actions.release_before_start(tx, fence, **kw))


def _racing(statement: str) -> dict[str, Callable[[Transaction, Params], None]]:
    """A concurrent writer commits the same statement a moment before ours, so our CAS finds no row."""

    def first(tx: Transaction, params: Params) -> None:
        assert tx.run(statement, params) == 1

    return {statement: first}


# -- renew --------------------------------------------------------------------------------------


@pytest.mark.parametrize("field", [*FIELDS, "started_at"])
def test_renew_names_the_fence_field_that_does_not_match(harness: Harness, field: str) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = started(harness.db, dispatch) if field == "started_at" else leased(harness.db, dispatch.id)

    refusal = _refusal(harness, dispatch.id, lambda: _renew(harness, _stale(fence, field)))

    assert refusal == _mismatch(FIELDS.get(field, "started_at_mismatch"))


def test_renew_of_a_row_that_is_no_longer_leased_is_not_leased(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = leased(harness.db, dispatch.id)
    _release(harness, fence, retry_at_ms=harness.now_ms() + 1_000)

    assert _refusal(harness, dispatch.id, lambda: _renew(harness, fence)) == NOT_LEASED


@pytest.mark.parametrize("state", ["leased", "executing"])
def test_renew_at_the_lease_expiry_instant_is_refused_and_one_ms_before_is_not(
    harness: Harness, state: str
) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = started(harness.db, dispatch) if state == "executing" else leased(harness.db, dispatch.id)
    if harness.dialect == "sqlite":  # the injected clock stands still: the instant before expiry exactly
        harness.advance_clock(LEASE_MS - 1)
        fence = _renew(harness, fence)
        harness.advance_clock(1)  # one ms into the renewed lease: still live, renewable again
        fence = _renew(harness, fence)
    harness.advance_clock(LEASE_MS)  # the renewed lease's expiry instant (or later on PostgreSQL)

    assert _refusal(harness, dispatch.id, lambda: _renew(harness, fence)) == EXPIRED


@pytest.mark.parametrize("state", ["leased", "executing"])
def test_renew_that_loses_its_compare_and_set_is_a_version_mismatch(harness: Harness, state: str) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = started(harness.db, dispatch) if state == "executing" else leased(harness.db, dispatch.id)
    statement = f"aa_execution_renew_{state}"

    with pytest.raises(Ql3Error) as caught:
        harness.db.transaction(
            lambda tx: approved_actions.renew(StatementLog(tx, _racing(statement)), fence, lease_ms=LEASE_MS)
        )

    refusal = (type(caught.value).__name__, caught.value.message, caught.value.details.get("reason"))
    assert refusal == CONCURRENT
    # the refusal rolls the whole transaction back: the row is as the fence saw it
    assert execution(harness.db, dispatch.id).version == fence.version


# -- start --------------------------------------------------------------------------------------


@pytest.mark.parametrize("field", FIELDS)
def test_start_names_the_fence_field_that_does_not_match(harness: Harness, field: str) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = leased(harness.db, dispatch.id)

    refusal = _refusal(harness, dispatch.id, lambda: _start(harness, dispatch, _stale(fence, field)))

    assert refusal == _mismatch(FIELDS[field])


def test_start_ignores_the_start_time_of_a_fence_that_has_none_yet(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = leased(harness.db, dispatch.id)

    went = _start(harness, dispatch, replace(fence, started_at_ms=1))

    assert execution(harness.db, dispatch.id).started_at_ms == went.started_at_ms != 1


def test_start_of_an_executing_row_is_not_leased(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = leased(harness.db, dispatch.id)
    _start(harness, dispatch, fence)

    assert _refusal(harness, dispatch.id, lambda: _start(harness, dispatch, fence)) == NOT_LEASED


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        ({"approval_request_id": "other"}, ("the dispatch identity does not match", "dispatch_mismatch")),
        ({"action_digest": "f" * 64}, ("the action digest does not match", "action_digest_mismatch")),
        ({"action_digest": "F" * 64}, ("the action digest does not match", "action_digest_mismatch")),
        ({"action_digest": "not-a-digest"}, ("the action digest does not match", "action_digest_mismatch")),
    ],
)
def test_start_binds_the_approval_and_the_action_digest_with_exact_reasons(
    harness: Harness, bad: dict[str, str], expected: tuple[str, str]
) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = leased(harness.db, dispatch.id)

    refusal = _refusal(harness, dispatch.id, lambda: _start(harness, dispatch, fence, **bad))

    assert refusal == ("FenceConflict", *expected)


def test_start_refuses_an_execution_whose_dispatch_digest_drifted(harness: Harness) -> None:
    # Given an execution row whose copy of the dispatch digest no longer matches the dispatch
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = leased(harness.db, dispatch.id)
    harness.db.raw(
        "UPDATE approved_action_executions SET dispatch_digest = ? WHERE dispatch_id = ?",
        ("0" * 64, dispatch.id),
    )

    refusal = _refusal(harness, dispatch.id, lambda: _start(harness, dispatch, fence))

    assert refusal == ("FenceConflict", "the dispatch identity does not match", "dispatch_mismatch")


def test_start_at_the_lease_expiry_instant_is_refused_and_one_ms_before_is_not(harness: Harness) -> None:
    w = world(harness.db)
    first, second = dispatched(w), dispatched(w)
    fences = [leased(harness.db, first.id), leased(harness.db, second.id)]
    if harness.dialect == "sqlite":
        harness.advance_clock(LEASE_MS - 1)
        assert _start(harness, first, fences[0]).started_at_ms == harness.now_ms()
        harness.advance_clock(1)
    else:
        harness.advance_clock(LEASE_MS)

    assert _refusal(harness, second.id, lambda: _start(harness, second, fences[1])) == EXPIRED


def test_start_that_loses_its_compare_and_set_is_a_version_mismatch(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = leased(harness.db, dispatch.id)
    args = {"approval_request_id": dispatch.approval_request_id, "action_digest": dispatch.action_digest}

    with pytest.raises(Ql3Error) as caught:
        harness.db.transaction(
            lambda tx: approved_actions.start(StatementLog(tx, _racing("aa_execution_start")), fence, **args)
        )

    assert (
        type(caught.value).__name__,
        caught.value.message,
        caught.value.details.get("reason"),
    ) == CONCURRENT


# -- release before the barrier -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({"mutation_id": "no spaces allowed"}, ("invalid mutation_id", "mutation_id")),
        ({"result_code": "Not-A-Code"}, ("invalid result_code", "result_code")),
        ({"retry_at_ms": True}, ("invalid retry time", "retry_at_ms")),
        ({"retry_at_ms": 1.5}, ("invalid retry time", "retry_at_ms")),
        ({"retry_at_ms": "soon"}, ("invalid retry time", "retry_at_ms")),
    ],
)
def test_a_malformed_release_is_refused_naming_its_field(
    harness: Harness, kw: dict[str, Any], expected: tuple[str, str]
) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = leased(harness.db, dispatch.id)

    assert _refusal(harness, dispatch.id, lambda: _release(harness, fence, **kw)) == (
        "ValidationFailed",
        *expected,
    )


def test_a_retry_time_is_allowed_up_to_the_approval_ttl_ahead_and_not_beyond(harness: Harness) -> None:
    w = world(harness.db)
    first, second = dispatched(w), dispatched(w)
    fences = [leased(harness.db, first.id), leased(harness.db, second.id)]
    limit = harness.now_ms() + MAX_APPROVAL_TTL_MS

    # one ms beyond on the injected clock; on PostgreSQL the database clock moves on meanwhile
    beyond = limit + (1 if harness.dialect == "sqlite" else 60_000)
    refusal = _refusal(harness, second.id, lambda: _release(harness, fences[1], retry_at_ms=beyond))
    done = _release(harness, fences[0], retry_at_ms=limit)

    assert refusal == ("ValidationFailed", "the retry time is too far ahead", "retry_at_ms")
    assert (done.status, done.next_attempt_at_ms) == ("retry_wait", limit)


@pytest.mark.parametrize("field", FIELDS)
def test_release_names_the_fence_field_that_does_not_match(harness: Harness, field: str) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = leased(harness.db, dispatch.id)

    refusal = _refusal(harness, dispatch.id, lambda: _release(harness, _stale(fence, field)))

    assert refusal == _mismatch(FIELDS[field])


def test_release_of_an_executing_row_is_not_leased(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = started(harness.db, dispatch)

    assert _refusal(harness, dispatch.id, lambda: _release(harness, fence)) == NOT_LEASED


def test_a_blocking_release_replays_by_mutation_id_and_another_result_under_it_conflicts(
    harness: Harness,
) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = leased(harness.db, dispatch.id)
    mutation_id = new_id()

    done = _release(harness, fence, mutation_id=mutation_id, result_code="invalid_plan")

    assert done.status == "blocked"
    assert _release(harness, fence, mutation_id=mutation_id, result_code="invalid_plan") == done
    refusal = _refusal(
        harness, dispatch.id, lambda: _release(harness, fence, mutation_id=mutation_id, result_code="other")
    )
    assert refusal == REUSED


def test_a_release_replay_under_another_fence_version_conflicts(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = leased(harness.db, dispatch.id)
    mutation_id = new_id()
    _release(harness, fence, mutation_id=mutation_id, result_code="invalid_plan")

    stale = replace(fence, version=fence.version - 1)
    refusal = _refusal(
        harness,
        dispatch.id,
        lambda: _release(harness, stale, mutation_id=mutation_id, result_code="invalid_plan"),
    )

    assert refusal == REUSED


def test_the_caller_attempt_cap_blocks_a_release_that_the_dispatch_budget_would_retry(
    harness: Harness,
) -> None:
    # Given a dispatch allowed three attempts, released on its first under a caller cap of one
    w = world(harness.db)
    dispatch = consume(w, approved(w).id, max_attempts=3)
    fence = leased(harness.db, dispatch.id)

    done = _release(harness, fence, retry_at_ms=harness.now_ms(), max_attempts=1)

    assert (done.status, done.attempt_count) == ("blocked", 1)


def test_a_retry_time_in_the_past_is_due_at_once(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = leased(harness.db, dispatch.id)
    now = harness.now_ms()

    done = _release(harness, fence, retry_at_ms=now - 60_000)

    assert done.status == "retry_wait" and done.next_attempt_at_ms >= now
    if harness.dialect == "sqlite":
        assert done.next_attempt_at_ms == now


def test_release_that_loses_its_compare_and_set_is_a_version_mismatch(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = leased(harness.db, dispatch.id)

    with pytest.raises(Ql3Error) as caught:
        harness.db.transaction(
            lambda tx: approved_actions.release_before_start(
                StatementLog(tx, _racing("aa_execution_release")),
                fence,
                mutation_id=new_id(),
                result_code="handler_missing",
            )
        )

    assert (
        type(caught.value).__name__,
        caught.value.message,
        caught.value.details.get("reason"),
    ) == CONCURRENT


# -- complete -----------------------------------------------------------------------------------


@pytest.mark.parametrize("field", [*FIELDS, "started_at"])
def test_complete_names_the_fence_field_that_does_not_match(harness: Harness, field: str) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = started(harness.db, dispatch)

    refusal = _refusal(
        harness,
        dispatch.id,
        lambda: complete(harness.db, _stale(fence, field), outcome="failed", result_code="exit_1"),
    )

    assert refusal == (
        "FenceConflict",
        "the execution fence does not match",
        FIELDS.get(field, "started_at_mismatch"),
    )


def test_complete_of_a_row_that_is_not_executing_is_a_conflict_naming_its_status(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = leased(harness.db, dispatch.id)

    with pytest.raises(Ql3Error) as caught:
        complete(harness.db, fence, outcome="failed", result_code="exit_1")

    assert (type(caught.value).__name__, caught.value.message, dict(caught.value.details)) == (
        "Conflict",
        "the approved action is no longer executing",
        {"status": "leased"},
    )


@pytest.mark.parametrize(
    "other",
    [
        {"outcome": "failed", "result_code": "ok", "result_digest": None},
        {"outcome": "succeeded", "result_code": "other", "result_digest": "d" * 64},
        {"outcome": "succeeded", "result_code": "ok", "result_digest": "e" * 64},
    ],
    ids=["outcome", "code", "digest"],
)
def test_a_result_replay_with_another_outcome_code_or_digest_conflicts(
    harness: Harness, other: dict[str, Any]
) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = started(harness.db, dispatch)
    mutation_id = new_id()
    done = complete(
        harness.db,
        fence,
        mutation_id=mutation_id,
        outcome="succeeded",
        result_code="ok",
        result_digest="d" * 64,
    )

    refusal = _refusal(
        harness, dispatch.id, lambda: complete(harness.db, fence, mutation_id=mutation_id, **other)
    )

    assert refusal == REUSED
    assert execution(harness.db, dispatch.id) == done


def test_complete_that_loses_its_compare_and_set_is_a_version_mismatch(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = started(harness.db, dispatch)

    with pytest.raises(Ql3Error) as caught:
        harness.db.transaction(
            lambda tx: approved_actions.complete(
                StatementLog(tx, _racing("aa_execution_finish")),
                fence,
                mutation_id=new_id(),
                outcome="failed",
                result_code="exit_1",
            )
        )

    assert (
        type(caught.value).__name__,
        caught.value.message,
        caught.value.details.get("reason"),
    ) == CONCURRENT


def test_a_malformed_result_mutation_id_is_refused_naming_its_field(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)
    fence = started(harness.db, dispatch)

    refusal = _refusal(
        harness,
        dispatch.id,
        lambda: complete(harness.db, fence, mutation_id="no spaces", outcome="failed", result_code="exit_1"),
    )

    assert refusal == ("ValidationFailed", "invalid mutation_id", "mutation_id")


# -- claim --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [None, 12345678901234567890123456789012, "a" * 31, "a" * 257, "é" * 32, "\x01" + "a" * 31],
    ids=["none", "not_text", "short", "long", "not_ascii", "not_printable"],
)
def test_a_malformed_claim_token_is_refused_before_any_read(harness: Harness, bad: Any) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)

    refusal = _refusal(
        harness,
        dispatch.id,
        lambda: harness.db.transaction(
            lambda tx: approved_actions.claim(tx, dispatch_id=dispatch.id, owner="replica-a", token=bad)
        ),
    )

    assert refusal == ("ValidationFailed", "invalid lease token", "token")


@pytest.mark.parametrize("length", [32, 256])
def test_a_claim_token_of_32_to_256_printable_ascii_characters_is_accepted(
    harness: Harness, length: int
) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)

    result = harness.db.transaction(
        lambda tx: approved_actions.claim(tx, dispatch_id=dispatch.id, owner="replica-a", token="~" * length)
    )

    assert result.outcome == "claimed"


STATES = ["missing", "executing", "terminal", "idempotent", "leased", "not_due", "exhausted", "stale_token"]


@pytest.mark.parametrize("state", STATES)
def test_every_claim_answer_carries_the_database_instant_it_observed(harness: Harness, state: str) -> None:
    # Given a dispatch id in each state a claim answers without a new lease
    w = world(harness.db)
    dispatch = consume(w, approved(w).id, max_attempts=1) if state == "exhausted" else dispatched(w)
    dispatch_id = new_id() if state == "missing" else dispatch.id
    owner, tok = "replica-b", token()
    if state in ("executing", "terminal"):
        fence = started(harness.db, dispatch)
        if state == "terminal":
            complete(harness.db, fence, outcome="failed", result_code="exit_1")
    elif state in ("idempotent", "leased", "exhausted", "stale_token"):
        leased(harness.db, dispatch.id, owner="replica-b" if state != "leased" else "replica-a", tok=tok)
        if state in ("exhausted", "stale_token"):
            harness.advance_clock(LEASE_MS)
    elif state == "not_due":
        _release(harness, leased(harness.db, dispatch.id), retry_at_ms=harness.now_ms() + 60_000)
    before = harness.now_ms()

    result = harness.db.transaction(
        lambda tx: approved_actions.claim(tx, dispatch_id=dispatch_id, owner=owner, token=tok)
    )

    assert result.outcome == state
    assert before <= result.now_ms <= harness.now_ms()
    if harness.dialect == "sqlite":
        assert result.now_ms == before


def test_a_claim_that_loses_its_compare_and_set_is_a_conflict(harness: Harness) -> None:
    w = world(harness.db)
    dispatch = dispatched(w)

    def other_replica_first(tx: Transaction, params: Params) -> None:
        assert tx.run("aa_execution_claim", {**params, "lease_owner": "replica-z"}) == 1

    refusal = _refusal(
        harness,
        dispatch.id,
        lambda: harness.db.transaction(
            lambda tx: approved_actions.claim(
                StatementLog(tx, {"aa_execution_claim": other_replica_first}),
                dispatch_id=dispatch.id,
                owner="replica-a",
                token=token(),
            )
        ),
    )

    assert refusal == ("Conflict", "the approved action changed concurrently", None)
