"""Cancellation dispatches (docs/contracts.md §4, §9): the claim/backoff row of one Run's
cancellation, the supervisor's and the timeout scan's pages, the management reads and the rearm audit.

Every write is a compare-and-set the SQL states on the version the caller read; the fences themselves
(which holder, which attempt, which result) are checked by ``application/cancellation*.py`` under the
row locks it takes, in its own order. Times are passed in: a use case reads ``tx.now_ms()`` once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ql3.domain.cancellation import DISPATCH_STATUSES, CancellationDispatch, DispatchStatus
from ql3.domain.model import Attempt, RunEvent
from ql3.ports.storage import Row, Transaction
from ql3.repositories.mapping import one_of, opt_int
from ql3.repositories.runs import attempt_from_row, event_from_row


@dataclass(frozen=True, slots=True, kw_only=True)
class IntentKey:
    """One Run with a due cancel intent, as the supervisor pages them. ``cancel_requested_at_ms`` stays
    nullable so the supervisor itself refuses a source that breaks the page's promise."""

    run_id: str
    cancel_requested_at_ms: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class TimedOutAttempt:
    """A started Attempt past its persisted deadline whose Run has no intent yet."""

    attempt_id: str
    run_id: str
    project_id: str
    deadline_at_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class InterruptedStop:
    """A still-leased dispatch of a terminal Run on one worker: a stop a crash cut short."""

    run_id: str
    version: int
    executor_handle: str | None
    pid: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class SummaryCount:
    """One ``(status, last_result)`` group of a project's live dispatches. ``status`` stays a plain
    string: the summary's own invariant check refuses a status it does not know."""

    status: str
    last_result: str | None
    n: int
    due: int
    expired: int
    oldest_blocked_at_ms: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockedEntry:
    run_id: str
    blocked_at_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RearmAudit:
    """Who used a rearm mutation id, on which Run."""

    id: str
    project_id: str
    run_id: str
    principal_id: str
    operation: str
    mutation_id: str
    created_at_ms: int
    payload_json: str


@dataclass(frozen=True, slots=True, kw_only=True)
class NextWake:
    """The earliest instants the supervisor has work at; None where nothing is scheduled."""

    next_deadline_ms: int | None
    next_dispatch_ms: int | None
    next_lease_ms: int | None


# The supervisor's intent page: the first page, or the one after a ``(requested_at, run_id)`` key.
_INTENT_QUERIES: Final[dict[bool, str]] = {False: "cancel_intent_first", True: "cancel_intent_after"}


def dispatch_from_row(row: Row) -> CancellationDispatch:
    return CancellationDispatch(
        run_id=row["run_id"],
        attempt_id=row["attempt_id"],
        project_id=row["project_id"],
        status=one_of(row["status"], DISPATCH_STATUSES, "cancellation_dispatches.status"),
        version=int(row["version"]),
        dispatch_count=int(row["dispatch_count"]),
        next_attempt_at_ms=opt_int(row["next_attempt_at_ms"]),
        lease_owner=row["lease_owner"],
        lease_token_digest=row["lease_token_digest"],
        lease_expires_at_ms=opt_int(row["lease_expires_at_ms"]),
        last_result=row["last_result"],
        last_dispatched_at_ms=opt_int(row["last_dispatched_at_ms"]),
        created_at_ms=int(row["created_at_ms"]),
        updated_at_ms=int(row["updated_at_ms"]),
    )


# -- the dispatch row ---------------------------------------------------------------------------


def lock_dispatch(tx: Transaction, run_id: str) -> CancellationDispatch | None:
    """The Run's dispatch under the row lock its transaction holds to its end (lock order: Run ->
    Attempt -> dispatch, the caller's)."""
    row = tx.one("cancel_dispatch_lock", {"run_id": run_id})
    return dispatch_from_row(row) if row else None


def get_dispatch_in_project(tx: Transaction, project_id: str, run_id: str) -> CancellationDispatch | None:
    row = tx.one("cancel_dispatch_get_in_project", {"run_id": run_id, "project_id": project_id})
    return dispatch_from_row(row) if row else None


def insert_dispatch(
    tx: Transaction, *, run_id: str, attempt_id: str, project_id: str, next_attempt_at_ms: int, now_ms: int
) -> None:
    """A new ``pending@v0`` dispatch bound to ``attempt_id`` for good, due at ``next_attempt_at_ms``."""
    tx.run(
        "cancel_dispatch_insert",
        {
            "run_id": run_id,
            "attempt_id": attempt_id,
            "project_id": project_id,
            "next_attempt_at_ms": next_attempt_at_ms,
            "now": now_ms,
        },
    )


def lease_dispatch(
    tx: Transaction,
    run_id: str,
    *,
    expected_version: int,
    owner: str,
    lease_token_digest: str,
    lease_expires_at_ms: int,
    now_ms: int,
) -> bool:
    """``pending|retry_wait|leased@v -> leased@v+1`` (count + 1) to ``owner``; False when it moved."""
    changed = tx.run(
        "cancel_dispatch_lease",
        {
            "run_id": run_id,
            "expected_version": expected_version,
            "owner": owner,
            "lease_token_digest": lease_token_digest,
            "lease_expires_at_ms": lease_expires_at_ms,
            "now": now_ms,
        },
    )
    return changed == 1


def settle_dispatch(
    tx: Transaction,
    run_id: str,
    *,
    expected_version: int,
    status: DispatchStatus,
    next_attempt_at_ms: int | None,
    result: str,
    last_dispatched_at_ms: int | None,
    now_ms: int,
) -> bool:
    """``leased@v -> status@v+1``, the lease cleared and the result kept; False when it moved."""
    changed = tx.run(
        "cancel_dispatch_settle",
        {
            "run_id": run_id,
            "expected_version": expected_version,
            "status": status,
            "next_attempt_at_ms": next_attempt_at_ms,
            "result": result,
            "last_dispatched_at_ms": last_dispatched_at_ms,
            "now": now_ms,
        },
    )
    return changed == 1


def rearm_dispatch(
    tx: Transaction,
    *,
    run_id: str,
    project_id: str,
    expected_version: int,
    expected_last_result: str,
    next_attempt_at_ms: int,
    now_ms: int,
) -> bool:
    """``blocked@v -> retry_wait@v+1`` for exactly this last result; False when it moved."""
    changed = tx.run(
        "cancel_dispatch_rearm",
        {
            "run_id": run_id,
            "project_id": project_id,
            "expected_version": expected_version,
            "expected_last_result": expected_last_result,
            "next_attempt_at_ms": next_attempt_at_ms,
            "now": now_ms,
        },
    )
    return changed == 1


# -- the supervisor's and the timeout scan's sources --------------------------------------------


def active_attempts(tx: Transaction, run_id: str) -> list[Attempt]:
    """The Run's claimed/starting/running attempts in order; the query reads at most two, so the
    caller can tell one from more than one."""
    return [attempt_from_row(row) for row in tx.all("cancel_active_attempts", {"run_id": run_id})]


def intent_page(tx: Transaction, *, after: tuple[int, str] | None, limit: int) -> list[IntentKey]:
    """Live Runs with a due intent by ``(cancel_requested_at_ms, run_id)``, strictly after ``after``."""
    params: dict[str, object] = {"now": tx.now_ms(), "limit": limit}
    if after is not None:
        params["c_ms"], params["c_id"] = after
    found = tx.all(_INTENT_QUERIES[after is not None], params)
    return [
        IntentKey(run_id=row["run_id"], cancel_requested_at_ms=opt_int(row["cancel_requested_at_ms"]))
        for row in found
    ]


def timed_out_attempts(tx: Transaction, *, limit: int) -> list[TimedOutAttempt]:
    """Started attempts past their deadline now, whose Run has no intent, earliest deadline first."""
    found = tx.all("cancel_timeout_page", {"now": tx.now_ms(), "limit": limit})
    return [
        TimedOutAttempt(
            attempt_id=str(row["attempt_id"]),
            run_id=str(row["run_id"]),
            project_id=str(row["project_id"]),
            deadline_at_ms=int(row["deadline_at_ms"]),
        )
        for row in found
    ]


def interrupted_stops(tx: Transaction, *, worker_id: str, since_ms: int, limit: int) -> list[InterruptedStop]:
    """Leased dispatches of terminal Runs on ``worker_id`` whose lease expired or predates ``since_ms``."""
    found = tx.all(
        "cancel_interrupted_stops",
        {"worker_id": worker_id, "now": tx.now_ms(), "since": since_ms, "limit": limit},
    )
    return [
        InterruptedStop(
            run_id=str(row["run_id"]),
            version=int(row["version"]),
            executor_handle=row["executor_handle"],
            pid=opt_int(row["pid"]),
        )
        for row in found
    ]


def next_wake(tx: Transaction, *, worker_id: str | None) -> NextWake:
    """The next deadline, dispatch backoff and lease expiry; of ``worker_id``'s attempts when given."""
    if worker_id is None:
        row = tx.one("cancel_next_wake")
    else:
        row = tx.one("cancel_next_wake_for_worker", {"worker_id": worker_id})
    if row is None:
        return NextWake(next_deadline_ms=None, next_dispatch_ms=None, next_lease_ms=None)
    return NextWake(
        next_deadline_ms=opt_int(row["next_deadline_ms"]),
        next_dispatch_ms=opt_int(row["next_dispatch_ms"]),
        next_lease_ms=opt_int(row["next_lease_ms"]),
    )


# -- management reads ---------------------------------------------------------------------------


def summary_counts(tx: Transaction, *, project_id: str, now_ms: int) -> list[SummaryCount]:
    """The project's live dispatches grouped by status and last result (at most 64 groups)."""
    found = tx.all("cancel_summary_counts", {"project_id": project_id, "now": now_ms})
    return [
        SummaryCount(
            status=str(row["status"]),
            last_result=row["last_result"],
            n=int(row["n"]),
            due=int(row["due"] or 0),
            expired=int(row["expired"] or 0),
            oldest_blocked_at_ms=opt_int(row["oldest_blocked"]),
        )
        for row in found
    ]


def blocked_page(
    tx: Transaction, *, project_id: str, snapshot_at_ms: int, after: tuple[int, str] | None, limit: int
) -> list[BlockedEntry]:
    """Blocked dispatches of live Runs blocked at or before the snapshot, by ``(blocked_at, run_id)``."""
    params: dict[str, object] = {"project_id": project_id, "snapshot_at_ms": snapshot_at_ms, "limit": limit}
    if after is None:
        found = tx.all("cancel_blocked_first", params)
    else:
        params["c_blocked_at_ms"], params["c_run_id"] = after
        found = tx.all("cancel_blocked_after", params)
    return [BlockedEntry(run_id=str(row["run_id"]), blocked_at_ms=int(row["updated_at_ms"])) for row in found]


# -- the rearm audit ----------------------------------------------------------------------------


def audit_by_mutation(
    tx: Transaction, *, project_id: str, operation: str, mutation_id: str
) -> RearmAudit | None:
    row = tx.one(
        "cancel_audit_by_mutation",
        {"project_id": project_id, "operation": operation, "mutation_id": mutation_id},
    )
    if row is None:
        return None
    return RearmAudit(
        id=row["id"],
        project_id=row["project_id"],
        run_id=row["run_id"],
        principal_id=row["principal_id"],
        operation=row["operation"],
        mutation_id=row["mutation_id"],
        created_at_ms=int(row["created_at_ms"]),
        payload_json=row["payload_json"],
    )


def event_by_dedupe(tx: Transaction, run_id: str, dedupe_key: str) -> RunEvent | None:
    """The Run's event written under ``dedupe_key`` (unique per Run)."""
    row = tx.one("cancel_event_by_dedupe", {"run_id": run_id, "dedupe_key": dedupe_key})
    return None if row is None else event_from_row(row)


def insert_audit(
    tx: Transaction,
    *,
    audit_id: str,
    project_id: str,
    run_id: str,
    principal_id: str,
    operation: str,
    mutation_id: str,
    payload_json: str,
    now_ms: int,
) -> None:
    tx.run(
        "cancel_audit_insert",
        {
            "id": audit_id,
            "project_id": project_id,
            "run_id": run_id,
            "principal_id": principal_id,
            "operation": operation,
            "mutation_id": mutation_id,
            "now": now_ms,
            "payload_json": payload_json,
        },
    )


# -- stops through lease control ----------------------------------------------------------------


def stop_requested_attempts(tx: Transaction, *, worker_id: str, session_id: str, limit: int) -> list[str]:
    """Attempt ids of the worker session's live leases whose Run has a stop intent, in order."""
    found = tx.all("worker_stop_requests", {"worker_id": worker_id, "session_id": session_id, "limit": limit})
    return [str(row["attempt_id"]) for row in found]
