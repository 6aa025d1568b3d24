"""Approved actions: list, show, and the manual resolution of a ``recovery_required`` one.

An action whose handler may have run (``executing`` past its lease) is never retried: trusted evidence
or a person with ``approval.recover`` closes it, as ``succeeded``, ``failed`` or ``blocked`` (abandoned).
No response carries a lease owner, a token or its digest.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel

from ql3.application import approved_action_recovery, approved_actions, auth
from ql3.domain.approvals import MAX_LIST_PAGE
from ql3.domain.errors import NotFound
from ql3.domain.ids import is_id, new_id
from ql3.http.auth import DbDep, PrincipalDep
from ql3.http.dto import Body
from ql3.ports.storage import Transaction

router = APIRouter(prefix="/api/v1/projects/{project}/actions", tags=["approvals"])

# What a person states about the outcome -> the manual decision recorded for it.
DECISION_BY_OUTCOME: Final[dict[str, str]] = {
    "succeeded": "confirm_succeeded",
    "failed": "confirm_failed",
    "abandoned": "abandon_unknown",
}
DEFAULT_RESOLVE_REASON: Final = "manual_resolution"


class ActionOut(BaseModel):
    """``effective_status`` is ``recovery_required`` for an ``executing`` action past its lease."""

    dispatch_id: str
    project_id: str
    approval_request_id: str
    action_type: str
    action_ref: str
    action_digest_prefix: str
    status: str
    effective_status: str
    version: int
    attempt_count: int
    max_attempts: int
    eligible_at_ms: int | None
    lease_expires_at_ms: int | None
    started_at_ms: int | None
    result_code: str | None
    result_digest_prefix: str | None
    completed_at_ms: int | None
    created_at_ms: int
    updated_at_ms: int
    recovery_status: str | None
    recovery_last_finding: str | None


class ActionPage(BaseModel):
    items: list[ActionOut]
    next_cursor: str | None


class ResolveIn(Body):
    outcome: Literal["succeeded", "failed", "abandoned"]
    expected_version: int
    mutation_id: str | None = None
    reason_code: str = DEFAULT_RESOLVE_REASON


def _dispatch_id(dispatch_id: str) -> str:
    if not is_id(dispatch_id):
        raise NotFound("approved action not found")
    return dispatch_id


@router.get("", response_model=ActionPage)
def list_actions(
    project: str,
    db: DbDep,
    principal: PrincipalDep,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST_PAGE)] = 50,
) -> ActionPage:
    """Newest first; pass ``next_cursor`` back as ``cursor`` for the next page."""

    def unit(tx: Transaction) -> ActionPage:
        found = auth.authorize(tx, principal, project, "run.read")
        items, next_cursor = approved_actions.list_actions(tx, found.id, limit=limit, cursor=cursor)
        return ActionPage(items=[ActionOut(**i) for i in items], next_cursor=next_cursor)

    return db.transaction(unit, write=False)


@router.get("/{dispatch_id}", response_model=ActionOut)
def show_action(project: str, dispatch_id: str, db: DbDep, principal: PrincipalDep) -> ActionOut:
    def unit(tx: Transaction) -> ActionOut:
        found = auth.authorize(tx, principal, project, "run.read")
        return ActionOut(**approved_actions.get_action(tx, found.id, _dispatch_id(dispatch_id)))

    return db.transaction(unit, write=False)


@router.post(
    "/{dispatch_id}/resolve",
    response_model=ActionOut,
    responses={409: {"description": "not recovery_required, version mismatch, or already resolved"}},
)
def resolve_action(
    project: str, dispatch_id: str, body: ResolveIn, db: DbDep, principal: PrincipalDep
) -> ActionOut:
    """Close a ``recovery_required`` action (``approval.recover``) at exactly ``expected_version``:
    ``succeeded|failed|abandoned`` -> ``confirm_succeeded|confirm_failed|abandon_unknown``. There is no
    retry; the same ``mutation_id`` with the same content replays."""

    def unit(tx: Transaction) -> ActionOut:
        found = auth.authorize(tx, principal, project, "approval.recover")
        role = auth.role_in(tx, principal, found)
        assert role is not None  # authorize refused a caller without a role
        did = _dispatch_id(dispatch_id)
        approved_action_recovery.resolve_manually(
            tx,
            dispatch_id=did,
            project_id=found.id,
            principal=principal,
            role=role,
            mutation_id=body.mutation_id or new_id(),
            expected_execution_version=body.expected_version,
            decision=DECISION_BY_OUTCOME[body.outcome],
            reason_code=body.reason_code,
        )
        return ActionOut(**approved_actions.get_action(tx, found.id, did))

    return db.transaction(unit)
