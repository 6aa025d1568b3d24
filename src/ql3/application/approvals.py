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
    ApprovalPolicy,
    ApprovalRequest,
    Consumer,
    Dispatch,
    RequesterNotAllowed,
    RunCreatePlan,
    SeparationOfDuty,
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
from ql3.domain.choices import choose
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
from ql3.ports.storage import Transaction
from ql3.repositories import actions as action_store
from ql3.repositories import approvals as approval_store
from ql3.repositories import auth as auth_store

DEFAULT_LIST_PAGE: Final = 50
DIGEST_PREFIX: Final = 12


def get_dispatch(tx: Transaction, dispatch_id: str) -> Dispatch:
    found = action_store.get_dispatch(tx, dispatch_id)
    if found is None:
        raise NotFound("dispatch not found")
    return found


# -- policy -------------------------------------------------------------------------------------


def evaluate_policy(tx: Transaction, principal: Principal, project: Project) -> tuple[str | None, str]:
    """The principal's current role in the project and the policy fence it was read under."""
    role = auth.role_in(tx, principal, project)
    binding = None
    if not principal.is_owner:
        found = auth_store.get_binding(tx, principal.id, project.id)
        binding = None if found is None else found.version
    current = auth.resolve_project(tx, project.id)
    return role, policy_fence(current.version, binding)


def require_role(
    tx: Transaction, principal: Principal, project: Project, *, role: str, permission: str
) -> str:
    """Re-check, inside the writing transaction, that ``principal`` still is a live user holding
    ``role`` (the role the caller resolved: the policy fence) and that it grants ``permission``."""
    if principal.kind != "user":
        raise PermissionDenied("only a user may do this", permission=permission)
    stored = auth_store.get_live_principal(tx, principal.id)
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
    requester = auth_store.get_live_principal(tx, requested_by.id)
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
    stored = approval_store.get_approval(tx, approval_id)
    if stored is None:
        new = _new_run_approval(
            approval_id,
            project_id=project.id,
            requested_by=requester.id,
            plan=plan,
            preview=preview,
            fence=fence,
            now=tx.now_ms(),
            ttl_ms=ttl_ms,
        )
        if approval_store.insert_approval(tx, new):
            tx.notify(channels.APPROVED_ACTIONS)
            notifications.on_approval_requested(tx, project.id, view.task.id, approval_id)
            return _written(tx, approval_id)
        stored = approval_store.get_approval(tx, approval_id)
        if stored is None:
            raise Conflict("approval id collision")
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


def _new_run_approval(
    approval_id: str,
    *,
    project_id: str,
    requested_by: str,
    plan: RunCreatePlan,
    preview: str,
    fence: str,
    now: int,
    ttl_ms: int,
) -> ApprovalRequest:
    """A ``pending@1`` request to run ``plan``, made at ``now``, with its request digest."""
    expires = now + ttl_ms
    action_digest = plan.digest()
    return ApprovalRequest(
        id=approval_id,
        project_id=project_id,
        version=1,
        state="pending",
        permission="run.create",
        action_type=RUN_CREATE,
        action_ref=plan.action_ref,
        action_digest=action_digest,
        action_plan=plan.canonical(),
        preview_digest=preview,
        risk="medium",
        requested_by=requested_by,
        requested_at_ms=now,
        expires_at_ms=expires,
        request_fence=fence,
        request_digest=approval_request_digest(
            approval_id=approval_id,
            project_id=project_id,
            permission="run.create",
            action_type=RUN_CREATE,
            action_ref=plan.action_ref,
            action_digest=action_digest,
            preview_digest=preview,
            risk="medium",
            requested_by=requested_by,
            requested_at_ms=now,
            expires_at_ms=expires,
            request_fence=fence,
        ),
        updated_at_ms=now,
    )


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
    chosen = choose(decision, DECISIONS)
    if chosen is None:
        raise ValidationFailed("decision must be approve or reject", field="decision")
    validate_client_id(decision_id, "decision_id")
    validate_code(reason_code)
    note = validate_note(note)
    project = auth.resolve_project(tx, project_id)
    request = approval_store.lock_approval(tx, approval_id)
    if request is None or request.project_id != project.id:
        raise NotFound("approval not found")
    fence = require_role(tx, decider, project, role=decider_role, permission="approval.decide")
    check_separation(tx, request, decider, decider_role, approval_store.get_policy(tx, project.id))
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
    if chosen == "approve":
        # docs/security.md: a request whose requester was revoked (or lost the permission) is refused;
        # rejecting it stays possible, to close it.
        _requester_policy_fence(tx, request)
    decided = approval_store.decide_approval(
        tx,
        request,
        decision=chosen,
        decision_id=decision_id,
        reason_code=reason_code,
        note=note,
        decided_by=decider.id,
        decision_fence=fence,
    )
    if not decided:
        raise Conflict("the approval changed concurrently")
    if chosen == "approve":
        tx.notify(channels.APPROVED_ACTIONS)
    return _written(tx, request.id)


# How far a chain of token issuers is followed (each link is one read; chains are short in practice).
MAX_ISSUER_CHAIN: Final = 32


def issuers(tx: Transaction, principal_id: str) -> list[str]:
    """Who issued ``principal_id``'s current token, who issued that one's, ... nearest first (bounded;
    a principal that rotated its own token keeps its issuer)."""
    chain: list[str] = []
    seen = {principal_id}
    current = principal_id
    for _ in range(MAX_ISSUER_CHAIN):
        issuer = auth_store.get_issuer(tx, current)
        if issuer is None or issuer in seen:
            break
        chain.append(issuer)
        seen.add(issuer)
        current = issuer
    return chain


def check_separation(
    tx: Transaction, request: ApprovalRequest, decider: Principal, decider_role: str, policy: ApprovalPolicy
) -> None:
    """The separation of duty of a decision (docs/security.md "Separation of duty"): never the
    requester, never a principal whose token the requester issued (directly or through others); under
    ``second_admin`` also only an admin, and never one who issued the requester's token."""
    if decider.id == request.requested_by:
        raise SeparationOfDuty("the requester cannot decide their own request", permission="approval.decide")
    if request.requested_by in issuers(tx, decider.id):
        raise SeparationOfDuty(
            "the decider's token was issued by the requester", permission="approval.decide"
        )
    if not policy.second_admin:
        return
    if decider_role != "admin":
        raise SeparationOfDuty("this project's policy needs a second admin", permission="approval.decide")
    if decider.id in issuers(tx, request.requested_by):
        raise SeparationOfDuty(
            "this project's policy needs an admin who did not issue the requester's token",
            permission="approval.decide",
        )


def get_policy(tx: Transaction, project: Project) -> ApprovalPolicy:
    return approval_store.get_policy(tx, project.id)


def set_policy(tx: Transaction, project: Project, admin: Principal, *, second_admin: bool) -> ApprovalPolicy:
    """Set the project's approval policy (the caller holds ``project.admin``); returns it as written."""
    if not isinstance(second_admin, bool):
        raise ValidationFailed("second_admin is true or false", field="second_admin")
    approval_store.set_policy(tx, project.id, second_admin=second_admin, updated_by=admin.id)
    return approval_store.get_policy(tx, project.id)


def _written(tx: Transaction, approval_id: str) -> ApprovalRequest:
    """The request as this transaction just wrote it."""
    found = approval_store.get_approval(tx, approval_id)
    assert found is not None
    return found


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
    consumed_by = choose(consumer, CONSUMERS)
    if consumed_by is None:
        raise ValidationFailed("invalid consumer", field="consumer")
    validate_client_id(consumption_id, "consumption_id")
    validate_max_attempts(max_attempts)
    request = approval_store.lock_approval(tx, approval_id)
    if request is None:
        raise NotFound("approval not found")
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
    fence = _requester_policy_fence(tx, request)
    dispatch = _new_dispatch(request, dispatch_id=new_id(), consumed_by=consumed_by, fence=fence, now=now)
    consumed = approval_store.consume_approval(
        tx,
        request,
        consumption_id=consumption_id,
        dispatch_id=dispatch.id,
        consumed_by=consumed_by,
        consumption_fence=fence,
    )
    if not consumed:
        raise Conflict("the approval changed concurrently")
    action_store.insert_dispatch(tx, dispatch)
    action_store.insert_execution(
        tx,
        dispatch=dispatch,
        max_attempts=max_attempts,
        execution_digest=execution_digest(
            dispatch_id=dispatch.id,
            dispatch_digest_hex=dispatch.dispatch_digest,
            project_id=request.project_id,
            max_attempts=max_attempts,
            created_at_ms=now,
        ),
    )
    tx.notify(channels.APPROVED_ACTIONS)
    return get_dispatch(tx, dispatch.id)


def _requester_policy_fence(tx: Transaction, request: ApprovalRequest) -> str:
    """The policy fence under which the requester, still live, still holds the request's permission."""
    project = auth.resolve_project(tx, request.project_id)
    requester = auth_store.get_live_principal(tx, request.requested_by)
    if requester is None:
        raise RequesterNotAllowed(permission=request.permission)
    role, fence = evaluate_policy(tx, requester, project)
    if role is None or not role_allows(role, request.permission):
        raise RequesterNotAllowed(permission=request.permission)
    return fence


def _new_dispatch(
    request: ApprovalRequest, *, dispatch_id: str, consumed_by: Consumer, fence: str, now: int
) -> Dispatch:
    """The immutable dispatch of a decided request consumed at ``now``, with its digest."""
    if request.decided_by is None or request.decided_at_ms is None:
        raise Conflict("the approval has no decision")
    d_digest = dispatch_digest(
        dispatch_id=dispatch_id,
        approval_request_id=request.id,
        approval_request_digest_hex=request.request_digest,
        project_id=request.project_id,
        action_type=request.action_type,
        action_ref=request.action_ref,
        action_digest=request.action_digest,
        requested_by=request.requested_by,
        consumed_by=consumed_by,
        approved_by=request.decided_by,
        approved_at_ms=request.decided_at_ms,
        expires_at_ms=request.expires_at_ms,
        approval_fence=fence,
        created_at_ms=now,
    )
    return Dispatch(
        id=dispatch_id,
        approval_request_id=request.id,
        approval_request_version=3,
        project_id=request.project_id,
        action_type=request.action_type,
        action_ref=request.action_ref,
        action_digest=request.action_digest,
        action_plan=request.action_plan,
        requested_by=request.requested_by,
        consumed_by=consumed_by,
        approved_by=request.decided_by,
        approved_at_ms=request.decided_at_ms,
        expires_at_ms=request.expires_at_ms,
        approval_fence=fence,
        dispatch_digest=d_digest,
        created_at_ms=now,
    )


def unconsumed_approved(tx: Transaction, *, limit: int = 16) -> list[str]:
    """Ids of approved, unexpired, not yet consumed requests, oldest decision first (for a consumer
    loop in ``ql3 serve``)."""
    if not 1 <= limit <= 64:
        raise ValidationFailed("limit out of range", field="limit")
    return approval_store.unconsumed_approved_ids(tx, limit=limit)


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
    found = approval_store.get_approval_in_project(tx, project_id, approval_id)
    if found is None:
        raise NotFound("approval not found")
    return approval_view(found, tx.now_ms())


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
    wanted = None if state is None else choose(state, APPROVAL_STATES)
    if state is not None and wanted is None:
        raise ValidationFailed("invalid state", field="state")
    before = runs.decode_cursor(cursor) if cursor else None
    found = approval_store.list_approvals(
        tx, project_id=project_id, state=wanted, before=before, limit=limit + 1
    )
    now = tx.now_ms()
    page = found[:limit]
    next_cursor = None
    if len(found) > limit and page:
        next_cursor = runs.encode_cursor(page[-1].requested_at_ms, page[-1].id)
    return [approval_view(r, now) for r in page], next_cursor
