"""Server-side expiry of run leases and lost retry: an expired lease releases its claim or makes its
attempt lost, and the run's retry policy decides what follows (docs/contracts.md §2)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Final

from ql3.application import leases
from ql3.application.runs import (
    EventSpec,
    latest_attempt,
    lock_attempt,
    lock_run,
    write_run,
)
from ql3.domain import time_model
from ql3.domain.errors import Ql3Error, ValidationFailed
from ql3.domain.ids import new_id
from ql3.domain.model import Attempt, Run
from ql3.domain.states import ATTEMPT_TERMINAL, is_run_terminal
from ql3.domain.tasks import MAX_GRACE_MS, build_spec
from ql3.ports import channels
from ql3.ports.storage import Transaction
from ql3.repositories import leases as repo
from ql3.repositories import runs as run_repo
from ql3.repositories import tasks as task_repo

MAX_SCAN_PAGE: Final = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class PauseDeferral:
    """Whose expired leases the scanner defers after its own process was paused, and by how much."""

    worker_id: str
    lease_ms: int


class PauseWatch:
    """Notices that this process was not running (SIGSTOP, a paused VM): the monotonic time between
    two marks exceeds what the loop allowed itself (the wait it announced with ``waiting``) by more
    than ``slack_s``. The first mark only starts the watch, so a slow start-up is never a pause.
    Used by one loop thread only (docs/reliability.md, "A paused server")."""

    def __init__(self, slack_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not slack_s > 0:
            raise ValidationFailed("pause slack out of range")
        self._slack_s = slack_s
        self._clock = clock
        self._mark: float | None = None
        self._allowed_s = 0.0

    def waiting(self, timeout_s: float) -> None:
        """The loop is about to wait up to ``timeout_s``: that much silence is expected."""
        self.paused()
        self._allowed_s = max(0.0, timeout_s)

    def paused(self) -> bool:
        """True when the time since the last mark is longer than allowed; marks now."""
        now = self._clock()
        last, allowed = self._mark, self._allowed_s
        self._mark, self._allowed_s = now, 0.0
        return last is not None and now - last > allowed + self._slack_s


def mark_lost(
    tx: Transaction,
    run_id: str,
    attempt_id: str,
    *,
    error_code: str,
    actor_type: str = "reconciler",
    retry_not_before_ms: int | None = None,
) -> bool:
    """Attempt and Run become ``lost`` (non-terminal Run), then lost retry decides what follows.
    ``retry_not_before_ms``: no retry is admitted before it (the re-grant wait of an expired lease)."""
    run = lock_run(tx, run_id)
    attempt = lock_attempt(tx, attempt_id)
    if (
        attempt.status in ATTEMPT_TERMINAL
        or is_run_terminal(run.status)
        or run.status not in ("dispatching", "running")
    ):
        return False
    now = tx.now_ms()
    outcome, code = leases.cancel_outcome(run, "lost", error_code)
    if outcome != "lost":
        leases.end_attempt(
            tx,
            run,
            attempt,
            run_status=outcome,
            error_code=code,
            actor_type=actor_type,
            actor_id=None,
            now=now,
            bump_sequence=False,
        )
        return True
    # lost is not terminal for the Run: lost retry decides what follows. The lease is released (not
    # completed) with the reason the server saw.
    lost_run = leases.end_attempt(
        tx,
        run,
        attempt,
        run_status="lost",
        error_code=error_code,
        actor_type=actor_type,
        actor_id=None,
        now=now,
        bump_sequence=False,
        lease_end="release",
        release_reason="lease_expired",
    )
    after_lost(tx, lost_run, attempt, now, retry_not_before_ms)
    return True


def after_lost(
    tx: Transaction,
    run: Run,
    attempt: Attempt,
    now: int,
    not_before_ms: int | None = None,
    *,
    exit_code: int | None = None,
) -> str:
    """Lost retry: schedule a new attempt when the policy allows, else the run fails; the run's new
    status. The retry waits for its backoff and, after a lease expiry, until ``not_before_ms``, when
    the old host has stopped the attempt (the re-grant wait of docs/reliability.md "Time"). A run
    that fails here keeps ``exit_code``, the lost attempt's when its host reported one."""
    policy = repo.get_retry_policy(tx, run.id)
    if policy is not None and policy.retry_on_lost and attempt.attempt < policy.max_attempts:
        delay = min(policy.backoff_max_ms, policy.backoff_min_ms * 2 ** min(attempt.attempt - 1, 30))
        if not_before_ms is not None:
            delay = max(delay, not_before_ms - now)
        repo.schedule_retry(tx, policy, next_retry_at_ms=now + delay)
        write_run(
            tx,
            run,
            replace(run, status="retry_wait"),
            [
                EventSpec(
                    type="run.retry_wait",
                    actor_type="system",
                    attempt_id=attempt.id,
                    payload={"from": "lost", "to": "retry_wait", "delay_ms": delay},
                    dedupe_key=f"run-transition:{run.version}:retry_wait",
                )
            ],
        )
        tx.notify(channels.RETRIES)
        return "retry_wait"
    write_run(
        tx,
        run,
        replace(run, status="failed", finished_at_ms=now, exit_code=exit_code),
        [
            EventSpec(
                type="run.failed",
                actor_type="system",
                attempt_id=attempt.id,
                payload={"from": "lost", "to": "failed", "error_code": run.error_code},
                dedupe_key=f"run-transition:{run.version}:failed",
            )
        ],
    )
    return "failed"


def admit_retry(tx: Transaction, run_id: str) -> str | None:
    """When due: re-check, create Attempt N+1 (claimed), Run -> queued, clear the cursor. Replay-safe."""
    policy = repo.get_retry_policy(tx, run_id)
    run = lock_run(tx, run_id)
    now = tx.now_ms()
    if policy is None or policy.next_retry_at_ms is None or policy.next_retry_at_ms > now:
        return None
    latest = latest_attempt(tx, run_id)
    repo.schedule_retry(tx, policy, next_retry_at_ms=None)
    if run.status != "retry_wait" or latest is None or latest.status != "lost" or run.cancel_requested_at_ms:
        return None
    if latest.attempt >= policy.max_attempts:
        return None
    attempt_id = new_id()
    run_repo.insert_attempt(
        tx,
        attempt_id=attempt_id,
        run_id=run_id,
        attempt=latest.attempt + 1,
        status="claimed",
        executor_type=latest.executor_type,
        now=now,
    )
    write_run(
        tx,
        run,
        replace(run, status="queued", queued_at_ms=now, error_code=None),
        [
            EventSpec(
                type="run.queued",
                actor_type="system",
                attempt_id=attempt_id,
                payload={"from": "retry_wait", "to": "queued", "attempt": latest.attempt + 1},
                dedupe_key=f"run-transition:{run.version}:queued",
            )
        ],
    )
    tx.notify(channels.RUNS)
    return attempt_id


def expire_lease(
    tx: Transaction,
    attempt_id: str,
    *,
    fence_margin_ms: int = time_model.DEFAULT_FENCE_MARGIN_MS,
    defer: PauseDeferral | None = None,
) -> str:
    """Server-side expiry (lease row locked first): claimed -> release only; starting/running -> lost,
    its retry admitted no earlier than the re-grant instant of the time model: the expiry, the
    attempt's grace and ``fence_margin_ms`` (domain/time_model.py, docs/reliability.md "Time").

    ``defer``: this process was just found not running (``PauseWatch``), and a lease of its own
    embedded worker is not expired but given one more lease from now (``deferred``), as that worker's
    next renewal would: the worker paused with the scanner and had no chance to renew. Its renewal
    version stays, so the worker's next renewal under its fence applies."""
    lease = leases.get_lease(tx, attempt_id, lock=False)
    if lease is None:
        return "missing"
    run = lock_run(tx, lease.run_id)
    attempt = lock_attempt(tx, attempt_id)
    lease = leases.get_lease(tx, attempt_id, lock=True)
    now = tx.now_ms()
    if lease is None or lease.status != "leased" or lease.expires_at_ms > now:
        return "noop"
    if defer is not None and lease.worker_id == defer.worker_id:
        if repo.defer_lease(tx, lease, expires_at_ms=now + defer.lease_ms, now=now):
            return "deferred"
        return "noop"
    if attempt.status == "claimed":
        leases.release(tx, lease, "lease_expired", now)
        if run.status == "dispatching":
            # An unstarted claim whose lease expired returns the run to the queue; the next claim gets a
            # new lease generation (and so a new offer id).
            write_run(
                tx,
                run,
                replace(run, status="queued"),
                [
                    EventSpec(
                        type="run.queued",
                        actor_type="system",
                        attempt_id=attempt.id,
                        payload={"from": "dispatching", "to": "queued", "reason": "lease_expired"},
                        dedupe_key=f"run-transition:{run.version}:queued",
                    )
                ],
            )
            tx.notify(channels.RUNS)
        return "released"
    if attempt.status in ("starting", "running"):
        not_before = time_model.regrant_not_before(
            lease.expires_at_ms, _attempt_grace_ms(tx, run), fence_margin_ms
        )
        mark_lost(tx, run.id, attempt_id, error_code="LEASE_EXPIRED", retry_not_before_ms=not_before)
        return "lost"
    leases.release(tx, lease, "lease_expired", now)
    return "released"


def _attempt_grace_ms(tx: Transaction, run: Run) -> int:
    """The TERM -> KILL grace the attempt's host was given (its pinned revision's), the longest a
    task may declare when the revision cannot be read: waiting too long is safe, too short is not."""
    found = task_repo.get_revision(tx, run.task_id, run.task_revision)
    if found is None:
        return MAX_GRACE_MS
    try:
        return build_spec(found.spec).grace_ms
    except Ql3Error:
        return MAX_GRACE_MS


def expired_page(tx: Transaction, limit: int) -> list[str]:
    if not 1 <= limit <= MAX_SCAN_PAGE:
        raise ValidationFailed("page out of range")
    return repo.expired_leases(tx, now=tx.now_ms(), limit=limit)


def retry_due_page(tx: Transaction, limit: int) -> list[str]:
    if not 1 <= limit <= MAX_SCAN_PAGE:
        raise ValidationFailed("page out of range")
    return repo.due_retries(tx, now=tx.now_ms(), limit=limit)
