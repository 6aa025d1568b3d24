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

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Final, Literal, Protocol, cast

from ql3.application import auth, rows, runs, tasks
from ql3.application.approvals import get_dispatch, require_role
from ql3.domain.approvals import (
    DEFAULT_LEASE_MS,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_PAGE,
    FINDINGS,
    MANUAL_DECISIONS,
    MAX_APPROVAL_TTL_MS,
    MAX_LIST_PAGE,
    RECEIPT_SCHEMA_VERSION,
    RUN_CREATE,
    RUN_CREATE_RESULT_CODE,
    TERMINAL_EXECUTION,
    Dispatch,
    Execution,
    ExecutionFence,
    RecoveryMode,
    RunActionReceipt,
    RunCreatePlan,
    effective_execution_status,
    is_hex_digest,
    lease_token_digest,
    manual_resolution_digest,
    parse_run_create_plan,
    recovery_token_digest,
    rescan_delay_ms,
    retry_delay_ms,
    validate_client_id,
    validate_code,
    validate_lease_ms,
    validate_max_attempts,
    validate_owner,
    validate_page,
    validate_result,
)
from ql3.domain.digests import digest_equals, new_token
from ql3.domain.errors import (
    Conflict,
    FenceConflict,
    IdempotencyConflict,
    NotFound,
    Ql3Error,
    ValidationFailed,
)
from ql3.domain.ids import new_id
from ql3.domain.model import Principal, Run
from ql3.ports.storage import Database, Row, Transaction

MIN_TOKEN_CHARS: Final = 32
MAX_TOKEN_CHARS: Final = 256
DEFAULT_RESOLVER_LEASE_MS: Final = 30_000
DIGEST_PREFIX: Final = 12

ClaimOutcome = Literal[
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

log = logging.getLogger("ql3.approved_actions")


# -- row mapping --------------------------------------------------------------------------------


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def execution_from_row(row: Row) -> Execution:
    return Execution(
        dispatch_id=row["dispatch_id"],
        dispatch_digest=row["dispatch_digest"],
        project_id=row["project_id"],
        status=row["status"],
        version=int(row["version"]),
        attempt_count=int(row["attempt_count"]),
        max_attempts=int(row["max_attempts"]),
        eligible_at_ms=_opt_int(row["eligible_at_ms"]),
        next_attempt_at_ms=_opt_int(row["next_attempt_at_ms"]),
        lease_owner=row["lease_owner"],
        lease_token_digest=row["lease_token_digest"],
        lease_expires_at_ms=_opt_int(row["lease_expires_at_ms"]),
        started_at_ms=_opt_int(row["started_at_ms"]),
        result_mutation_id=row["result_mutation_id"],
        result_code=row["result_code"],
        result_digest=row["result_digest"],
        completed_at_ms=_opt_int(row["completed_at_ms"]),
        created_at_ms=int(row["created_at_ms"]),
        updated_at_ms=int(row["updated_at_ms"]),
        execution_digest=row["execution_digest"],
    )


def _lock_execution(tx: Transaction, dispatch_id: str) -> Execution:
    row = tx.one("aa_execution_lock", {"dispatch_id": dispatch_id})
    if row is None:
        raise NotFound("approved action not found")
    return execution_from_row(row)


def get_execution(tx: Transaction, dispatch_id: str) -> Execution:
    row = tx.one("aa_execution_get", {"dispatch_id": dispatch_id})
    if row is None:
        raise NotFound("approved action not found")
    return execution_from_row(row)


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
class ClaimResult:
    outcome: ClaimOutcome
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
) -> ClaimResult:
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
    row = tx.one("aa_execution_lock", {"dispatch_id": dispatch_id})
    now = tx.now_ms()
    if row is None:
        return ClaimResult(outcome="missing", now_ms=now)
    ex = execution_from_row(row)
    digest = lease_token_digest(token)
    same_holder = (
        ex.lease_owner == owner
        and ex.lease_token_digest is not None
        and digest_equals(ex.lease_token_digest, digest)
    )
    if ex.status == "executing":
        lapsed = effective_execution_status(ex, now) == "recovery_required"
        return ClaimResult(outcome="recovery_required" if lapsed else "executing", now_ms=now)
    if ex.status in TERMINAL_EXECUTION:
        return ClaimResult(outcome="terminal", now_ms=now)
    if ex.status == "leased" and ex.lease_expires_at_ms is not None and now < ex.lease_expires_at_ms:
        if same_holder:
            fence = ExecutionFence(
                dispatch_id=ex.dispatch_id,
                owner=owner,
                token=token,
                version=ex.version,
                attempt=ex.attempt_count,
            )
            return ClaimResult(outcome="idempotent", now_ms=now, fence=fence)
        return ClaimResult(outcome="leased", now_ms=now)
    if ex.eligible_at_ms is None or ex.eligible_at_ms > now:
        return ClaimResult(outcome="not_due", now_ms=now)
    if ex.attempt_count >= _cap(ex, max_attempts):
        _write_release(
            tx, ex, status="blocked", mutation_id=new_id(), result_code="attempts_exhausted", now=now
        )
        return ClaimResult(outcome="exhausted", now_ms=now)
    if ex.status == "leased" and same_holder:
        # An expired lease is taken over only under a new token, so a stale holder stays fenced out.
        return ClaimResult(outcome="stale_token", now_ms=now)
    expires = now + lease_ms
    changed = tx.run(
        "aa_execution_claim",
        {
            "dispatch_id": ex.dispatch_id,
            "expected_version": ex.version,
            "lease_owner": owner,
            "lease_token_digest": digest,
            "lease_expires_at_ms": expires,
            "now": now,
        },
    )
    if changed != 1:
        raise Conflict("the approved action changed concurrently")
    fence = ExecutionFence(
        dispatch_id=ex.dispatch_id,
        owner=owner,
        token=token,
        version=ex.version + 1,
        attempt=ex.attempt_count + 1,
    )
    return ClaimResult(outcome="claimed", now_ms=now, fence=fence)


def renew(tx: Transaction, fence: ExecutionFence, *, lease_ms: int = DEFAULT_LEASE_MS) -> ExecutionFence:
    """Extend the current ``leased|executing`` lease before it expires; returns the bumped fence.

    Renewing an ``executing`` row also bumps the recovery control, revokes any resolver lease and moves
    its next scan to the new expiry.
    """
    validate_lease_ms(lease_ms)
    ex = _lock_execution(tx, fence.dispatch_id)
    now = tx.now_ms()
    if ex.status not in ("leased", "executing"):
        raise FenceConflict("the approved action is not leased", reason="not_leased")
    if not _holds(ex, fence):
        raise FenceConflict("the lease fence does not match", reason=_fence_reason(ex, fence))
    if ex.lease_expires_at_ms is None or now >= ex.lease_expires_at_ms:
        raise FenceConflict("the lease expired", reason="lease_expired")
    expires = now + lease_ms
    params = {
        "dispatch_id": ex.dispatch_id,
        "expected_version": ex.version,
        "lease_expires_at_ms": expires,
        "now": now,
    }
    query = "aa_execution_renew_leased" if ex.status == "leased" else "aa_execution_renew_executing"
    if tx.run(query, params) != 1:
        raise FenceConflict("the approved action changed concurrently", reason="version_mismatch")
    if ex.status == "executing":
        tx.run(
            "aa_recovery_on_renew",
            {
                "dispatch_id": ex.dispatch_id,
                "execution_version": ex.version + 1,
                "next_scan_at_ms": expires,
                "now": now,
            },
        )
    return replace(fence, version=ex.version + 1)


def start(
    tx: Transaction, fence: ExecutionFence, *, approval_request_id: str, action_digest: str
) -> ExecutionFence:
    """The durable start barrier: ``leased`` + exact fence + dispatch, approval and action digest, with
    ``updated_at <= now < lease_expires_at`` -> ``executing`` (v+1, no eligibility), and the recovery
    control armed in this same transaction. Returns the fence the handler must present."""
    ex = _lock_execution(tx, fence.dispatch_id)
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
    changed = tx.run(
        "aa_execution_start",
        {"dispatch_id": ex.dispatch_id, "expected_version": ex.version, "now": now},
    )
    if changed != 1:
        raise FenceConflict("the approved action changed concurrently", reason="version_mismatch")
    tx.run(
        "aa_recovery_insert",
        {
            "dispatch_id": ex.dispatch_id,
            "project_id": ex.project_id,
            "execution_version": ex.version + 1,
            "next_scan_at_ms": ex.lease_expires_at_ms,
            "now": now,
        },
    )
    return replace(fence, version=ex.version + 1, started_at_ms=now)


def _write_release(
    tx: Transaction,
    ex: Execution,
    *,
    status: str,
    mutation_id: str,
    result_code: str,
    now: int,
    retry_at_ms: int | None = None,
) -> Execution:
    changed = tx.run(
        "aa_execution_release",
        {
            "dispatch_id": ex.dispatch_id,
            "expected_version": ex.version,
            "status": status,
            "next_attempt_at_ms": retry_at_ms if status == "retry_wait" else None,
            "result_mutation_id": mutation_id,
            "result_code": result_code,
            "completed_at_ms": now if status == "blocked" else None,
            "now": now,
        },
    )
    if changed != 1:
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
    ex = _lock_execution(tx, fence.dispatch_id)
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
    ex = _lock_execution(tx, fence.dispatch_id)
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
    _finish(
        tx,
        ex,
        status=status,
        mutation_id=mutation_id,
        result_code=result_code,
        result_digest=result_digest,
        now=now,
    )
    tx.run(
        "aa_recovery_resolve",
        {
            "dispatch_id": ex.dispatch_id,
            "last_finding": "completed",
            "evidence_digest": None,
            "resolution_mutation_id": mutation_id,
            "now": now,
        },
    )
    return get_execution(tx, ex.dispatch_id)


def _finish(
    tx: Transaction,
    ex: Execution,
    *,
    status: str,
    mutation_id: str,
    result_code: str,
    result_digest: str | None,
    now: int,
) -> None:
    changed = tx.run(
        "aa_execution_finish",
        {
            "dispatch_id": ex.dispatch_id,
            "expected_version": ex.version,
            "status": status,
            "result_mutation_id": mutation_id,
            "result_code": result_code,
            "result_digest": result_digest,
            "now": now,
        },
    )
    if changed != 1:
        raise FenceConflict("the approved action changed concurrently", reason="version_mismatch")


# -- due scan -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class DueRow:
    dispatch_id: str
    eligible_at_ms: int


def due_page(
    tx: Transaction, *, limit: int = DEFAULT_PAGE, after: tuple[int, str] | None = None
) -> list[DueRow]:
    """One keyset page of due executions by ``(eligible_at_ms, dispatch_id)``, at most 64 rows.

    ``executing`` and terminal rows have no ``eligible_at`` and are never returned; a live ``leased``
    row is not due until its lease expires."""
    validate_page(limit)
    params: dict[str, Any] = {"now": tx.now_ms(), "limit": limit}
    if after is None:
        found = tx.all("aa_due_first", params)
    else:
        params["c_eligible"], params["c_id"] = after
        found = tx.all("aa_due_after", params)
    return [DueRow(dispatch_id=r["dispatch_id"], eligible_at_ms=int(r["eligible_at_ms"])) for r in found]


# -- handlers -----------------------------------------------------------------------------------


class InspectBlocked(Ql3Error):
    """The handler refused the approved plan; it will never run."""

    code = "approved_action_blocked"

    def __init__(self, result_code: str, message: str | None = None) -> None:
        super().__init__(message, result_code=validate_code(result_code, "result_code"))
        self.result_code = result_code


@dataclass(frozen=True, slots=True, kw_only=True)
class HandlerResult:
    """What ``execute`` proved. ``fence`` is the latest fence when the handler renewed its lease."""

    outcome: str
    result_code: str
    result_digest: str | None = None
    fence: ExecutionFence | None = None


class ActionHandler(Protocol):
    """Executes one action type behind the start barrier."""

    @property
    def action_type(self) -> str:
        """The ``actionType`` this handler owns."""
        ...

    @property
    def recovery_mode(self) -> RecoveryMode:
        """``automatic`` when it also provides trusted evidence, else ``manual_only``."""
        ...

    def inspect(self, tx: Transaction, dispatch: Dispatch) -> str:
        """Side-effect free (runs in a read-only transaction): parse the immutable plan and return the
        actual canonical action digest. Raise ``InspectBlocked`` for an invalid or refused plan; any
        other exception is transient and retried before the barrier within the attempt budget."""
        ...

    def execute(self, db: Database, dispatch: Dispatch, fence: ExecutionFence) -> HandlerResult:
        """Called only after the barrier committed, at most once per barrier. Must make the downstream
        accept ``dispatch.id`` as its idempotency key (or leave a queryable receipt). A raise or an
        unprovable result is recorded as ``indeterminate -> blocked`` and never retried."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Evidence:
    finding: str
    result_code: str | None = None
    evidence_digest: str | None = None


class EvidenceProvider(Protocol):
    """Read-only evidence about an execution whose completion was lost."""

    @property
    def action_type(self) -> str: ...

    @property
    def recovery_mode(self) -> RecoveryMode: ...

    def probe(self, db: Database, dispatch: Dispatch, execution: Execution) -> Evidence:
        """Never executes, resends or parses logs. Returns ``verified_succeeded`` / ``verified_failed``
        (with an evidence digest), ``still_running``, ``missing``, ``conflict``, ``unsupported`` or
        ``unavailable``."""
        ...


class RunCreateHandler:
    """``run.create``: one transaction creates the Run (idempotency key = dispatch id) and its receipt."""

    action_type: str = RUN_CREATE
    recovery_mode: RecoveryMode = "automatic"

    def _plan(self, tx: Transaction, dispatch: Dispatch) -> tuple[RunCreatePlan, Any]:
        if dispatch.action_type != RUN_CREATE:
            raise InspectBlocked("unsupported_action")
        try:
            plan = parse_run_create_plan(dispatch.action_plan)
        except ValidationFailed as exc:
            raise InspectBlocked("invalid_plan") from exc
        if plan.project_id != dispatch.project_id or plan.action_ref != dispatch.action_ref:
            raise InspectBlocked("plan_identity_mismatch")
        try:
            task = tasks.find_task(tx, plan.project_id, plan.task_id)
            revision = tasks.get_revision(tx, task.id, plan.task_revision)
        except NotFound as exc:
            raise InspectBlocked("task_revision_unavailable") from exc
        if plan.task_snapshot_ref is not None and plan.task_snapshot_ref != revision.content_digest:
            raise InspectBlocked("task_snapshot_mismatch")
        # create_run pins task.revision: hand it the exact approved revision, never the latest.
        return plan, replace(task, revision=plan.task_revision)

    def inspect(self, tx: Transaction, dispatch: Dispatch) -> str:
        plan, _ = self._plan(tx, dispatch)
        return plan.digest()

    def execute(self, db: Database, dispatch: Dispatch, fence: ExecutionFence) -> HandlerResult:
        return db.transaction(partial(self._execute, dispatch=dispatch, fence=fence))

    def _execute(self, tx: Transaction, dispatch: Dispatch, fence: ExecutionFence) -> HandlerResult:
        ex = _lock_execution(tx, dispatch.id)
        # The version may have risen (renewals); everything else must be the barrier's fence.
        if (
            ex.status != "executing"
            or ex.project_id != dispatch.project_id
            or ex.attempt_count != fence.attempt
            or ex.started_at_ms is None
            or ex.started_at_ms != fence.started_at_ms
            or ex.lease_owner != fence.owner
            or ex.lease_token_digest is None
            or not digest_equals(ex.lease_token_digest, lease_token_digest(fence.token))
            or ex.version < fence.version
        ):
            raise FenceConflict("the execution fence no longer holds", reason="stale_handler")
        existing = tx.one("aa_receipt_get", {"dispatch_id": dispatch.id})
        if existing is not None:
            receipt = receipt_from_row(existing)
            if not _receipt_binds(receipt, existing, dispatch, ex):
                raise Conflict("the stored receipt does not match this dispatch")
            return HandlerResult(
                outcome="succeeded", result_code=receipt.result_code, result_digest=receipt.evidence_digest()
            )
        plan, task = self._plan(tx, dispatch)
        if not digest_equals(plan.digest(), dispatch.action_digest):
            raise FenceConflict("the action digest drifted", reason="action_digest_mismatch")
        run, created = runs.create_run(
            tx,
            runs.CreateRun(
                project_id=dispatch.project_id,
                task=task,
                trigger_type="approved_action",
                idempotency_key=dispatch.id,
                priority=plan.priority,
                request_id=dispatch.approval_request_id,
                actor_type="system",
            ),
        )
        if not created:
            raise IdempotencyConflict("a run holds this dispatch's key without a receipt")
        now = tx.now_ms()
        receipt = RunActionReceipt(
            dispatch_id=dispatch.id,
            approval_request_id=dispatch.approval_request_id,
            project_id=dispatch.project_id,
            action_type=RUN_CREATE,
            action_digest=dispatch.action_digest,
            execution_attempt=ex.attempt_count,
            execution_version=ex.version,
            started_at_ms=ex.started_at_ms,
            idempotency_key=dispatch.id,
            outcome="succeeded",
            result_code=RUN_CREATE_RESULT_CODE,
            resource_type="run",
            resource_id=run.id,
            finished_at_ms=now,
            created_at_ms=now,
        )
        evidence = receipt.evidence_digest()
        tx.run(
            "aa_receipt_insert",
            {
                "dispatch_id": receipt.dispatch_id,
                "schema_version": receipt.schema_version,
                "approval_request_id": receipt.approval_request_id,
                "project_id": receipt.project_id,
                "action_type": receipt.action_type,
                "action_digest": receipt.action_digest,
                "execution_attempt": receipt.execution_attempt,
                "execution_version": receipt.execution_version,
                "started_at_ms": receipt.started_at_ms,
                "idempotency_key": receipt.idempotency_key,
                "outcome": receipt.outcome,
                "result_code": receipt.result_code,
                "resource_type": receipt.resource_type,
                "resource_id": receipt.resource_id,
                "finished_at_ms": receipt.finished_at_ms,
                "created_at_ms": receipt.created_at_ms,
                "evidence_digest": evidence,
            },
        )
        return HandlerResult(outcome="succeeded", result_code=RUN_CREATE_RESULT_CODE, result_digest=evidence)

    def probe(self, db: Database, dispatch: Dispatch, execution: Execution) -> Evidence:
        """Receipt-based evidence; never judged by the Run's final status."""
        try:
            return db.transaction(partial(self._probe, dispatch=dispatch, execution=execution), write=False)
        except Exception as exc:
            log.warning(
                "receipt probe failed", extra={"action": "action.probe_failed", "error": type(exc).__name__}
            )
            return Evidence(finding="unavailable")

    def _probe(self, tx: Transaction, dispatch: Dispatch, execution: Execution) -> Evidence:
        row = tx.one("aa_receipt_get", {"dispatch_id": dispatch.id})
        if row is None:
            collision = tx.one(
                "run_by_idempotency", {"project_id": dispatch.project_id, "idempotency_key": dispatch.id}
            )
            return Evidence(finding="conflict" if collision is not None else "missing")
        receipt = receipt_from_row(row)
        if not _receipt_binds(receipt, row, dispatch, execution):
            return Evidence(finding="conflict")
        run_row = tx.one("run_get_in_project", {"id": receipt.resource_id, "project_id": dispatch.project_id})
        if run_row is None:
            return Evidence(finding="conflict")
        try:
            plan = parse_run_create_plan(dispatch.action_plan)
        except ValidationFailed:
            return Evidence(finding="conflict")
        if not _run_binds(rows.run(run_row), dispatch, plan):
            return Evidence(finding="conflict")
        return Evidence(
            finding="verified_succeeded",
            result_code=receipt.result_code,
            evidence_digest=receipt.evidence_digest(),
        )


def _run_binds(run: Run, dispatch: Dispatch, plan: RunCreatePlan) -> bool:
    return (
        run.project_id == dispatch.project_id
        and run.idempotency_key == dispatch.id
        and run.request_id == dispatch.approval_request_id
        and run.trigger_type == "approved_action"
        and run.task_id == plan.task_id
        and run.task_revision == plan.task_revision
        and run.priority == plan.priority
    )


def receipt_from_row(row: Row) -> RunActionReceipt:
    return RunActionReceipt(
        schema_version=int(row["schema_version"]),
        dispatch_id=row["dispatch_id"],
        approval_request_id=row["approval_request_id"],
        project_id=row["project_id"],
        action_type=row["action_type"],
        action_digest=row["action_digest"],
        execution_attempt=int(row["execution_attempt"]),
        execution_version=int(row["execution_version"]),
        started_at_ms=int(row["started_at_ms"]),
        idempotency_key=row["idempotency_key"],
        outcome=row["outcome"],
        result_code=row["result_code"],
        resource_type=row["resource_type"],
        resource_id=row["resource_id"],
        finished_at_ms=int(row["finished_at_ms"]),
        created_at_ms=int(row["created_at_ms"]),
    )


def _receipt_binds(receipt: RunActionReceipt, row: Row, dispatch: Dispatch, execution: Execution) -> bool:
    """Every bound field matches; the receipt's version may be lower than the snapshot, never higher."""
    return (
        receipt.schema_version == RECEIPT_SCHEMA_VERSION
        and receipt.dispatch_id == dispatch.id
        and receipt.approval_request_id == dispatch.approval_request_id
        and receipt.project_id == dispatch.project_id
        and receipt.action_type == dispatch.action_type == RUN_CREATE
        and receipt.action_digest == dispatch.action_digest
        and receipt.execution_attempt == execution.attempt_count
        and 1 <= receipt.execution_version <= execution.version
        and receipt.started_at_ms == execution.started_at_ms
        and receipt.idempotency_key == dispatch.id
        and receipt.outcome == "succeeded"
        and receipt.result_code == RUN_CREATE_RESULT_CODE
        and receipt.resource_type == "run"
        and receipt.finished_at_ms >= receipt.started_at_ms
        and receipt.created_at_ms == receipt.finished_at_ms
        and digest_equals(str(row["evidence_digest"]), receipt.evidence_digest())
    )


# -- dispatcher ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchItem:
    dispatch_id: str
    outcome: str


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchReport:
    """What one ``dispatch_batch()`` did; ids and low-cardinality outcomes only."""

    observed_at_ms: int
    scanned: int
    items: tuple[BatchItem, ...]
    next_cursor: tuple[int, str] | None

    def count(self, outcome: str) -> int:
        return sum(1 for item in self.items if item.outcome == outcome)


def _index(handlers: object) -> dict[str, Any]:
    if isinstance(handlers, Mapping):
        return {str(key): value for key, value in handlers.items()}
    out: dict[str, Any] = {}
    for handler in cast(Iterable[Any], handlers):
        if handler.action_type in out:
            raise ValidationFailed("two handlers for one action type", field="handlers")
        out[handler.action_type] = handler
    return out


class ApprovedActionDispatcher:
    """``dispatch_batch()`` reads one due page at one observation time and, per row, claims, inspects,
    crosses the start barrier, executes and completes. It owns no timer; the lifecycle owner calls it.

    ``fault`` is a test hook called with ``"after_start_barrier"`` between the barrier commit and
    execute, and with ``"after_execute"`` between execute and the completion write; an exception it
    raises propagates (a simulated crash)."""

    def __init__(
        self,
        db: Database,
        handlers: Iterable[ActionHandler] | Mapping[str, ActionHandler],
        owner: str,
        *,
        page: int = DEFAULT_PAGE,
        lease_ms: int = DEFAULT_LEASE_MS,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        fault: Callable[[str], None] | None = None,
    ) -> None:
        self._db = db
        self._handlers: dict[str, ActionHandler] = _index(handlers)
        self.owner = validate_owner(owner)
        self.page = validate_page(page)
        self.lease_ms = validate_lease_ms(lease_ms)
        self.max_attempts = validate_max_attempts(max_attempts)
        self._fault = fault or (lambda _point: None)

    def dispatch_batch(self, cursor: tuple[int, str] | None = None) -> BatchReport:
        def read(tx: Transaction) -> tuple[int, list[DueRow]]:
            return tx.now_ms(), due_page(tx, limit=self.page, after=cursor)

        observed, page = self._db.transaction(read, write=False)
        items = tuple(BatchItem(dispatch_id=r.dispatch_id, outcome=self._one(r.dispatch_id)) for r in page)
        last = (page[-1].eligible_at_ms, page[-1].dispatch_id) if len(page) == self.page else None
        return BatchReport(observed_at_ms=observed, scanned=len(page), items=items, next_cursor=last)

    def _release(self, fence: ExecutionFence, code: str, *, retry_at: int | None) -> str:
        try:
            ex: Execution = self._db.transaction(
                partial(
                    release_before_start,
                    fence=fence,
                    mutation_id=new_id(),
                    result_code=code,
                    retry_at_ms=retry_at,
                    max_attempts=self.max_attempts,
                )
            )
        except Ql3Error:
            return "release_failed"
        return ex.status

    def _one(self, dispatch_id: str) -> str:
        token = new_token()
        try:
            claimed: ClaimResult = self._db.transaction(
                partial(
                    claim,
                    dispatch_id=dispatch_id,
                    owner=self.owner,
                    token=token,
                    lease_ms=self.lease_ms,
                    max_attempts=self.max_attempts,
                )
            )
        except Ql3Error:
            return "claim_failed"
        if claimed.fence is None:
            return claimed.outcome
        fence = claimed.fence
        retry_at = claimed.now_ms + retry_delay_ms(fence.attempt)
        try:
            dispatch = self._db.transaction(lambda tx: get_dispatch(tx, dispatch_id), write=False)
        except Ql3Error:
            return self._release(fence, "dispatch_unavailable", retry_at=retry_at)
        handler = self._handlers.get(dispatch.action_type)
        if handler is None:
            return self._release(fence, "handler_missing", retry_at=retry_at)
        try:
            digest = self._db.transaction(lambda tx: handler.inspect(tx, dispatch), write=False)
        except InspectBlocked as exc:
            return self._release(fence, exc.result_code, retry_at=None)
        except Exception as exc:
            log.warning(
                "inspect failed", extra={"action": "action.inspect_failed", "error": type(exc).__name__}
            )
            return self._release(fence, "inspect_unavailable", retry_at=retry_at)
        if not is_hex_digest(digest) or not digest_equals(digest, dispatch.action_digest):
            return self._release(fence, "action_digest_drift", retry_at=None)
        try:
            started: ExecutionFence = self._db.transaction(
                partial(
                    start,
                    fence=fence,
                    approval_request_id=dispatch.approval_request_id,
                    action_digest=digest,
                )
            )
        except Ql3Error:
            return "start_refused"
        self._fault("after_start_barrier")
        return self._execute(handler, dispatch, started)

    def _execute(self, handler: ActionHandler, dispatch: Dispatch, fence: ExecutionFence) -> str:
        outcome, code, digest = "indeterminate", "handler_error", None
        try:
            result = handler.execute(self._db, dispatch, fence)
        except Exception as exc:
            # It may have failed after its side effect: never retried, recorded as indeterminate.
            log.warning(
                "handler failed", extra={"action": "action.handler_failed", "error": type(exc).__name__}
            )
            result = None
        self._fault("after_execute")
        if result is not None:
            try:
                validate_result(result.outcome, result.result_code, result.result_digest)
            except ValidationFailed:
                code = "unprovable_result"
            else:
                outcome, code, digest = result.outcome, result.result_code, result.result_digest
                fence = result.fence or fence
        try:
            ex: Execution = self._db.transaction(
                partial(
                    complete,
                    fence=fence,
                    mutation_id=new_id(),
                    outcome=outcome,
                    result_code=code,
                    result_digest=digest,
                )
            )
        except Exception as exc:
            # The row stays executing and becomes recovery_required; it is never executed again.
            log.warning(
                "completion failed", extra={"action": "action.completion_failed", "error": type(exc).__name__}
            )
            return "completion_failed"
        return ex.status


# -- recovery -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class RecoveryLease:
    dispatch_id: str
    token: str
    control_version: int
    execution_version: int
    scans: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ResolveReport:
    observed_at_ms: int
    scanned: int
    items: tuple[BatchItem, ...]

    def count(self, outcome: str) -> int:
        return sum(1 for item in self.items if item.outcome == outcome)


def _acquire_recovery(
    tx: Transaction, *, dispatch_id: str, owner: str, token: str, lease_ms: int
) -> tuple[RecoveryLease, Dispatch, Execution] | None:
    ex = _lock_execution(tx, dispatch_id)
    now = tx.now_ms()
    if effective_execution_status(ex, now) != "recovery_required":
        return None
    row = tx.one("aa_recovery_lock", {"dispatch_id": dispatch_id})
    if row is None or row["status"] != "armed" or int(row["next_scan_at_ms"]) > now:
        return None
    lease_until = row["resolver_lease_expires_at_ms"]
    if lease_until is not None and int(lease_until) > now:
        return None
    version = int(row["version"])
    changed = tx.run(
        "aa_recovery_acquire",
        {
            "dispatch_id": dispatch_id,
            "expected_version": version,
            "resolver_owner": owner,
            "resolver_token_digest": recovery_token_digest(token),
            "resolver_lease_expires_at_ms": now + lease_ms,
            "now": now,
        },
    )
    if changed != 1:
        return None
    lease = RecoveryLease(
        dispatch_id=dispatch_id,
        token=token,
        control_version=version + 1,
        execution_version=ex.version,
        scans=int(row["scan_count"]) + 1,
    )
    return lease, get_dispatch(tx, dispatch_id), ex


def _record_finding(tx: Transaction, lease: RecoveryLease, *, finding: str, manual: bool) -> str:
    now = tx.now_ms()
    params = {
        "dispatch_id": lease.dispatch_id,
        "expected_version": lease.control_version,
        "resolver_token_digest": recovery_token_digest(lease.token),
        "last_finding": finding,
        "now": now,
    }
    if manual:
        changed = tx.run("aa_recovery_to_manual", params)
    else:
        params["next_scan_at_ms"] = now + rescan_delay_ms(lease.scans)
        changed = tx.run("aa_recovery_finding", params)
    return "lease_lost" if changed != 1 else ("manual" if manual else finding)


def _resolve_verified(tx: Transaction, lease: RecoveryLease, evidence: Evidence) -> str:
    """Resolution + terminal execution + closed control, atomically; CAS on the execution version so
    a late completion and this resolution cannot both win."""
    ex = _lock_execution(tx, lease.dispatch_id)
    if ex.status != "executing" or ex.version != lease.execution_version:
        return "lost_race"
    row = tx.one("aa_recovery_lock", {"dispatch_id": lease.dispatch_id})
    if (
        row is None
        or row["status"] != "armed"
        or int(row["version"]) != lease.control_version
        or row["resolver_token_digest"] is None
        or not digest_equals(str(row["resolver_token_digest"]), recovery_token_digest(lease.token))
    ):
        return "lease_lost"
    now = tx.now_ms()
    succeeded = evidence.finding == "verified_succeeded"
    mutation_id = new_id()
    result_code = evidence.result_code or evidence.finding
    tx.run(
        "aa_resolution_insert",
        {
            "dispatch_id": ex.dispatch_id,
            "project_id": ex.project_id,
            "mutation_id": mutation_id,
            "expected_execution_version": ex.version,
            "source": "resolver",
            "resolution": evidence.finding,
            "outcome": "succeeded" if succeeded else "failed",
            "actor_type": "system",
            "actor_id": str(row["resolver_owner"]),
            "actor_role": None,
            "reason_code": evidence.finding,
            "evidence_digest": evidence.evidence_digest,
            "now": now,
        },
    )
    _finish(
        tx,
        ex,
        status="succeeded" if succeeded else "failed",
        mutation_id=mutation_id,
        result_code=result_code,
        result_digest=evidence.evidence_digest if succeeded else None,
        now=now,
    )
    tx.run(
        "aa_recovery_resolve",
        {
            "dispatch_id": ex.dispatch_id,
            "last_finding": evidence.finding,
            "evidence_digest": evidence.evidence_digest,
            "resolution_mutation_id": mutation_id,
            "now": now,
        },
    )
    return "resolved_succeeded" if succeeded else "resolved_failed"


class RecoveryResolver:
    """``resolve_batch()`` scans armed recovery controls of lapsed ``executing`` rows, takes its own
    resolver lease (probing only), asks the action type's evidence provider and either resolves from
    verified evidence, records the finding for a later scan, or leaves the row for a person."""

    def __init__(
        self,
        db: Database,
        providers: Iterable[EvidenceProvider] | Mapping[str, EvidenceProvider],
        owner: str,
        *,
        page: int = DEFAULT_PAGE,
        lease_ms: int = DEFAULT_RESOLVER_LEASE_MS,
    ) -> None:
        self._db = db
        self._providers: dict[str, EvidenceProvider] = _index(providers)
        self.owner = validate_owner(owner)
        self.page = validate_page(page)
        self.lease_ms = validate_lease_ms(lease_ms)

    def resolve_batch(self) -> ResolveReport:
        def read(tx: Transaction) -> tuple[int, list[str]]:
            now = tx.now_ms()
            found = tx.all("aa_recovery_due_first", {"now": now, "limit": self.page})
            return now, [str(r["dispatch_id"]) for r in found]

        observed, page = self._db.transaction(read, write=False)
        items = tuple(BatchItem(dispatch_id=d, outcome=self._one(d)) for d in page)
        return ResolveReport(observed_at_ms=observed, scanned=len(page), items=items)

    def _one(self, dispatch_id: str) -> str:
        try:
            acquired = self._db.transaction(
                partial(
                    _acquire_recovery,
                    dispatch_id=dispatch_id,
                    owner=self.owner,
                    token=new_token(),
                    lease_ms=self.lease_ms,
                )
            )
        except Ql3Error:
            return "acquire_failed"
        if acquired is None:
            return "skipped"
        lease, dispatch, execution = acquired
        provider = self._providers.get(dispatch.action_type)
        if provider is None or provider.recovery_mode != "automatic":
            finding = "manual_only" if provider is not None else "unsupported"
            return self._write(partial(_record_finding, lease=lease, finding=finding, manual=True))
        try:
            evidence = provider.probe(self._db, dispatch, execution)
        except Exception as exc:
            log.warning(
                "recovery probe failed", extra={"action": "action.probe_failed", "error": type(exc).__name__}
            )
            evidence = Evidence(finding="unavailable")
        if evidence.finding not in FINDINGS:
            evidence = Evidence(finding="conflict")
        if evidence.finding in ("verified_succeeded", "verified_failed"):
            if not is_hex_digest(evidence.evidence_digest) or (
                evidence.result_code is not None and not _is_code(evidence.result_code)
            ):
                return self._write(partial(_record_finding, lease=lease, finding="conflict", manual=True))
            return self._write(partial(_resolve_verified, lease=lease, evidence=evidence))
        if evidence.finding in ("still_running", "missing", "unavailable"):
            return self._write(partial(_record_finding, lease=lease, finding=evidence.finding, manual=False))
        return self._write(partial(_record_finding, lease=lease, finding=evidence.finding, manual=True))

    def _write(self, fn: Callable[[Transaction], str]) -> str:
        try:
            result: str = self._db.transaction(fn)
        except Ql3Error:
            return "write_failed"
        return result


def _is_code(value: str) -> bool:
    try:
        validate_code(value, "result_code")
    except ValidationFailed:
        return False
    return True


def resolve_manually(
    tx: Transaction,
    *,
    dispatch_id: str,
    project_id: str,
    principal: Principal,
    role: str,
    mutation_id: str,
    expected_execution_version: int,
    decision: str,
    reason_code: str,
) -> Execution:
    """A person closes a ``recovery_required`` execution: ``confirm_succeeded|confirm_failed|
    abandon_unknown`` -> ``succeeded|failed|blocked``. Needs a live user whose current role is ``role``
    and grants ``approval.recover``, and the exact execution version. There is no retry, reset or
    barrier clear; repeating the action needs a new plan, approval and dispatch. Same ``mutation_id``
    with the same content replays."""
    if decision not in MANUAL_DECISIONS:
        raise ValidationFailed("invalid decision", field="decision")
    validate_client_id(mutation_id, "mutation_id")
    validate_code(reason_code)
    if isinstance(expected_execution_version, bool) or not isinstance(expected_execution_version, int):
        raise ValidationFailed("invalid expected version", field="expected_execution_version")
    project = auth.resolve_project(tx, project_id)
    require_role(tx, principal, project, role=role, permission="approval.recover")
    ex = _lock_execution(tx, dispatch_id)
    if ex.project_id != project.id:
        raise NotFound("approved action not found")
    existing = tx.one("aa_resolution_get", {"dispatch_id": dispatch_id})
    if existing is not None:
        if (
            existing["mutation_id"] == mutation_id
            and existing["resolution"] == decision
            and existing["actor_id"] == principal.id
            and int(existing["expected_execution_version"]) == expected_execution_version
            and existing["reason_code"] == reason_code
        ):
            return ex
        raise Conflict("the approved action was already resolved")
    now = tx.now_ms()
    if effective_execution_status(ex, now) != "recovery_required":
        raise Conflict("the approved action is not recovery_required", status=ex.status)
    if ex.version != expected_execution_version:
        raise FenceConflict("the approved action changed", reason="version_mismatch")
    outcome = MANUAL_DECISIONS[decision]
    digest = None
    if outcome == "succeeded":
        digest = manual_resolution_digest(
            dispatch_id=dispatch_id,
            mutation_id=mutation_id,
            decision=decision,
            actor_id=principal.id,
            expected_version=expected_execution_version,
            at_ms=now,
        )
    tx.run(
        "aa_resolution_insert",
        {
            "dispatch_id": dispatch_id,
            "project_id": ex.project_id,
            "mutation_id": mutation_id,
            "expected_execution_version": expected_execution_version,
            "source": "manual",
            "resolution": decision,
            "outcome": outcome,
            "actor_type": "user",
            "actor_id": principal.id,
            "actor_role": role,
            "reason_code": reason_code,
            "evidence_digest": None,
            "now": now,
        },
    )
    _finish(
        tx,
        ex,
        status=outcome,
        mutation_id=mutation_id,
        result_code=decision,
        result_digest=digest,
        now=now,
    )
    tx.run(
        "aa_recovery_resolve",
        {
            "dispatch_id": dispatch_id,
            "last_finding": None,
            "evidence_digest": None,
            "resolution_mutation_id": mutation_id,
            "now": now,
        },
    )
    return get_execution(tx, dispatch_id)


# -- read models --------------------------------------------------------------------------------


def action_view(row: Row, now_ms: int) -> dict[str, Any]:
    """Low-sensitivity fields only: never lease owners, tokens or token digests."""
    ex = execution_from_row(row)
    return {
        "dispatch_id": ex.dispatch_id,
        "project_id": ex.project_id,
        "approval_request_id": row["approval_request_id"],
        "action_type": row["action_type"],
        "action_ref": row["action_ref"],
        "action_digest_prefix": str(row["action_digest"])[:DIGEST_PREFIX],
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
        "recovery_status": row["recovery_status"],
        "recovery_last_finding": row["recovery_last_finding"],
    }


def get_action(tx: Transaction, project_id: str, dispatch_id: str) -> dict[str, Any]:
    row = tx.one("aa_action_get", {"project_id": project_id, "dispatch_id": dispatch_id})
    if row is None:
        raise NotFound("approved action not found")
    return action_view(row, tx.now_ms())


def list_actions(
    tx: Transaction, project_id: str, *, limit: int = 50, cursor: str | None = None
) -> tuple[list[dict[str, Any]], str | None]:
    """Newest first, keyset paginated by ``(created_at_ms, dispatch_id)``."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIST_PAGE:
        raise ValidationFailed("limit out of range", field="limit")
    params: dict[str, Any] = {"project_id": project_id, "limit": limit + 1}
    if cursor:
        params["cursor_ms"], params["cursor_id"] = runs.decode_cursor(cursor)
        found = tx.all("aa_action_list_after", params)
    else:
        found = tx.all("aa_action_list_first", params)
    now = tx.now_ms()
    page = found[:limit]
    next_cursor = None
    if len(found) > limit and page:
        next_cursor = runs.encode_cursor(int(page[-1]["created_at_ms"]), str(page[-1]["dispatch_id"]))
    return [action_view(r, now) for r in page], next_cursor
