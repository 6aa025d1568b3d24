"""The cancellation supervisor (docs/contracts.md §9): claims due dispatches in bounded, fair pages,
signals each proven process group outside any transaction and records the fenced result; it also
finishes stops a crash interrupted."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

from ql3.application.cancellation import (
    DispatchClaim,
    StopReason,
    claim,
    finalize_unstarted,
    record_result,
)
from ql3.application.parking import ItemGuard, Parked, guarded
from ql3.application.runs import (
    lock_attempt,
    lock_run,
)
from ql3.application.tasks import get_revision
from ql3.domain import cancellation as rules
from ql3.domain import leases as lease_rules
from ql3.domain.errors import FenceConflict, NotFound, ValidationFailed
from ql3.domain.model import Run
from ql3.domain.states import is_run_terminal
from ql3.domain.tasks import build_spec
from ql3.ports.storage import Database, Transaction
from ql3.repositories import cancellation as dispatches
from ql3.repositories.cancellation import IntentKey, InterruptedStop

log = logging.getLogger("ql3.cancellation.supervisor")


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
    claim: DispatchClaim | None = None
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
        guard: ItemGuard | None = None,
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
        # One bad run (a failure that is not an outage) is parked instead of failing the cycle.
        self._guard = guard

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
            for intent in found:
                if intent.cancel_requested_at_ms is None or not intent.run_id:
                    return report("cursor_stalled")
                key = (intent.cancel_requested_at_ms, intent.run_id)
                if (cursor is not None and key <= cursor) or (keys and key <= keys[-1]):
                    return report("cursor_stalled")
                keys.append(key)
            for requested_at, run_id in keys:
                counts["scanned"] += 1
                handled = guarded(
                    self._guard, "stop", run_id, partial(self._one, run_id, requested_at, counts, results)
                )
                kind = "parked" if isinstance(handled, Parked) else handled
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
        stale: list[InterruptedStop] = self._db.transaction(
            partial(dispatches.interrupted_stops, worker_id=worker_id, since_ms=since, limit=self._page),
            write=False,
        )
        for stop in stale[: self._page]:
            guarded(
                self._guard, "finish", stop.run_id, partial(self._finish_one, stop, finish, counts, results)
            )

    def _finish_one(
        self, stop: InterruptedStop, finish: SignalFn, counts: dict[str, int], results: dict[str, int]
    ) -> None:
        run_id, version = stop.run_id, stop.version
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
            return  # someone else moved it meanwhile
        handle, pid = stop.executor_handle, stop.pid
        result = "handle_missing"
        if handle:
            counts["signals"] += 1
            try:
                outcome = finish(handle, pid, grace_ms=self._grace_ms)
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
            return
        results[result] = results.get(result, 0) + 1

    def next_wake_ms(self, tx: Transaction) -> int | None:
        """The earliest database instant at which this supervisor has work: a run deadline, or a
        dispatch backoff or lease expiry of its own worker's attempts (any attempt without a local
        worker). None: nothing is scheduled, wait for a new intent or the backstop."""
        wake = dispatches.next_wake(tx, worker_id=self._local_worker_id)
        due = [v for v in (wake.next_deadline_ms, wake.next_dispatch_ms, wake.next_lease_ms) if v is not None]
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
        active = dispatches.active_attempts(tx, run_id)
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
    dispatch = dispatches.lock_dispatch(tx, run_id)
    if (
        not is_run_terminal(run.status)
        or dispatch is None
        or dispatch.status != "leased"
        or dispatch.version != expected_version
    ):
        return None
    now = tx.now_ms()
    leased = dispatches.lease_dispatch(
        tx,
        run_id,
        expected_version=expected_version,
        owner=owner,
        lease_token_digest=rules.lease_token_digest(token),
        lease_expires_at_ms=now + lease_ms,
        now_ms=now,
    )
    return (dispatch.attempt_id, expected_version + 1) if leased else None


def _intent_page(tx: Transaction, *, cursor: tuple[int, str] | None, limit: int) -> list[IntentKey]:
    return dispatches.intent_page(tx, after=cursor, limit=limit)
