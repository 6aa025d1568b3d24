"""Claiming a run: a fenced lease (generation +1) and ``queued -> dispatching`` in one transaction, for
one claim or a batch (docs/dispatch.md; the fence itself is ``leases``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Final, Literal

from ql3.application import leases
from ql3.application.runs import (
    AttemptChange,
    EventSpec,
    event_payload_json,
    lock_run,
    write_run,
)
from ql3.domain import leases as lease_rules
from ql3.domain.errors import Conflict, NotFound, RunVersionConflict, ValidationFailed
from ql3.domain.ids import new_id
from ql3.ports.storage import Transaction
from ql3.repositories import leases as repo
from ql3.repositories import workers as worker_repo
from ql3.repositories.leases import Lease

RunClaimStatus = Literal["claimed", "leased", "not_eligible", "worker_unavailable", "capacity_exhausted"]


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
        lease_token_digest=leases.lease_digest(token_for_generation(1)),
        expires_at_ms=now + lease_ms,
        now=now,
    )
    if written is None:
        existing = leases.get_lease(tx, attempt_id, lock=True)
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
            lease_token_digest=leases.lease_digest(token_for_generation(generation)),
            expires_at_ms=now + lease_ms,
            now=now,
        )
        if written is None:
            return RunClaim(status="leased")
        if existing.status == "leased":
            # An expired lease that the expiry loop has not ended yet: its holder's slot ends with it.
            leases.adjust_slots(tx, existing.worker_id, -1)
    assert written is not None
    if not written.slot_counted:
        leases.adjust_slots(tx, worker_id, +1)
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
        lease_token_digest=leases.lease_digest(request.token_for_generation(generation)),
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
            lease_token_digest=leases.lease_digest(token_for_generation(generation)),
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
