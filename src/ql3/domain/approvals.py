"""Approvals and approved actions (docs/contracts.md §10): records, state machines, digests and limits.

Pure rules only: no I/O and no clock reads. Times are passed in by the caller (the transaction's
observation time).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from ql3.domain import leases as lease_rules
from ql3.domain.digests import canonical_json, domain_digest, sha256_hex
from ql3.domain.errors import Conflict, PermissionDenied, ValidationFailed

# -- limits (docs/contracts.md §7) -------------------------------------------------------------
MAX_APPROVAL_TTL_MS: Final = 24 * 3600 * 1000
DEFAULT_APPROVAL_TTL_MS: Final = 3600 * 1000
DEFAULT_MAX_ATTEMPTS: Final = 5
HARD_MAX_ATTEMPTS: Final = 16
DEFAULT_LEASE_MS: Final = 60_000
DEFAULT_PAGE: Final = 16
HARD_PAGE: Final = 64
MAX_LIST_PAGE: Final = 100
MAX_ACTION_REF: Final = 255
MAX_TASK_ID: Final = 255
MAX_TASK_REVISION: Final = 128
MAX_OWNER: Final = 128
MAX_DECISION_NOTE: Final = 500
RETRY_BASE_MS: Final = 1_000
RETRY_MAX_MS: Final = 60_000
RESCAN_BASE_MS: Final = 30_000
RESCAN_MAX_MS: Final = 3600 * 1000

# -- digest domains -----------------------------------------------------------------------------
APPROVAL_REQUEST_DIGEST_DOMAIN: Final = "qinglong/approval-request-digest@v1"
DISPATCH_DIGEST_DOMAIN: Final = "qinglong/approved-action-dispatch-digest@v1"
EXECUTION_DIGEST_DOMAIN: Final = "qinglong/approved-action-execution-digest@v1"
PREVIEW_DIGEST_DOMAIN: Final = "qinglong/approval-preview-digest@v1"
POLICY_FENCE_DOMAIN: Final = "qinglong/approval-policy-fence@v1"
EXECUTION_LEASE_DOMAIN: Final = "qinglong/approved-action-execution-lease@v1"
RECOVERY_LEASE_DOMAIN: Final = "qinglong/approved-action-recovery-lease@v1"
MANUAL_RESOLUTION_DOMAIN: Final = "qinglong/approved-action-manual-resolution@v1"

RUN_CREATE: Final = "run.create"
RUN_CREATE_RESULT_CODE: Final = "approved_run_created"
RECEIPT_SCHEMA_VERSION: Final = 1
PLAN_SCHEMA_VERSION: Final = 1

CODE_RE: Final = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
CLIENT_ID_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
HEX64_RE: Final = re.compile(r"^[0-9a-f]{64}$")

ApprovalState = Literal["pending", "approved", "rejected", "consumed"]
Decision = Literal["approve", "reject"]
Risk = Literal["low", "medium", "high", "critical"]
Consumer = Literal["system", "worker"]
ExecutionStatus = Literal["pending", "leased", "executing", "retry_wait", "succeeded", "failed", "blocked"]
Outcome = Literal["succeeded", "failed", "indeterminate"]
RecoveryMode = Literal["automatic", "manual_only"]
Finding = Literal[
    "verified_succeeded",
    "verified_failed",
    "still_running",
    "missing",
    "conflict",
    "unsupported",
    "unavailable",
]
ManualDecision = Literal["confirm_succeeded", "confirm_failed", "abandon_unknown"]
RecoveryStatus = Literal["armed", "manual", "resolved"]
ResolutionSource = Literal["resolver", "manual"]
ResolutionKind = Literal[
    "verified_succeeded", "verified_failed", "confirm_succeeded", "confirm_failed", "abandon_unknown"
]
# The terminal execution states: what a handler's result or a resolution closes an execution as.
TerminalExecutionStatus = Literal["succeeded", "failed", "blocked"]
ResolutionOutcome = TerminalExecutionStatus
ResolutionActor = Literal["system", "user"]

APPROVAL_STATES: Final[tuple[ApprovalState, ...]] = ("pending", "approved", "rejected", "consumed")
DECISIONS: Final[tuple[Decision, ...]] = ("approve", "reject")
RISKS: Final[tuple[Risk, ...]] = ("low", "medium", "high", "critical")
CONSUMERS: Final[tuple[Consumer, ...]] = ("system", "worker")
EXECUTION_STATUSES: Final[tuple[ExecutionStatus, ...]] = (
    "pending",
    "leased",
    "executing",
    "retry_wait",
    "succeeded",
    "failed",
    "blocked",
)
RECOVERY_STATUSES: Final[tuple[RecoveryStatus, ...]] = ("armed", "manual", "resolved")
RESOLUTION_SOURCES: Final[tuple[ResolutionSource, ...]] = ("resolver", "manual")
RESOLUTION_KINDS: Final[tuple[ResolutionKind, ...]] = (
    "verified_succeeded",
    "verified_failed",
    "confirm_succeeded",
    "confirm_failed",
    "abandon_unknown",
)
RESOLUTION_OUTCOMES: Final[tuple[ResolutionOutcome, ...]] = ("succeeded", "failed", "blocked")
RESOLUTION_ACTORS: Final[tuple[ResolutionActor, ...]] = ("system", "user")
OUTCOMES: Final = ("succeeded", "failed", "indeterminate")
FINDINGS: Final = (
    "verified_succeeded",
    "verified_failed",
    "still_running",
    "missing",
    "conflict",
    "unsupported",
    "unavailable",
)
MANUAL_DECISIONS: Final[dict[str, TerminalExecutionStatus]] = {
    "confirm_succeeded": "succeeded",
    "confirm_failed": "failed",
    "abandon_unknown": "blocked",
}
TERMINAL_EXECUTION: Final = frozenset({"succeeded", "failed", "blocked"})
DUE_EXECUTION: Final = frozenset({"pending", "retry_wait", "leased"})

# pending@1 -> approved@2 -> consumed@3, pending@1 -> rejected@2; rejected and consumed are terminal.
APPROVAL_TRANSITIONS: Final[dict[tuple[str, int], tuple[tuple[str, int], ...]]] = {
    ("pending", 1): (("approved", 2), ("rejected", 2)),
    ("approved", 2): (("consumed", 3),),
}

# The execution state machine (docs/contracts.md §10). ``executing`` never goes back to a due state.
EXECUTION_TRANSITIONS: Final[dict[str, frozenset[str]]] = {
    "pending": frozenset({"leased"}),
    "leased": frozenset({"leased", "retry_wait", "blocked", "executing"}),
    "retry_wait": frozenset({"leased", "blocked"}),
    "executing": frozenset({"executing", "succeeded", "failed", "blocked"}),
    "succeeded": frozenset(),
    "failed": frozenset(),
    "blocked": frozenset(),
}


class ApprovalExpired(Conflict):
    """The approval request has expired; it can no longer be decided or consumed."""

    code = "approval_expired"


class SeparationOfDuty(PermissionDenied):
    """The decider may not decide this request: the requester, or a principal on the requester's side
    (docs/security.md "Separation of duty")."""

    code = "separation_of_duty"


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalPolicy:
    """A project's approval policy. ``second_admin``: a decision needs an admin who neither issued the
    requester's token nor got theirs from the requester, directly or through others."""

    second_admin: bool = False
    version: int = 0  # 0: never set (the default policy)
    updated_at_ms: int | None = None


class RequesterNotAllowed(PermissionDenied):
    """The requester may no longer do this (revoked, or no longer holding the permission): the request
    is refused."""

    code = "requester_not_allowed"
    http_status = 409


def approval_transition_allowed(state: str, version: int, to: str, to_version: int) -> bool:
    return (to, to_version) in APPROVAL_TRANSITIONS.get((state, version), ())


def execution_transition_allowed(status: str, to: str) -> bool:
    return to in EXECUTION_TRANSITIONS.get(status, frozenset())


# -- validation ---------------------------------------------------------------------------------


def validate_code(value: object, what: str = "reason_code") -> str:
    """Low-cardinality machine codes: ``^[a-z][a-z0-9_]{0,63}$``."""
    if not isinstance(value, str) or not CODE_RE.fullmatch(value):
        raise ValidationFailed(f"invalid {what}", field=what)
    return value


def validate_note(value: object) -> str | None:
    """An optional decision note: 1-500 characters of text, no control characters (C0, DEL, C1)
    and no lone surrogates. ``None`` and the empty string mean no note."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > MAX_DECISION_NOTE:
        raise ValidationFailed(f"note must be at most {MAX_DECISION_NOTE} characters", field="note")
    if any(ord(c) < 32 or 127 <= ord(c) < 160 or 0xD800 <= ord(c) < 0xE000 for c in value):
        raise ValidationFailed("note must not contain control characters", field="note")
    return value


def validate_client_id(value: object, what: str) -> str:
    """Client-supplied idempotency ids (approval, decision, consumption, mutation ids)."""
    if not isinstance(value, str) or not CLIENT_ID_RE.fullmatch(value):
        raise ValidationFailed(f"invalid {what}", field=what)
    return value


def validate_ttl(ttl_ms: object) -> int:
    if isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int) or not 1 <= ttl_ms <= MAX_APPROVAL_TTL_MS:
        raise ValidationFailed("ttl_ms must be 1 ms to 24 h", field="ttl_ms")
    return ttl_ms


def validate_lease_ms(lease_ms: object) -> int:
    return lease_rules.APPROVED_ACTION.validate(lease_ms)


def validate_page(page: object, hard: int = HARD_PAGE) -> int:
    if isinstance(page, bool) or not isinstance(page, int) or not 1 <= page <= hard:
        raise ValidationFailed(f"page must be 1-{hard}", field="page")
    return page


def validate_max_attempts(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= HARD_MAX_ATTEMPTS:
        raise ValidationFailed(f"max_attempts must be 1-{HARD_MAX_ATTEMPTS}", field="max_attempts")
    return value


def validate_owner(owner: object) -> str:
    if not isinstance(owner, str) or not CLIENT_ID_RE.fullmatch(owner):
        raise ValidationFailed("invalid owner", field="owner")
    return owner


def is_hex_digest(value: object) -> bool:
    return isinstance(value, str) and bool(HEX64_RE.fullmatch(value))


def validate_result(outcome: str, result_code: str, result_digest: str | None) -> TerminalExecutionStatus:
    """Check a handler result and return the execution status it maps to.

    ``succeeded`` needs a digest; ``failed`` and ``indeterminate`` forbid one; indeterminate -> blocked.
    """
    if outcome not in OUTCOMES:
        raise ValidationFailed("invalid outcome", field="outcome")
    validate_code(result_code, "result_code")
    if outcome == "succeeded":
        if not is_hex_digest(result_digest):
            raise ValidationFailed("a succeeded result needs a result digest", field="result_digest")
        return "succeeded"
    if result_digest is not None:
        raise ValidationFailed("only a succeeded result carries a digest", field="result_digest")
    return "failed" if outcome == "failed" else "blocked"


def retry_delay_ms(attempt: int) -> int:
    """Pre-start retry backoff: 1 s doubling to 60 s."""
    return int(min(RETRY_MAX_MS, RETRY_BASE_MS * 2 ** max(0, min(attempt - 1, 30))))


def rescan_delay_ms(scans: int) -> int:
    """Recovery re-scan backoff: 30 s doubling to 1 h."""
    return int(min(RESCAN_MAX_MS, RESCAN_BASE_MS * 2 ** max(0, min(scans - 1, 30))))


# -- records ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalRequest:
    id: str
    project_id: str
    version: int
    state: ApprovalState
    permission: str
    action_type: str
    action_ref: str
    action_digest: str
    action_plan: str = field(repr=False)
    preview_digest: str
    risk: Risk
    requested_by: str
    requested_at_ms: int
    expires_at_ms: int
    request_fence: str
    request_digest: str
    decision_id: str | None = None
    decision: Decision | None = None
    reason_code: str | None = None
    decision_note: str | None = None
    decided_by: str | None = None
    decided_at_ms: int | None = None
    decision_fence: str | None = None
    consumption_id: str | None = None
    dispatch_id: str | None = None
    consumed_by: Consumer | None = None
    consumed_at_ms: int | None = None
    consumption_fence: str | None = None
    updated_at_ms: int = 0


def effective_approval_state(request: ApprovalRequest, now_ms: int) -> str:
    """``expired`` is computed (never stored): pending/approved at or after ``expires_at``."""
    if request.state in ("pending", "approved") and now_ms >= request.expires_at_ms:
        return "expired"
    return request.state


@dataclass(frozen=True, slots=True, kw_only=True)
class Dispatch:
    """The immutable, approved action: one per consumed approval."""

    id: str
    approval_request_id: str
    approval_request_version: int
    project_id: str
    action_type: str
    action_ref: str
    action_digest: str
    action_plan: str = field(repr=False)
    requested_by: str
    consumed_by: Consumer
    approved_by: str
    approved_at_ms: int
    expires_at_ms: int
    approval_fence: str
    dispatch_digest: str
    created_at_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Execution:
    """The mutable execution control, 1:1 with a dispatch. Holds only the lease token's digest."""

    dispatch_id: str
    dispatch_digest: str
    project_id: str
    status: ExecutionStatus
    version: int
    attempt_count: int
    max_attempts: int
    eligible_at_ms: int | None
    next_attempt_at_ms: int | None
    lease_owner: str | None
    lease_token_digest: str | None = field(repr=False)
    lease_expires_at_ms: int | None
    started_at_ms: int | None
    result_mutation_id: str | None
    result_code: str | None
    result_digest: str | None
    completed_at_ms: int | None
    created_at_ms: int
    updated_at_ms: int
    execution_digest: str


def effective_execution_status(execution: Execution, now_ms: int) -> str:
    """``recovery_required`` = ``executing`` whose lease expired; computed, never stored."""
    if (
        execution.status == "executing"
        and execution.lease_expires_at_ms is not None
        and now_ms >= execution.lease_expires_at_ms
    ):
        return "recovery_required"
    return execution.status


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionFence:
    """What a lease holder presents: the raw token lives only in the holder's memory."""

    dispatch_id: str
    owner: str
    token: str = field(repr=False)
    version: int
    attempt: int
    started_at_ms: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RecoveryControl:
    """The recovery control of a started execution, armed by the start barrier. Its resolver lease
    only coordinates probing; it never grants execution."""

    dispatch_id: str
    project_id: str
    status: RecoveryStatus
    version: int
    execution_version: int
    next_scan_at_ms: int | None
    resolver_owner: str | None
    resolver_token_digest: str | None = field(repr=False)
    resolver_lease_expires_at_ms: int | None
    last_finding: str | None
    scan_count: int
    evidence_digest: str | None
    resolution_mutation_id: str | None
    armed_at_ms: int
    updated_at_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Resolution:
    """How a ``recovery_required`` execution was closed: from verified evidence or by a person; one per
    dispatch, immutable."""

    dispatch_id: str
    project_id: str
    mutation_id: str
    expected_execution_version: int
    source: ResolutionSource
    resolution: ResolutionKind
    outcome: ResolutionOutcome
    actor_type: ResolutionActor
    actor_id: str
    actor_role: str | None
    reason_code: str
    evidence_digest: str | None
    created_at_ms: int


# -- digests ------------------------------------------------------------------------------------


def policy_fence(project_version: int, binding_version: int | None) -> str:
    """``{projectVersion, bindingVersion|null}`` captured when policy was evaluated."""
    return canonical_json({"projectVersion": project_version, "bindingVersion": binding_version})


def approval_request_digest(
    *,
    approval_id: str,
    project_id: str,
    permission: str,
    action_type: str,
    action_ref: str,
    action_digest: str,
    preview_digest: str,
    risk: str,
    requested_by: str,
    requested_at_ms: int,
    expires_at_ms: int,
    request_fence: str,
) -> str:
    body = {
        "id": approval_id,
        "projectId": project_id,
        "permission": permission,
        "actionType": action_type,
        "actionRef": action_ref,
        "actionDigest": action_digest,
        "previewDigest": preview_digest,
        "risk": risk,
        "requestedBy": requested_by,
        "requestedAt": requested_at_ms,
        "expiresAt": expires_at_ms,
        "requestFence": request_fence,
    }
    return domain_digest(APPROVAL_REQUEST_DIGEST_DOMAIN, canonical_json(body))


def dispatch_digest(
    *,
    dispatch_id: str,
    approval_request_id: str,
    approval_request_digest_hex: str,
    project_id: str,
    action_type: str,
    action_ref: str,
    action_digest: str,
    requested_by: str,
    consumed_by: str,
    approved_by: str,
    approved_at_ms: int,
    expires_at_ms: int,
    approval_fence: str,
    created_at_ms: int,
) -> str:
    body = {
        "id": dispatch_id,
        "approvalRequestId": approval_request_id,
        "approvalRequestVersion": 3,
        "approvalRequestDigest": approval_request_digest_hex,
        "projectId": project_id,
        "actionType": action_type,
        "actionRef": action_ref,
        "actionDigest": action_digest,
        "requestedBy": requested_by,
        "consumedBy": consumed_by,
        "approvedBy": approved_by,
        "approvedAt": approved_at_ms,
        "expiresAt": expires_at_ms,
        "approvalFence": approval_fence,
        "createdAt": created_at_ms,
    }
    return domain_digest(DISPATCH_DIGEST_DOMAIN, canonical_json(body))


def execution_digest(
    *, dispatch_id: str, dispatch_digest_hex: str, project_id: str, max_attempts: int, created_at_ms: int
) -> str:
    body = {
        "dispatchId": dispatch_id,
        "dispatchDigest": dispatch_digest_hex,
        "projectId": project_id,
        "maxAttempts": max_attempts,
        "createdAt": created_at_ms,
    }
    return domain_digest(EXECUTION_DIGEST_DOMAIN, canonical_json(body))


def lease_token_digest(token: str) -> str:
    return domain_digest(EXECUTION_LEASE_DOMAIN, token)


def recovery_token_digest(token: str) -> str:
    return domain_digest(RECOVERY_LEASE_DOMAIN, token)


# -- run.create plan (docs/contracts.md §8) ----------------------------------------------------

PLAN_KEYS: Final = (
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
)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunCreatePlan:
    action_ref: str
    project_id: str
    task_id: str
    task_revision: int
    executor_type: str
    priority: int
    task_name: str | None
    task_snapshot_ref: str | None
    input_ref: str | None

    def to_json_obj(self) -> dict[str, Any]:
        """The canonical plan, keys in the digest order of docs/contracts.md §8."""
        return {
            "schemaVersion": PLAN_SCHEMA_VERSION,
            "actionType": RUN_CREATE,
            "actionRef": self.action_ref,
            "projectId": self.project_id,
            "taskId": self.task_id,
            "taskRevision": str(self.task_revision),
            "executorType": self.executor_type,
            "priority": self.priority,
            "taskName": self.task_name,
            "taskSnapshotRef": self.task_snapshot_ref,
            "inputRef": self.input_ref,
        }

    def canonical(self) -> str:
        return canonical_json(self.to_json_obj())

    def digest(self) -> str:
        return sha256_hex(self.canonical())


def _opt_text(value: object, what: str, limit: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= limit or any(ord(c) < 32 for c in value):
        raise ValidationFailed(f"invalid {what}", field=what)
    return value


def _req_text(value: object, what: str, limit: int) -> str:
    text = _opt_text(value, what, limit)
    if text is None:
        raise ValidationFailed(f"{what} is required", field=what)
    return text


def build_run_create_plan(
    *,
    project_id: str,
    task_id: str,
    task_revision: int,
    priority: int,
    task_name: str | None,
    task_snapshot_ref: str | None,
    input_ref: str | None = None,
    executor_type: str = "local_process",
) -> RunCreatePlan:
    """The canonical ``run.create`` plan; ``actionRef`` is the task id."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not -(2**31) <= priority < 2**31:
        raise ValidationFailed("priority out of range", field="priority")
    if isinstance(task_revision, bool) or not isinstance(task_revision, int) or task_revision < 1:
        raise ValidationFailed("invalid task revision", field="taskRevision")
    if len(str(task_revision)) > MAX_TASK_REVISION:
        raise ValidationFailed("invalid task revision", field="taskRevision")
    if executor_type != "local_process":
        raise ValidationFailed("unsupported executor", field="executorType")
    return RunCreatePlan(
        action_ref=_req_text(task_id, "actionRef", MAX_ACTION_REF),
        project_id=_req_text(project_id, "projectId", MAX_ACTION_REF),
        task_id=_req_text(task_id, "taskId", MAX_TASK_ID),
        task_revision=task_revision,
        executor_type=executor_type,
        priority=priority,
        task_name=_opt_text(task_name, "taskName", MAX_ACTION_REF),
        task_snapshot_ref=_opt_text(task_snapshot_ref, "taskSnapshotRef", MAX_ACTION_REF),
        input_ref=_opt_text(input_ref, "inputRef", MAX_ACTION_REF),
    )


def parse_run_create_plan(text: str) -> RunCreatePlan:
    """Strictly parse a stored plan: exact keys in canonical order, re-canonicalising byte for byte.

    Anything else (unknown or missing keys, reordering, whitespace, wrong types) is invalid.
    """
    try:
        raw = json.loads(text)
    except (ValueError, TypeError) as exc:
        raise ValidationFailed("the action plan is not JSON", field="plan") from exc
    if not isinstance(raw, dict) or tuple(raw) != PLAN_KEYS:
        raise ValidationFailed("the action plan has the wrong shape", field="plan")
    if raw["schemaVersion"] != PLAN_SCHEMA_VERSION or raw["actionType"] != RUN_CREATE:
        raise ValidationFailed("unsupported action plan", field="plan")
    revision = raw["taskRevision"]
    if not isinstance(revision, str) or not revision.isdigit() or revision.startswith("0"):
        raise ValidationFailed("invalid task revision", field="taskRevision")
    plan = build_run_create_plan(
        project_id=raw["projectId"],
        task_id=raw["taskId"],
        task_revision=int(revision),
        priority=raw["priority"],
        task_name=raw["taskName"],
        task_snapshot_ref=raw["taskSnapshotRef"],
        input_ref=raw["inputRef"],
        executor_type=raw["executorType"],
    )
    if plan.action_ref != raw["actionRef"] or plan.canonical() != text:
        raise ValidationFailed("the action plan is not canonical", field="plan")
    return plan


def preview_digest(action_type: str, action_ref: str, summary: dict[str, Any]) -> str:
    """A digest of the low-sensitivity preview; the preview text itself is never stored."""
    body = {"actionType": action_type, "actionRef": action_ref, "summary": summary}
    return domain_digest(PREVIEW_DIGEST_DOMAIN, canonical_json(body))


# -- run.create receipt (docs/contracts.md §8) -------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class RunActionReceipt:
    dispatch_id: str
    approval_request_id: str
    project_id: str
    action_type: str
    action_digest: str
    execution_attempt: int
    execution_version: int
    started_at_ms: int
    idempotency_key: str
    outcome: str
    result_code: str
    resource_type: str
    resource_id: str
    finished_at_ms: int
    created_at_ms: int
    schema_version: int = RECEIPT_SCHEMA_VERSION

    def evidence_digest(self) -> str:
        """sha256 of the JSON of every other field, in declared order."""
        body = {
            "schemaVersion": self.schema_version,
            "dispatchId": self.dispatch_id,
            "approvalRequestId": self.approval_request_id,
            "projectId": self.project_id,
            "actionType": self.action_type,
            "actionDigest": self.action_digest,
            "executionAttempt": self.execution_attempt,
            "executionVersion": self.execution_version,
            "startedAt": self.started_at_ms,
            "idempotencyKey": self.idempotency_key,
            "outcome": self.outcome,
            "resultCode": self.result_code,
            "resourceType": self.resource_type,
            "resourceId": self.resource_id,
            "finishedAt": self.finished_at_ms,
            "createdAt": self.created_at_ms,
        }
        return sha256_hex(canonical_json(body))


def manual_resolution_digest(
    *, dispatch_id: str, mutation_id: str, decision: str, actor_id: str, expected_version: int, at_ms: int
) -> str:
    body = {
        "dispatchId": dispatch_id,
        "mutationId": mutation_id,
        "decision": decision,
        "actorId": actor_id,
        "expectedExecutionVersion": expected_version,
        "at": at_ms,
    }
    return domain_digest(MANUAL_RESOLUTION_DOMAIN, canonical_json(body))
