"""Bounded aggregates of runs for the console's pictures (``storage/sql/stats.sql``)."""

from __future__ import annotations

from ql3.ports.storage import Transaction


def finished_by_bucket(
    tx: Transaction, *, project_id: str, start_ms: int, bucket_ms: int, buckets: int
) -> dict[tuple[int, str], int]:
    """Runs of the project that finished in each bucket of ``[start, start + buckets * bucket)``, by
    outcome: ``{(bucket index, status): count}``. At most ``buckets`` x statuses rows."""
    params = {
        "project_id": project_id,
        "start_ms": start_ms,
        "end_ms": start_ms + buckets * bucket_ms,
        "bucket_ms": bucket_ms,
    }
    return {
        (int(row["bucket"]), str(row["status"])): int(row["n"])
        for row in tx.all("stats_runs_by_bucket", params)
    }


def busy_ms_by_bucket(
    tx: Transaction, *, project_id: str, start_ms: int, bucket_ms: int, buckets: int, now_ms: int
) -> dict[int, int]:
    """Milliseconds of the project's run time (started to finished, or to ``now_ms`` while running)
    inside each bucket: ``{bucket index: ms}``. At most ``buckets`` rows."""
    params = {
        "project_id": project_id,
        "start_ms": start_ms,
        "end_ms": start_ms + buckets * bucket_ms,
        "bucket_ms": bucket_ms,
        "buckets": buckets,
        "now_ms": now_ms,
    }
    return {int(row["bucket"]): int(row["busy_ms"]) for row in tx.all("stats_busy_by_bucket", params)}


def online_slots(tx: Transaction, *, now_ms: int) -> int:
    """The slots of the workers online now (their session lease not run out)."""
    row = tx.one("stats_capacity", {"now_ms": now_ms})
    return int(row["slots"]) if row is not None else 0
