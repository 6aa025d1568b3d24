"""Approval requests (docs/contracts.md §10): create, decide, consume into an immutable dispatch, and
read models.

Every function runs inside the caller's transaction; a raised error rolls all of its writes back.
"""

from __future__ import annotations

from typing import Any, Final

from ql3.application import auth, notifications, runs, tasks
from ql3.domain.approvals import (
    APPROVAL_STATES,
    CONSUMERS,
    DECISIONS,
    DEFAULT_APPROVAL_TTL_MS,
    DEFAULT_MAX_ATTEMPTS,
    MAX_LIST_PAGE,
    RUN_CREATE,
    ApprovalExpired,
    ApprovalRequest,
    Dispatch,
    approval_request_digest,
    build_run_create_plan,
    dispatch_digest,
    effective_approval_state,
    execution_digest,
    parse_run_create_plan,
    policy_fence,
    preview_digest,
    validate_client_id,
    validate_code,
    validate_max_attempts,
    validate_note,
    validate_ttl,
)
from ql3.domain.auth import role_allows
from ql3.domain.digests import sha256_hex
from ql3.domain.errors import (
    Conflict,
    FenceConflict,
    IdempotencyConflict,
    NotFound,
    PermissionDenied,
    ValidationFailed,
)
from ql3.domain.ids import new_id
from ql3.domain.model import Principal, Project
from ql3.ports import channels
from ql3.ports.storage import Row, Transaction

DEFAULT_LIST_PAGE: Final = 50
DIGEST_PREFIX: Final = 12


# -- row mapping --------------------------------------------------------------------------------


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def approval_from_row(row: Row) -> ApprovalRequest:
    return ApprovalRequest(
        id=row["id"],
        project_id=row["project_id"],
        version=int(row["version"]),
        state=row["state"],
        permission=row["permission"],
        action_type=row["action_type"],
        action_ref=row["action_ref"],
        action_digest=row["action_digest"],
        action_plan=row["action_plan_json"],
        preview_digest=row["preview_digest"],
        risk=row["risk"],
        requested_by=row["requested_by"],
        requested_at_ms=int(row["requested_at_ms"]),
        expires_at_ms=int(row["expires_at_ms"]),
        request_fence=row["request_fence"],
        request_digest=row["request_digest"],
        decision_id=row["decision_id"],
        decision=row["decision"],
        reason_code=row["reason_code"],
        decision_note=row["decision_note"],
        decided_by=row["decided_by"],
        decided_at_ms=_opt_int(row["decided_at_ms"]),
        decision_fence=row["decision_fence"],
        consumption_id=row["consumption_id"],
        dispatch_id=row["dispatch_id"],
        consumed_by=row["consumed_by"],
        consumed_at_ms=_opt_int(row["consumed_at_ms"]),
        consumption_fence=row["consumption_fence"],
        updated_at_ms=int(row["updated_at_ms"]),
    )


def dispatch_from_row(row: Row) -> Dispatch:
    return Dispatch(
        id=row["id"],
        approval_request_id=row["approval_request_id"],
        approval_request_version=int(row["approval_request_version"]),
        project_id=row["project_id"],
        action_type=row["action_type"],
        action_ref=row["action_ref"],
        action_digest=row["action_digest"],
        action_plan=row["action_plan_json"],
        requested_by=row["requested_by"],
        consumed_by=row["consumed_by"],
        approved_by=row["approved_by"],
        approved_at_ms=int(row["approved_at_ms"]),
        expires_at_ms=int(row["expires_at_ms"]),
        approval_fence=row["approval_fence"],
        dispatch_digest=row["dispatch_digest"],
        created_at_ms=int(row["created_at_ms"]),
    )


def get_dispatch(tx: Transaction, dispatch_id: str) -> Dispatch:
    row = tx.one("aa_dispatch_get", {"id": dispatch_id})
    if row is None:
        raise NotFound("dispatch not found")
    return dispatch_from_row(row)


# -- policy -------------------------------------------------------------------------------------


def _live_principal(tx: Transaction, principal_id: str) -> Principal | None:
    row = tx.one("approval_principal_get", {"id": principal_id})
    if row is None or row["disabled_at_ms"] is not None:
        return None
    return Principal(
        id=row["id"],
        name=row["name"],
        kind=row["kind"],
        is_owner=bool(row["is_owner"]),
        created_at_ms=int(row["created_at_ms"]),
    )


def evaluate_policy(tx: Transaction, principal: Principal, project: Project) -> tuple[str | None, str]:
    """The principal's current role in the project and the policy fence it was read under."""
    role = auth.role_in(tx, principal, project)
    binding = None
    if not principal.is_owner:
        row = tx.one("binding_get", {"principal_id": principal.id, "project_id": project.id})
        binding = int(row["version"]) if row else None
    current = auth.resolve_project(tx, project.id)
    return role, policy_fence(current.version, binding)


def require_role(
    tx: Transaction, principal: Principal, project: Project, *, role: str, permission: str
) -> str:
    """Re-check, inside the writing transaction, that ``principal`` still is a live user holding
    ``role`` (the role the caller resolved: the policy fence) and that it grants ``permission``."""
    if principal.kind != "user":
        raise PermissionDenied("only a user may do this", permission=permission)
    stored = _live_principal(tx, principal.id)
    if stored is None or stored.kind != "user":
        raise PermissionDenied("only a user may do this", permission=permission)
    current, fence = evaluate_policy(tx, stored, project)
    if current is None:
        raise NotFound("project not found")
    if current != role:
        raise FenceConflict("the caller's role changed", reason="policy_drift")
    if not role_allows(current, permission):
        raise PermissionDenied(permission=permission)
    return fence


# -- create -------------------------------------------------------------------------------------


def request_run_approval(
    tx: Transaction,
    *,
    project_id: str,
    task_ref: str,
    requested_by: Principal,
    ttl_ms: int = DEFAULT_APPROVAL_TTL_MS,
    priority: int = 0,
    approval_id: str | None = None,
) -> ApprovalRequest:
    """Ask for approval to create a Run of a task whose pinned revision requires it.

    Only a task with ``approval == "required"`` may create a request (else ``ValidationFailed``); the
    requester must hold ``run.create``. The plan binds the exact current revision. A repeated
    ``approval_id`` with identical content returns the stored request; any drift is a conflict.
    """
    validate_ttl(ttl_ms)
    approval_id = new_id() if approval_id is None else validate_client_id(approval_id, "approval_id")
    project = auth.resolve_project(tx, project_id)
    requester = _live_principal(tx, requested_by.id)
    if requester is None:
        raise PermissionDenied(permission="run.create")
    role, fence = evaluate_policy(tx, requester, project)
    if role is None:
        raise NotFound("project not found")
    if not role_allows(role, "run.create"):
        raise PermissionDenied(permission="run.create")
    view = tasks.view(tx, tasks.find_task(tx, project.id, task_ref))
    if view.spec.approval != "required":
        raise ValidationFailed("the task does not require approval", field="approval")
    plan = build_run_create_plan(
        project_id=project.id,
        task_id=view.task.id,
        task_revision=view.task.revision,
        priority=priority,
        task_name=view.task.name,
        task_snapshot_ref=view.revision.content_digest,
    )
    action_digest = plan.digest()
    preview = preview_digest(
        RUN_CREATE,
        plan.action_ref,
        {"taskName": view.task.name, "taskRevision": str(view.task.revision), "priority": priority},
    )
    existing = tx.one("approval_get", {"id": approval_id})
    if existing is None:
        now = tx.now_ms()
        expires = now + ttl_ms
        params = {
            "id": approval_id,
            "project_id": project.id,
            "permission": "run.create",
            "action_type": RUN_CREATE,
            "action_ref": plan.action_ref,
            "action_digest": action_digest,
            "action_plan_json": plan.canonical(),
            "preview_digest": preview,
            "risk": "medium",
            "requested_by": requester.id,
            "expires_at_ms": expires,
            "request_fence": fence,
            "request_digest": approval_request_digest(
                approval_id=approval_id,
                project_id=project.id,
                permission="run.create",
                action_type=RUN_CREATE,
                action_ref=plan.action_ref,
                action_digest=action_digest,
                preview_digest=preview,
                risk="medium",
                requested_by=requester.id,
                requested_at_ms=now,
                expires_at_ms=expires,
                request_fence=fence,
            ),
            "now": now,
        }
        if tx.run("approval_insert", params) == 1:
            tx.notify(channels.APPROVED_ACTIONS)
            notifications.on_approval_requested(tx, project.id, view.task.id, approval_id)
            return approval_from_row(tx.one("approval_get", {"id": approval_id}) or {})
        existing = tx.one("approval_get", {"id": approval_id})
        if existing is None:
            raise Conflict("approval id collision")
    stored = approval_from_row(existing)
    same = (
        stored.project_id == project.id
        and stored.requested_by == requester.id
        and stored.action_type == RUN_CREATE
        and stored.action_digest == action_digest
        and stored.risk == "medium"
        and stored.expires_at_ms - stored.requested_at_ms == ttl_ms
    )
    if not same:
        raise IdempotencyConflict("the approval id was already used for a different request")
    return stored


# -- decide -------------------------------------------------------------------------------------


def decide(
    tx: Transaction,
    *,
    approval_id: str,
    project_id: str,
    decider: Principal,
    decider_role: str,
    decision: str,
    decision_id: str,
    reason_code: str,
    note: str | None = None,
) -> ApprovalRequest:
    """``pending@1 -> approved@2 | rejected@2`` by a user with ``approval.decide`` who is not the
    requester, strictly before expiry. The same ``decision_id`` with the same content replays; anything
    else on a decided request is a conflict. Concurrent deciders commit once (CAS on the version)."""
    if decision not in DECISIONS:
        raise ValidationFailed("decision must be approve or reject", field="decision")
    validate_client_id(decision_id, "decision_id")
    validate_code(reason_code)
    note = validate_note(note)
    project = auth.resolve_project(tx, project_id)
    row = tx.one("approval_lock", {"id": approval_id})
    if row is None or row["project_id"] != project.id:
        raise NotFound("approval not found")
    request = approval_from_row(row)
    fence = require_role(tx, decider, project, role=decider_role, permission="approval.decide")
    if decider.id == request.requested_by:
        raise PermissionDenied("the requester cannot decide their own request", permission="approval.decide")
    if request.decision_id is not None:
        if (
            request.decision_id == decision_id
            and request.decision == decision
            and request.reason_code == reason_code
            and request.decision_note == note
            and request.decided_by == decider.id
        ):
            return request
        raise Conflict("the approval was already decided", state=request.state)
    now = tx.now_ms()
    if now >= request.expires_at_ms:
        raise ApprovalExpired()
    changed = tx.run(
        "approval_decide",
        {
            "id": request.id,
            "state": "approved" if decision == "approve" else "rejected",
            "decision_id": decision_id,
            "decision": decision,
            "reason_code": reason_code,
            "decision_note": note,
            "decided_by": decider.id,
            "decision_fence": fence,
            "now": now,
        },
    )
    if changed != 1:
        raise Conflict("the approval changed concurrently")
    if decision == "approve":
        tx.notify(channels.APPROVED_ACTIONS)
    return approval_from_row(tx.one("approval_get", {"id": request.id}) or {})


# -- consume ------------------------------------------------------------------------------------


def consume(
    tx: Transaction,
    *,
    approval_id: str,
    consumption_id: str,
    consumer: str = "system",
    action_digest: str | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> Dispatch:
    """One transaction: re-evaluate the requester's policy, ``approved@2 -> consumed@3`` strictly
    before expiry, insert the immutable dispatch and the execution ``pending@v0`` (eligible now).

    Any failure rolls back all three writes. A repeated ``consumption_id`` returns the same dispatch.
    """
    if consumer not in CONSUMERS:
        raise ValidationFailed("invalid consumer", field="consumer")
    validate_client_id(consumption_id, "consumption_id")
    validate_max_attempts(max_attempts)
    row = tx.one("approval_lock", {"id": approval_id})
    if row is None:
        raise NotFound("approval not found")
    request = approval_from_row(row)
    if request.consumption_id is not None and request.dispatch_id is not None:
        if request.consumption_id == consumption_id and request.consumed_by == consumer:
            return get_dispatch(tx, request.dispatch_id)
        raise Conflict("the approval was already consumed")
    if request.state != "approved":
        raise Conflict("the approval is not approved", state=request.state)
    now = tx.now_ms()
    if now >= request.expires_at_ms:
        raise ApprovalExpired()
    if action_digest is not None and action_digest != request.action_digest:
        raise FenceConflict("the action differs from the approved one", reason="action_mismatch")
    if sha256_hex(request.action_plan) != request.action_digest:
        raise FenceConflict("the stored plan does not match its digest", reason="action_mismatch")
    project = auth.resolve_project(tx, request.project_id)
    requester = _live_principal(tx, request.requested_by)
    if requester is None:
        raise PermissionDenied("the requester may no longer do this", permission=request.permission)
    role, fence = evaluate_policy(tx, requester, project)
    if role is None or not role_allows(role, request.permission):
        raise PermissionDenied("the requester may no longer do this", permission=request.permission)
    if request.decided_by is None or request.decided_at_ms is None:
        raise Conflict("the approval has no decision")
    dispatch_id = new_id()
    changed = tx.run(
        "approval_consume",
        {
            "id": request.id,
            "consumption_id": consumption_id,
            "dispatch_id": dispatch_id,
            "consumed_by": consumer,
            "consumption_fence": fence,
            "action_digest": request.action_digest,
            "now": now,
        },
    )
    if changed != 1:
        raise Conflict("the approval changed concurrently")
    d_digest = dispatch_digest(
        dispatch_id=dispatch_id,
        approval_request_id=request.id,
        approval_request_digest_hex=request.request_digest,
        project_id=request.project_id,
        action_type=request.action_type,
        action_ref=request.action_ref,
        action_digest=request.action_digest,
        requested_by=request.requested_by,
        consumed_by=consumer,
        approved_by=request.decided_by,
        approved_at_ms=request.decided_at_ms,
        expires_at_ms=request.expires_at_ms,
        approval_fence=fence,
        created_at_ms=now,
    )
    tx.run(
        "aa_dispatch_insert",
        {
            "id": dispatch_id,
            "approval_request_id": request.id,
            "project_id": request.project_id,
            "action_type": request.action_type,
            "action_ref": request.action_ref,
            "action_digest": request.action_digest,
            "action_plan_json": request.action_plan,
            "requested_by": request.requested_by,
            "consumed_by": consumer,
            "approved_by": request.decided_by,
            "approved_at_ms": request.decided_at_ms,
            "expires_at_ms": request.expires_at_ms,
            "approval_fence": fence,
            "dispatch_digest": d_digest,
            "now": now,
        },
    )
    tx.run(
        "aa_execution_insert",
        {
            "dispatch_id": dispatch_id,
            "dispatch_digest": d_digest,
            "project_id": request.project_id,
            "max_attempts": max_attempts,
            "execution_digest": execution_digest(
                dispatch_id=dispatch_id,
                dispatch_digest_hex=d_digest,
                project_id=request.project_id,
                max_attempts=max_attempts,
                created_at_ms=now,
            ),
            "now": now,
        },
    )
    tx.notify(channels.APPROVED_ACTIONS)
    return get_dispatch(tx, dispatch_id)


def unconsumed_approved(tx: Transaction, *, limit: int = 16) -> list[str]:
    """Ids of approved, unexpired, not yet consumed requests, oldest decision first (for a consumer
    loop in ``ql3 serve``)."""
    if not 1 <= limit <= 64:
        raise ValidationFailed("limit out of range", field="limit")
    return [str(r["id"]) for r in tx.all("approval_unconsumed_page", {"now": tx.now_ms(), "limit": limit})]


# -- read models --------------------------------------------------------------------------------


def bound_task_revision(request: ApprovalRequest) -> int | None:
    """The task revision a ``run.create`` request is bound to (from its stored, digest-checked plan)."""
    if request.action_type != RUN_CREATE:
        return None
    try:
        return parse_run_create_plan(request.action_plan).task_revision
    except ValidationFailed:
        return None


def approval_view(request: ApprovalRequest, now_ms: int) -> dict[str, Any]:
    """Low-sensitivity fields only: no plan, fences or full digests."""
    return {
        "id": request.id,
        "project_id": request.project_id,
        "state": request.state,
        "effective_state": effective_approval_state(request, now_ms),
        "version": request.version,
        "permission": request.permission,
        "action_type": request.action_type,
        "action_ref": request.action_ref,
        "action_digest_prefix": request.action_digest[:DIGEST_PREFIX],
        "risk": request.risk,
        "task_revision": bound_task_revision(request),
        "requested_by": request.requested_by,
        "requested_at_ms": request.requested_at_ms,
        "expires_at_ms": request.expires_at_ms,
        "decision": request.decision,
        "reason_code": request.reason_code,
        "note": request.decision_note,
        "decided_by": request.decided_by,
        "decided_at_ms": request.decided_at_ms,
        "consumed_at_ms": request.consumed_at_ms,
        "dispatch_id": request.dispatch_id,
    }


def get_approval(tx: Transaction, project_id: str, approval_id: str) -> dict[str, Any]:
    row = tx.one("approval_get_in_project", {"id": approval_id, "project_id": project_id})
    if row is None:
        raise NotFound("approval not found")
    return approval_view(approval_from_row(row), tx.now_ms())


def list_approvals(
    tx: Transaction,
    project_id: str,
    *,
    state: str | None = None,
    limit: int = DEFAULT_LIST_PAGE,
    cursor: str | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """Newest first, keyset paginated by ``(requested_at_ms, id)``; ``state`` filters the stored state."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIST_PAGE:
        raise ValidationFailed("limit out of range", field="limit")
    if state is not None and state not in APPROVAL_STATES:
        raise ValidationFailed("invalid state", field="state")
    params: dict[str, Any] = {"project_id": project_id, "limit": limit + 1, "state": state}
    prefix = "approval_list_state" if state else "approval_list"
    if cursor:
        params["cursor_ms"], params["cursor_id"] = runs.decode_cursor(cursor)
        found = tx.all(f"{prefix}_after", params)
    else:
        found = tx.all(f"{prefix}_first", params)
    now = tx.now_ms()
    page = [approval_from_row(r) for r in found[:limit]]
    next_cursor = None
    if len(found) > limit and page:
        next_cursor = runs.encode_cursor(page[-1].requested_at_ms, page[-1].id)
    return [approval_view(r, now) for r in page], next_cursor
