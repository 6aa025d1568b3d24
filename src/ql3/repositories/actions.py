"""Approved actions (docs/contracts.md §10): the immutable dispatch a consumed approval creates, the
execution control row created with it (its lease, start barrier, release and finish), the recovery
control the start barrier arms, the resolutions that close a lapsed execution, the ``run.create``
receipts and the low-sensitivity read model.

Every write is a compare-and-set the SQL states on the version the caller read and returns whether it
applied; the fences themselves (holder, token digest, attempt, barrier times) are checked by
``application/approved_action*.py`` under the row locks it takes. Times are passed in: a use case
reads ``tx.now_ms()`` once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ql3.domain.approvals import (
    CONSUMERS,
    EXECUTION_STATUSES,
    RECOVERY_STATUSES,
    RESOLUTION_ACTORS,
    RESOLUTION_KINDS,
    RESOLUTION_OUTCOMES,
    RESOLUTION_SOURCES,
    Dispatch,
    Execution,
    ExecutionStatus,
    RecoveryControl,
    RecoveryStatus,
    Resolution,
    RunActionReceipt,
)
from ql3.ports.storage import Row, Transaction
from ql3.repositories.mapping import one_of, opt_int

# The read model's page: the newest, or the one before a ``(created_at_ms, dispatch_id)`` key.
_ACTION_LIST_QUERIES: Final[dict[bool, str]] = {False: "aa_action_list_first", True: "aa_action_list_after"}
# The due page: the first, or the one after an ``(eligible_at_ms, dispatch_id)`` key.
_DUE_QUERIES: Final[dict[bool, str]] = {False: "aa_due_first", True: "aa_due_after"}


@dataclass(frozen=True, slots=True, kw_only=True)
class DueRow:
    """An execution due for a claim, as the dispatcher pages them."""

    dispatch_id: str
    eligible_at_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredReceipt:
    """A ``run.create`` receipt with the evidence digest stored next to it (the caller re-derives the
    digest from the fields and compares)."""

    receipt: RunActionReceipt
    evidence_digest: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionRecord:
    """The read model of one approved action: its execution, the dispatch's identity and the state of
    its recovery control (None before the start barrier armed one)."""

    execution: Execution
    approval_request_id: str
    action_type: str
    action_ref: str
    action_digest: str
    recovery_status: RecoveryStatus | None
    recovery_last_finding: str | None


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


# -- the execution control ----------------------------------------------------------------------


def execution_from_row(row: Row) -> Execution:
    return Execution(
        dispatch_id=row["dispatch_id"],
        dispatch_digest=row["dispatch_digest"],
        project_id=row["project_id"],
        status=one_of(row["status"], EXECUTION_STATUSES, "approved_action_executions.status"),
        version=int(row["version"]),
        attempt_count=int(row["attempt_count"]),
        max_attempts=int(row["max_attempts"]),
        eligible_at_ms=opt_int(row["eligible_at_ms"]),
        next_attempt_at_ms=opt_int(row["next_attempt_at_ms"]),
        lease_owner=row["lease_owner"],
        lease_token_digest=row["lease_token_digest"],
        lease_expires_at_ms=opt_int(row["lease_expires_at_ms"]),
        started_at_ms=opt_int(row["started_at_ms"]),
        result_mutation_id=row["result_mutation_id"],
        result_code=row["result_code"],
        result_digest=row["result_digest"],
        completed_at_ms=opt_int(row["completed_at_ms"]),
        created_at_ms=int(row["created_at_ms"]),
        updated_at_ms=int(row["updated_at_ms"]),
        execution_digest=row["execution_digest"],
    )


def lock_execution(tx: Transaction, dispatch_id: str) -> Execution | None:
    """The execution under the row lock its transaction holds to its end."""
    row = tx.one("aa_execution_lock", {"dispatch_id": dispatch_id})
    return None if row is None else execution_from_row(row)


def get_execution(tx: Transaction, dispatch_id: str) -> Execution | None:
    row = tx.one("aa_execution_get", {"dispatch_id": dispatch_id})
    return None if row is None else execution_from_row(row)


def claim_execution(
    tx: Transaction,
    current: Execution,
    *,
    lease_owner: str,
    lease_token_digest: str,
    lease_expires_at_ms: int,
    now_ms: int,
) -> bool:
    """``pending|retry_wait|leased@v -> leased@v+1`` (attempt + 1, due again at the lease's expiry) while
    it is due and attempts remain; False when it moved."""
    changed = tx.run(
        "aa_execution_claim",
        {
            "dispatch_id": current.dispatch_id,
            "expected_version": current.version,
            "lease_owner": lease_owner,
            "lease_token_digest": lease_token_digest,
            "lease_expires_at_ms": lease_expires_at_ms,
            "now": now_ms,
        },
    )
    return changed == 1


def renew_leased(tx: Transaction, current: Execution, *, lease_expires_at_ms: int, now_ms: int) -> bool:
    """``leased@v -> leased@v+1`` with the new expiry (also its due time) before the lease expires."""
    params = {
        "dispatch_id": current.dispatch_id,
        "expected_version": current.version,
        "lease_expires_at_ms": lease_expires_at_ms,
        "now": now_ms,
    }
    return tx.run("aa_execution_renew_leased", params) == 1


def renew_executing(tx: Transaction, current: Execution, *, lease_expires_at_ms: int, now_ms: int) -> bool:
    """``executing@v -> executing@v+1`` with the new expiry, before the lease expires."""
    params = {
        "dispatch_id": current.dispatch_id,
        "expected_version": current.version,
        "lease_expires_at_ms": lease_expires_at_ms,
        "now": now_ms,
    }
    return tx.run("aa_execution_renew_executing", params) == 1


def start_execution(tx: Transaction, current: Execution, *, now_ms: int) -> bool:
    """The start barrier: ``leased@v -> executing@v+1`` started now, no longer due, with
    ``updated_at <= now < lease_expires_at``; False when it moved."""
    changed = tx.run(
        "aa_execution_start",
        {"dispatch_id": current.dispatch_id, "expected_version": current.version, "now": now_ms},
    )
    return changed == 1


def release_execution(
    tx: Transaction,
    current: Execution,
    *,
    status: ExecutionStatus,
    next_attempt_at_ms: int | None,
    result_mutation_id: str,
    result_code: str,
    completed_at_ms: int | None,
    now_ms: int,
) -> bool:
    """Before the barrier: ``pending|leased|retry_wait@v -> status@v+1``, the lease cleared, due again at
    ``next_attempt_at_ms`` (None: never); False when it moved."""
    changed = tx.run(
        "aa_execution_release",
        {
            "dispatch_id": current.dispatch_id,
            "expected_version": current.version,
            "status": status,
            "next_attempt_at_ms": next_attempt_at_ms,
            "result_mutation_id": result_mutation_id,
            "result_code": result_code,
            "completed_at_ms": completed_at_ms,
            "now": now_ms,
        },
    )
    return changed == 1


def finish_execution(
    tx: Transaction,
    current: Execution,
    *,
    status: ExecutionStatus,
    result_mutation_id: str,
    result_code: str,
    result_digest: str | None,
    now_ms: int,
) -> bool:
    """``executing@v -> status@v+1`` completed now, the lease cleared; False when it moved."""
    changed = tx.run(
        "aa_execution_finish",
        {
            "dispatch_id": current.dispatch_id,
            "expected_version": current.version,
            "status": status,
            "result_mutation_id": result_mutation_id,
            "result_code": result_code,
            "result_digest": result_digest,
            "now": now_ms,
        },
    )
    return changed == 1


def due_executions(tx: Transaction, *, after: tuple[int, str] | None, limit: int) -> list[DueRow]:
    """Executions due now by ``(eligible_at_ms, dispatch_id)``, strictly after ``after``."""
    params: dict[str, object] = {"now": tx.now_ms(), "limit": limit}
    if after is not None:
        params["c_eligible"], params["c_id"] = after
    found = tx.all(_DUE_QUERIES[after is not None], params)
    return [DueRow(dispatch_id=r["dispatch_id"], eligible_at_ms=int(r["eligible_at_ms"])) for r in found]


# -- the recovery control -----------------------------------------------------------------------


def recovery_from_row(row: Row) -> RecoveryControl:
    return RecoveryControl(
        dispatch_id=row["dispatch_id"],
        project_id=row["project_id"],
        status=one_of(row["status"], RECOVERY_STATUSES, "approved_action_recovery.status"),
        version=int(row["version"]),
        execution_version=int(row["execution_version"]),
        next_scan_at_ms=opt_int(row["next_scan_at_ms"]),
        resolver_owner=row["resolver_owner"],
        resolver_token_digest=row["resolver_token_digest"],
        resolver_lease_expires_at_ms=opt_int(row["resolver_lease_expires_at_ms"]),
        last_finding=row["last_finding"],
        scan_count=int(row["scan_count"]),
        evidence_digest=row["evidence_digest"],
        resolution_mutation_id=row["resolution_mutation_id"],
        armed_at_ms=int(row["armed_at_ms"]),
        updated_at_ms=int(row["updated_at_ms"]),
    )


def lock_recovery(tx: Transaction, dispatch_id: str) -> RecoveryControl | None:
    """The recovery control under the row lock (taken after the execution's: lock order execution ->
    recovery)."""
    row = tx.one("aa_recovery_lock", {"dispatch_id": dispatch_id})
    return None if row is None else recovery_from_row(row)


def insert_recovery(
    tx: Transaction, current: Execution, *, execution_version: int, next_scan_at_ms: int, now_ms: int
) -> None:
    """Arm the control (``armed@v0``) for the execution started at ``execution_version``."""
    tx.run(
        "aa_recovery_insert",
        {
            "dispatch_id": current.dispatch_id,
            "project_id": current.project_id,
            "execution_version": execution_version,
            "next_scan_at_ms": next_scan_at_ms,
            "now": now_ms,
        },
    )


def recovery_on_renew(
    tx: Transaction, dispatch_id: str, *, execution_version: int, next_scan_at_ms: int, now_ms: int
) -> None:
    """A renewed execution: bump the control, revoke any resolver lease, rescan an armed one at the new
    expiry."""
    tx.run(
        "aa_recovery_on_renew",
        {
            "dispatch_id": dispatch_id,
            "execution_version": execution_version,
            "next_scan_at_ms": next_scan_at_ms,
            "now": now_ms,
        },
    )


def recovery_due_ids(tx: Transaction, *, now_ms: int, limit: int) -> list[str]:
    """Armed controls of lapsed executions due for a scan now, without a live resolver lease."""
    found = tx.all("aa_recovery_due_first", {"now": now_ms, "limit": limit})
    return [str(r["dispatch_id"]) for r in found]


def acquire_recovery(
    tx: Transaction,
    control: RecoveryControl,
    *,
    resolver_owner: str,
    resolver_token_digest: str,
    resolver_lease_expires_at_ms: int,
    now_ms: int,
) -> bool:
    """``armed@v -> armed@v+1`` leased to the resolver (scan count + 1); False when it moved."""
    changed = tx.run(
        "aa_recovery_acquire",
        {
            "dispatch_id": control.dispatch_id,
            "expected_version": control.version,
            "resolver_owner": resolver_owner,
            "resolver_token_digest": resolver_token_digest,
            "resolver_lease_expires_at_ms": resolver_lease_expires_at_ms,
            "now": now_ms,
        },
    )
    return changed == 1


def record_recovery_finding(
    tx: Transaction,
    dispatch_id: str,
    *,
    expected_version: int,
    resolver_token_digest: str,
    last_finding: str,
    next_scan_at_ms: int,
    now_ms: int,
) -> bool:
    """The resolver's finding, the control still armed for a rescan; only under its own lease."""
    changed = tx.run(
        "aa_recovery_finding",
        {
            "dispatch_id": dispatch_id,
            "expected_version": expected_version,
            "resolver_token_digest": resolver_token_digest,
            "last_finding": last_finding,
            "next_scan_at_ms": next_scan_at_ms,
            "now": now_ms,
        },
    )
    return changed == 1


def recovery_to_manual(
    tx: Transaction,
    dispatch_id: str,
    *,
    expected_version: int,
    resolver_token_digest: str,
    last_finding: str,
    now_ms: int,
) -> bool:
    """``armed -> manual`` with the finding: only a person closes it now; only under the resolver lease."""
    changed = tx.run(
        "aa_recovery_to_manual",
        {
            "dispatch_id": dispatch_id,
            "expected_version": expected_version,
            "resolver_token_digest": resolver_token_digest,
            "last_finding": last_finding,
            "now": now_ms,
        },
    )
    return changed == 1


def resolve_recovery(
    tx: Transaction,
    dispatch_id: str,
    *,
    last_finding: str | None,
    evidence_digest: str | None,
    resolution_mutation_id: str,
    now_ms: int,
) -> None:
    """Close an ``armed|manual`` control (``resolved``); a None finding keeps the last one."""
    tx.run(
        "aa_recovery_resolve",
        {
            "dispatch_id": dispatch_id,
            "last_finding": last_finding,
            "evidence_digest": evidence_digest,
            "resolution_mutation_id": resolution_mutation_id,
            "now": now_ms,
        },
    )


# -- resolutions --------------------------------------------------------------------------------


def get_resolution(tx: Transaction, dispatch_id: str) -> Resolution | None:
    row = tx.one("aa_resolution_get", {"dispatch_id": dispatch_id})
    if row is None:
        return None
    return Resolution(
        dispatch_id=row["dispatch_id"],
        project_id=row["project_id"],
        mutation_id=row["mutation_id"],
        expected_execution_version=int(row["expected_execution_version"]),
        source=one_of(row["source"], RESOLUTION_SOURCES, "approved_action_resolutions.source"),
        resolution=one_of(row["resolution"], RESOLUTION_KINDS, "approved_action_resolutions.resolution"),
        outcome=one_of(row["outcome"], RESOLUTION_OUTCOMES, "approved_action_resolutions.outcome"),
        actor_type=one_of(row["actor_type"], RESOLUTION_ACTORS, "approved_action_resolutions.actor_type"),
        actor_id=row["actor_id"],
        actor_role=row["actor_role"],
        reason_code=row["reason_code"],
        evidence_digest=row["evidence_digest"],
        created_at_ms=int(row["created_at_ms"]),
    )


def insert_resolution(tx: Transaction, resolution: Resolution) -> None:
    """Store the one resolution of a dispatch (created at ``created_at_ms``)."""
    tx.run(
        "aa_resolution_insert",
        {
            "dispatch_id": resolution.dispatch_id,
            "project_id": resolution.project_id,
            "mutation_id": resolution.mutation_id,
            "expected_execution_version": resolution.expected_execution_version,
            "source": resolution.source,
            "resolution": resolution.resolution,
            "outcome": resolution.outcome,
            "actor_type": resolution.actor_type,
            "actor_id": resolution.actor_id,
            "actor_role": resolution.actor_role,
            "reason_code": resolution.reason_code,
            "evidence_digest": resolution.evidence_digest,
            "now": resolution.created_at_ms,
        },
    )


# -- run.create receipts ------------------------------------------------------------------------


def get_receipt(tx: Transaction, dispatch_id: str) -> StoredReceipt | None:
    row = tx.one("aa_receipt_get", {"dispatch_id": dispatch_id})
    if row is None:
        return None
    receipt = RunActionReceipt(
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
    return StoredReceipt(receipt=receipt, evidence_digest=str(row["evidence_digest"]))


def insert_receipt(tx: Transaction, receipt: RunActionReceipt, *, evidence_digest: str) -> None:
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
            "evidence_digest": evidence_digest,
        },
    )


# -- the read model -----------------------------------------------------------------------------


def action_from_row(row: Row) -> ActionRecord:
    recovery_status = row["recovery_status"]
    return ActionRecord(
        execution=execution_from_row(row),
        approval_request_id=row["approval_request_id"],
        action_type=row["action_type"],
        action_ref=row["action_ref"],
        action_digest=str(row["action_digest"]),
        recovery_status=None
        if recovery_status is None
        else one_of(recovery_status, RECOVERY_STATUSES, "approved_action_recovery.status"),
        recovery_last_finding=row["recovery_last_finding"],
    )


def get_action(tx: Transaction, project_id: str, dispatch_id: str) -> ActionRecord | None:
    row = tx.one("aa_action_get", {"project_id": project_id, "dispatch_id": dispatch_id})
    return None if row is None else action_from_row(row)


def list_actions(
    tx: Transaction, *, project_id: str, before: tuple[int, str] | None, limit: int
) -> list[ActionRecord]:
    """The project's actions newest first by ``(created_at_ms, dispatch_id)``, strictly before ``before``."""
    params: dict[str, object] = {"project_id": project_id, "limit": limit}
    if before is not None:
        params["cursor_ms"], params["cursor_id"] = before
    found = tx.all(_ACTION_LIST_QUERIES[before is not None], params)
    return [action_from_row(row) for row in found]
