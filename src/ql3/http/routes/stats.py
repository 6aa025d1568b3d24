"""Aggregates for the console's pictures: runs per hour by outcome, busy slots."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel

from ql3.application import auth, stats
from ql3.http.auth import DbDep, PrincipalDep
from ql3.ports.storage import Transaction

router = APIRouter(prefix="/api/v1/projects/{project}/stats", tags=["stats"])


class BucketOut(BaseModel):
    start_ms: int
    counts: dict[str, int]
    busy_slots: float


class RunStatsOut(BaseModel):
    range: str
    bucket_ms: int
    start_ms: int
    end_ms: int
    now_ms: int
    capacity: int
    buckets: list[BucketOut]


@router.get("/runs", response_model=RunStatsOut)
def run_stats(
    project: str,
    db: DbDep,
    principal: PrincipalDep,
    range_: Annotated[
        Literal["24h", "7d"],
        Query(alias="range", description="24h: 24 hourly buckets; 7d: 28 buckets of 6 hours"),
    ] = "24h",
) -> RunStatsOut:
    """Finished runs per bucket by outcome (``counts``), the mean busy slots of the project's runs per
    bucket (``busy_slots``, from their start and end times) and the slots of the workers online now
    (``capacity``). Buckets are UTC-aligned; the last one holds now. One bounded query each."""

    def unit(tx: Transaction) -> RunStatsOut:
        found = auth.authorize(tx, principal, project, "run.read")
        got = stats.run_stats(tx, found.id, range_)
        return RunStatsOut(
            range=got.range,
            bucket_ms=got.bucket_ms,
            start_ms=got.start_ms,
            end_ms=got.end_ms,
            now_ms=got.now_ms,
            capacity=got.capacity,
            buckets=[
                BucketOut(start_ms=b.start_ms, counts=b.counts, busy_slots=b.busy_slots) for b in got.buckets
            ],
        )

    return db.transaction(unit, write=False)
