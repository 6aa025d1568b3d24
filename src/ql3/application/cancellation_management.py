"""The low-sensitivity management surface of cancellation (docs/contracts.md §9): inspect one
dispatch, rearm a blocked one by exact compare-and-set, the project summary and the blocked list."""

from __future__ import annotations

import logging
from typing import Any

from ql3.application.cancellation import (
    REARM_OPERATION,
)
from ql3.application.runs import (
    EventSpec,
    get_run,
    latest_attempt,
    lock_run,
    write_run,
)
from ql3.domain import cancellation as rules
from ql3.domain.cancellation import BlockedCursor, CancellationDispatch
from ql3.domain.digests import canonical_json
from ql3.domain.errors import Conflict, FenceConflict, NotFound, ValidationFailed
from ql3.domain.ids import new_id
from ql3.domain.model import Run
from ql3.domain.states import ATTEMPT_ACTIVE, is_run_terminal
from ql3.ports import channels
from ql3.ports.storage import Transaction
from ql3.repositories import cancellation as dispatches

log = logging.getLogger("ql3.cancellation.management")


# -- 6. management -----------------------------------------------------------------------------------


def _run_in_project(tx: Transaction, project_id: str, run_id: str, *, lock: bool) -> Run:
    if lock:
        run = lock_run(tx, run_id)
        if run.project_id != project_id:
            raise NotFound("run not found")
        return run
    return get_run(tx, project_id, run_id)


def _dispatch_view(d: CancellationDispatch) -> dict[str, Any]:
    """The low-sensitivity projection: never the owner, token digest or any process identity."""
    view: dict[str, Any] = {
        "attemptId": d.attempt_id,
        "status": d.status,
        "version": d.version,
        "dispatchCount": d.dispatch_count,
    }
    for key, value in (
        ("nextAttemptAtMs", d.next_attempt_at_ms),
        ("leaseExpiresAtMs", d.lease_expires_at_ms),
        ("lastResult", d.last_result),
        ("lastDispatchedAtMs", d.last_dispatched_at_ms),
    ):
        if value is not None:
            view[key] = value
    view["createdAtMs"] = d.created_at_ms
    view["updatedAtMs"] = d.updated_at_ms
    return view


def inspect(tx: Transaction, project_id: str, run_id: str) -> dict[str, Any]:
    """``run.cancellation.inspect``: Run facts, the dispatch projection and the operator's next move."""
    run = _run_in_project(tx, project_id, run_id, lock=False)
    dispatch = dispatches.get_dispatch_in_project(tx, project_id, run_id)
    if is_run_terminal(run.status):
        action = "none"
    elif dispatch is not None and dispatch.status == "blocked":
        action = "rearm"
    elif (dispatch is not None and dispatch.status in ("pending", "leased", "retry_wait")) or (
        dispatch is None and run.cancel_requested_at_ms is not None
    ):
        action = "wait"
    else:
        action = "none"
    out: dict[str, Any] = {
        "runStatus": run.status,
        "runVersion": run.version,
        "eventSequence": run.event_sequence,
    }
    if run.cancel_requested_at_ms is not None:
        out["cancelRequestedAtMs"] = run.cancel_requested_at_ms
        out["cancelReason"] = run.cancel_reason
    out["operatorAction"] = action
    out["dispatch"] = _dispatch_view(dispatch) if dispatch is not None else None
    return out


def _rearm_receipt(payload: dict[str, Any], attempt_id: str, event_sequence: int) -> dict[str, Any]:
    return {
        "status": "rearmed",
        "attemptId": attempt_id,
        "previousDispatchVersion": payload["previous_dispatch_version"],
        "dispatchVersion": payload["dispatch_version"],
        "previousResult": payload["previous_result"],
        "retryDelayMs": payload["retry_delay_ms"],
        "nextAttemptAtMs": payload["next_attempt_at_ms"],
        "runVersion": payload["run_version"],
        "eventSequence": event_sequence,
    }


def rearm(
    tx: Transaction,
    project_id: str,
    run_id: str,
    *,
    principal_id: str,
    mutation_id: str,
    expected_dispatch_version: int,
    expected_last_result: str,
    retry_delay_ms: int,
) -> dict[str, Any]:
    """``run.cancellation.rearm``: exact-CAS ``blocked -> retry_wait`` (last result kept), atomic with the
    Run version bump, ``run.cancel_dispatch_rearmed`` and the audit row. The same ``mutation_id`` with
    the same input replays the same receipt; with any other input it is a Conflict."""
    rules.validate_mutation_id(mutation_id)
    rules.validate_rearm_delay(retry_delay_ms)
    if rules.classify_result(expected_last_result) != "blocking":
        raise ValidationFailed("expected last result must be a blocking result", field="expectedLastResult")
    if isinstance(expected_dispatch_version, bool) or expected_dispatch_version < 1:
        raise ValidationFailed("invalid expected dispatch version", field="expectedDispatchVersion")
    run = _run_in_project(tx, project_id, run_id, lock=True)
    dedupe = rules.rearm_dedupe_key(mutation_id)
    audit = dispatches.audit_by_mutation(
        tx, project_id=project_id, operation=REARM_OPERATION, mutation_id=mutation_id
    )
    if audit is not None:
        event = dispatches.event_by_dedupe(tx, run_id, dedupe)
        if audit.run_id != run_id or audit.principal_id != principal_id or event is None:
            raise Conflict("the mutation id was already used for another request", reason="mutation_drift")
        payload = event.payload
        if (
            payload.get("previous_dispatch_version") != expected_dispatch_version
            or payload.get("previous_result") != expected_last_result
            or payload.get("retry_delay_ms") != retry_delay_ms
        ):
            raise Conflict("the mutation id was already used for another request", reason="mutation_drift")
        return _rearm_receipt(payload, str(event.attempt_id), event.sequence)
    if is_run_terminal(run.status):
        raise Conflict("the run is already terminal", reason="run_terminal")
    if run.cancel_requested_at_ms is None:
        raise Conflict("the run has no cancel intent", reason="no_cancel_intent")
    dispatch = dispatches.lock_dispatch(tx, run_id)
    if dispatch is None:
        raise Conflict("the run has no cancellation dispatch", reason="dispatch_missing")
    attempt = latest_attempt(tx, run_id)
    if attempt is None or attempt.id != dispatch.attempt_id or attempt.status not in ATTEMPT_ACTIVE:
        raise Conflict("the dispatch's attempt is no longer active", reason="attempt_inactive")
    if dispatch.status != "blocked":
        raise FenceConflict(reason="not_blocked")
    if dispatch.version != expected_dispatch_version:
        raise FenceConflict(reason="version_mismatch")
    if dispatch.last_result != expected_last_result:
        raise FenceConflict(reason="result_mismatch")
    now = tx.now_ms()
    next_at = now + retry_delay_ms
    rearmed = dispatches.rearm_dispatch(
        tx,
        run_id=run_id,
        project_id=project_id,
        expected_version=expected_dispatch_version,
        expected_last_result=expected_last_result,
        next_attempt_at_ms=next_at,
        now_ms=now,
    )
    if not rearmed:
        raise FenceConflict(reason="version_mismatch")
    payload = {
        "mutation_id": mutation_id,
        "previous_dispatch_version": expected_dispatch_version,
        "dispatch_version": expected_dispatch_version + 1,
        "previous_result": expected_last_result,
        "retry_delay_ms": retry_delay_ms,
        "next_attempt_at_ms": next_at,
        "run_version": run.version + 1,
    }
    written = write_run(
        tx,
        run,
        run,
        [
            EventSpec(
                type="run.cancel_dispatch_rearmed",
                actor_type="user",
                actor_id=principal_id,
                attempt_id=dispatch.attempt_id,
                payload=payload,
                dedupe_key=dedupe,
            )
        ],
    )
    receipt = _rearm_receipt(payload, dispatch.attempt_id, written.event_sequence)
    dispatches.insert_audit(
        tx,
        audit_id=new_id(),
        project_id=project_id,
        run_id=run_id,
        principal_id=principal_id,
        operation=REARM_OPERATION,
        mutation_id=mutation_id,
        payload_json=canonical_json(receipt),
        now_ms=now,
    )
    tx.notify(channels.CANCELLATIONS)
    return receipt


def summary(tx: Transaction, project_id: str) -> dict[str, Any]:
    """``run.cancellation.summary`` over the Project's live Runs: counts only, no identities."""
    now = tx.now_ms()
    by_status: dict[str, int] = {}
    blocked_by_result: dict[str, int] = {}
    due = expired = 0
    oldest: int | None = None
    for group in dispatches.summary_counts(tx, project_id=project_id, now_ms=now):
        status, n = group.status, group.n
        by_status[status] = by_status.get(status, 0) + n
        if status == "blocked":
            result = str(group.last_result)
            blocked_by_result[result] = blocked_by_result.get(result, 0) + n
        due += group.due
        expired += group.expired
        if group.oldest_blocked_at_ms is not None:
            value = group.oldest_blocked_at_ms
            oldest = value if oldest is None else min(oldest, value)
    return rules.build_summary(
        observed_at_ms=now,
        by_status=by_status,
        blocked_by_result=blocked_by_result,
        due=due,
        expired_lease=expired,
        oldest_blocked_at_ms=oldest,
    )


def blocked_page(tx: Transaction, project_id: str, cursor: str | None) -> dict[str, Any]:
    """``run.cancellation.blocked.list``: one fixed page of 16 (reads 17) by ``(blockedAtMs, runId)``.

    The first page fixes ``snapshotAtMs`` from the database clock; later pages keep it, so rows
    blocked after the snapshot never appear and rearmed ones may vanish. A discovery view, not a ledger.
    """
    limit = rules.BLOCKED_PAGE + 1
    after: tuple[int, str] | None = None
    if cursor is None:
        snapshot = tx.now_ms()
    else:
        decoded = rules.decode_blocked_cursor(cursor)
        if decoded.snapshot_at_ms > tx.now_ms():
            raise ValidationFailed("invalid cursor", field="cursor")
        snapshot = decoded.snapshot_at_ms
        after = (decoded.blocked_at_ms, decoded.run_id)
    found = dispatches.blocked_page(
        tx, project_id=project_id, snapshot_at_ms=snapshot, after=after, limit=limit
    )
    keys = [(entry.blocked_at_ms, entry.run_id) for entry in found[: rules.BLOCKED_PAGE]]
    truncated = len(found) > rules.BLOCKED_PAGE
    next_cursor = (
        rules.encode_blocked_cursor(
            BlockedCursor(snapshot_at_ms=snapshot, blocked_at_ms=keys[-1][0], run_id=keys[-1][1])
        )
        if truncated
        else None
    )
    items = [{"runId": run_id, "blockedAtMs": blocked_at} for blocked_at, run_id in keys]
    return {"snapshotAtMs": snapshot, "items": items, "truncated": truncated, "nextCursor": next_cursor}
