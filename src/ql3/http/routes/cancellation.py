"""Cancellation: request a cancel, and the low-sensitivity management surface (docs/contracts.md §9).

``inspect``, ``summary`` and ``blocked`` are read-only; ``cancel`` and ``rearm`` need ``run.stop``.
No response carries a lease owner, a token or its digest, a handle, a pid or a command.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from ql3.application import auth, cancellation, cancellation_management, runs
from ql3.domain.cancellation import MAX_REARM_DELAY_MS, MIN_REARM_DELAY_MS, MUTATION_ID_PATTERN
from ql3.domain.errors import NotFound
from ql3.domain.ids import is_id
from ql3.http.auth import DbDep, PrincipalDep
from ql3.http.dto import Body, RunOut, integer_schema, run_out
from ql3.ports.storage import Transaction

router = APIRouter(prefix="/api/v1/projects/{project}", tags=["cancellation"])

# Shapes are the §6 ones (camelCase); optional facts are absent, not null (``exclude_unset``).
_EXCLUDE_UNSET: Any = {"response_model_exclude_unset": True}


class CancelOut(BaseModel):
    """``requested``: the intent is committed now; ``already_requested`` / ``already_terminal``: nothing
    was written."""

    result: Literal["requested", "already_requested", "already_terminal"]
    run: RunOut


class DispatchOut(BaseModel):
    attemptId: str
    status: str
    version: int
    dispatchCount: int
    nextAttemptAtMs: int | None = None
    leaseExpiresAtMs: int | None = None
    lastResult: str | None = None
    lastDispatchedAtMs: int | None = None
    createdAtMs: int
    updatedAtMs: int


class InspectOut(BaseModel):
    runStatus: str
    runVersion: int
    eventSequence: int
    cancelRequestedAtMs: int | None = None
    cancelReason: str | None = None
    operatorAction: Literal["rearm", "wait", "none"]
    dispatch: DispatchOut | None


class RearmIn(Body):
    mutation_id: str = Field(json_schema_extra={"pattern": MUTATION_ID_PATTERN})
    expected_dispatch_version: int
    expected_last_result: str
    retry_delay_ms: Annotated[int, integer_schema(MIN_REARM_DELAY_MS, MAX_REARM_DELAY_MS)]


class RearmOut(BaseModel):
    status: Literal["rearmed"]
    attemptId: str
    previousDispatchVersion: int
    dispatchVersion: int
    previousResult: str
    retryDelayMs: int
    nextAttemptAtMs: int
    runVersion: int
    eventSequence: int


class DispatchCounts(BaseModel):
    total: int
    pending: int
    leased: int
    retryWait: int
    dispatched: int
    blocked: int


class SignalCounts(BaseModel):
    due: int
    expiredLease: int


class BlockingCounts(BaseModel):
    identityMismatch: int
    pidMismatch: int
    unsupported: int
    invalid: int


class SummaryOut(BaseModel):
    """``total`` is the sum of the five statuses, ``blocked`` the sum of the blocking results;
    ``oldestBlockedAtMs`` is present exactly when something is blocked."""

    observedAtMs: int
    dispatches: DispatchCounts
    signals: SignalCounts
    blockingResults: BlockingCounts
    oldestBlockedAtMs: int | None = None
    assessment: Literal["clear", "converging", "attention_required"]
    operatorAction: Literal["none", "wait", "inspect"]


class BlockedItem(BaseModel):
    runId: str
    blockedAtMs: int


class BlockedPage(BaseModel):
    snapshotAtMs: int
    items: list[BlockedItem]
    truncated: bool
    nextCursor: str | None


def _run_id(run_id: str) -> str:
    if not is_id(run_id):
        raise NotFound("run not found")
    return run_id


@router.post("/runs/{run_id}/cancel", response_model=CancelOut)
def cancel_run(project: str, run_id: str, db: DbDep, principal: PrincipalDep) -> CancelOut:
    """Commit the cancel intent. A run that never started (or waits between attempts) ends
    ``cancelled`` at once; a running one ends once its process group has been stopped."""

    def unit(tx: Transaction) -> CancelOut:
        found = auth.authorize(tx, principal, project, "run.stop")
        rid = _run_id(run_id)
        result = cancellation.request_cancel(
            tx, found.id, rid, reason="user", actor_type="user", actor_id=principal.id
        )
        return CancelOut(result=result, run=run_out(runs.get_run(tx, found.id, rid)))

    return db.transaction(unit)


@router.get("/runs/{run_id}/cancellation", response_model=InspectOut, **_EXCLUDE_UNSET)
def inspect_cancellation(project: str, run_id: str, db: DbDep, principal: PrincipalDep) -> InspectOut:
    """The run's cancellation facts and the operator's next move (``rearm`` when blocked)."""

    def unit(tx: Transaction) -> InspectOut:
        found = auth.authorize(tx, principal, project, "run.read")
        return InspectOut(**cancellation_management.inspect(tx, found.id, _run_id(run_id)))

    return db.transaction(unit, write=False)


@router.post("/runs/{run_id}/cancellation/rearm", response_model=RearmOut)
def rearm_cancellation(
    project: str, run_id: str, body: RearmIn, db: DbDep, principal: PrincipalDep
) -> RearmOut:
    """Move a blocked dispatch back to ``retry_wait`` after ``retry_delay_ms`` (1 s - 24 h). The
    expected version and last result must match exactly (else 409); the same ``mutation_id`` with the
    same input replays the receipt."""

    def unit(tx: Transaction) -> RearmOut:
        found = auth.authorize(tx, principal, project, "run.stop")
        receipt = cancellation_management.rearm(
            tx,
            found.id,
            _run_id(run_id),
            principal_id=principal.id,
            mutation_id=body.mutation_id,
            expected_dispatch_version=body.expected_dispatch_version,
            expected_last_result=body.expected_last_result,
            retry_delay_ms=body.retry_delay_ms,
        )
        return RearmOut(**receipt)

    return db.transaction(unit)


@router.get("/cancellation/summary", response_model=SummaryOut, **_EXCLUDE_UNSET)
def cancellation_summary(project: str, db: DbDep, principal: PrincipalDep) -> SummaryOut:
    """Counts only: ``clear`` / ``converging`` / ``attention_required``. Never changes ``/readyz``."""

    def unit(tx: Transaction) -> SummaryOut:
        found = auth.authorize(tx, principal, project, "run.read")
        return SummaryOut(**cancellation_management.summary(tx, found.id))

    return db.transaction(unit, write=False)


@router.get("/cancellation/blocked", response_model=BlockedPage)
def cancellation_blocked(
    project: str,
    db: DbDep,
    principal: PrincipalDep,
    cursor: Annotated[
        str | None, Query(max_length=512, description="nextCursor of the previous page")
    ] = None,
) -> BlockedPage:
    """One fixed page of 16 blocked cancellations by ``(blockedAtMs, runId)`` as of the first page's
    snapshot; a malformed cursor is 422."""

    def unit(tx: Transaction) -> BlockedPage:
        found = auth.authorize(tx, principal, project, "run.read")
        return BlockedPage(**cancellation_management.blocked_page(tx, found.id, cursor))

    return db.transaction(unit, write=False)
