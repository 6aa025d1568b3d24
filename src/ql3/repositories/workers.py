"""Worker sessions (the ``workers`` table): registration, the session CAS, and the pages placement,
management and waiting reasons read (``application/workers.py``, ``cluster/pull.py``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final, Literal

from ql3.domain.workers import WorkerSnapshot, stored_capabilities
from ql3.ports.storage import CommitsWithStatement, Row, Transaction
from ql3.repositories.mapping import one_of

WorkerStatus = Literal["online", "draining", "offline"]
WORKER_STATUSES: Final[tuple[WorkerStatus, ...]] = ("online", "draining", "offline")


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerRecord:
    """One worker row. ``capabilities`` is the stored JSON object as written at registration;
    ``active_leases`` counts its leases in status ``leased`` (kept in the leases' transactions)."""

    worker_id: str
    session_id: str
    generation: int
    version: int
    status: WorkerStatus
    capabilities: dict[str, Any]
    capabilities_hash: str
    max_concurrent_runs: int
    active_leases: int
    session_lease_ms: int
    last_heartbeat_at_ms: int
    lease_expires_at_ms: int


def worker_from_row(row: Row) -> WorkerRecord:
    capabilities: dict[str, Any] = json.loads(row["capabilities_json"])
    return WorkerRecord(
        worker_id=row["worker_id"],
        session_id=row["session_id"],
        generation=int(row["generation"]),
        version=int(row["version"]),
        status=one_of(row["status"], WORKER_STATUSES, "workers.status"),
        capabilities=capabilities,
        capabilities_hash=row["capabilities_hash"],
        max_concurrent_runs=int(row["max_concurrent_runs"]),
        active_leases=int(row["active_leases"]),
        session_lease_ms=int(row["session_lease_ms"]),
        last_heartbeat_at_ms=int(row["last_heartbeat_at_ms"]),
        lease_expires_at_ms=int(row["lease_expires_at_ms"]),
    )


def get_worker(tx: Transaction, worker_id: str) -> WorkerRecord | None:
    row = tx.one("worker_get", {"worker_id": worker_id})
    return None if row is None else worker_from_row(row)


def lock_worker(tx: Transaction, worker_id: str) -> WorkerRecord | None:
    """The worker read under the row lock its transaction holds to its end."""
    row = tx.one("worker_lock", {"worker_id": worker_id})
    return None if row is None else worker_from_row(row)


def list_workers(tx: Transaction, *, after: str, limit: int) -> list[WorkerRecord]:
    """Registered workers of every status by id, after ``after``."""
    return [worker_from_row(row) for row in tx.all("worker_list", {"after": after, "limit": limit})]


def _session_params(
    *,
    worker_id: str,
    session_id: str,
    capabilities_json: str,
    capabilities_hash: str,
    max_concurrent_runs: int,
    session_lease_ms: int,
    now: int,
) -> dict[str, Any]:
    return {
        "worker_id": worker_id,
        "session_id": session_id,
        "capabilities_json": capabilities_json,
        "capabilities_hash": capabilities_hash,
        "max_concurrent_runs": max_concurrent_runs,
        "session_lease_ms": session_lease_ms,
        "lease_expires_at_ms": now + session_lease_ms,
        "now": now,
    }


def insert_worker(
    tx: Transaction,
    *,
    worker_id: str,
    session_id: str,
    capabilities_json: str,
    capabilities_hash: str,
    max_concurrent_runs: int,
    session_lease_ms: int,
    now: int,
) -> bool:
    """Generation 1, online, its session lease from ``now``; False when the worker id is taken."""
    params = _session_params(
        worker_id=worker_id,
        session_id=session_id,
        capabilities_json=capabilities_json,
        capabilities_hash=capabilities_hash,
        max_concurrent_runs=max_concurrent_runs,
        session_lease_ms=session_lease_ms,
        now=now,
    )
    return tx.run("worker_insert", params) == 1


def replace_session(
    tx: Transaction,
    *,
    worker_id: str,
    session_id: str,
    capabilities_json: str,
    capabilities_hash: str,
    max_concurrent_runs: int,
    session_lease_ms: int,
    now: int,
    expected_version: int,
) -> bool:
    """A new session bumps the generation (fencing all the old one held); compare-and-set on the
    version the caller read, False when it moved."""
    params = _session_params(
        worker_id=worker_id,
        session_id=session_id,
        capabilities_json=capabilities_json,
        capabilities_hash=capabilities_hash,
        max_concurrent_runs=max_concurrent_runs,
        session_lease_ms=session_lease_ms,
        now=now,
    )
    return tx.run("worker_replace_session", {**params, "expected_version": expected_version}) == 1


def update_session(
    tx: Transaction,
    current: WorkerRecord,
    *,
    session_id: str,
    generation: int,
    status: WorkerStatus,
    last_heartbeat_at_ms: int,
    lease_expires_at_ms: int,
    now: int,
) -> bool:
    """Status and liveness of the session, fenced on its session id, generation and the version of
    ``current``; False when any of them moved."""
    count = tx.run(
        "worker_cas",
        {
            "worker_id": current.worker_id,
            "session_id": session_id,
            "generation": generation,
            "expected_version": current.version,
            "status": status,
            "last_heartbeat_at_ms": last_heartbeat_at_ms,
            "lease_expires_at_ms": lease_expires_at_ms,
            "now": now,
        },
    )
    return count == 1


def _snapshot(row: Row) -> WorkerSnapshot:
    return WorkerSnapshot(
        worker_id=row["worker_id"],
        session_id=row["session_id"],
        generation=int(row["generation"]),
        capabilities=stored_capabilities(row["capabilities_json"]),
        free_slots=max(0, int(row["max_concurrent_runs"]) - int(row["active_leases"])),
    )


def _read(tx: Transaction, query: str, params: dict[str, Any], last: bool) -> list[Row]:
    """``last``: the unit's last statement, sent with its COMMIT where the database can
    (PostgreSQL, ``CommitsWithStatement``)."""
    if last and isinstance(tx, CommitsWithStatement):
        return tx.all_then_commit(query, params)
    return tx.all(query, params)


def eligible_workers(tx: Transaction, *, after: str, limit: int, last: bool = False) -> list[WorkerSnapshot]:
    """Online workers with a live session lease (at the transaction's clock), keyset by worker id."""
    found = _read(tx, "worker_snapshot_page", {"now": tx.now_ms(), "after": after, "limit": limit}, last)
    return [_snapshot(row) for row in found]


def eligible_worker(tx: Transaction, worker_id: str, *, last: bool = False) -> list[WorkerSnapshot]:
    """The one named worker if it is online with a live session lease, else nothing."""
    found = _read(tx, "worker_snapshot_one", {"now": tx.now_ms(), "worker_id": worker_id}, last)
    return [_snapshot(row) for row in found]


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveLeaseRef:
    """One live (``leased``) run lease a worker holds: its attempt and its token digest."""

    attempt_id: str
    lease_token_digest: str


def live_leases(tx: Transaction, worker_id: str, *, after: str, limit: int) -> list[LiveLeaseRef]:
    """The worker's live leases by attempt id, after ``after`` (index run_leases_worker)."""
    found = tx.all("worker_live_leases", {"worker_id": worker_id, "after": after, "limit": limit})
    return [
        LiveLeaseRef(attempt_id=str(row["attempt_id"]), lease_token_digest=str(row["lease_token_digest"]))
        for row in found
    ]
