"""Runs per time bucket by outcome, and busy slots per bucket, over a fixed window ending now: what
the console's overview draws (docs/console.md "Pictures"). Each is one bounded aggregate query."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ql3.domain.errors import ValidationFailed
from ql3.ports.storage import Transaction
from ql3.repositories import stats as store

HOUR_MS: Final = 3_600_000
# range -> (bucket length, number of buckets)
RANGES: Final[dict[str, tuple[int, int]]] = {"24h": (HOUR_MS, 24), "7d": (6 * HOUR_MS, 28)}


@dataclass(frozen=True, slots=True, kw_only=True)
class Bucket:
    start_ms: int
    counts: dict[str, int]
    busy_slots: float  # mean busy slots over the bucket (its elapsed part for the current one)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStats:
    range: str
    bucket_ms: int
    start_ms: int
    end_ms: int
    now_ms: int
    capacity: int
    buckets: list[Bucket]


def window(range_name: str, now_ms: int) -> tuple[int, int, int]:
    """``(start_ms, bucket_ms, buckets)``: whole buckets (UTC-aligned) whose last one holds ``now``."""
    if range_name not in RANGES:
        raise ValidationFailed(f"range is one of {', '.join(RANGES)}", field="range")
    bucket_ms, buckets = RANGES[range_name]
    end_ms = (now_ms // bucket_ms + 1) * bucket_ms
    return end_ms - buckets * bucket_ms, bucket_ms, buckets


def run_stats(tx: Transaction, project_id: str, range_name: str) -> RunStats:
    """Finished runs by outcome and mean busy slots per bucket of the range, with today's capacity."""
    now_ms = tx.now_ms()
    start_ms, bucket_ms, buckets = window(range_name, now_ms)
    counts = store.finished_by_bucket(
        tx, project_id=project_id, start_ms=start_ms, bucket_ms=bucket_ms, buckets=buckets
    )
    busy = store.busy_ms_by_bucket(
        tx, project_id=project_id, start_ms=start_ms, bucket_ms=bucket_ms, buckets=buckets, now_ms=now_ms
    )
    out: list[Bucket] = []
    for i in range(buckets):
        begins = start_ms + i * bucket_ms
        elapsed = max(1, min(bucket_ms, now_ms - begins))
        out.append(
            Bucket(
                start_ms=begins,
                counts={status: n for (index, status), n in sorted(counts.items()) if index == i},
                busy_slots=round(busy.get(i, 0) / elapsed, 3) if now_ms > begins else 0.0,
            )
        )
    return RunStats(
        range=range_name,
        bucket_ms=bucket_ms,
        start_ms=start_ms,
        end_ms=start_ms + buckets * bucket_ms,
        now_ms=now_ms,
        capacity=store.online_slots(tx, now_ms=now_ms),
        buckets=out,
    )
