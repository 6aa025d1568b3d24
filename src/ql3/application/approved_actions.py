"""Approved-action execution behind a durable start barrier (docs/contracts.md §10).

The execution row moves ``pending -> leased -> executing -> succeeded|failed|blocked`` (with
``retry_wait``/``blocked`` before the barrier). Only a failure proven to be before the barrier may be
retried. Once ``executing`` is committed the handler may have produced a side effect, so an expired
``executing`` row is never due, claimed or executed again: it is ``recovery_required`` (computed), and
only trusted evidence or a person closes it.

Each function below runs inside the caller's transaction. The dispatcher and resolver are plain calls:
they own no timers or threads.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Final, Literal

from ql3.application import runs
from ql3.application.approvals import get_dispatch
from ql3.domain.approvals import (
    DEFAULT_LEASE_MS,
    DEFAULT_PAGE,
    MAX_APPROVAL_TTL_MS,
    MAX_LIST_PAGE,
    TERMINAL_EXECUTION,
    Execution,
    ExecutionFence,
    ExecutionStatus,
    effective_execution_status,
    is_hex_digest,
    lease_token_digest,
    validate_client_id,
    validate_code,
    validate_lease_ms,
    validate_max_attempts,
    validate_owner,
    validate_page,
    validate_result,
)
from ql3.domain.digests import digest_equals
from ql3.domain.errors import (
    Conflict,
    FenceConflict,
    NotFound,
    ValidationFailed,
)
from ql3.domain.ids import new_id
from ql3.ports.storage import Transaction
from ql3.repositories import actions as action_store
from ql3.repositories.actions import ActionRecord, DueRow

MIN_TOKEN_CHARS: Final = 32
MAX_TOKEN_CHARS: Final = 256
DIGEST_PREFIX: Final = 12

ExecutionClaimOutcome = Literal[
    "claimed",
    "idempotent",
    "leased",
    "not_due",
    "exhausted",
    "executing",
    "recovery_required",
    "terminal",
    "missing",
    "stale_token",
]


# -- reads under the caller's transaction -------------------------------------------------------


def lock_execution(tx: Transaction, dispatch_id: str) -> Execution:
    found = action_store.lock_execution(tx, dispatch_id)
    if found is None:
        raise NotFound("approved action not found")
    return found


def get_execution(tx: Transaction, dispatch_id: str) -> Execution:
    found = action_store.get_execution(tx, dispatch_id)
    if found is None:
        raise NotFound("approved action not found")
    return found


def _validate_token(token: object) -> str:
    if (
        not isinstance(token, str)
        or not MIN_TOKEN_CHARS <= len(token) <= MAX_TOKEN_CHARS
        or not token.isascii()
        or not token.isprintable()
    ):
        raise ValidationFailed("invalid lease token", field="token")
    return token


def _holds(execution: Execution, fence: ExecutionFence) -> bool:
    """The exact fence: owner, token digest, version and attempt (and start time once started)."""
    return (
        execution.dispatch_id == fence.dispatch_id
        and execution.lease_owner == fence.owner
        and execution.lease_token_digest is not None
        and digest_equals(execution.lease_token_digest, lease_token_digest(fence.token))
        and execution.version == fence.version
        and execution.attempt_count == fence.attempt
        and (fence.started_at_ms is None or execution.started_at_ms == fence.started_at_ms)
    )


def _fence_reason(execution: Execution, fence: ExecutionFence) -> str:
    if execution.lease_owner != fence.owner:
        return "owner_mismatch"
    if execution.lease_token_digest is None or not digest_equals(
        execution.lease_token_digest, lease_token_digest(fence.token)
    ):
        return "lease_token_mismatch"
    if execution.attempt_count != fence.attempt:
        return "attempt_mismatch"
    if execution.version != fence.version:
        return "version_mismatch"
    return "started_at_mismatch"


def _cap(execution: Execution, max_attempts: int | None) -> int:
    if max_attempts is None:
        return execution.max_attempts
    return min(execution.max_attempts, validate_max_attempts(max_attempts))


# -- claim / renew / start / release / complete -------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionClaim:
    outcome: ExecutionClaimOutcome
    now_ms: int
    fence: ExecutionFence | None = None


def claim(
    tx: Transaction,
    *,
    dispatch_id: str,
    owner: str,
    token: str,
    lease_ms: int = DEFAULT_LEASE_MS,
    max_attempts: int | None = None,
) -> ExecutionClaim:
    """Lease a due execution: ``pending``/``retry_wait`` whose ``eligible_at <= now``, or a ``leased``
    row whose lease expired (takeover, which needs a new token), while attempts remain.

    Claim bumps attempts and version and sets ``eligible_at = lease_expires_at`` (so an abandoned lease
    becomes due again). The same owner and token on a live lease replay (``idempotent``); a live lease
    under another token is ``leased``. ``executing`` is never claimed: a lapsed one is only
    ``recovery_required``. A due row without attempts left is moved to ``blocked`` (``exhausted``):
    nothing was started under it, so closing it is safe.
    """
    validate_owner(owner)
    _validate_token(token)
    validate_lease_ms(lease_ms)
    found = action_store.lock_execution(tx, dispatch_id)
    now = tx.now_ms()
    if found is None:
        return ExecutionClaim(outcome="missing", now_ms=now)
    ex = found
    digest = lease_token_digest(token)
    same_holder = (
        ex.lease_owner == owner
        and ex.lease_token_digest is not None
        and digest_equals(ex.lease_token_digest, digest)
    )
    if ex.status == "executing":
        lapsed = effective_execution_status(ex, now) == "recovery_required"
        return ExecutionClaim(outcome="recovery_required" if lapsed else "executing", now_ms=now)
    if ex.status in TERMINAL_EXECUTION:
        return ExecutionClaim(outcome="terminal", now_ms=now)
    if ex.status == "leased" and ex.lease_expires_at_ms is not None and now < ex.lease_expires_at_ms:
        if same_holder:
            fence = ExecutionFence(
                dispatch_id=ex.dispatch_id,
                owner=owner,
                token=token,
                version=ex.version,
                attempt=ex.attempt_count,
            )
            return ExecutionClaim(outcome="idempotent", now_ms=now, fence=fence)
        return ExecutionClaim(outcome="leased", now_ms=now)
    if ex.eligible_at_ms is None or ex.eligible_at_ms > now:
        return ExecutionClaim(outcome="not_due", now_ms=now)
    if ex.attempt_count >= _cap(ex, max_attempts):
        _write_release(
            tx, ex, status="blocked", mutation_id=new_id(), result_code="attempts_exhausted", now=now
        )
        return ExecutionClaim(outcome="exhausted", now_ms=now)
    if ex.status == "leased" and same_holder:
        # An expired lease is taken over only under a new token, so a stale holder stays fenced out.
        return ExecutionClaim(outcome="stale_token", now_ms=now)
    expires = now + lease_ms
    claimed = action_store.claim_execution(
        tx, ex, lease_owner=owner, lease_token_digest=digest, lease_expires_at_ms=expires, now_ms=now
    )
    if not claimed:
        raise Conflict("the approved action changed concurrently")
    fence = ExecutionFence(
        dispatch_id=ex.dispatch_id,
        owner=owner,
        token=token,
        version=ex.version + 1,
        attempt=ex.attempt_count + 1,
    )
    return ExecutionClaim(outcome="claimed", now_ms=now, fence=fence)


def renew(tx: Transaction, fence: ExecutionFence, *, lease_ms: int = DEFAULT_LEASE_MS) -> ExecutionFence:
    """Extend the current ``leased|executing`` lease before it expires; returns the bumped fence.

    Renewing an ``executing`` row also bumps the recovery control, revokes any resolver lease and moves
    its next scan to the new expiry.
    """
    validate_lease_ms(lease_ms)
    ex = lock_execution(tx, fence.dispatch_id)
    now = tx.now_ms()
    if ex.status not in ("leased", "executing"):
        raise FenceConflict("the approved action is not leased", reason="not_leased")
    if not _holds(ex, fence):
        raise FenceConflict("the lease fence does not match", reason=_fence_reason(ex, fence))
    if ex.lease_expires_at_ms is None or now >= ex.lease_expires_at_ms:
        raise FenceConflict("the lease expired", reason="lease_expired")
    expires = now + lease_ms
    renew_row = action_store.renew_leased if ex.status == "leased" else action_store.renew_executing
    if not renew_row(tx, ex, lease_expires_at_ms=expires, now_ms=now):
        raise FenceConflict("the approved action changed concurrently", reason="version_mismatch")
    if ex.status == "executing":
        action_store.recovery_on_renew(
            tx, ex.dispatch_id, execution_version=ex.version + 1, next_scan_at_ms=expires, now_ms=now
        )
    return replace(fence, version=ex.version + 1)


def start(
    tx: Transaction, fence: ExecutionFence, *, approval_request_id: str, action_digest: str
) -> ExecutionFence:
    """The durable start barrier: ``leased`` + exact fence + dispatch, approval and action digest, with
    ``updated_at <= now < lease_expires_at`` -> ``executing`` (v+1, no eligibility), and the recovery
    control armed in this same transaction. Returns the fence the handler must present."""
    ex = lock_execution(tx, fence.dispatch_id)
    now = tx.now_ms()
    if ex.status != "leased":
        raise FenceConflict("the approved action is not leased", reason="not_leased")
    if not _holds(replace(ex, started_at_ms=None), replace(fence, started_at_ms=None)):
        raise FenceConflict("the lease fence does not match", reason=_fence_reason(ex, fence))
    dispatch = get_dispatch(tx, ex.dispatch_id)
    if (
        dispatch.project_id != ex.project_id
        or not digest_equals(dispatch.dispatch_digest, ex.dispatch_digest)
        or dispatch.approval_request_id != approval_request_id
    ):
        raise FenceConflict("the dispatch identity does not match", reason="dispatch_mismatch")
    if not is_hex_digest(action_digest) or not digest_equals(dispatch.action_digest, action_digest):
        raise FenceConflict("the action digest does not match", reason="action_digest_mismatch")
    if ex.lease_expires_at_ms is None or not ex.updated_at_ms <= now < ex.lease_expires_at_ms:
        raise FenceConflict("the lease expired", reason="lease_expired")
    if not action_store.start_execution(tx, ex, now_ms=now):
        raise FenceConflict("the approved action changed concurrently", reason="version_mismatch")
    action_store.insert_recovery(
        tx, ex, execution_version=ex.version + 1, next_scan_at_ms=ex.lease_expires_at_ms, now_ms=now
    )
    return replace(fence, version=ex.version + 1, started_at_ms=now)


def _write_release(
    tx: Transaction,
    ex: Execution,
    *,
    status: ExecutionStatus,
    mutation_id: str,
    result_code: str,
    now: int,
    retry_at_ms: int | None = None,
) -> Execution:
    released = action_store.release_execution(
        tx,
        ex,
        status=status,
        next_attempt_at_ms=retry_at_ms if status == "retry_wait" else None,
        result_mutation_id=mutation_id,
        result_code=result_code,
        completed_at_ms=now if status == "blocked" else None,
        now_ms=now,
    )
    if not released:
        raise FenceConflict("the approved action changed concurrently", reason="version_mismatch")
    return get_execution(tx, ex.dispatch_id)


def release_before_start(
    tx: Transaction,
    fence: ExecutionFence,
    *,
    mutation_id: str,
    result_code: str,
    retry_at_ms: int | None = None,
    max_attempts: int | None = None,
) -> Execution:
    """Give a lease back before the barrier: ``retry_wait`` at ``retry_at_ms`` when a retry time is
    given and attempts remain, otherwise ``blocked``. Fenced; the same ``mutation_id`` replays."""
    validate_client_id(mutation_id, "mutation_id")
    validate_code(result_code, "result_code")
    ex = lock_execution(tx, fence.dispatch_id)
    now = tx.now_ms()
    if ex.result_mutation_id == mutation_id and ex.status in ("retry_wait", "blocked"):
        if ex.result_code == result_code and ex.version == fence.version + 1:
            return ex
        raise Conflict("the mutation id was used for a different result")
    if ex.status != "leased":
        raise FenceConflict("the approved action is not leased", reason="not_leased")
    if not _holds(ex, fence):
        raise FenceConflict("the lease fence does not match", reason=_fence_reason(ex, fence))
    if retry_at_ms is not None:
        if isinstance(retry_at_ms, bool) or not isinstance(retry_at_ms, int):
            raise ValidationFailed("invalid retry time", field="retry_at_ms")
        if retry_at_ms > now + MAX_APPROVAL_TTL_MS:
            raise ValidationFailed("the retry time is too far ahead", field="retry_at_ms")
    if retry_at_ms is not None and ex.attempt_count < _cap(ex, max_attempts):
        return _write_release(
            tx,
            ex,
            status="retry_wait",
            mutation_id=mutation_id,
            result_code=result_code,
            now=now,
            retry_at_ms=max(retry_at_ms, now),
        )
    return _write_release(tx, ex, status="blocked", mutation_id=mutation_id, result_code=result_code, now=now)


def complete(
    tx: Transaction,
    fence: ExecutionFence,
    *,
    mutation_id: str,
    outcome: str,
    result_code: str,
    result_digest: str | None = None,
) -> Execution:
    """Record the handler's result: ``succeeded`` (needs a digest), ``failed`` or ``indeterminate``
    (-> ``blocked``; both forbid a digest). Fenced on the exact execution fence but with no expiry check,
    so a trusted late result still lands unless recovery already closed the row. The same
    ``mutation_id`` with the same result replays; the recovery control is closed in this transaction."""
    validate_client_id(mutation_id, "mutation_id")
    status = validate_result(outcome, result_code, result_digest)
    ex = lock_execution(tx, fence.dispatch_id)
    if ex.result_mutation_id == mutation_id:
        if (
            ex.status == status
            and ex.status in TERMINAL_EXECUTION
            and ex.result_code == result_code
            and ex.result_digest == result_digest
        ):
            return ex
        raise Conflict("the mutation id was used for a different result")
    if ex.status != "executing":
        raise Conflict("the approved action is no longer executing", status=ex.status)
    if not _holds(ex, fence):
        raise FenceConflict("the execution fence does not match", reason=_fence_reason(ex, fence))
    now = tx.now_ms()
    finish_execution(
        tx,
        ex,
        status=status,
        mutation_id=mutation_id,
        result_code=result_code,
        result_digest=result_digest,
        now=now,
    )
    action_store.resolve_recovery(
        tx,
        ex.dispatch_id,
        last_finding="completed",
        evidence_digest=None,
        resolution_mutation_id=mutation_id,
        now_ms=now,
    )
    return get_execution(tx, ex.dispatch_id)


def finish_execution(
    tx: Transaction,
    ex: Execution,
    *,
    status: ExecutionStatus,
    mutation_id: str,
    result_code: str,
    result_digest: str | None,
    now: int,
) -> None:
    finished = action_store.finish_execution(
        tx,
        ex,
        status=status,
        result_mutation_id=mutation_id,
        result_code=result_code,
        result_digest=result_digest,
        now_ms=now,
    )
    if not finished:
        raise FenceConflict("the approved action changed concurrently", reason="version_mismatch")


# -- due scan -----------------------------------------------------------------------------------


def due_page(
    tx: Transaction, *, limit: int = DEFAULT_PAGE, after: tuple[int, str] | None = None
) -> list[DueRow]:
    """One keyset page of due executions by ``(eligible_at_ms, dispatch_id)``, at most 64 rows.

    ``executing`` and terminal rows have no ``eligible_at`` and are never returned; a live ``leased``
    row is not due until its lease expires."""
    validate_page(limit)
    return action_store.due_executions(tx, after=after, limit=limit)


# -- read models --------------------------------------------------------------------------------


def action_view(action: ActionRecord, now_ms: int) -> dict[str, Any]:
    """Low-sensitivity fields only: never lease owners, tokens or token digests."""
    ex = action.execution
    return {
        "dispatch_id": ex.dispatch_id,
        "project_id": ex.project_id,
        "approval_request_id": action.approval_request_id,
        "action_type": action.action_type,
        "action_ref": action.action_ref,
        "action_digest_prefix": action.action_digest[:DIGEST_PREFIX],
        "status": ex.status,
        "effective_status": effective_execution_status(ex, now_ms),
        "version": ex.version,
        "attempt_count": ex.attempt_count,
        "max_attempts": ex.max_attempts,
        "eligible_at_ms": ex.eligible_at_ms,
        "lease_expires_at_ms": ex.lease_expires_at_ms,
        "started_at_ms": ex.started_at_ms,
        "result_code": ex.result_code,
        "result_digest_prefix": ex.result_digest[:DIGEST_PREFIX] if ex.result_digest else None,
        "completed_at_ms": ex.completed_at_ms,
        "created_at_ms": ex.created_at_ms,
        "updated_at_ms": ex.updated_at_ms,
        "recovery_status": action.recovery_status,
        "recovery_last_finding": action.recovery_last_finding,
    }


def get_action(tx: Transaction, project_id: str, dispatch_id: str) -> dict[str, Any]:
    found = action_store.get_action(tx, project_id, dispatch_id)
    if found is None:
        raise NotFound("approved action not found")
    return action_view(found, tx.now_ms())


def list_actions(
    tx: Transaction, project_id: str, *, limit: int = 50, cursor: str | None = None
) -> tuple[list[dict[str, Any]], str | None]:
    """Newest first, keyset paginated by ``(created_at_ms, dispatch_id)``."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIST_PAGE:
        raise ValidationFailed("limit out of range", field="limit")
    before = runs.decode_cursor(cursor) if cursor else None
    found = action_store.list_actions(tx, project_id=project_id, before=before, limit=limit + 1)
    now = tx.now_ms()
    page = found[:limit]
    next_cursor = None
    if len(found) > limit and page:
        last = page[-1].execution
        next_cursor = runs.encode_cursor(last.created_at_ms, last.dispatch_id)
    return [action_view(a, now) for a in page], next_cursor
