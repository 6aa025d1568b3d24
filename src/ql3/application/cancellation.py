"""Durable cancellation dispatch (docs/contracts.md §4, §9): intent, fenced claim and result, supervisor,
timeouts, and the low-sensitivity management surface.

The shape is always durable fact -> effect -> fenced result: a cancel intent is committed on the Run,
one supervisor wins a leased claim on the Run's ``cancellation_dispatches`` row, signals the process
group outside any transaction, and records the outcome under the full fence. The repository is the
only time authority; callers pass durations, never instants.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Final, Literal, Protocol

from ql3.application import leases, notifications, rows
from ql3.application.runs import (
    EventSpec,
    latest_attempt,
    lock_attempt,
    lock_run,
    write_run,
)
from ql3.application.tasks import get_revision
from ql3.domain import cancellation as rules
from ql3.domain import leases as lease_rules
from ql3.domain.cancellation import BlockedCursor, CancellationDispatch
from ql3.domain.digests import canonical_json, digest_equals
from ql3.domain.errors import Conflict, FenceConflict, NotFound, ValidationFailed
from ql3.domain.ids import new_id
from ql3.domain.model import Attempt, Run
from ql3.domain.states import ATTEMPT_ACTIVE, is_run_terminal
from ql3.domain.tasks import build_spec
from ql3.ports.storage import Database, Row, Transaction

CANCELLATIONS_CHANNEL: Final = "cancellations"
REARM_OPERATION: Final = "cancellation.rearm"
TIMEOUT_PAGE_DEFAULT: Final = 16

RequestOutcome = Literal["requested", "already_requested", "already_terminal"]
ClaimStatus = Literal[
    "claimed", "not_eligible", "not_due", "leased", "dispatched", "blocked", "binding_conflict"
]
StopReason = Literal["complete", "page_limit", "unsafe_attempt_overflow", "cursor_stalled", "oversized_page"]

log = logging.getLogger("ql3.cancellation")


def _dispatch(row: Row) -> CancellationDispatch:
    def opt(key: str) -> int | None:
        value = row[key]
        return None if value is None else int(value)

    return CancellationDispatch(
        run_id=row["run_id"],
        attempt_id=row["attempt_id"],
        project_id=row["project_id"],
        status=row["status"],
        version=int(row["version"]),
        dispatch_count=int(row["dispatch_count"]),
        next_attempt_at_ms=opt("next_attempt_at_ms"),
        lease_owner=row["lease_owner"],
        lease_token_digest=row["lease_token_digest"],
        lease_expires_at_ms=opt("lease_expires_at_ms"),
        last_result=row["last_result"],
        last_dispatched_at_ms=opt("last_dispatched_at_ms"),
        created_at_ms=int(row["created_at_ms"]),
        updated_at_ms=int(row["updated_at_ms"]),
    )


def _lock_dispatch(tx: Transaction, run_id: str) -> CancellationDispatch | None:
    row = tx.one("cancel_dispatch_lock", {"run_id": run_id})
    return _dispatch(row) if row else None


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
    tx.notify(CANCELLATIONS_CHANNEL)
    return "requested"


# -- 2. claim ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimOutcome:
    """A claim's answer. ``token`` is the caller's own raw token, echoed only on ``claimed``."""

    status: ClaimStatus
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
) -> ClaimOutcome:
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
        return ClaimOutcome(status="not_eligible", run_id=run_id)
    latest = latest_attempt(tx, run_id)
    if latest is None:
        return ClaimOutcome(status="not_eligible", run_id=run_id)
    attempt = lock_attempt(tx, latest.id)
    if attempt.run_id != run.id or attempt.status not in ATTEMPT_ACTIVE:
        return ClaimOutcome(status="not_eligible", run_id=run_id)
    now = tx.now_ms()
    dispatch = _lock_dispatch(tx, run_id)
    if dispatch is None:
        tx.run(
            "cancel_dispatch_insert",
            {
                "run_id": run_id,
                "attempt_id": attempt.id,
                "project_id": run.project_id,
                "next_attempt_at_ms": run.cancel_requested_at_ms,
                "now": now,
            },
        )
        dispatch = _lock_dispatch(tx, run_id)
        assert dispatch is not None
    if dispatch.attempt_id != attempt.id:
        # Bound forever to one Attempt: never re-bind, never chase the "latest PID".
        return ClaimOutcome(status="binding_conflict", run_id=run_id, attempt_id=dispatch.attempt_id)
    answer = ClaimOutcome(
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
    updated = tx.run(
        "cancel_dispatch_lease",
        {
            "run_id": run_id,
            "expected_version": dispatch.version,
            "owner": owner,
            "lease_token_digest": rules.lease_token_digest(token),
            "lease_expires_at_ms": expires,
            "now": now,
        },
    )
    if updated != 1:
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
    attempt_row = tx.one("attempt_lock", {"id": attempt_id})
    if attempt_row is None:
        raise FenceConflict(reason="attempt_mismatch")
    attempt = rows.attempt(attempt_row)
    if attempt.run_id != run.id:
        raise FenceConflict(reason="run_mismatch")
    dispatch = _lock_dispatch(tx, run_id)
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
    settled = tx.run(
        "cancel_dispatch_settle",
        {
            "run_id": run_id,
            "expected_version": dispatch.version,
            "status": status,
            "next_attempt_at_ms": next_at,
            "result": result,
            "last_dispatched_at_ms": now if controller_ran else dispatch.last_dispatched_at_ms,
            "now": now,
        },
    )
    if settled != 1:
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
        tx.notify(CANCELLATIONS_CHANNEL)
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
    dispatch = _lock_dispatch(tx, run_id)
    if (
        dispatch is None
        or dispatch.status != "dispatched"
        or dispatch.attempt_id != attempt.id
        or attempt.status not in ("starting", "running")
    ):
        return "not_eligible"
    result = _end_run(tx, run, attempt, actor_type=actor_type, actor_id=actor_id, bump_sequence=True)
    return "timed_out" if result == "timed_out" else "cancelled"


# -- 4. supervisor -----------------------------------------------------------------------------------


class StopOutcomeLike(Protocol):
    @property
    def status(self) -> str: ...


class SignalFn(Protocol):
    """``ProcessController.stop`` fits as-is: verify the handle (and pid), TERM -> grace -> KILL the group."""

    def __call__(self, handle: str, pid: int | None, /, *, grace_ms: int) -> StopOutcomeLike: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class CycleReport:
    """What one bounded cycle did. Holds counts and enums only: no handle, pid or token."""

    stop_reason: StopReason
    pages: int = 0
    scanned: int = 0
    claimed: int = 0
    finalized: int = 0
    signals: int = 0
    fenced: int = 0
    results: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Prepared:
    kind: str
    claim: ClaimOutcome | None = None
    handle: str | None = field(default=None, repr=False)
    pid: int | None = field(default=None, repr=False)
    grace_ms: int = rules.DEFAULT_GRACE_MS


class CancellationSupervisor:
    """One bounded cycle per ``run_cycle()`` call: no timers, no threads, no boot hooks.

    Pages live Runs with a due cancel intent by ``(cancel_requested_at_ms, run_id)``; per Run it either
    ends a never-started Attempt, or claims the dispatch and - only when it won the claim - calls
    ``signal(handle, pid, grace_ms=...)`` outside any transaction and records the fenced result.
    ``signal=None`` means no controller is available (``controller_missing``, retried with backoff).
    """

    def __init__(
        self,
        db: Database,
        *,
        signal: SignalFn | None,
        owner: str,
        page: int = rules.DEFAULT_PAGE,
        pages: int = rules.DEFAULT_PAGES,
        lease_ms: int = rules.DEFAULT_LEASE_MS,
        retry_base_ms: int = rules.DEFAULT_RETRY_BASE_MS,
        retry_max_ms: int = rules.DEFAULT_RETRY_MAX_MS,
        grace_ms: int = rules.DEFAULT_GRACE_MS,
        fault: Callable[[str], None] | None = None,
        local_worker_id: str | None = None,
        finish: SignalFn | None = None,
    ) -> None:
        if isinstance(page, bool) or not 1 <= page <= rules.MAX_PAGE:
            raise ValidationFailed(f"page must be 1-{rules.MAX_PAGE}", field="page")
        if isinstance(pages, bool) or not 1 <= pages <= rules.MAX_PAGES:
            raise ValidationFailed(f"pages must be 1-{rules.MAX_PAGES}", field="pages")
        rules.validate_lease_ms(lease_ms)
        rules.validate_retry_budget(retry_base_ms, retry_max_ms)
        if not 0 <= grace_ms <= rules.MAX_GRACE_MS or grace_ms * 2 >= lease_ms:
            # The lease must outlast a normal TERM -> KILL window, or a live holder could be taken over.
            raise ValidationFailed("grace_ms must be below half the lease", field="grace_ms")
        self._db = db
        self._signal = signal
        self._owner = rules.validate_owner(owner)
        self._page = page
        self._pages = pages
        self._lease_ms = lease_ms
        self._retry_base_ms = retry_base_ms
        self._retry_max_ms = retry_max_ms
        self._grace_ms = grace_ms
        # Crash-test hook: called with "after_cancel_claim" once a claim committed, before any signal.
        self._fault = fault or (lambda _point: None)
        # Signal only processes of this host's worker (None: any attempt, e.g. a single server).
        self._local_worker_id = local_worker_id
        # Finishes a stop a crash cut short (the Run already ended): ``signal`` plus a sweep of what is
        # left of the group once its leader is gone. Only with a local worker (its processes only).
        self._finish = finish
        self._since_ms: int | None = None  # the database time of this supervisor's first cycle
        # Fair paging: a cycle stopped by ``page_limit`` leaves its cursor here and the next cycle
        # continues past it, so intents this supervisor skips (another server's worker, backoff) can
        # never hide its own behind them. A cycle that reaches the end wraps to the first page.
        self._cursor: tuple[int, str] | None = None

    def run_cycle(self) -> CycleReport:
        counts: dict[str, int] = {"scanned": 0, "claimed": 0, "finalized": 0, "signals": 0, "fenced": 0}
        results: dict[str, int] = {}
        skipped: dict[str, int] = {}
        cursor: tuple[int, str] | None = self._cursor
        pages = 0

        def report(reason: StopReason) -> CycleReport:
            # Only a page_limit cycle resumes where it stopped; the end of the intents or a cycle that
            # failed closed starts the next one from the first page.
            self._cursor = cursor if reason == "page_limit" else None
            return CycleReport(stop_reason=reason, pages=pages, results=results, skipped=skipped, **counts)

        self._finish_interrupted(counts, results)
        for _ in range(self._pages):
            found = self._db.transaction(partial(_intent_page, cursor=cursor, limit=self._page), write=False)
            pages += 1
            if len(found) > self._page:
                # More rows than asked for: the source is broken, so nothing on it is trusted.
                return report("oversized_page")
            keys: list[tuple[int, str]] = []
            for row in found:
                if row["cancel_requested_at_ms"] is None or not row["run_id"]:
                    return report("cursor_stalled")
                key = (int(row["cancel_requested_at_ms"]), str(row["run_id"]))
                if (cursor is not None and key <= cursor) or (keys and key <= keys[-1]):
                    return report("cursor_stalled")
                keys.append(key)
            for requested_at, run_id in keys:
                counts["scanned"] += 1
                kind = self._one(run_id, requested_at, counts, results)
                if kind == "overflow":
                    return report("unsafe_attempt_overflow")
                if kind not in ("claimed", "finalized"):
                    skipped[kind] = skipped.get(kind, 0) + 1
            if len(found) < self._page:
                return report("complete")
            cursor = keys[-1]
        return report("page_limit")

    def _finish_interrupted(self, counts: dict[str, int], results: dict[str, int]) -> None:
        """A stop this server began and a crash cut short: the TERM went out, the shim exited and the Run
        ended, but the KILL after the grace never came, so a process that ignored the TERM still runs.
        No intent lists a terminal Run again, so the stale lease is taken over here (one page per
        cycle), the stop finished on the identity-proven group, and the dispatch settled. The Run is
        immutable and gets no event."""
        if self._finish is None or self._local_worker_id is None:
            return
        worker_id, finish = self._local_worker_id, self._finish
        if self._since_ms is None:
            self._since_ms = self._db.transaction(lambda tx: tx.now_ms(), write=False)
        since = self._since_ms
        stale = self._db.transaction(
            lambda tx: tx.all(
                "cancel_interrupted_stops",
                {"worker_id": worker_id, "now": tx.now_ms(), "since": since, "limit": self._page},
            ),
            write=False,
        )
        for row in stale[: self._page]:
            run_id, version = str(row["run_id"]), int(row["version"])
            token = secrets.token_urlsafe(32)
            taken = self._db.transaction(
                partial(
                    _take_over_interrupted,
                    run_id=run_id,
                    expected_version=version,
                    owner=self._owner,
                    token=token,
                    lease_ms=self._lease_ms,
                )
            )
            if taken is None:
                continue  # someone else moved it meanwhile
            handle, pid = row["executor_handle"], row["pid"]
            result = "handle_missing"
            if handle:
                counts["signals"] += 1
                try:
                    outcome = finish(str(handle), None if pid is None else int(pid), grace_ms=self._grace_ms)
                    result = rules.result_from_stop_status(getattr(outcome, "status", None))
                except Exception as exc:  # retried from the next cycle: the lease expires
                    log.warning(
                        "finishing a stop failed",
                        extra={"action": "cancel.finish_failed", "error": type(exc).__name__},
                    )
                    result = "dispatch_error"
            try:
                self._db.transaction(
                    partial(
                        record_result,
                        run_id=run_id,
                        attempt_id=taken[0],
                        owner=self._owner,
                        token=token,
                        expected_version=taken[1],
                        result=result,
                        controller_ran=bool(handle),
                    )
                )
            except FenceConflict:
                counts["fenced"] += 1
                continue
            results[result] = results.get(result, 0) + 1

    def next_wake_ms(self, tx: Transaction) -> int | None:
        """The earliest database instant at which this supervisor has work: a run deadline, or a
        dispatch backoff or lease expiry of its own worker's attempts (any attempt without a local
        worker). None: nothing is scheduled, wait for a new intent or the backstop."""
        if self._local_worker_id is None:
            row = tx.one("cancel_next_wake")
        else:
            row = tx.one("cancel_next_wake_for_worker", {"worker_id": self._local_worker_id})
        due = [int(v) for v in (row or {}).values() if v is not None]
        return min(due) if due else None

    def _one(self, run_id: str, requested_at: int, counts: dict[str, int], results: dict[str, int]) -> str:
        token = secrets.token_urlsafe(32)
        prepared: _Prepared = self._db.transaction(lambda tx: self._prepare(tx, run_id, requested_at, token))
        if prepared.kind == "finalized":
            counts["finalized"] += 1
            return "finalized"
        if prepared.kind != "claimed" or prepared.claim is None:
            return prepared.kind
        counts["claimed"] += 1
        claimed = prepared.claim
        self._fault("after_cancel_claim")
        controller_ran = False
        if self._signal is None:
            result = "controller_missing"
        elif prepared.handle is None:
            result = "handle_missing"
        else:
            controller_ran = True
            counts["signals"] += 1
            try:
                outcome = self._signal(prepared.handle, prepared.pid, grace_ms=prepared.grace_ms)
                result = rules.result_from_stop_status(getattr(outcome, "status", None))
            except Exception as exc:  # any controller failure is a transient, retryable dispatch error
                log.warning(
                    "stop signal failed",
                    extra={"action": "cancel.signal_failed", "error": type(exc).__name__},
                )
                result = "dispatch_error"
        assert claimed.attempt_id is not None and claimed.dispatch_version is not None
        attempt_id, version = claimed.attempt_id, claimed.dispatch_version
        try:
            self._db.transaction(
                lambda tx: record_result(
                    tx,
                    run_id=run_id,
                    attempt_id=attempt_id,
                    owner=self._owner,
                    token=token,
                    expected_version=version,
                    result=result,
                    controller_ran=controller_ran,
                    retry_base_ms=self._retry_base_ms,
                    retry_max_ms=self._retry_max_ms,
                )
            )
        except FenceConflict:
            # Taken over after our lease expired: the new holder re-verifies and records instead.
            counts["fenced"] += 1
            return "claimed"
        results[result] = results.get(result, 0) + 1
        return "claimed"

    def _prepare(self, tx: Transaction, run_id: str, requested_at: int, token: str) -> _Prepared:
        run = lock_run(tx, run_id)
        if is_run_terminal(run.status) or run.cancel_requested_at_ms != requested_at:
            return _Prepared(kind="not_eligible")
        active = [rows.attempt(r) for r in tx.all("cancel_active_attempts", {"run_id": run_id})]
        if len(active) > 1:
            return _Prepared(kind="overflow")  # ambiguous: never pick one, fail the cycle closed
        if not active:
            return _Prepared(kind="no_attempt")
        if active[0].status == "claimed":
            outcome = finalize_unstarted(tx, run_id)
            return _Prepared(kind="finalized" if outcome in ("cancelled", "timed_out") else outcome)
        if self._local_worker_id is not None and active[0].worker_id != self._local_worker_id:
            # Another server's worker runs it: only that server can prove the process's identity.
            return _Prepared(kind="other_worker")
        # The task's own grace governs TERM -> KILL; the claim lease is stretched to outlast it.
        grace_ms = self._task_grace_ms(tx, run)
        claimed = claim(
            tx,
            run_id=run_id,
            owner=self._owner,
            token=token,
            lease_ms=lease_rules.CANCELLATION.clamp(max(self._lease_ms, 2 * grace_ms + 1_000)),
            requested_at_ms=requested_at,
        )
        if claimed.status != "claimed":
            return _Prepared(kind=claimed.status)
        assert claimed.attempt_id is not None
        attempt = lock_attempt(tx, claimed.attempt_id)
        return _Prepared(
            kind="claimed", claim=claimed, handle=attempt.executor_handle, pid=attempt.pid, grace_ms=grace_ms
        )

    def _task_grace_ms(self, tx: Transaction, run: Run) -> int:
        """The pinned revision's ``grace_ms`` (the offer's ``terminationGraceMs``); the default otherwise."""
        try:
            return build_spec(get_revision(tx, run.task_id, run.task_revision).spec).grace_ms
        except (NotFound, ValidationFailed):
            return self._grace_ms


def _take_over_interrupted(
    tx: Transaction, *, run_id: str, expected_version: int, owner: str, token: str, lease_ms: int
) -> tuple[str, int] | None:
    """Lease a stale dispatch of a terminal Run to this owner (CAS on its version); its attempt id and new
    version, or None when it moved."""
    run = lock_run(tx, run_id)
    dispatch = _lock_dispatch(tx, run_id)
    if (
        not is_run_terminal(run.status)
        or dispatch is None
        or dispatch.status != "leased"
        or dispatch.version != expected_version
    ):
        return None
    now = tx.now_ms()
    changed = tx.run(
        "cancel_dispatch_lease",
        {
            "run_id": run_id,
            "expected_version": expected_version,
            "owner": owner,
            "lease_token_digest": rules.lease_token_digest(token),
            "lease_expires_at_ms": now + lease_ms,
            "now": now,
        },
    )
    return (dispatch.attempt_id, expected_version + 1) if changed == 1 else None


def _intent_page(tx: Transaction, *, cursor: tuple[int, str] | None, limit: int) -> list[Row]:
    params: dict[str, Any] = {"now": tx.now_ms(), "limit": limit}
    if cursor is None:
        return tx.all("cancel_intent_first", params)
    params["c_ms"], params["c_id"] = cursor
    return tx.all("cancel_intent_after", params)


# -- 5. timeouts -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeoutReport:
    scanned: int
    requested: int
    skipped: int
    truncated: bool


def timeout_cycle(db: Database, *, page: int = TIMEOUT_PAGE_DEFAULT) -> TimeoutReport:
    """One bounded scan of started Attempts past their persisted deadline: commit the intent
    (reason ``timeout``) first; only the cancellation lease holder will ever signal. No timer."""
    if isinstance(page, bool) or not 1 <= page <= rules.MAX_PAGE:
        raise ValidationFailed(f"page must be 1-{rules.MAX_PAGE}", field="page")
    found = db.transaction(
        lambda tx: tx.all("cancel_timeout_page", {"now": tx.now_ms(), "limit": page}), write=False
    )
    requested = 0
    for row in found:
        project_id, run_id = str(row["project_id"]), str(row["run_id"])
        outcome = db.transaction(partial(_request_timeout, project_id=project_id, run_id=run_id))
        requested += outcome == "requested"
    return TimeoutReport(
        scanned=len(found), requested=requested, skipped=len(found) - requested, truncated=len(found) == page
    )


def _request_timeout(tx: Transaction, *, project_id: str, run_id: str) -> RequestOutcome:
    return request_cancel(tx, project_id, run_id, reason="timeout", actor_type="system")


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
    dispatch = _dispatch(row) if row else None
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
    dispatch = _lock_dispatch(tx, run_id)
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
    tx.notify(CANCELLATIONS_CHANNEL)
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
