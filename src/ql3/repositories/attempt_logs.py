"""Shipped attempt logs: the head row of each attempt's log and its contiguous chunks
(application/attempt_logs.py holds the append and read rules)."""

from __future__ import annotations

from dataclasses import dataclass

from ql3.domain.attempt_logs import LogHead
from ql3.ports.storage import Row, Transaction


@dataclass(frozen=True, slots=True, kw_only=True)
class LogLease:
    """Who holds (or last held) the lease of the attempt whose log is shipped."""

    worker_id: str
    worker_session_id: str
    worker_generation: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LogChunk:
    start_offset: int
    data: bytes


def _head(row: Row) -> LogHead:
    return LogHead(
        attempt_id=str(row["attempt_id"]),
        stored_bytes=int(row["stored_bytes"]),
        cap_bytes=int(row["cap_bytes"]),
        truncated=row["truncated_at_ms"] is not None,
        closed=row["closed_at_ms"] is not None,
    )


def get_log_lease(tx: Transaction, attempt_id: str) -> LogLease | None:
    row = tx.one("attempt_log_lease", {"attempt_id": attempt_id})
    if row is None:
        return None
    return LogLease(
        worker_id=row["worker_id"],
        worker_session_id=row["worker_session_id"],
        worker_generation=int(row["worker_generation"]),
    )


def insert_log_if_absent(tx: Transaction, *, attempt_id: str, cap_bytes: int, now: int) -> None:
    """The head row at length 0 with its quota; an existing head (and its quota) is kept."""
    tx.run("attempt_log_create", {"attempt_id": attempt_id, "cap_bytes": cap_bytes, "now": now})


def get_log(tx: Transaction, attempt_id: str) -> LogHead | None:
    row = tx.one("attempt_log_head", {"attempt_id": attempt_id})
    return None if row is None else _head(row)


def lock_log(tx: Transaction, attempt_id: str) -> LogHead | None:
    """The head, locked until the transaction ends: the appends of one attempt run one at a time."""
    row = tx.one("attempt_log_lock", {"attempt_id": attempt_id})
    return None if row is None else _head(row)


def get_chunk_at(tx: Transaction, attempt_id: str, start_offset: int) -> bytes | None:
    row = tx.one("attempt_log_chunk_at", {"attempt_id": attempt_id, "start_offset": start_offset})
    return None if row is None else bytes(row["data"])


def insert_chunk(tx: Transaction, *, attempt_id: str, start_offset: int, data: bytes, now: int) -> None:
    tx.run(
        "attempt_log_chunk_insert",
        {"attempt_id": attempt_id, "start_offset": start_offset, "data": data, "now": now},
    )


def update_log_length(
    tx: Transaction,
    *,
    attempt_id: str,
    stored_bytes: int,
    truncated_at_ms: int | None,
    expected_bytes: int,
    now: int,
) -> bool:
    """Move the stored end from ``expected_bytes`` to ``stored_bytes`` (the CAS result)."""
    params = {
        "attempt_id": attempt_id,
        "stored_bytes": stored_bytes,
        "truncated_at_ms": truncated_at_ms,
        "expected_bytes": expected_bytes,
        "now": now,
    }
    return tx.run("attempt_log_advance", params) == 1


def close_log(tx: Transaction, attempt_id: str, now: int) -> None:
    """Mark the log complete (a no-op when it is already closed)."""
    tx.run("attempt_log_close", {"attempt_id": attempt_id, "now": now})


def list_chunks(tx: Transaction, *, attempt_id: str, from_offset: int, limit: int) -> list[LogChunk]:
    """From the chunk holding ``from_offset`` on, in offset order, at most ``limit``."""
    params = {"attempt_id": attempt_id, "from_offset": from_offset, "limit": limit}
    return [
        LogChunk(start_offset=int(r["start_offset"]), data=bytes(r["data"]))
        for r in tx.all("attempt_log_page", params)
    ]
