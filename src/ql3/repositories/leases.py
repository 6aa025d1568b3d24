"""Run leases (the ``run_leases`` table), the claim's statements and its PostgreSQL one-statement form
(``ql3_claim``), the worker's active-lease counter the leases move, and the lost-retry cursor
(``run_retry_policies``) with the expiry and retry pages (``application/lease_expiry.py``).

Every lease write is a compare-and-set the SQL states on the version the caller read, and answers
whether it applied; the fences themselves (token digest, session, generation, version, status, slot
accounting) are decided by ``application/leases.py`` and the claims, results and expiry beside it
(``lease_claims``, ``lease_results``, ``lease_expiry``) under the row locks they take, in their own order.
Times are passed in: a use case reads ``tx.now_ms()`` once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final, Literal, get_args

from ql3.domain.model import Attempt, Run
from ql3.ports.storage import CommitsWithStatement, Row, Transaction
from ql3.repositories.mapping import one_of, opt_int
from ql3.repositories.runs import attempt_from_row, run_from_row
from ql3.repositories.workers import WorkerRecord, worker_from_row

LeaseStatus = Literal["leased", "released", "completed"]
LEASE_STATUSES: Final[tuple[LeaseStatus, ...]] = ("leased", "released", "completed")
# What ql3_claim (PostgreSQL migration 0010) answers in its ``claim_status`` column.
ClaimFunctionStatus = Literal[
    "claimed",
    "not_eligible",
    "worker_unavailable",
    "capacity_exhausted",
    "leased",
    "reacquire",
    "run_missing",
    "attempt_missing",
    "run_conflict",
    "attempt_conflict",
]
CLAIM_FUNCTION_STATUSES: Final[tuple[ClaimFunctionStatus, ...]] = get_args(ClaimFunctionStatus)
RetrySafety = Literal["unknown", "idempotent", "deduplicated"]
RETRY_SAFETIES: Final[tuple[RetrySafety, ...]] = ("unknown", "idempotent", "deduplicated")


@dataclass(frozen=True, slots=True, kw_only=True)
class Lease:
    """One run lease. Only the digest of its token is stored; ``version`` moves with every write."""

    attempt_id: str
    run_id: str
    status: LeaseStatus
    version: int
    lease_generation: int
    worker_id: str
    worker_session_id: str
    worker_generation: int
    lease_token_digest: str
    acquired_at_ms: int
    expires_at_ms: int


def lease_from_row(row: Row) -> Lease:
    return Lease(
        attempt_id=row["attempt_id"],
        run_id=row["run_id"],
        status=one_of(row["status"], LEASE_STATUSES, "run_leases.status"),
        version=int(row["version"]),
        lease_generation=int(row["lease_generation"]),
        worker_id=row["worker_id"],
        worker_session_id=row["worker_session_id"],
        worker_generation=int(row["worker_generation"]),
        lease_token_digest=row["lease_token_digest"],
        acquired_at_ms=int(row["acquired_at_ms"]),
        expires_at_ms=int(row["expires_at_ms"]),
    )


def get_lease(tx: Transaction, attempt_id: str) -> Lease | None:
    """The attempt's lease, read without a row lock."""
    row = tx.one("lease_get", {"attempt_id": attempt_id})
    return None if row is None else lease_from_row(row)


def lock_lease(tx: Transaction, attempt_id: str) -> Lease | None:
    """The attempt's lease under the row lock its transaction holds to its end (lock order: Run ->
    Attempt -> worker -> lease, the caller's)."""
    row = tx.one("lease_lock", {"attempt_id": attempt_id})
    return None if row is None else lease_from_row(row)


@dataclass(frozen=True, slots=True, kw_only=True)
class FenceRows:
    """What a lease holder's result is checked against, read in one statement (``fence_lock``): the
    Run and the Attempt (None when not asked for, or missing), the attempt's lease, the worker, and the
    pinned revision's spec when asked (None when missing)."""

    run: Run | None
    attempt: Attempt | None
    lease: Lease | None
    worker: WorkerRecord | None
    revision_spec: dict[str, Any] | None


def _json_row(value: Any) -> Row | None:
    """A row the statement answered as JSON (PostgreSQL's ``ql3_fence_rows``: ``to_jsonb``, already
    decoded; text if a driver leaves it undecoded)."""
    if value is None:
        return None
    decoded: Row = value if isinstance(value, dict) else json.loads(value)
    return decoded


# The columns SQLite's ``fence_lock`` answers for each table, under its prefix (storage/sqlite/locks.sql).
_FENCE_COLUMNS: Final[dict[str, tuple[tuple[str, str], ...]]] = {
    prefix: tuple((name, prefix + name) for name in names.split())
    for prefix, names in {
        "r__": "id project_id task_id task_revision trigger_type status version event_sequence priority"
        " idempotency_key request_id scheduled_for_ms created_at_ms queued_at_ms started_at_ms"
        " finished_at_ms cancel_requested_at_ms cancel_reason error_code exit_code",
        "a__": "id run_id attempt status executor_type worker_id pid executor_handle log_artifact_id"
        " deadline_at_ms callback_token_hash callback_sequence created_at_ms started_at_ms finished_at_ms"
        " exit_code error_code",
        "l__": "attempt_id run_id status version lease_generation worker_id worker_session_id"
        " worker_generation lease_token_digest acquired_at_ms expires_at_ms",
        "w__": "worker_id session_id generation status version capabilities_json capabilities_hash"
        " max_concurrent_runs active_leases session_lease_ms last_heartbeat_at_ms lease_expires_at_ms",
    }.items()
}


def _prefixed_row(row: Row, prefix: str, key: str) -> Row | None:
    """The columns of one table a statement answered under ``prefix`` (SQLite's ``fence_lock``: plain
    columns named ``r__id``, ``a__status``...), without the prefix; None when its ``key`` is NULL (the
    row is missing, or was not asked for)."""
    if row[prefix + key] is None:
        return None
    return {name: row[column] for name, column in _FENCE_COLUMNS[prefix]}


def _fence_parts(row: Row) -> tuple[Row | None, Row | None, Row | None, Row | None]:
    """The Run, Attempt, lease and worker rows of a ``fence_lock`` answer, in either dialect's form."""
    if "run_row" in row:
        return (
            _json_row(row["run_row"]),
            _json_row(row["attempt_row"]),
            _json_row(row["lease_row"]),
            _json_row(row["worker_row"]),
        )
    return (
        _prefixed_row(row, "r__", "id"),
        _prefixed_row(row, "a__", "id"),
        _prefixed_row(row, "l__", "attempt_id"),
        _prefixed_row(row, "w__", "worker_id"),
    )


def lock_fence_rows(
    tx: Transaction,
    *,
    run_id: str | None,
    attempt_id: str,
    worker_id: str,
    with_revision: bool = False,
    then_commit: bool = False,
) -> FenceRows:
    """In one statement, in the lock order Run -> Attempt -> lease (each under the row lock its
    transaction holds to its end; on SQLite BEGIN IMMEDIATE serialises writers): the Run and the
    Attempt when ``run_id`` is given, the attempt's lease, then the worker read without a lock, and
    with ``with_revision`` the spec of the Run's pinned task revision. Only reads: the caller makes
    every check. ``then_commit`` (PostgreSQL): the read is the unit's only statement and commits in
    the same round trip (``one_then_commit``), for a caller that writes nothing after it."""
    params = {
        "run_id": run_id,
        "attempt_id": attempt_id,
        "worker_id": worker_id,
        "with_revision": with_revision,
    }
    if then_commit and isinstance(tx, CommitsWithStatement):
        row = tx.one_then_commit("fence_lock", params)
    else:
        row = tx.one("fence_lock", params)
    assert row is not None  # one row whatever exists
    run, attempt, lease, worker = _fence_parts(row)
    spec = row["revision_spec"]
    return FenceRows(
        run=None if run is None else run_from_row(run),
        attempt=None if attempt is None else attempt_from_row(attempt),
        lease=None if lease is None else lease_from_row(lease),
        worker=None if worker is None else worker_from_row(worker),
        revision_spec=None if spec is None else json.loads(spec),
    )


def adjust_active_leases(tx: Transaction, worker_id: str, delta: int) -> None:
    """Move the worker's ``active_leases`` counter by ``delta``; the caller does it in the transaction
    that changed the lease, after the lease statement that applied. On SQLite that statement already
    moved it (the triggers of ``run_leases``, SQLite migration 0010), so there is nothing to write."""
    if tx.dialect == "sqlite":
        return
    tx.run("worker_leases_adjust", {"worker_id": worker_id, "delta": delta})


def renew_lease(tx: Transaction, current: Lease, *, expires_at_ms: int, now: int) -> bool:
    """Version +1 and a new expiry, compare-and-set on the version of ``current`` while still leased;
    False when either moved."""
    count = tx.run(
        "lease_renew",
        {
            "attempt_id": current.attempt_id,
            "expected_version": current.version,
            "expires_at_ms": expires_at_ms,
            "now": now,
        },
    )
    return count == 1


@dataclass(frozen=True, slots=True, kw_only=True)
class CompletedLease:
    """A completion's lease write. ``slot_freed``: the statement itself also took one from the
    holder's active-lease counter (PostgreSQL's form; SQLite's trigger); otherwise the caller does, in
    the same transaction."""

    slot_freed: bool


def complete_lease(tx: Transaction, current: Lease, *, now: int) -> CompletedLease | None:
    """``leased -> completed`` (version +1), compare-and-set on the version of ``current``; None when
    it moved or the lease is no longer leased (and then no slot moved either)."""
    row = tx.one(
        "lease_complete", {"attempt_id": current.attempt_id, "expected_version": current.version, "now": now}
    )
    return None if row is None else CompletedLease(slot_freed=bool(int(row["slot_freed"])))


def release_lease(tx: Transaction, current: Lease, *, reason: str, now: int) -> bool:
    """``leased -> released`` with ``reason`` (version +1), compare-and-set on the version of
    ``current``; False when it moved or the lease is no longer leased."""
    count = tx.run(
        "lease_release",
        {"attempt_id": current.attempt_id, "expected_version": current.version, "reason": reason, "now": now},
    )
    return count == 1


# -- the claim, statement by statement (SQLite) ----------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimedAttempt:
    """The attempt a claim locked, with the id of its run's latest attempt read in the same statement."""

    attempt: Attempt
    latest_attempt_id: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimWrite:
    """The lease row a claim wrote. ``slot_counted``: the statement itself also moved the worker's
    active-lease counter (PostgreSQL's form does, and SQLite's triggers); when False the caller moves it."""

    lease: Lease
    slot_counted: bool


def lock_attempt_with_latest(tx: Transaction, attempt_id: str) -> ClaimedAttempt | None:
    """The attempt under its row lock, and whether it is still its run's latest, in one statement."""
    row = tx.one("attempt_lock_with_latest", {"id": attempt_id})
    if row is None:
        return None
    latest = row["latest_attempt_id"]
    return ClaimedAttempt(
        attempt=attempt_from_row(row), latest_attempt_id=None if latest is None else str(latest)
    )


def _claim_write(row: Row | None) -> ClaimWrite | None:
    if row is None:
        return None
    return ClaimWrite(lease=lease_from_row(row), slot_counted=bool(int(row["slot_counted"])))


def insert_claim(
    tx: Transaction,
    *,
    attempt_id: str,
    run_id: str,
    worker_id: str,
    session_id: str,
    worker_generation: int,
    lease_token_digest: str,
    expires_at_ms: int,
    now: int,
) -> ClaimWrite | None:
    """The attempt's first lease (generation 1, version 0); None, writing nothing, when the attempt
    already has a lease row."""
    params = {
        "attempt_id": attempt_id,
        "run_id": run_id,
        "worker_id": worker_id,
        "worker_session_id": session_id,
        "worker_generation": worker_generation,
        "expires_at_ms": expires_at_ms,
        "now": now,
        "lease_token_digest": lease_token_digest,
    }
    return _claim_write(tx.one("lease_insert_claim", params))


def reacquire_claim(
    tx: Transaction,
    current: Lease,
    *,
    worker_id: str,
    session_id: str,
    worker_generation: int,
    lease_token_digest: str,
    expires_at_ms: int,
    now: int,
) -> ClaimWrite | None:
    """The attempt's lease row taken over by a new holder (generation +1, version +1, leased),
    compare-and-set on the version of ``current``; None when it moved. The row keeps its run."""
    params = {
        "attempt_id": current.attempt_id,
        "worker_id": worker_id,
        "worker_session_id": session_id,
        "worker_generation": worker_generation,
        "expires_at_ms": expires_at_ms,
        "now": now,
        "lease_token_digest": lease_token_digest,
        "expected_version": current.version,
    }
    return _claim_write(tx.one("lease_reacquire_claim", params))


# -- the claim in one statement (PostgreSQL) -------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimAnswer:
    """What one ``ql3_claim`` call answered: the lease when ``claimed``; for ``reacquire`` the lease
    generation the caller derives its token for before it calls again."""

    status: ClaimFunctionStatus
    lease: Lease | None
    lease_generation: int | None


def claim_in_one_statement(
    tx: Transaction,
    *,
    run_id: str,
    attempt_id: str,
    worker_id: str,
    session_id: str,
    worker_generation: int,
    lease_ms: int,
    generation: int,
    lease_token_digest: str,
    event_id: str,
    payload_json: str,
    last: bool = False,
) -> ClaimAnswer:
    """PostgreSQL only: one call of ``ql3_claim`` (migration 0010) for lease generation
    ``generation``, whose token digest the caller derived; ``payload_json`` is the
    ``run.dispatching`` event's payload, ``event_id`` its id. ``last``: the claim is the unit's last
    statement, sent with its COMMIT (``ql3_claim_or_raise``, migration 0015: a CAS conflict raises
    Conflict instead of answering, so the COMMIT cannot keep a half claim)."""
    params = {
        "run_id": run_id,
        "attempt_id": attempt_id,
        "worker_id": worker_id,
        "session_id": session_id,
        "worker_generation": worker_generation,
        "lease_ms": lease_ms,
        "generation": generation,
        "lease_token_digest": lease_token_digest,
        "event_id": event_id,
        "payload_json": payload_json,
    }
    if last and isinstance(tx, CommitsWithStatement):
        row = tx.one_then_commit("lease_claim_last", params)
    else:
        row = tx.one("lease_claim", params)
    assert row is not None  # a function call always answers one row
    status = one_of(row["claim_status"], CLAIM_FUNCTION_STATUSES, "ql3_claim.claim_status")
    return ClaimAnswer(
        status=status,
        lease=lease_from_row(row) if status == "claimed" else None,
        lease_generation=opt_int(row["lease_generation"]),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchClaim:
    """One element of a ``ql3_claim_batch`` call: the arguments of one ``ql3_claim``."""

    run_id: str
    attempt_id: str
    worker_id: str
    session_id: str
    worker_generation: int
    generation: int
    lease_token_digest: str
    event_id: str
    payload_json: str


def claim_batch_in_one_statement(
    tx: Transaction, claims: list[BatchClaim], *, lease_ms: int
) -> list[ClaimAnswer]:
    """PostgreSQL only: one call of ``ql3_claim_batch`` (migration 0013), the claims in this order
    after the rows of all of them were locked level by level; one answer per claim, in order."""
    payload = json.dumps(
        [
            {
                "run_id": c.run_id,
                "attempt_id": c.attempt_id,
                "worker_id": c.worker_id,
                "session_id": c.session_id,
                "worker_generation": c.worker_generation,
                "generation": c.generation,
                "token_digest": c.lease_token_digest,
                "event_id": c.event_id,
                "payload_json": c.payload_json,
            }
            for c in claims
        ],
        separators=(",", ":"),
    )
    rows = tx.all("lease_claim_batch", {"claims_json": payload, "lease_ms": lease_ms})
    if [int(row["ord"]) for row in rows] != list(range(len(claims))):
        raise ValueError("ql3_claim_batch answered another number or order of claims")
    answers: list[ClaimAnswer] = []
    for row in rows:
        status = one_of(row["claim_status"], CLAIM_FUNCTION_STATUSES, "ql3_claim_batch.claim_status")
        answers.append(
            ClaimAnswer(
                status=status,
                lease=lease_from_row(row) if status == "claimed" else None,
                lease_generation=opt_int(row["lease_generation"]),
            )
        )
    return answers


# -- a lease holder's result in one statement (PostgreSQL) ----------------------------------------

ResultKind = Literal["starting", "running", "complete"]
ResultFunctionAnswer = Literal["starting", "running", "applied", "defer"]
RESULT_FUNCTION_ANSWERS: Final[tuple[ResultFunctionAnswer, ...]] = get_args(ResultFunctionAnswer)


@dataclass(frozen=True, slots=True, kw_only=True)
class ResultAnswer:
    """What one ``ql3_lease_result`` call answered: ``defer`` (nothing written), or the result it
    wrote, with the lease as it locked it, for a completion the outcome, and the channels it sent
    ``pg_notify`` on."""

    answer: ResultFunctionAnswer
    outcome: str | None
    lease: Lease | None
    notified: tuple[str, ...]


def result_in_one_statement(
    tx: Transaction,
    *,
    kind: ResultKind,
    run_id: str,
    attempt_id: str,
    worker_id: str,
    session_id: str,
    worker_generation: int,
    lease_generation: int,
    token_digest: str,
    args: dict[str, Any],
    event_ids: list[str],
    channel: str,
) -> ResultAnswer:
    """PostgreSQL only: one call of ``ql3_lease_result`` (migration 0014) as the unit's last
    statement, sent with its COMMIT (and with BEGIN when it is also the first: ``one_then_commit``);
    ``channel`` is notified when the write wakes a loop."""
    params = {
        "kind": kind,
        "run_id": run_id,
        "attempt_id": attempt_id,
        "worker_id": worker_id,
        "session_id": session_id,
        "worker_generation": worker_generation,
        "lease_generation": lease_generation,
        "token_digest": token_digest,
        "args_json": json.dumps(args, separators=(",", ":")),
        "event_ids": event_ids,
        "channel": channel,
    }
    if not isinstance(tx, CommitsWithStatement):
        # A transaction that cannot send the call with its COMMIT (a wrapper of the port) takes the
        # statement-by-statement path, as on SQLite.
        return ResultAnswer(answer="defer", outcome=None, lease=None, notified=())
    row = tx.one_then_commit("lease_result", params)
    assert row is not None  # a function call always answers one row
    answer = one_of(row["answer"], RESULT_FUNCTION_ANSWERS, "ql3_lease_result.answer")
    lease = _json_row(row["lease_row"])
    return ResultAnswer(
        answer=answer,
        outcome=None if row["outcome"] is None else str(row["outcome"]),
        lease=None if lease is None else lease_from_row(lease),
        notified=tuple(str(channel) for channel in row["notified"] or ()),
    )


# -- expiry and lost retry -------------------------------------------------------------------------


def expired_leases(tx: Transaction, *, now: int, limit: int) -> list[str]:
    """The attempt ids of leases still ``leased`` whose expiry is at or before ``now``, oldest expiry
    first; at most ``limit``."""
    return [str(row["attempt_id"]) for row in tx.all("lease_expired_page", {"now": now, "limit": limit})]


def defer_lease(tx: Transaction, current: Lease, *, expires_at_ms: int, now: int) -> bool:
    """A new expiry for a live lease, its version kept (the holder's next renewal still applies),
    compare-and-set on the version of ``current``; False when it moved."""
    count = tx.run(
        "lease_defer",
        {
            "attempt_id": current.attempt_id,
            "expected_version": current.version,
            "expires_at_ms": expires_at_ms,
            "now": now,
        },
    )
    return count == 1


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """A run's lost-retry policy, fixed at creation, and its cursor ``next_retry_at_ms`` (None when
    no retry is scheduled); ``version`` moves with every cursor write."""

    run_id: str
    max_attempts: int
    retry_on_lost: bool
    safety: RetrySafety
    backoff_min_ms: int
    backoff_max_ms: int
    next_retry_at_ms: int | None
    version: int


def get_retry_policy(tx: Transaction, run_id: str) -> RetryPolicy | None:
    row = tx.one("retry_policy_get", {"run_id": run_id})
    if row is None:
        return None
    return RetryPolicy(
        run_id=row["run_id"],
        max_attempts=int(row["max_attempts"]),
        retry_on_lost=bool(row["retry_on_lost"]),
        safety=one_of(row["safety"], RETRY_SAFETIES, "run_retry_policies.safety"),
        backoff_min_ms=int(row["backoff_min_ms"]),
        backoff_max_ms=int(row["backoff_max_ms"]),
        next_retry_at_ms=opt_int(row["next_retry_at_ms"]),
        version=int(row["version"]),
    )


def schedule_retry(tx: Transaction, current: RetryPolicy, *, next_retry_at_ms: int | None) -> bool:
    """Set (or clear, with None) the retry cursor, compare-and-set on the version of ``current``;
    False when it moved."""
    count = tx.run(
        "retry_policy_schedule",
        {"run_id": current.run_id, "expected_version": current.version, "next_retry_at_ms": next_retry_at_ms},
    )
    return count == 1


def due_retries(tx: Transaction, *, now: int, limit: int) -> list[str]:
    """The run ids whose retry cursor is at or before ``now``, earliest first; at most ``limit``."""
    return [str(row["run_id"]) for row in tx.all("retry_due_page", {"now": now, "limit": limit})]
