"""Fenced run leases: the fence and its renewal, and the one path that ends an attempt (docs/contracts.md
§1.4, §2). Claims are in ``lease_claims``, the holder's results in ``lease_results``, server-side
expiry and lost retry in ``lease_expiry``; all of them end an attempt through ``end_attempt``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

from ql3.application.runs import (
    AttemptChange,
    EventSpec,
    write_run,
)
from ql3.domain import leases as lease_rules
from ql3.domain.digests import digest_equals, sha256_hex
from ql3.domain.errors import FenceConflict
from ql3.domain.model import Attempt, Run
from ql3.domain.offers import LeaseFence
from ql3.domain.states import ATTEMPT_ACTIVE, is_run_terminal
from ql3.ports import channels
from ql3.ports.storage import Transaction
from ql3.repositories import leases as repo
from ql3.repositories import runs as run_repo
from ql3.repositories.leases import Lease as Lease  # the record; ``leases.Lease`` stays importable


def adjust_slots(tx: Transaction, worker_id: str, delta: int) -> None:
    """The worker's active-lease counter moves in the same transaction as the lease itself."""
    repo.adjust_active_leases(tx, worker_id, delta)


def release(tx: Transaction, lease: Lease, reason: str, now: int) -> None:
    if repo.release_lease(tx, lease, reason=reason, now=now):
        adjust_slots(tx, lease.worker_id, -1)


def fence_of(lease: Lease, token: str) -> LeaseFence:
    """The full fence of ``lease`` for the holder of ``token`` (the raw token is never stored)."""
    return LeaseFence(
        run_id=lease.run_id,
        attempt_id=lease.attempt_id,
        worker_id=lease.worker_id,
        session_id=lease.worker_session_id,
        worker_generation=lease.worker_generation,
        lease_generation=lease.lease_generation,
        lease_token=token,
        lease_version=lease.version,
    )


def lease_digest(token: str) -> str:
    return sha256_hex(token)


def get_lease(tx: Transaction, attempt_id: str, *, lock: bool = False) -> Lease | None:
    return repo.lock_lease(tx, attempt_id) if lock else repo.get_lease(tx, attempt_id)


def check_fence(
    tx: Transaction, fence: LeaseFence, *, allow_terminal_replay: bool = False, ignore_version: bool = False
) -> tuple[Lease, int]:
    """Verify the full fence under a lease row lock; raises FenceConflict with a domain reason.

    ``ignore_version`` is for results (ACKs, completion, lost report, status): the renewal version may lag
    behind after a restart, while identity, generation and token must still match exactly. The lease
    (locked) and the worker are read in one statement (``repositories.leases.lock_fence_rows``).
    """
    rows = repo.lock_fence_rows(tx, run_id=None, attempt_id=fence.attempt_id, worker_id=fence.worker_id)
    now = tx.now_ms()
    lease = verify_fence(
        rows, fence, now, allow_terminal_replay=allow_terminal_replay, ignore_version=ignore_version
    )
    return lease, now


def verify_fence(
    rows: repo.FenceRows,
    fence: LeaseFence,
    now: int,
    *,
    allow_terminal_replay: bool = False,
    ignore_version: bool = False,
) -> Lease:
    """The checks of ``check_fence`` on rows already read under their locks, in their order: the
    holder's identity (``verify_holder``), then the lease live and the worker's session with it."""
    lease = verify_holder(rows, fence)
    if lease.status != "leased":
        if allow_terminal_replay and lease.status == "completed":
            return lease
        raise FenceConflict(reason="not_leased")
    if lease.version != fence.lease_version and not ignore_version:
        raise FenceConflict(reason="version_mismatch")
    if lease.expires_at_ms <= now:
        raise FenceConflict(reason="lease_expired")
    worker = rows.worker
    if (
        worker is None
        or worker.worker_id != fence.worker_id
        or worker.session_id != fence.session_id
        or worker.generation != fence.worker_generation
        or worker.status not in ("online", "draining")
        or worker.lease_expires_at_ms <= now
    ):
        raise FenceConflict(reason="worker_unavailable")
    return lease


def verify_holder(rows: repo.FenceRows, fence: LeaseFence) -> Lease:
    """The identity checks of ``verify_fence`` only (lease, run, worker, session, generations,
    token), in its order and with its reasons: whether ``fence`` was the holder of the lease, however
    the lease ended and whatever became of the worker's session since. The authority of a fact (a
    completion, docs/contracts.md §2.4), never of an action."""
    lease = rows.lease
    if lease is None or lease.attempt_id != fence.attempt_id:
        raise FenceConflict(reason="missing")
    if lease.run_id != fence.run_id:
        raise FenceConflict(reason="run_mismatch")
    if lease.worker_id != fence.worker_id:
        raise FenceConflict(reason="worker_mismatch")
    if lease.worker_session_id != fence.session_id:
        raise FenceConflict(reason="worker_session_mismatch")
    if lease.worker_generation != fence.worker_generation:
        raise FenceConflict(reason="worker_generation_mismatch")
    if lease.lease_generation != fence.lease_generation:
        raise FenceConflict(reason="lease_generation_mismatch")
    if not digest_equals(lease.lease_token_digest, lease_digest(fence.lease_token)):
        raise FenceConflict(reason="lease_token_mismatch")
    return lease


def renew(tx: Transaction, fence: LeaseFence, lease_ms: int) -> Lease:
    """Same full fence, before expiry: version +1 and a new expiry."""
    lease_rules.RUN.validate(lease_ms)
    rows = repo.lock_fence_rows(tx, run_id=None, attempt_id=fence.attempt_id, worker_id=fence.worker_id)
    now = tx.now_ms()
    try:
        lease = verify_fence(rows, fence, now)
    except FenceConflict as exc:
        # Past its expiry but not recovered yet (still ``leased``: the expiry scanner had not come),
        # held by a worker whose session is live: nobody else was given the run, so its holder keeps
        # it. A paused process renews its leases on resume (docs/reliability.md, "A paused server").
        if exc.details.get("reason") != "lease_expired" or not _session_live(rows, fence, now):
            raise
        lease = verify_holder(rows, fence)
    if not repo.renew_lease(tx, lease, expires_at_ms=now + lease_ms, now=now):
        raise FenceConflict(reason="version_mismatch")
    # The CAS wrote exactly this (lease_renew: version + 1, the new expiry): no second read.
    return replace(lease, version=lease.version + 1, expires_at_ms=now + lease_ms)


def _session_live(rows: repo.FenceRows, fence: LeaseFence, now: int) -> bool:
    worker = rows.worker
    return (
        worker is not None
        and worker.worker_id == fence.worker_id
        and worker.session_id == fence.session_id
        and worker.generation == fence.worker_generation
        and worker.status in ("online", "draining")
        and worker.lease_expires_at_ms > now
    )


def cancel_outcome(run: Run, default: str, code: str | None) -> tuple[str, str | None]:
    """A committed cancel intent decides the outcome: timeout wins, then cancel."""
    if run.cancel_requested_at_ms is not None:
        if run.cancel_reason == "timeout":
            return "timed_out", "EXECUTION_TIMED_OUT"
        return "cancelled", "EXECUTION_CANCELLED"
    return default, code


LeaseEnd = Literal["complete", "release"]


def end_attempt(
    tx: Transaction,
    run: Run,
    attempt: Attempt | None,
    *,
    run_status: str,
    attempt_status: str | None = None,
    error_code: str | None,
    exit_code: int | None = None,
    actor_type: str,
    actor_id: str | None,
    bump_sequence: bool,
    lease_end: LeaseEnd = "complete",
    release_reason: str = "lease_expired",
    now: int | None = None,
    locked_lease: Lease | None = None,
) -> Run:
    """The one path that ends an attempt: Attempt and Run transitions with their events, the
    attempt's live lease completed (or released) and the worker's slot freed, all in one transaction.

    Every ending goes through here - completion, start failure, cancellation before and after start,
    timeout, lost, lease expiry - so the worker's ``active_leases`` counter can never drift from the
    number of its ``leased`` leases (docs/dispatch.md). ``attempt_status`` defaults to ``run_status``;
    an attempt that is no longer active is left as it is. A non-terminal ``run_status`` (``lost``)
    keeps the Run's ``finished_at_ms``. ``locked_lease``: the attempt's lease as this transaction
    already read it under its row lock (``check_fence``), so it is not read a second time.
    """
    now = tx.now_ms() if now is None else now
    events: list[EventSpec] = []
    change: AttemptChange | None = None
    if attempt is not None and attempt.status in ATTEMPT_ACTIVE:
        a_status = attempt_status or run_status
        change = AttemptChange(
            attempt=attempt,
            new=replace(
                attempt,
                status=a_status,
                finished_at_ms=now,
                exit_code=exit_code,
                error_code=error_code,
                callback_sequence=attempt.callback_sequence + (1 if bump_sequence else 0),
            ),
        )
        payload: dict[str, Any] = {"attempt": attempt.attempt}
        if exit_code is not None:
            payload["exit_code"] = exit_code
        if error_code is not None:
            payload["error_code"] = error_code
        events.append(
            EventSpec(
                type=f"attempt.{a_status}",
                actor_type=actor_type,
                actor_id=actor_id,
                attempt_id=attempt.id,
                payload=payload,
            )
        )
    events.append(
        EventSpec(
            type=f"run.{run_status}",
            actor_type=actor_type,
            actor_id=actor_id,
            attempt_id=attempt.id if attempt is not None else None,
            payload={"from": run.status, "to": run_status},
            dedupe_key=f"run-transition:{run.version}:{run_status}",
        )
    )
    finished = now if is_run_terminal(run_status) else run.finished_at_ms
    written = write_run(
        tx,
        run,
        replace(run, status=run_status, finished_at_ms=finished, exit_code=exit_code, error_code=error_code),
        events,
        change,
    )
    if attempt is not None:
        _end_lease(tx, attempt.id, now, lease_end, release_reason, locked_lease)
    tx.notify(channels.SLOTS)  # a slot was freed: the dispatcher may place the next candidate
    return written


def end_lease(tx: Transaction, attempt_id: str, now: int) -> None:
    """Complete the attempt's lease if it is still live and free its worker's slot (an attempt ended
    outside ``end_attempt``: a retry withdrawn by a late fact)."""
    _end_lease(tx, attempt_id, now, "complete", "lease_expired")
    tx.notify(channels.SLOTS)


def _end_lease(
    tx: Transaction, attempt_id: str, now: int, how: LeaseEnd, reason: str, locked: Lease | None = None
) -> None:
    """Complete (or release) the attempt's lease if it is still live, and free its worker slot.

    The counter moves only when the lease row itself changed (CAS on its version), so a replay or a
    lease already ended by another path never frees a slot twice. ``locked``: the lease row as this
    transaction read it under its lock and has not written since (the CAS still checks its version).
    """
    if locked is not None and locked.attempt_id != attempt_id:
        raise FenceConflict(reason="run_mismatch")
    lease = locked if locked is not None else get_lease(tx, attempt_id, lock=True)
    if lease is None or lease.status != "leased":
        return
    if how == "complete":
        completed = repo.complete_lease(tx, lease, now=now)
        ended, freed = completed is not None, completed is not None and completed.slot_freed
    else:
        ended, freed = repo.release_lease(tx, lease, reason=reason, now=now), False
    if ended and not freed:  # on PostgreSQL the completion's statement freed the slot itself
        adjust_slots(tx, lease.worker_id, -1)


def attempt_row(tx: Transaction, attempt_id: str) -> Attempt | None:
    return run_repo.get_attempt(tx, attempt_id)


def lease_status(tx: Transaction, fence: LeaseFence) -> Lease:
    """The live lease for an exact authority (any renewal version), for a worker resuming after a restart."""
    if tx.dialect == "postgres":
        # Only reads: on PostgreSQL the read commits in the same round trip as BEGIN and the checks
        # run on the rows it answered (no write follows that the lock would have to cover).
        rows = repo.lock_fence_rows(
            tx, run_id=None, attempt_id=fence.attempt_id, worker_id=fence.worker_id, then_commit=True
        )
        return verify_fence(rows, fence, tx.now_ms(), ignore_version=True)
    lease, _ = check_fence(tx, fence, ignore_version=True)
    return lease
