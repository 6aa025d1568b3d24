"""Fenced run leases, activation ACKs, completion, expiry and lost retry (docs/contracts.md §1.4, §2)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Final, Literal

from ql3.application.runs import (
    AttemptChange,
    EventSpec,
    attempt_deadline_from_spec,
    event_payload_json,
    latest_attempt,
    lock_attempt,
    lock_run,
    write_run,
)
from ql3.domain import leases as lease_rules
from ql3.domain.digests import digest_equals, sha256_hex
from ql3.domain.errors import Conflict, FenceConflict, NotFound, RunVersionConflict, ValidationFailed
from ql3.domain.ids import new_id
from ql3.domain.model import Attempt, Run
from ql3.domain.offers import LeaseFence
from ql3.domain.states import ATTEMPT_ACTIVE, ATTEMPT_TERMINAL, is_run_terminal
from ql3.ports import channels
from ql3.ports.storage import Transaction
from ql3.repositories import leases as repo
from ql3.repositories import runs as run_repo
from ql3.repositories import workers as worker_repo
from ql3.repositories.leases import Lease as Lease  # the record; ``leases.Lease`` stays importable

MAX_HANDLE_BYTES: Final = 512
MAX_SCAN_PAGE: Final = 64
RunClaimStatus = Literal["claimed", "leased", "not_eligible", "worker_unavailable", "capacity_exhausted"]


def _adjust(tx: Transaction, worker_id: str, delta: int) -> None:
    """The worker's active-lease counter moves in the same transaction as the lease itself."""
    repo.adjust_active_leases(tx, worker_id, delta)


def _release(tx: Transaction, lease: Lease, reason: str, now: int) -> None:
    if repo.release_lease(tx, lease, reason=reason, now=now):
        _adjust(tx, lease.worker_id, -1)


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


@dataclass(frozen=True, slots=True, kw_only=True)
class RunClaim:
    status: RunClaimStatus
    lease: Lease | None = None


def claim(
    tx: Transaction,
    *,
    run_id: str,
    attempt_id: str,
    worker_id: str,
    session_id: str,
    worker_generation: int,
    token_for_generation: Any,
    lease_ms: int,
    last: bool = False,
) -> RunClaim:
    """Atomic claim: lease (generation +1) and Run ``queued -> dispatching``; the Attempt stays claimed.

    Lock order Run -> Attempt -> worker -> lease. ``token_for_generation(g)`` returns the raw token of
    lease generation ``g``; only its digest is stored. On PostgreSQL the same claim is one statement,
    the ``ql3_claim`` function (docs/dispatch.md, "Dispatch on PostgreSQL: round trips"); with
    ``last`` (the claim ends its unit, nothing follows it that must commit with it) it travels with
    the unit's COMMIT.
    """
    lease_rules.RUN.validate(lease_ms)
    if tx.dialect == "postgres":
        return _claim_in_one_statement(
            tx,
            run_id=run_id,
            attempt_id=attempt_id,
            worker_id=worker_id,
            session_id=session_id,
            worker_generation=worker_generation,
            token_for_generation=token_for_generation,
            lease_ms=lease_ms,
            last=last,
        )
    run = lock_run(tx, run_id)
    if run.status != "queued" or run.cancel_requested_at_ms is not None:
        return RunClaim(status="not_eligible")
    claimed = repo.lock_attempt_with_latest(tx, attempt_id)
    if claimed is None:
        raise NotFound("attempt not found")
    attempt = claimed.attempt
    if attempt.status != "claimed" or claimed.latest_attempt_id != attempt.id:
        return RunClaim(status="not_eligible")
    worker = worker_repo.lock_worker(tx, worker_id)
    now = tx.now_ms()
    if (
        worker is None
        or worker.session_id != session_id
        or worker.generation != worker_generation
        or worker.status != "online"
        or worker.lease_expires_at_ms <= now
    ):
        return RunClaim(status="worker_unavailable")
    # The counter is a column of the worker row just locked: no second read.
    if worker.active_leases >= worker.max_concurrent_runs:
        return RunClaim(status="capacity_exhausted")
    # The first lease of the attempt: inserted directly (no row to lock yet); when the attempt
    # already has one, nothing is written and its row is locked and reacquired instead.
    generation = 1
    written = repo.insert_claim(
        tx,
        attempt_id=attempt_id,
        run_id=run_id,
        worker_id=worker_id,
        session_id=session_id,
        worker_generation=worker_generation,
        lease_token_digest=lease_digest(token_for_generation(1)),
        expires_at_ms=now + lease_ms,
        now=now,
    )
    if written is None:
        existing = get_lease(tx, attempt_id, lock=True)
        if existing is None:
            return RunClaim(status="leased")  # the conflicting row vanished: a concurrent writer
        if existing.status == "completed" or (existing.status == "leased" and existing.expires_at_ms > now):
            return RunClaim(status="leased" if existing.status == "leased" else "not_eligible")
        generation = existing.lease_generation + 1
        written = repo.reacquire_claim(
            tx,
            existing,
            worker_id=worker_id,
            session_id=session_id,
            worker_generation=worker_generation,
            lease_token_digest=lease_digest(token_for_generation(generation)),
            expires_at_ms=now + lease_ms,
            now=now,
        )
        if written is None:
            return RunClaim(status="leased")
        if existing.status == "leased":
            # An expired lease that the expiry loop has not ended yet: its holder's slot ends with it.
            _adjust(tx, existing.worker_id, -1)
    assert written is not None
    if not written.slot_counted:
        _adjust(tx, worker_id, +1)
    lease = written.lease
    write_run(
        tx,
        run,
        replace(run, status="dispatching"),
        [
            EventSpec(
                type="run.dispatching",
                actor_type="system",
                attempt_id=attempt_id,
                payload={
                    "from": "queued",
                    "to": "dispatching",
                    "worker_id": worker_id,
                    "lease_generation": generation,
                },
                dedupe_key=f"run-transition:{run.version}:dispatching",
            )
        ],
        AttemptChange(attempt=attempt, new=replace(attempt, worker_id=worker_id)),
    )
    return RunClaim(status="claimed", lease=lease)


MAX_CLAIM_BATCH: Final = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimRequest:
    """One claim of a ``claim_many`` batch: the arguments ``claim`` takes besides the lease duration."""

    run_id: str
    attempt_id: str
    worker_id: str
    session_id: str
    worker_generation: int
    token_for_generation: Any


def claim_many(tx: Transaction, requests: list[ClaimRequest], *, lease_ms: int) -> list[RunClaim]:
    """Several claims in one transaction, one answer each, in order (docs/dispatch.md, "Several
    offers per cycle").

    Each claim keeps all the fences of ``claim``: the Run and Attempt checks and CASes, the worker's
    session, generation, status and lease, its capacity (checked per claim, after the slots the claims
    before it in this batch took), the lease generation. A claim that is refused writes nothing, so it
    never undoes the others; only an invariant that ``claim`` raises for rolls the batch back. On
    SQLite (one writer at a time) it is ``claim`` once per request; on PostgreSQL a batch of one is
    ``claim`` too, and a larger one is one call of ``ql3_claim_batch`` (migration 0013), which first
    locks the rows of every claim level by level in a fixed order, plus one more call for the claims
    that reacquire an earlier lease row. It is its unit's last work: a batch of one on PostgreSQL
    travels with the unit's COMMIT (``claim`` with ``last``).
    """
    lease_rules.RUN.validate(lease_ms)
    if not 1 <= len(requests) <= MAX_CLAIM_BATCH:
        raise ValidationFailed(f"a claim batch holds 1-{MAX_CLAIM_BATCH} claims", field="claims")
    if len({r.run_id for r in requests}) != len(requests):
        raise ValidationFailed("a claim batch names each run once", field="claims")
    if tx.dialect == "postgres" and len(requests) > 1:
        return _claim_many_in_one_statement(tx, requests, lease_ms=lease_ms)
    # SQLite (one writer at a time), and a batch of one on PostgreSQL: ``ql3_claim`` alone skips the
    # batch's level-by-level locking, which only orders several claims (about a third faster per
    # offer in an interleaved check, bench/README.md "2026-12-02"). A batch of one ends the unit
    # (``claim_many`` is its caller's last statement): on PostgreSQL it travels with the COMMIT.
    return [
        claim(
            tx,
            run_id=r.run_id,
            attempt_id=r.attempt_id,
            worker_id=r.worker_id,
            session_id=r.session_id,
            worker_generation=r.worker_generation,
            token_for_generation=r.token_for_generation,
            lease_ms=lease_ms,
            last=len(requests) == 1,
        )
        for r in requests
    ]


def _batch_claim(request: ClaimRequest, generation: int) -> repo.BatchClaim:
    return repo.BatchClaim(
        run_id=request.run_id,
        attempt_id=request.attempt_id,
        worker_id=request.worker_id,
        session_id=request.session_id,
        worker_generation=request.worker_generation,
        generation=generation,
        lease_token_digest=lease_digest(request.token_for_generation(generation)),
        event_id=new_id(),
        payload_json=event_payload_json(
            {
                "from": "queued",
                "to": "dispatching",
                "worker_id": request.worker_id,
                "lease_generation": generation,
            }
        ),
    )


def _claim_many_in_one_statement(
    tx: Transaction, requests: list[ClaimRequest], *, lease_ms: int
) -> list[RunClaim]:
    """``claim_many`` on PostgreSQL: the answers of ``_claim_in_one_statement``, for all the claims
    in one call; those answered ``reacquire`` go once more, in one more call in this transaction (the
    locks stay held), with the generation the function named."""
    out: dict[int, RunClaim] = {}
    pending = [(i, request, 1) for i, request in enumerate(requests)]
    for _ in range(2):  # a reacquire answer names a generation above 1, which is never answered so
        answers = repo.claim_batch_in_one_statement(
            tx, [_batch_claim(request, generation) for _, request, generation in pending], lease_ms=lease_ms
        )
        again: list[tuple[int, ClaimRequest, int]] = []
        for (i, request, generation), answer in zip(pending, answers, strict=True):
            status = answer.status
            if status == "reacquire" and generation == 1:
                assert answer.lease_generation is not None  # a reacquire answer names the generation
                again.append((i, request, answer.lease_generation))
                continue
            out[i] = _run_claim(status, answer.lease)
        pending = again
        if not pending:
            return [out[i] for i in range(len(requests))]
    raise Conflict("the claim function answered out of turn", status="reacquire")


def _run_claim(status: str, lease: Lease | None) -> RunClaim:
    """A claim function's answer as a ``RunClaim``; raises for the answers that break an invariant."""
    if status == "claimed":
        return RunClaim(status="claimed", lease=lease)
    if status in _CLAIM_ANSWERS:
        return RunClaim(status=_CLAIM_ANSWERS[status])
    if status == "run_missing":
        raise NotFound("run not found")
    if status == "attempt_missing":
        raise NotFound("attempt not found")
    if status == "run_conflict":
        raise RunVersionConflict()
    if status == "attempt_conflict":
        raise Conflict("the attempt changed concurrently")
    raise Conflict("the claim function answered out of turn", status=status)


_CLAIM_ANSWERS: Final[dict[str, RunClaimStatus]] = {
    "not_eligible": "not_eligible",
    "worker_unavailable": "worker_unavailable",
    "capacity_exhausted": "capacity_exhausted",
    "leased": "leased",
}


def _claim_in_one_statement(
    tx: Transaction,
    *,
    run_id: str,
    attempt_id: str,
    worker_id: str,
    session_id: str,
    worker_generation: int,
    token_for_generation: Any,
    lease_ms: int,
    last: bool,
) -> RunClaim:
    """The claim as ``ql3_claim`` (PostgreSQL migration 0010): the statements of ``claim`` above, in
    the same order under the same locks, in one round trip. A lease row that may be reacquired costs
    one call more in the same transaction (the locks stay held): the function names the generation,
    whose token only this process can derive. Like ``write_run`` on SQLite it writes no notification
    outbox row: ``dispatching`` is not an outcome (``domain.notifications.RUN_STATUS_EVENTS``); were
    it to become one, the function would have to enqueue it too."""
    generation = 1
    for _ in range(2):
        answer = repo.claim_in_one_statement(
            tx,
            run_id=run_id,
            attempt_id=attempt_id,
            worker_id=worker_id,
            session_id=session_id,
            worker_generation=worker_generation,
            lease_ms=lease_ms,
            generation=generation,
            lease_token_digest=lease_digest(token_for_generation(generation)),
            event_id=new_id(),
            payload_json=event_payload_json(
                {
                    "from": "queued",
                    "to": "dispatching",
                    "worker_id": worker_id,
                    "lease_generation": generation,
                }
            ),
            last=last,
        )
        if answer.status == "reacquire" and generation == 1:
            assert answer.lease_generation is not None  # a reacquire answer names the generation
            generation = answer.lease_generation
            continue
        return _run_claim(answer.status, answer.lease)
    raise Conflict("the claim function answered out of turn", status="reacquire")


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
    lease = _verify_fence(
        rows, fence, now, allow_terminal_replay=allow_terminal_replay, ignore_version=ignore_version
    )
    return lease, now


def _verify_fence(
    rows: repo.FenceRows,
    fence: LeaseFence,
    now: int,
    *,
    allow_terminal_replay: bool = False,
    ignore_version: bool = False,
) -> Lease:
    """The checks of ``check_fence`` on rows already read under their locks, in their order."""
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


def renew(tx: Transaction, fence: LeaseFence, lease_ms: int) -> Lease:
    """Same full fence, before expiry: version +1 and a new expiry."""
    lease_rules.RUN.validate(lease_ms)
    lease, now = check_fence(tx, fence)
    if not repo.renew_lease(tx, lease, expires_at_ms=now + lease_ms, now=now):
        raise FenceConflict(reason="version_mismatch")
    # The CAS wrote exactly this (lease_renew: version + 1, the new expiry): no second read.
    return replace(lease, version=lease.version + 1, expires_at_ms=now + lease_ms)


AckResult = Literal["starting", "already_starting", "running", "already_running"]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Held:
    """A result's rows, read in one statement under their locks (Run -> Attempt -> lease), with the
    transaction's clock."""

    run: Run
    attempt: Attempt
    rows: repo.FenceRows
    now: int

    def fence(
        self, fence: LeaseFence, *, allow_terminal_replay: bool = False, ignore_version: bool = False
    ) -> Lease:
        """``check_fence`` on the rows already read: no second read of the lease or the worker."""
        return _verify_fence(
            self.rows,
            fence,
            self.now,
            allow_terminal_replay=allow_terminal_replay,
            ignore_version=ignore_version,
        )


def _run_and_attempt(tx: Transaction, fence: LeaseFence, *, with_revision: bool = False) -> _Held:
    """The Run, the Attempt, the lease (each locked, in that order) and the worker in one statement;
    NotFound for a missing Run or Attempt, ``run_mismatch`` for an Attempt of another Run, before any
    fence check."""
    rows = repo.lock_fence_rows(
        tx,
        run_id=fence.run_id,
        attempt_id=fence.attempt_id,
        worker_id=fence.worker_id,
        with_revision=with_revision,
    )
    if rows.run is None or rows.run.id != fence.run_id:
        raise NotFound("run not found")
    if rows.attempt is None or rows.attempt.id != fence.attempt_id:
        raise NotFound("attempt not found")
    if rows.attempt.run_id != rows.run.id:
        raise FenceConflict(reason="run_mismatch")
    return _Held(run=rows.run, attempt=rows.attempt, rows=rows, now=tx.now_ms())


def _result_answer(
    tx: Transaction, kind: repo.ResultKind, fence: LeaseFence, args: dict[str, Any], channel: str | None
) -> repo.ResultAnswer:
    """PostgreSQL: the result's common case in one call of ``ql3_lease_result`` (migration 0014),
    with BEGIN and COMMIT in the same round trip when it opens the unit. The function makes every
    check the statement-by-statement path below makes and writes only when all pass; anything else
    it answers ``defer`` having written nothing, and that path then runs (in a new transaction when
    the call committed), deciding and refusing as on SQLite. The rows stay locked in the order Run ->
    Attempt -> lease."""
    answer = repo.result_in_one_statement(
        tx,
        kind=kind,
        run_id=fence.run_id,
        attempt_id=fence.attempt_id,
        worker_id=fence.worker_id,
        session_id=fence.session_id,
        worker_generation=fence.worker_generation,
        lease_generation=fence.lease_generation,
        token_digest=lease_digest(fence.lease_token),
        args=args,
        event_ids=[new_id(), new_id()],
        channel=channel or "",
    )
    for notified in answer.notified:
        tx.notify(notified)  # the function sent the NOTIFY: the transaction only posts it locally
    return answer


def _result_in_one_statement(
    tx: Transaction, kind: repo.ResultKind, fence: LeaseFence, args: dict[str, Any], channel: str | None
) -> Lease | None:
    """An ACK by ``_result_answer``: the lease when the function wrote it, None (and nothing
    written) on SQLite or when it deferred."""
    if tx.dialect != "postgres":
        return None
    answer = _result_answer(tx, kind, fence, args, channel)
    if answer.answer == "defer":
        return None
    if answer.answer != kind or answer.lease is None:
        raise Conflict("the result function answered out of turn", status=answer.answer)
    return answer.lease


def ack_starting(tx: Transaction, fence: LeaseFence) -> tuple[AckResult, Lease]:
    """Attempt ``claimed -> starting`` (the Run stays dispatching); the deadline is persisted before spawn.
    It is computed here (``runs.attempt_deadline_from_spec``, from the pinned revision's spec read with
    the fence's rows), never taken from the worker's clock.

    Like every result of the lease holder, an ACK is fenced on the exact authority (worker, session,
    generations, token, live lease) but not on the renewal version: the holder's own renewal that
    committed a moment earlier must not fence its ACK (docs/dispatch.md).
    """
    done = _result_in_one_statement(tx, "starting", fence, {}, channels.ATTEMPTS)
    if done is not None:
        return "starting", done
    held = _run_and_attempt(tx, fence, with_revision=True)
    run, attempt = held.run, held.attempt
    lease = held.fence(fence, ignore_version=True)
    if attempt.status == "starting":
        return "already_starting", lease
    if attempt.status == "running":
        return "already_running", lease
    if attempt.status != "claimed" or run.status != "dispatching":
        raise Conflict("the attempt cannot start", status=attempt.status)
    if held.rows.revision_spec is None:
        raise NotFound("task revision not found")
    deadline = attempt_deadline_from_spec(tx, held.rows.revision_spec)
    write_run(
        tx,
        run,
        run,
        [
            EventSpec(
                type="attempt.starting",
                actor_type="worker",
                actor_id=fence.worker_id,
                attempt_id=attempt.id,
                payload={"attempt": attempt.attempt},
            )
        ],
        AttemptChange(attempt=attempt, new=replace(attempt, status="starting", deadline_at_ms=deadline)),
    )
    if deadline is not None:
        # A new deadline: the cancellation loop re-plans its sleep at once. An attempt without a
        # timeout gives it nothing to plan, so it is not woken once per run while work flows.
        tx.notify(channels.ATTEMPTS)
    return "starting", lease


def ack_running(
    tx: Transaction,
    fence: LeaseFence,
    *,
    pid: int,
    handle: str,
    log_artifact_id: str,
    callback_sequence: int,
    callback_token_digest: str,
) -> tuple[AckResult, Lease]:
    """Attempt and Run -> running with DB times; an identical replay is idempotent, another handle is not."""
    if len(handle.encode()) > MAX_HANDLE_BYTES or pid < 1 or callback_sequence < 1:
        raise ValidationFailed("invalid running ACK")
    if len(callback_token_digest) != 64:
        raise ValidationFailed("invalid callback digest")
    done = _result_in_one_statement(
        tx,
        "running",
        fence,
        {
            "pid": pid,
            "handle": handle,
            "log_artifact_id": log_artifact_id,
            "callback_sequence": callback_sequence,
            "callback_token_digest": callback_token_digest,
        },
        None,
    )
    if done is not None:
        return "running", done
    held = _run_and_attempt(tx, fence)
    run, attempt, now = held.run, held.attempt, held.now
    # Not fenced on the renewal version: see ack_starting. A lost running ACK leaves no callback
    # digest, and then even a valid receipt of the current holder could never complete the run.
    lease = held.fence(fence, ignore_version=True)
    if attempt.status == "running":
        if (
            attempt.executor_handle == handle
            and attempt.pid == pid
            and attempt.callback_sequence == callback_sequence
        ):
            return "already_running", lease
        raise Conflict("a different handle is already running", reason="handle_mismatch")
    if attempt.status != "starting":
        raise Conflict("running requires starting", status=attempt.status)
    new_attempt = replace(
        attempt,
        status="running",
        pid=pid,
        executor_handle=handle,
        log_artifact_id=log_artifact_id,
        callback_sequence=callback_sequence,
        callback_token_hash=callback_token_digest,
        started_at_ms=now,
    )
    write_run(
        tx,
        run,
        replace(run, status="running", started_at_ms=now),
        [
            EventSpec(
                type="attempt.running",
                actor_type="worker",
                actor_id=fence.worker_id,
                attempt_id=attempt.id,
                payload={"attempt": attempt.attempt},
            ),
            EventSpec(
                type="run.running",
                actor_type="worker",
                actor_id=fence.worker_id,
                attempt_id=attempt.id,
                payload={"from": run.status, "to": "running"},
                dedupe_key=f"run-transition:{run.version}:running",
            ),
        ],
        AttemptChange(attempt=attempt, new=new_attempt),
    )
    return "running", lease


def _cancel_outcome(run: Run, default: str, code: str | None) -> tuple[str, str | None]:
    """A committed cancel intent decides the outcome: timeout wins, then cancel."""
    if run.cancel_requested_at_ms is not None:
        if run.cancel_reason == "timeout":
            return "timed_out", "EXECUTION_TIMED_OUT"
        return "cancelled", "EXECUTION_CANCELLED"
    return default, code


def ack_start_failure(tx: Transaction, fence: LeaseFence, *, error_code: str) -> str:
    """From ``starting``: outcome by cancel fact; lease completed (v+1); two events; atomic."""
    held = _run_and_attempt(tx, fence)
    run, attempt, now = held.run, held.attempt, held.now
    lease = held.fence(fence, allow_terminal_replay=True, ignore_version=True)
    if lease.status == "completed":
        if attempt.status in ATTEMPT_TERMINAL and lease.version == fence.lease_version + 1:
            return "already_terminal"
        raise FenceConflict(reason="not_leased")
    if attempt.status not in ("starting", "claimed"):
        raise Conflict("start failure requires starting", status=attempt.status)
    outcome, code = _cancel_outcome(run, "failed", "EXECUTOR_START_FAILED" if error_code else None)
    end_attempt(
        tx,
        run,
        attempt,
        run_status=outcome,
        error_code=code or error_code,
        actor_type="worker",
        actor_id=fence.worker_id,
        now=now,
        bump_sequence=True,
        locked_lease=lease,
    )
    return outcome


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
        _adjust(tx, lease.worker_id, -1)


CompletionResult = Literal["applied", "already_terminal"]


def complete(
    tx: Transaction,
    fence: LeaseFence,
    *,
    callback_sequence: int,
    callback_token: str,
    exit_code: int,
) -> tuple[CompletionResult, str]:
    """The one completion path for live close and receipt replay.

    Checks relation, token hash (constant time) and sequence; an already-terminal attempt answers
    ``already_terminal`` (a late callback appends ``attempt.late_callback_ignored`` only); a committed
    cancel intent forces cancelled / timed_out; otherwise exit 0 succeeds and anything else fails.
    """
    if not 0 <= exit_code <= 255:
        raise ValidationFailed("exit code out of range")
    if tx.dialect == "postgres":
        answer = _result_answer(
            tx,
            "complete",
            fence,
            {
                "callback_sequence": callback_sequence,
                "callback_digest": sha256_hex(callback_token),
                "exit_code": exit_code,
            },
            channels.SLOTS,  # a slot was freed, as end_attempt notifies
        )
        if answer.answer == "applied" and answer.outcome is not None:
            return "applied", answer.outcome
        if answer.answer != "defer":
            raise Conflict("the result function answered out of turn", status=answer.answer)
    held = _run_and_attempt(tx, fence)
    run, attempt = held.run, held.attempt
    if attempt.callback_token_hash is None or not digest_equals(
        attempt.callback_token_hash, sha256_hex(callback_token)
    ):
        raise FenceConflict(reason="callback_token_mismatch")
    if attempt.status in ATTEMPT_TERMINAL or is_run_terminal(run.status):
        # A terminal run is immutable: a replay changes nothing. An attempt that ended while its run
        # goes on (lost, the run retried) was never completed, so no callback of it is a replay:
        # each one, under any sequence, is a late callback and is recorded.
        if not is_run_terminal(run.status):
            write_run(
                tx,
                run,
                run,
                [
                    EventSpec(
                        type="attempt.late_callback_ignored",
                        actor_type="worker",
                        actor_id=fence.worker_id,
                        attempt_id=attempt.id,
                        payload={"attempt": attempt.attempt},
                    )
                ],
            )
        return "already_terminal", attempt.status
    if callback_sequence != attempt.callback_sequence:
        raise FenceConflict(reason="callback_sequence_mismatch")
    lease, now = held.fence(fence, ignore_version=True), held.now
    outcome, code = _cancel_outcome(
        run, "succeeded" if exit_code == 0 else "failed", None if exit_code == 0 else "EXIT_NONZERO"
    )
    end_attempt(
        tx,
        run,
        attempt,
        run_status=outcome,
        error_code=code,
        exit_code=exit_code,
        actor_type="worker",
        actor_id=fence.worker_id,
        now=now,
        bump_sequence=True,
        locked_lease=lease,
    )
    return "applied", outcome


def mark_lost(
    tx: Transaction, run_id: str, attempt_id: str, *, error_code: str, actor_type: str = "reconciler"
) -> bool:
    """Attempt and Run become ``lost`` (non-terminal Run), then lost retry decides what follows."""
    run = lock_run(tx, run_id)
    attempt = lock_attempt(tx, attempt_id)
    if (
        attempt.status in ATTEMPT_TERMINAL
        or is_run_terminal(run.status)
        or run.status not in ("dispatching", "running")
    ):
        return False
    now = tx.now_ms()
    outcome, code = _cancel_outcome(run, "lost", error_code)
    if outcome != "lost":
        end_attempt(
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
    lost_run = end_attempt(
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
    _after_lost(tx, lost_run, attempt, now)
    return True


def _after_lost(tx: Transaction, run: Run, attempt: Attempt, now: int) -> None:
    """Lost retry: schedule a new attempt when the policy allows, else the run fails."""
    policy = repo.get_retry_policy(tx, run.id)
    if policy is not None and policy.retry_on_lost and attempt.attempt < policy.max_attempts:
        delay = min(policy.backoff_max_ms, policy.backoff_min_ms * 2 ** min(attempt.attempt - 1, 30))
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
        return
    write_run(
        tx,
        run,
        replace(run, status="failed", finished_at_ms=now),
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


def expire_lease(tx: Transaction, attempt_id: str) -> str:
    """Server-side expiry (lease row locked first): claimed -> release only; starting/running -> lost."""
    lease = get_lease(tx, attempt_id, lock=False)
    if lease is None:
        return "missing"
    run = lock_run(tx, lease.run_id)
    attempt = lock_attempt(tx, attempt_id)
    lease = get_lease(tx, attempt_id, lock=True)
    now = tx.now_ms()
    if lease is None or lease.status != "leased" or lease.expires_at_ms > now:
        return "noop"
    if attempt.status == "claimed":
        _release(tx, lease, "lease_expired", now)
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
        mark_lost(tx, run.id, attempt_id, error_code="LEASE_EXPIRED")
        return "lost"
    _release(tx, lease, "lease_expired", now)
    return "released"


def expired_page(tx: Transaction, limit: int) -> list[str]:
    if not 1 <= limit <= MAX_SCAN_PAGE:
        raise ValidationFailed("page out of range")
    return repo.expired_leases(tx, now=tx.now_ms(), limit=limit)


def retry_due_page(tx: Transaction, limit: int) -> list[str]:
    if not 1 <= limit <= MAX_SCAN_PAGE:
        raise ValidationFailed("page out of range")
    return repo.due_retries(tx, now=tx.now_ms(), limit=limit)


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
        return _verify_fence(rows, fence, tx.now_ms(), ignore_version=True)
    lease, _ = check_fence(tx, fence, ignore_version=True)
    return lease
