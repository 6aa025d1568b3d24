"""The low-sensitivity management surface of cancellation (docs/contracts.md §9): inspect one
dispatch, rearm a blocked one by exact compare-and-set, the project summary and the blocked list."""

from __future__ import annotations

import json
import logging
from typing import Any

from ql3.application import rows
from ql3.application.cancellation import (
    REARM_OPERATION,
    dispatch_from_row,
    lock_dispatch,
)
from ql3.application.runs import (
    EventSpec,
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

log = logging.getLogger("ql3.cancellation.management")


# -- 6. management -----------------------------------------------------------------------------------


def _run_in_project(tx: Transaction, project_id: str, run_id: str, *, lock: bool) -> Run:
    if lock:
        run = lock_run(tx, run_id)
        if run.project_id != project_id:
            raise NotFound("run not found")
        return run
    row = tx.one("run_get_in_project", {"id": run_id, "project_id": project_id})
    if row is None:
        raise NotFound("run not found")
    return rows.run(row)


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
    row = tx.one("cancel_dispatch_get_in_project", {"run_id": run_id, "project_id": project_id})
    dispatch = dispatch_from_row(row) if row else None
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
    audit = tx.one(
        "cancel_audit_by_mutation",
        {"project_id": project_id, "operation": REARM_OPERATION, "mutation_id": mutation_id},
    )
    if audit is not None:
        event = tx.one("cancel_event_by_dedupe", {"run_id": run_id, "dedupe_key": dedupe})
        if audit["run_id"] != run_id or audit["principal_id"] != principal_id or event is None:
            raise Conflict("the mutation id was already used for another request", reason="mutation_drift")
        payload = json.loads(event["payload_json"])
        if (
            payload.get("previous_dispatch_version") != expected_dispatch_version
            or payload.get("previous_result") != expected_last_result
            or payload.get("retry_delay_ms") != retry_delay_ms
        ):
            raise Conflict("the mutation id was already used for another request", reason="mutation_drift")
        return _rearm_receipt(payload, str(event["attempt_id"]), int(event["sequence"]))
    if is_run_terminal(run.status):
        raise Conflict("the run is already terminal", reason="run_terminal")
    if run.cancel_requested_at_ms is None:
        raise Conflict("the run has no cancel intent", reason="no_cancel_intent")
    dispatch = lock_dispatch(tx, run_id)
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
    changed = tx.run(
        "cancel_dispatch_rearm",
        {
            "run_id": run_id,
            "project_id": project_id,
            "expected_version": expected_dispatch_version,
            "expected_last_result": expected_last_result,
            "next_attempt_at_ms": next_at,
            "now": now,
        },
    )
    if changed != 1:
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
    tx.run(
        "cancel_audit_insert",
        {
            "id": new_id(),
            "project_id": project_id,
            "run_id": run_id,
            "principal_id": principal_id,
            "operation": REARM_OPERATION,
            "mutation_id": mutation_id,
            "now": now,
            "payload_json": canonical_json(receipt),
        },
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
    for row in tx.all("cancel_summary_counts", {"project_id": project_id, "now": now}):
        status, n = str(row["status"]), int(row["n"])
        by_status[status] = by_status.get(status, 0) + n
        if status == "blocked":
            result = str(row["last_result"])
            blocked_by_result[result] = blocked_by_result.get(result, 0) + n
        due += int(row["due"] or 0)
        expired += int(row["expired"] or 0)
        if row["oldest_blocked"] is not None:
            value = int(row["oldest_blocked"])
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
    if cursor is None:
        snapshot = tx.now_ms()
        found = tx.all(
            "cancel_blocked_first", {"project_id": project_id, "snapshot_at_ms": snapshot, "limit": limit}
        )
    else:
        decoded = rules.decode_blocked_cursor(cursor)
        if decoded.snapshot_at_ms > tx.now_ms():
            raise ValidationFailed("invalid cursor", field="cursor")
        snapshot = decoded.snapshot_at_ms
        found = tx.all(
            "cancel_blocked_after",
            {
                "project_id": project_id,
                "snapshot_at_ms": snapshot,
                "c_blocked_at_ms": decoded.blocked_at_ms,
                "c_run_id": decoded.run_id,
                "limit": limit,
            },
        )
    keys = [(int(r["updated_at_ms"]), str(r["run_id"])) for r in found[: rules.BLOCKED_PAGE]]
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
