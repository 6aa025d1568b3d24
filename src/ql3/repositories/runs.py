"""Runs and their attempts. Only the reads the edges need are here so far; ``application/runs.py``
and the lease code still run their own queries (tests/unit/test_repository_boundary.py)."""

from __future__ import annotations

from ql3.domain.model import Attempt
from ql3.ports.storage import Row, Transaction


def attempt_from_row(row: Row) -> Attempt:
    return Attempt(
        id=row["id"],
        run_id=row["run_id"],
        attempt=int(row["attempt"]),
        status=row["status"],
        executor_type=row["executor_type"],
        worker_id=row["worker_id"],
        pid=row["pid"],
        executor_handle=row["executor_handle"],
        log_artifact_id=row["log_artifact_id"],
        deadline_at_ms=row["deadline_at_ms"],
        callback_token_hash=row["callback_token_hash"],
        callback_sequence=int(row["callback_sequence"]),
        created_at_ms=int(row["created_at_ms"]),
        started_at_ms=row["started_at_ms"],
        finished_at_ms=row["finished_at_ms"],
        exit_code=row["exit_code"],
        error_code=row["error_code"],
    )


def list_attempts(tx: Transaction, run_id: str) -> list[Attempt]:
    """The run's attempts in order (the query reads at most 64)."""
    return [attempt_from_row(row) for row in tx.all("attempt_list", {"run_id": run_id})]
