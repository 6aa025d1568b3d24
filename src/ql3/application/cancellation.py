"""Durable cancellation dispatch (docs/contracts.md §4, §9): intent, fenced claim and result, supervisor,
timeouts, and the low-sensitivity management surface.

The shape is always durable fact -> effect -> fenced result: a cancel intent is committed on the Run,
one supervisor wins a leased claim on the Run's ``cancellation_dispatches`` row, signals the process
group outside any transaction, and records the outcome under the full fence. The repository is the
only time authority; callers pass durations, never instants.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Final, Literal

from ql3.application import leases, notifications
from ql3.application.parking import ItemGuard, guarded
from ql3.application.runs import (
    EventSpec,
    latest_attempt,
    lock_attempt,
    lock_run,
    write_run,
)
from ql3.domain import cancellation as rules
from ql3.domain.digests import digest_equals
from ql3.domain.errors import FenceConflict, NotFound, ValidationFailed
from ql3.domain.model import Attempt, Run
from ql3.domain.states import ATTEMPT_ACTIVE, is_run_terminal
from ql3.ports import channels
from ql3.ports.storage import Database, Transaction
from ql3.repositories import cancellation as dispatches
from ql3.repositories import runs as run_records
from ql3.repositories.cancellation import TimedOutAttempt

REARM_OPERATION: Final = "cancellation.rearm"
TIMEOUT_PAGE_DEFAULT: Final = 16

RequestOutcome = Literal["requested", "already_requested", "already_terminal"]
DispatchClaimStatus = Literal[
    "claimed", "not_eligible", "not_due", "leased", "dispatched", "blocked", "binding_conflict"
]
StopReason = Literal["complete", "page_limit", "unsafe_attempt_overflow", "cursor_stalled", "oversized_page"]

log = logging.getLogger("ql3.cancellation")


def _outcome_for(run: Run) -> tuple[str, str]:
    """The terminal Run status and error code a committed intent stands for (timeout wins)."""
    if run.cancel_reason == "timeout":
        return "timed_out", "EXECUTION_TIMED_OUT"
    return "cancelled", "EXECUTION_CANCELLED"


def _end_run(
    tx: Transaction,
    run: Run,
    attempt: Attempt | None,
    *,
    actor_type: str,
    actor_id: str | None,
    bump_sequence: bool,
) -> str:
    """Move a Run with an intent (and its live Attempt) to cancelled / timed_out through the one
    ending path (``leases.end_attempt``), which completes a live lease and frees its worker slot."""
    outcome, code = _outcome_for(run)
    # claimed -> timed_out is not an Attempt transition: an unstarted attempt is only ever cancelled.
    attempt_outcome = outcome if attempt is None or attempt.status != "claimed" else "cancelled"
    run_outcome = outcome
    if run.status == "lost" and outcome == "timed_out":
        run_outcome, code = "cancelled", "EXECUTION_CANCELLED"  # lost -> timed_out is not a transition
    leases.end_attempt(
        tx,
        run,
        attempt,
        run_status=run_outcome,
        attempt_status=attempt_outcome,
        error_code=code,
        actor_type=actor_type,
        actor_id=actor_id,
        bump_sequence=bump_sequence,
    )
    return run_outcome


# -- 1. intent ---------------------------------------------------------------------------------------


def request_cancel(
    tx: Transaction,
    project_id: str,
    run_id: str,
    *,
    reason: str,
    actor_type: str,
    actor_id: str | None = None,
) -> RequestOutcome:
    """Commit the cancel intent (Run CAS + ``run.cancel_requested``; statuses unchanged).

    A Run with no process (``queued``/``created`` never started, ``retry_wait``/``lost`` between
    attempts) ends as cancelled (timed_out for a timeout) in the same transaction. Terminal ->
    ``already_terminal``; a second request -> ``already_requested``; both write nothing.
    """
    rules.validate_reason(reason)
    run = lock_run(tx, run_id)
    if run.project_id != project_id:
        raise NotFound("run not found")
    if is_run_terminal(run.status):
        return "already_terminal"
    if run.cancel_requested_at_ms is not None:
        return "already_requested"
    now = tx.now_ms()
    attempt = latest_attempt(tx, run.id)
    written = write_run(
        tx,
        run,
        replace(run, cancel_requested_at_ms=now, cancel_reason=reason),
        [
            EventSpec(
                type="run.cancel_requested",
                actor_type=actor_type,
                actor_id=actor_id,
                attempt_id=attempt.id if attempt is not None else None,
                payload={"reason": reason},
            )
        ],
    )
    if written.status in ("created", "queued", "retry_wait", "lost"):
        live = lock_attempt(tx, attempt.id) if attempt is not None else None
        _end_run(tx, written, live, actor_type=actor_type, actor_id=actor_id, bump_sequence=False)
    tx.notify(channels.CANCELLATIONS)
    return "requested"


# -- 2. claim ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class DispatchClaim:
    """A claim's answer. ``token`` is the caller's own raw token, echoed only on ``claimed``."""

    status: DispatchClaimStatus
    run_id: str
    attempt_id: str | None = None
    dispatch_version: int | None = None
    dispatch_count: int | None = None
    lease_expires_at_ms: int | None = None
    next_attempt_at_ms: int | None = None
    token: str | None = field(default=None, repr=False)


def claim(
    tx: Transaction,
    *,
    run_id: str,
    owner: str,
    token: str,
    lease_ms: int,
    requested_at_ms: int | None = None,
) -> DispatchClaim:
    """Lease the Run's cancellation dispatch (docs/contracts.md §4.2). Lock order Run -> Attempt -> dispatch.

    ``requested_at_ms``, when given, must equal the Run's committed intent time. Only the digest of
    ``token`` is stored; ``dispatched``/``blocked`` are returned as-is and never leased again.
    """
    rules.validate_owner(owner)
    rules.validate_token(token)
    rules.validate_lease_ms(lease_ms)
    run = lock_run(tx, run_id)
    if (
        is_run_terminal(run.status)
        or run.cancel_requested_at_ms is None
        or (requested_at_ms is not None and requested_at_ms != run.cancel_requested_at_ms)
    ):
        return DispatchClaim(status="not_eligible", run_id=run_id)
    latest = latest_attempt(tx, run_id)
    if latest is None:
        return DispatchClaim(status="not_eligible", run_id=run_id)
    attempt = lock_attempt(tx, latest.id)
    if attempt.run_id != run.id or attempt.status not in ATTEMPT_ACTIVE:
        return DispatchClaim(status="not_eligible", run_id=run_id)
    now = tx.now_ms()
    dispatch = dispatches.lock_dispatch(tx, run_id)
    if dispatch is None:
        dispatches.insert_dispatch(
            tx,
            run_id=run_id,
            attempt_id=attempt.id,
            project_id=run.project_id,
            next_attempt_at_ms=run.cancel_requested_at_ms,
            now_ms=now,
        )
        dispatch = dispatches.lock_dispatch(tx, run_id)
        assert dispatch is not None
    if dispatch.attempt_id != attempt.id:
        # Bound forever to one Attempt: never re-bind, never chase the "latest PID".
        return DispatchClaim(status="binding_conflict", run_id=run_id, attempt_id=dispatch.attempt_id)
    answer = DispatchClaim(
        status="claimed",
        run_id=run_id,
        attempt_id=attempt.id,
        dispatch_version=dispatch.version,
        dispatch_count=dispatch.dispatch_count,
        next_attempt_at_ms=dispatch.next_attempt_at_ms,
    )
    if dispatch.status in ("dispatched", "blocked"):
        return replace(answer, status=dispatch.status)
    if dispatch.status == "leased":
        assert dispatch.lease_expires_at_ms is not None
        if dispatch.lease_expires_at_ms > now:
            return replace(answer, status="leased", lease_expires_at_ms=dispatch.lease_expires_at_ms)
    elif dispatch.next_attempt_at_ms is not None and dispatch.next_attempt_at_ms > now:
        return replace(answer, status="not_due")
    expires = now + lease_ms
    leased = dispatches.lease_dispatch(
        tx,
        run_id,
        expected_version=dispatch.version,
        owner=owner,
        lease_token_digest=rules.lease_token_digest(token),
        lease_expires_at_ms=expires,
        now_ms=now,
    )
    if not leased:
        return replace(answer, status="leased")
    return replace(
        answer,
        dispatch_version=dispatch.version + 1,
        dispatch_count=dispatch.dispatch_count + 1,
        lease_expires_at_ms=expires,
        next_attempt_at_ms=None,
        token=token,
    )


# -- 3. result ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordOutcome:
    """The settled dispatch. ``run_terminal``: the Run had already ended, so no event was appended."""

    status: str
    dispatch_version: int
    dispatch_count: int
    next_attempt_at_ms: int | None
    run_terminal: bool = False


def record_result(
    tx: Transaction,
    *,
    run_id: str,
    attempt_id: str,
    owner: str,
    token: str,
    expected_version: int,
    result: str,
    controller_ran: bool,
    retry_base_ms: int = rules.DEFAULT_RETRY_BASE_MS,
    retry_max_ms: int = rules.DEFAULT_RETRY_MAX_MS,
) -> RecordOutcome:
    """Record the controller's outcome under the full fence (docs/contracts.md §4.4), in one transaction:
    dispatch update (v+1, lease cleared, backoff persisted as an absolute time), Run CAS and one event.

    Fence reasons: ``missing, run_mismatch, attempt_mismatch, not_leased, owner_mismatch,
    lease_token_mismatch, version_mismatch``. Expiry alone does not reject; a takeover's bump does.
    """
    rules.classify_result(result)
    rules.validate_retry_budget(retry_base_ms, retry_max_ms)
    run = lock_run(tx, run_id)
    attempt = run_records.lock_attempt(tx, attempt_id)
    if attempt is None:
        raise FenceConflict(reason="attempt_mismatch")
    if attempt.run_id != run.id:
        raise FenceConflict(reason="run_mismatch")
    dispatch = dispatches.lock_dispatch(tx, run_id)
    if dispatch is None:
        raise FenceConflict(reason="missing")
    if dispatch.attempt_id != attempt_id:
        raise FenceConflict(reason="attempt_mismatch")
    if dispatch.status != "leased":
        raise FenceConflict(reason="not_leased")
    if dispatch.lease_owner != owner:
        raise FenceConflict(reason="owner_mismatch")
    if dispatch.lease_token_digest is None or not digest_equals(
        dispatch.lease_token_digest, rules.lease_token_digest(token)
    ):
        raise FenceConflict(reason="lease_token_mismatch")
    if dispatch.version != expected_version:
        raise FenceConflict(reason="version_mismatch")
    now = tx.now_ms()
    status = rules.status_after(result)
    next_at = (
        now + rules.backoff_ms(dispatch.dispatch_count, retry_base_ms, retry_max_ms)
        if status == "retry_wait"
        else None
    )
    settled = dispatches.settle_dispatch(
        tx,
        run_id,
        expected_version=dispatch.version,
        status=status,
        next_attempt_at_ms=next_at,
        result=result,
        last_dispatched_at_ms=now if controller_ran else dispatch.last_dispatched_at_ms,
        now_ms=now,
    )
    if not settled:
        raise FenceConflict(reason="version_mismatch")
    outcome = RecordOutcome(
        status=status,
        dispatch_version=dispatch.version + 1,
        dispatch_count=dispatch.dispatch_count,
        next_attempt_at_ms=next_at,
    )
    if is_run_terminal(run.status):
        # The completion committed first: the Run is immutable, the dispatch row still settles.
        return replace(outcome, run_terminal=True)
    write_run(
        tx,
        run,
        run,
        [
            EventSpec(
                type=rules.event_type_for(result),
                actor_type="worker",
                actor_id=owner,
                attempt_id=attempt_id,
                payload={
                    "attempt_id": attempt_id,
                    "dispatch_count": dispatch.dispatch_count,
                    "result": result,
                },
                dedupe_key=rules.dedupe_key(attempt_id, dispatch.dispatch_count),
            )
        ],
    )
    if status == "blocked":
        notifications.on_cancellation_blocked(tx, run, dispatch.version + 1)
    if status == "retry_wait":
        tx.notify(channels.CANCELLATIONS)
    return outcome


# -- finalisation when no process (or no receipt) will ever report --------------------------------


FinalizeOutcome = Literal["cancelled", "timed_out", "already_terminal", "not_eligible"]


def finalize_unstarted(
    tx: Transaction, run_id: str, *, actor_type: str = "system", actor_id: str | None = None
) -> FinalizeOutcome:
    """A Run with an intent whose only active Attempt is still ``claimed`` has no process: end it.

    Serialised with the starting ACK on the Run lock; once this commits the lease is completed, so a
    late starting ACK is fenced (``not_leased``) and nothing is ever spawned.
    """
    run = lock_run(tx, run_id)
    if is_run_terminal(run.status):
        return "already_terminal"
    latest = latest_attempt(tx, run_id)
    if run.cancel_requested_at_ms is None or latest is None:
        return "not_eligible"
    attempt = lock_attempt(tx, latest.id)
    if attempt.status != "claimed":
        return "not_eligible"
    result = _end_run(tx, run, attempt, actor_type=actor_type, actor_id=actor_id, bump_sequence=False)
    return "timed_out" if result == "timed_out" else "cancelled"


def finalize_stopped(
    tx: Transaction, run_id: str, *, actor_type: str = "worker", actor_id: str | None = None
) -> FinalizeOutcome:
    """End a Run whose cancellation was ``dispatched`` and whose process is proven gone with no receipt.

    Run and Attempt -> cancelled (timed_out for a timeout intent), lease completed. First commit wins:
    a Run already terminal (its completion arrived) is left unchanged (``already_terminal``); a dispatch
    that is not ``dispatched`` or an Attempt not starting/running -> ``not_eligible``, nothing written.
    """
    run = lock_run(tx, run_id)
    if is_run_terminal(run.status):
        return "already_terminal"
    latest = latest_attempt(tx, run_id)
    if run.cancel_requested_at_ms is None or latest is None:
        return "not_eligible"
    attempt = lock_attempt(tx, latest.id)
    dispatch = dispatches.lock_dispatch(tx, run_id)
    if (
        dispatch is None
        or dispatch.status != "dispatched"
        or dispatch.attempt_id != attempt.id
        or attempt.status not in ("starting", "running")
    ):
        return "not_eligible"
    result = _end_run(tx, run, attempt, actor_type=actor_type, actor_id=actor_id, bump_sequence=True)
    return "timed_out" if result == "timed_out" else "cancelled"


# -- stops through lease control (cluster/stops.py) ---------------------------------------------


def stop_requests(tx: Transaction, *, worker_id: str, session_id: str, limit: int) -> list[str]:
    """Attempt ids of the worker session's live leases whose Run has a stop intent (one bounded page)."""
    return dispatches.stop_requested_attempts(tx, worker_id=worker_id, session_id=session_id, limit=limit)


# -- 5. timeouts -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeoutReport:
    scanned: int
    requested: int
    skipped: int
    truncated: bool


def timeout_cycle(
    db: Database, *, page: int = TIMEOUT_PAGE_DEFAULT, guard: ItemGuard | None = None
) -> TimeoutReport:
    """One bounded scan of started Attempts past their persisted deadline: commit the intent
    (reason ``timeout``) first; only the cancellation lease holder will ever signal. No timer."""
    if isinstance(page, bool) or not 1 <= page <= rules.MAX_PAGE:
        raise ValidationFailed(f"page must be 1-{rules.MAX_PAGE}", field="page")
    found: list[TimedOutAttempt] = db.transaction(
        partial(dispatches.timed_out_attempts, limit=page), write=False
    )
    requested = 0
    for timed_out in found:
        outcome = guarded(
            guard,
            "timeout",
            timed_out.run_id,
            partial(
                db.transaction,
                partial(_request_timeout, project_id=timed_out.project_id, run_id=timed_out.run_id),
            ),
        )
        requested += outcome == "requested"
    return TimeoutReport(
        scanned=len(found), requested=requested, skipped=len(found) - requested, truncated=len(found) == page
    )


def _request_timeout(tx: Transaction, *, project_id: str, run_id: str) -> RequestOutcome:
    return request_cancel(tx, project_id, run_id, reason="timeout", actor_type="system")
