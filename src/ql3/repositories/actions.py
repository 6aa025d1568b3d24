"""Approved actions (docs/contracts.md §10): the immutable dispatch a consumed approval creates and
the execution control row created with it. The execution's state machine is still run by
``application/approved_actions.py`` itself."""

from __future__ import annotations

from ql3.domain.approvals import CONSUMERS, Dispatch
from ql3.ports.storage import Row, Transaction
from ql3.repositories.mapping import one_of


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
        consumed_by=one_of(row["consumed_by"], CONSUMERS, "approved_action_dispatches.consumed_by"),
        approved_by=row["approved_by"],
        approved_at_ms=int(row["approved_at_ms"]),
        expires_at_ms=int(row["expires_at_ms"]),
        approval_fence=row["approval_fence"],
        dispatch_digest=row["dispatch_digest"],
        created_at_ms=int(row["created_at_ms"]),
    )


def get_dispatch(tx: Transaction, dispatch_id: str) -> Dispatch | None:
    row = tx.one("aa_dispatch_get", {"id": dispatch_id})
    return None if row is None else dispatch_from_row(row)


def insert_dispatch(tx: Transaction, dispatch: Dispatch) -> None:
    """Store the dispatch of a request consumed at version 3, created at ``created_at_ms``."""
    tx.run(
        "aa_dispatch_insert",
        {
            "id": dispatch.id,
            "approval_request_id": dispatch.approval_request_id,
            "project_id": dispatch.project_id,
            "action_type": dispatch.action_type,
            "action_ref": dispatch.action_ref,
            "action_digest": dispatch.action_digest,
            "action_plan_json": dispatch.action_plan,
            "requested_by": dispatch.requested_by,
            "consumed_by": dispatch.consumed_by,
            "approved_by": dispatch.approved_by,
            "approved_at_ms": dispatch.approved_at_ms,
            "expires_at_ms": dispatch.expires_at_ms,
            "approval_fence": dispatch.approval_fence,
            "dispatch_digest": dispatch.dispatch_digest,
            "now": dispatch.created_at_ms,
        },
    )


def insert_execution(
    tx: Transaction,
    *,
    dispatch: Dispatch,
    max_attempts: int,
    execution_digest: str,
) -> None:
    """The dispatch's execution control, ``pending@v0`` and eligible from the dispatch's creation."""
    tx.run(
        "aa_execution_insert",
        {
            "dispatch_id": dispatch.id,
            "dispatch_digest": dispatch.dispatch_digest,
            "project_id": dispatch.project_id,
            "max_attempts": max_attempts,
            "execution_digest": execution_digest,
            "now": dispatch.created_at_ms,
        },
    )
