"""Approval requests: list, show, approve, reject; and the run-create branch of an approval-required task.

Starting a task whose spec has ``approval: required`` creates no run: it creates an approval request
(202 ``{"approval": {...}}``). Once another user with ``approval.decide`` approves it, ``ql3 serve``
consumes it and the approved-action dispatcher creates the run. The requester can never decide their
own request.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from ql3.application import approvals, auth
from ql3.domain.approvals import (
    APPROVAL_STATES,
    CLIENT_ID_RE,
    CODE_RE,
    MAX_DECISION_NOTE,
    MAX_LIST_PAGE,
    ApprovalPolicy,
)
from ql3.domain.digests import sha256_hex
from ql3.domain.errors import NotFound
from ql3.domain.ids import new_id
from ql3.domain.model import Principal, Project, Task
from ql3.http.auth import DbDep, PrincipalDep
from ql3.http.dto import Body
from ql3.ports.storage import Transaction

router = APIRouter(prefix="/api/v1/projects/{project}/approvals", tags=["approvals"])

DEFAULT_APPROVE_REASON = "approved"


class ApprovalOut(BaseModel):
    """Low-sensitivity fields only: no plan, fences or full digests. ``effective_state`` is
    ``expired`` for a pending or approved request past ``expires_at_ms``."""

    id: str
    project_id: str
    state: str
    effective_state: str
    version: int
    permission: str
    action_type: str
    action_ref: str
    action_digest_prefix: str
    risk: str
    task_revision: int | None = Field(
        default=None, description="the task revision a run.create request is bound to (what will run)"
    )
    requested_by: str
    requested_at_ms: int
    expires_at_ms: int
    decision: str | None
    reason_code: str | None
    note: str | None = Field(default=None, description="the decider's free-text note, if any")
    decided_by: str | None
    decided_at_ms: int | None
    consumed_at_ms: int | None
    dispatch_id: str | None


class ApprovalPage(BaseModel):
    items: list[ApprovalOut]
    next_cursor: str | None


class ApprovalRequested(BaseModel):
    """The answer (202) to starting an approval-required task: no run exists until it is approved."""

    approval: ApprovalOut


_NOTE = Field(
    default=None,
    max_length=MAX_DECISION_NOTE,
    description=f"optional free text stored with the decision (at most {MAX_DECISION_NOTE} characters, "
    "no control characters)",
    json_schema_extra={"pattern": r"^[^\x00-\x1f\x7f-\x9f]*$"},
)


class ApproveIn(Body):
    reason_code: str = Field(default=DEFAULT_APPROVE_REASON, json_schema_extra={"pattern": CODE_RE.pattern})
    note: str | None = _NOTE
    decision_id: str | None = None


class RejectIn(Body):
    reason_code: str = Field(json_schema_extra={"pattern": CODE_RE.pattern})
    note: str | None = _NOTE
    decision_id: str | None = None


def _approval_id(approval_id: str) -> str:
    if not CLIENT_ID_RE.fullmatch(approval_id):
        raise NotFound("approval not found")
    return approval_id


def _idempotent_approval_id(project: Project, key: str) -> str:
    """A repeated ``idempotency_key`` names the same request (ids are global, so the project is bound)."""
    return "idem." + sha256_hex(f"{project.id}\x00{key}")[:48]


def request_approval(
    tx: Transaction,
    project: Project,
    task: Task,
    principal: Principal,
    *,
    priority: int,
    idempotency_key: str | None,
) -> ApprovalRequested:
    """Create (or replay) the approval request that stands in for a run of ``task``."""
    request = approvals.request_run_approval(
        tx,
        project_id=project.id,
        task_ref=task.id,
        requested_by=principal,
        priority=priority,
        approval_id=None if idempotency_key is None else _idempotent_approval_id(project, idempotency_key),
    )
    return ApprovalRequested(approval=ApprovalOut(**approvals.approval_view(request, tx.now_ms())))


@router.get("", response_model=ApprovalPage)
def list_approvals(
    project: str,
    db: DbDep,
    principal: PrincipalDep,
    state: Annotated[
        str | None,
        Query(
            max_length=16,
            description="pending, approved, rejected or consumed",
            json_schema_extra={"enum": list(APPROVAL_STATES)},
        ),
    ] = None,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST_PAGE)] = approvals.DEFAULT_LIST_PAGE,
) -> ApprovalPage:
    """Newest first; pass ``next_cursor`` back as ``cursor`` for the next page."""

    def unit(tx: Transaction) -> ApprovalPage:
        found = auth.authorize(tx, principal, project, "run.read")
        items, next_cursor = approvals.list_approvals(tx, found.id, state=state, limit=limit, cursor=cursor)
        return ApprovalPage(items=[ApprovalOut(**i) for i in items], next_cursor=next_cursor)

    return db.transaction(unit, write=False)


@router.get("/{approval_id}", response_model=ApprovalOut)
def show_approval(project: str, approval_id: str, db: DbDep, principal: PrincipalDep) -> ApprovalOut:
    def unit(tx: Transaction) -> ApprovalOut:
        found = auth.authorize(tx, principal, project, "run.read")
        return ApprovalOut(**approvals.get_approval(tx, found.id, _approval_id(approval_id)))

    return db.transaction(unit, write=False)


def _decide(
    db: DbDep,
    principal: Principal,
    project: str,
    approval_id: str,
    *,
    decision: str,
    reason_code: str,
    note: str | None,
    decision_id: str | None,
) -> ApprovalOut:
    def unit(tx: Transaction) -> ApprovalOut:
        found = auth.authorize(tx, principal, project, "approval.decide")
        role = auth.role_in(tx, principal, found)
        assert role is not None  # authorize refused a caller without a role
        request = approvals.decide(
            tx,
            approval_id=_approval_id(approval_id),
            project_id=found.id,
            decider=principal,
            decider_role=role,
            decision=decision,
            decision_id=decision_id or new_id(),
            reason_code=reason_code,
            note=note,
        )
        return ApprovalOut(**approvals.approval_view(request, tx.now_ms()))

    result: ApprovalOut = db.transaction(unit)
    return result


_DECIDE_DOC: dict[str, Any] = {
    "response_model": ApprovalOut,
    "responses": {409: {"description": "approval_expired, or already decided differently"}},
}


@router.post("/{approval_id}/approve", **_DECIDE_DOC)
def approve(
    project: str, approval_id: str, db: DbDep, principal: PrincipalDep, body: ApproveIn | None = None
) -> ApprovalOut:
    """Approve (``approval.decide``; never the requester). The server mints ``decision_id`` when absent;
    repeating a ``decision_id`` with the same content replays."""
    request = body or ApproveIn()
    return _decide(
        db,
        principal,
        project,
        approval_id,
        decision="approve",
        reason_code=request.reason_code,
        note=request.note,
        decision_id=request.decision_id,
    )


@router.post("/{approval_id}/reject", **_DECIDE_DOC)
def reject(project: str, approval_id: str, body: RejectIn, db: DbDep, principal: PrincipalDep) -> ApprovalOut:
    """Reject with a ``reason_code`` (``^[a-z][a-z0-9_]{0,63}$``) and an optional free-text ``note``;
    same rules as approve."""
    return _decide(
        db,
        principal,
        project,
        approval_id,
        decision="reject",
        reason_code=body.reason_code,
        note=body.note,
        decision_id=body.decision_id,
    )


# -- the project's approval policy (docs/security.md "Separation of duty") ---------------------------

policy_router = APIRouter(prefix="/api/v1/projects/{project}", tags=["approvals"])


class ApprovalPolicyIn(Body):
    second_admin: bool


class ApprovalPolicyOut(BaseModel):
    second_admin: bool
    version: int
    updated_at_ms: int | None


def _policy_out(policy: ApprovalPolicy) -> ApprovalPolicyOut:
    return ApprovalPolicyOut(
        second_admin=policy.second_admin, version=policy.version, updated_at_ms=policy.updated_at_ms
    )


@policy_router.get("/approval-policy", response_model=ApprovalPolicyOut)
def show_policy(project: str, db: DbDep, principal: PrincipalDep) -> ApprovalPolicyOut:
    """Who may decide this project's approval requests. Always: never the requester, never a principal
    whose token the requester issued. ``second_admin``: also only an admin, never one who issued the
    requester's token (version 0: never set)."""

    def unit(tx: Transaction) -> ApprovalPolicyOut:
        found = auth.authorize(tx, principal, project, "run.read")
        return _policy_out(approvals.get_policy(tx, found))

    return db.transaction(unit, write=False)


@policy_router.put("/approval-policy", response_model=ApprovalPolicyOut)
def set_policy(project: str, body: ApprovalPolicyIn, db: DbDep, principal: PrincipalDep) -> ApprovalPolicyOut:
    """Set the project's approval policy (admin)."""

    def unit(tx: Transaction) -> ApprovalPolicyOut:
        found = auth.authorize(tx, principal, project, "project.admin")
        return _policy_out(approvals.set_policy(tx, found, principal, second_admin=body.second_admin))

    return db.transaction(unit)
