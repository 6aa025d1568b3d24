"""Approval requests (docs/contracts.md §10): the request, its decision and its consumption.

Every write is a compare-and-set the SQL states: a decision only on ``pending@1`` before expiry, a
consumption only on ``approved@2`` before expiry with the approved action digest.
"""

from __future__ import annotations

from typing import Final

from ql3.domain.approvals import (
    APPROVAL_STATES,
    CONSUMERS,
    DECISIONS,
    RISKS,
    ApprovalPolicy,
    ApprovalRequest,
    ApprovalState,
    Consumer,
    Decision,
)
from ql3.ports.storage import Row, Transaction
from ql3.repositories.mapping import one_of, opt_int

# The list query for (filtered by state, after a cursor).
_LIST_QUERIES: Final[dict[tuple[bool, bool], str]] = {
    (False, False): "approval_list_first",
    (False, True): "approval_list_after",
    (True, False): "approval_list_state_first",
    (True, True): "approval_list_state_after",
}


def approval_from_row(row: Row) -> ApprovalRequest:
    decision = row["decision"]
    consumed_by = row["consumed_by"]
    return ApprovalRequest(
        id=row["id"],
        project_id=row["project_id"],
        version=int(row["version"]),
        state=one_of(row["state"], APPROVAL_STATES, "approval_requests.state"),
        permission=row["permission"],
        action_type=row["action_type"],
        action_ref=row["action_ref"],
        action_digest=row["action_digest"],
        action_plan=row["action_plan_json"],
        preview_digest=row["preview_digest"],
        risk=one_of(row["risk"], RISKS, "approval_requests.risk"),
        requested_by=row["requested_by"],
        requested_at_ms=int(row["requested_at_ms"]),
        expires_at_ms=int(row["expires_at_ms"]),
        request_fence=row["request_fence"],
        request_digest=row["request_digest"],
        decision_id=row["decision_id"],
        decision=None if decision is None else one_of(decision, DECISIONS, "approval_requests.decision"),
        reason_code=row["reason_code"],
        decision_note=row["decision_note"],
        decided_by=row["decided_by"],
        decided_at_ms=opt_int(row["decided_at_ms"]),
        decision_fence=row["decision_fence"],
        consumption_id=row["consumption_id"],
        dispatch_id=row["dispatch_id"],
        consumed_by=None
        if consumed_by is None
        else one_of(consumed_by, CONSUMERS, "approval_requests.consumed_by"),
        consumed_at_ms=opt_int(row["consumed_at_ms"]),
        consumption_fence=row["consumption_fence"],
        updated_at_ms=int(row["updated_at_ms"]),
    )


def get_approval(tx: Transaction, approval_id: str) -> ApprovalRequest | None:
    row = tx.one("approval_get", {"id": approval_id})
    return None if row is None else approval_from_row(row)


def lock_approval(tx: Transaction, approval_id: str) -> ApprovalRequest | None:
    """The request read under the row lock the deciding or consuming transaction holds to its end."""
    row = tx.one("approval_lock", {"id": approval_id})
    return None if row is None else approval_from_row(row)


def get_approval_in_project(tx: Transaction, project_id: str, approval_id: str) -> ApprovalRequest | None:
    row = tx.one("approval_get_in_project", {"id": approval_id, "project_id": project_id})
    return None if row is None else approval_from_row(row)


def list_approvals(
    tx: Transaction,
    *,
    project_id: str,
    state: ApprovalState | None,
    before: tuple[int, str] | None,
    limit: int,
) -> list[ApprovalRequest]:
    """Newest first by ``(requested_at_ms, id)``, strictly before ``before`` when given."""
    params: dict[str, object] = {"project_id": project_id, "limit": limit, "state": state}
    if before is not None:
        params["cursor_ms"], params["cursor_id"] = before
    found = tx.all(_LIST_QUERIES[(state is not None, before is not None)], params)
    return [approval_from_row(row) for row in found]


def unconsumed_approved_ids(tx: Transaction, *, limit: int) -> list[str]:
    """Approved requests that are neither expired nor consumed, oldest decision first."""
    found = tx.all("approval_unconsumed_page", {"now": tx.now_ms(), "limit": limit})
    return [str(row["id"]) for row in found]


def insert_approval(tx: Transaction, request: ApprovalRequest) -> bool:
    """Store a new ``pending@1`` request (requested and updated at ``requested_at_ms``); False when
    the id is taken."""
    params = {
        "id": request.id,
        "project_id": request.project_id,
        "permission": request.permission,
        "action_type": request.action_type,
        "action_ref": request.action_ref,
        "action_digest": request.action_digest,
        "action_plan_json": request.action_plan,
        "preview_digest": request.preview_digest,
        "risk": request.risk,
        "requested_by": request.requested_by,
        "expires_at_ms": request.expires_at_ms,
        "request_fence": request.request_fence,
        "request_digest": request.request_digest,
        "now": request.requested_at_ms,
    }
    return tx.run("approval_insert", params) == 1


def decide_approval(
    tx: Transaction,
    request: ApprovalRequest,
    *,
    decision: Decision,
    decision_id: str,
    reason_code: str,
    note: str | None,
    decided_by: str,
    decision_fence: str,
) -> bool:
    """``pending@1 -> approved@2 | rejected@2`` now, before expiry; False when the request moved."""
    changed = tx.run(
        "approval_decide",
        {
            "id": request.id,
            "state": "approved" if decision == "approve" else "rejected",
            "decision_id": decision_id,
            "decision": decision,
            "reason_code": reason_code,
            "decision_note": note,
            "decided_by": decided_by,
            "decision_fence": decision_fence,
            "now": tx.now_ms(),
        },
    )
    return changed == 1


def consume_approval(
    tx: Transaction,
    request: ApprovalRequest,
    *,
    consumption_id: str,
    dispatch_id: str,
    consumed_by: Consumer,
    consumption_fence: str,
) -> bool:
    """``approved@2 -> consumed@3`` now, before expiry and only for the request's action digest;
    False when the request moved."""
    changed = tx.run(
        "approval_consume",
        {
            "id": request.id,
            "consumption_id": consumption_id,
            "dispatch_id": dispatch_id,
            "consumed_by": consumed_by,
            "consumption_fence": consumption_fence,
            "action_digest": request.action_digest,
            "now": tx.now_ms(),
        },
    )
    return changed == 1


def get_policy(tx: Transaction, project_id: str) -> ApprovalPolicy:
    """The project's approval policy (the default when it never set one)."""
    row = tx.one("approval_policy_get", {"project_id": project_id})
    if row is None:
        return ApprovalPolicy()
    return ApprovalPolicy(
        second_admin=bool(row["second_admin"]),
        version=int(row["version"]),
        updated_at_ms=opt_int(row["updated_at_ms"]),
    )


def set_policy(tx: Transaction, project_id: str, *, second_admin: bool, updated_by: str) -> None:
    """Create or replace the project's approval policy (its version goes up by one)."""
    tx.run(
        "approval_policy_upsert",
        {
            "project_id": project_id,
            "second_admin": int(second_admin),
            "updated_by": updated_by,
            "now": tx.now_ms(),
        },
    )
