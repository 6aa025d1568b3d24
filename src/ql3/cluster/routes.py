"""The worker API of ``ql3 control`` (docs/cluster.md) and the admin routes of worker credentials.

Every ``/api/v1/worker/...`` call is authenticated with a worker credential and acts for that one
worker id: a fence naming another worker is refused (403 ``worker_mismatch``) before anything is
read. Session and generation are the registry's; what the body carries is checked against them.
Each call is one call of the same application services as the embedded worker's in-process path,
with the same fences.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import Field
from pydantic import ValidationError as PydanticValidationError

from ql3.application import attempt_logs, auth, worker_labels, workers
from ql3.application import worker_credentials as credentials
from ql3.application.gateway import InProcessControlPlane
from ql3.cluster.auth_cache import WorkerAuthCache
from ql3.cluster.pull import MAX_PULL_PAIRS, PullPair, PullRequest, PullService
from ql3.cluster.stops import StopWatch, lease_control
from ql3.domain.auth import role_allows
from ql3.domain.errors import NotFound, PermissionDenied, Ql3Error, ValidationFailed
from ql3.domain.model import Principal
from ql3.domain.offers import LeaseFence
from ql3.http.auth import DbDep, PrincipalDep
from ql3.http.dto import Body
from ql3.http.errors import status_for
from ql3.ports.control_plane import MAX_BATCH_STEPS, LeaseCall, LeaseInfo, LeaseStep, SessionInfo
from ql3.ports.storage import Transaction

router = APIRouter(tags=["worker"])
admin_router = APIRouter(tags=["worker tokens"])
_bearer = HTTPBearer(auto_error=False, description="`Authorization: Bearer <worker token>`")


class WorkerMismatch(PermissionDenied):
    """A worker credential acts for its own worker id only."""

    code = "worker_mismatch"


def current_worker(
    db: DbDep, request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> str:
    """The worker id of the presented worker credential (401 without one, 403 for other tokens).
    A credential read from the database is remembered for at most a second (``auth_cache``)."""
    token = creds.credentials if creds else None

    def read() -> tuple[auth.Authenticated, str]:
        found = db.transaction(lambda tx: auth.authenticate_use(tx, token), write=False)
        worker_id = credentials.worker_id_of(found.principal)
        if found.needs_touch:
            db.transaction(lambda tx: auth.touch(tx, found.principal.id))
        return found, worker_id

    cache: WorkerAuthCache | None = getattr(_state(request), "worker_auth_cache", None)
    return read()[1] if cache is None else cache.worker_id(token or "", read)


WorkerDep = Annotated[str, Depends(current_worker)]


def _state(request: Request) -> Any:
    return request.app.state


# -- bodies ------------------------------------------------------------------------------------------

_ID = Field(min_length=1, max_length=255)
_TOKEN = Field(min_length=1, max_length=256)


class FenceIn(Body):
    workerId: str = Field(min_length=1, max_length=128)
    runId: str = _ID
    attemptId: str = _ID
    sessionId: str = _ID
    workerGeneration: int = Field(ge=1)
    leaseGeneration: int = Field(ge=1)
    leaseToken: str = _TOKEN
    leaseVersion: int = Field(ge=0)

    def fence(self, worker_id: str) -> LeaseFence:
        if self.workerId != worker_id:
            raise WorkerMismatch()
        return LeaseFence(
            run_id=self.runId,
            attempt_id=self.attemptId,
            worker_id=worker_id,
            session_id=self.sessionId,
            worker_generation=self.workerGeneration,
            lease_generation=self.leaseGeneration,
            lease_token=self.leaseToken,
            lease_version=self.leaseVersion,
        )


class RegisterIn(Body):
    sessionId: str = _ID
    capabilities: dict[str, Any]
    maxConcurrentRuns: int
    sessionLeaseMs: int


class SessionIn(Body):
    sessionId: str = _ID
    generation: int = Field(ge=1)


class StatusIn(SessionIn):
    status: Literal["draining", "offline"]


class PairIn(Body):
    offerId: str = Field(min_length=1, max_length=64)
    leaseToken: str = _TOKEN


class PullIn(SessionIn):
    offerId: str = Field(min_length=1, max_length=64)
    leaseToken: str = _TOKEN
    # one further pair per further free slot: the pull claims up to 1 + len(more) runs
    more: list[PairIn] = Field(default_factory=list, max_length=MAX_PULL_PAIRS - 1)
    waitMs: int = Field(default=0, ge=0, le=20_000)
    replayOnly: bool = False  # only re-deliver this pair's live lease, never claim
    fresh: bool = False  # never sent before: nothing to re-deliver (PullService.pull)


class StopsIn(SessionIn):
    waitMs: int = Field(default=0, ge=0, le=20_000)
    known: list[str] = Field(default_factory=list, max_length=1024)


class LogChunkIn(SessionIn):
    attemptId: str = _ID
    offset: int = Field(ge=0, le=attempt_logs.MAX_OFFSET)
    # base64 of at most MAX_CHUNK_BYTES bytes (checked again once decoded)
    data: str = Field(default="", max_length=(attempt_logs.MAX_CHUNK_BYTES + 2) // 3 * 4)
    final: bool = False  # the attempt settled and everything up to the end of this chunk was shipped


class FenceOnly(Body):
    fence: FenceIn


class RunningIn(Body):
    fence: FenceIn
    pid: int
    handle: str = Field(min_length=1, max_length=512)
    logArtifactId: str = _ID
    callbackSequence: int
    callbackTokenDigest: str = Field(min_length=64, max_length=64)


class StartFailureIn(Body):
    fence: FenceIn
    errorCode: str = Field(min_length=1, max_length=64)


class RenewIn(Body):
    fence: FenceIn
    leaseMs: int


class CompleteIn(Body):
    fence: FenceIn
    callbackSequence: int
    callbackToken: str = _TOKEN
    exitCode: int
    # The host stopped the command itself: at its timeout deadline, or at its lease fence.
    stopCause: Literal["timeout", "fence"] | None = None


class LostIn(Body):
    fence: FenceIn
    errorCode: str = Field(min_length=1, max_length=64)


def _session_out(info: Any) -> dict[str, Any]:
    return {
        "workerId": info.worker_id,
        "sessionId": info.session_id,
        "generation": info.generation,
        "status": info.status,
        "outcome": info.outcome,
    }


def _lease_out(result: str, lease: LeaseInfo) -> dict[str, Any]:
    out: dict[str, Any] = {
        "result": result,
        "leaseVersion": lease.version,
        "leaseExpiresAtMs": lease.expires_at_ms,
    }
    if lease.remaining_ms is not None:
        out["leaseRemainingMs"] = lease.remaining_ms
    return out


def _plane(request: Request) -> InProcessControlPlane:
    plane: InProcessControlPlane = _state(request).control_plane
    return plane


# -- the worker API ----------------------------------------------------------------------------------


@router.get("/api/v1/worker/identity")
def identity(worker_id: WorkerDep) -> dict[str, Any]:
    """The worker id this credential is bound to."""
    return {"workerId": worker_id}


@router.post("/api/v1/worker/register")
def register(body: RegisterIn, worker_id: WorkerDep, db: DbDep, request: Request) -> dict[str, Any]:
    """Register or resume a session; the generation comes from the registry. Only with the labels
    approved for this worker id (the first registration binds them): others are 403
    ``labels_not_approved``, nothing registered, and kept as the request ``ql3 worker approve`` shows."""
    try:
        info = _plane(request).register(
            worker_id=worker_id,
            session_id=body.sessionId,
            capabilities=body.capabilities,
            max_concurrent_runs=body.maxConcurrentRuns,
            session_lease_ms=body.sessionLeaseMs,
            approved_labels_only=True,
        )
    except worker_labels.LabelsNotApproved:
        labels = worker_labels.checked_labels(body.capabilities.get("labels", {}))
        db.transaction(lambda tx: worker_labels.record_request(tx, worker_id, labels))
        raise
    return _session_out(info)


def _session(db: Any, worker_id: str, body: SessionIn) -> SessionInfo:
    current = db.transaction(
        lambda tx: workers.current_session(tx, worker_id, body.sessionId, body.generation), write=False
    )
    return SessionInfo(
        worker_id=worker_id,
        session_id=current.session_id,
        generation=current.generation,
        status=current.status,
        outcome="current",
    )


@router.post("/api/v1/worker/heartbeat")
def heartbeat(body: SessionIn, worker_id: WorkerDep, db: DbDep, request: Request) -> dict[str, Any]:
    return _session_out(_plane(request).heartbeat(_session(db, worker_id, body)))


@router.post("/api/v1/worker/status")
def set_status(body: StatusIn, worker_id: WorkerDep, db: DbDep, request: Request) -> dict[str, Any]:
    return _session_out(_plane(request).set_status(_session(db, worker_id, body), body.status))


@router.post("/api/v1/worker/pull")
def pull(body: PullIn, worker_id: WorkerDep, request: Request) -> dict[str, Any]:
    """Place and claim runs for this session, one per proposed pair at most (long-poll up to
    ``waitMs``). ``offers`` lists them (``offer`` is the first, null when nothing could be placed);
    an identical retry returns the identical offers."""
    service: PullService = _state(request).pull_service
    result = service.pull(
        PullRequest(
            worker_id=worker_id,
            session_id=body.sessionId,
            generation=body.generation,
            offer_id=body.offerId,
            lease_token=body.leaseToken,
            more=tuple(PullPair(p.offerId, p.leaseToken) for p in body.more),
        ),
        wait_ms=body.waitMs,
        replay_only=body.replayOnly,
        fresh=body.fresh,
    )
    offers = [] if result.offer is None else [result.offer, *result.more_offers]
    encoded = [json.loads(offer.to_json()) for offer in offers]
    return {"reason": result.reason, "offer": encoded[0] if encoded else None, "offers": encoded}


@router.post("/api/v1/worker/stops")
def stops(body: StopsIn, worker_id: WorkerDep, db: DbDep, request: Request) -> dict[str, Any]:
    """Long-poll: the attempts of this session whose run has a stop intent (beyond ``known``)."""
    db.transaction(
        lambda tx: workers.current_session(tx, worker_id, body.sessionId, body.generation), write=False
    )
    watch: StopWatch = _state(request).stop_watch
    found = watch.wait(worker_id, body.sessionId, wait_ms=body.waitMs, known=frozenset(body.known))
    return {"attemptIds": found}


@router.post("/api/v1/worker/logs")
def ship_log(body: LogChunkIn, worker_id: WorkerDep, db: DbDep, request: Request) -> dict[str, Any]:
    """Store one chunk of an attempt's log at ``offset`` (docs/cluster.md "Log shipping"). The same
    chunk again is a replay; a chunk past the stored end is 409 ``log_gap``, one that differs from
    the stored log 409 ``log_overlap`` (both with ``stored_bytes``); an attempt not leased to this
    session is 409 ``fence_conflict``. Past the quota chunks are ``dropped`` (``truncated`` true)."""
    try:
        data = base64.b64decode(body.data, validate=True)
    except (binascii.Error, ValueError):
        raise ValidationFailed("data must be base64", field="data") from None
    cap: int = _state(request).log_cap_bytes
    result = db.transaction(
        lambda tx: attempt_logs.append(
            tx,
            worker_id=worker_id,
            session_id=body.sessionId,
            generation=body.generation,
            attempt_id=body.attemptId,
            offset=body.offset,
            data=data,
            final=body.final,
            cap_bytes=cap,
        )
    )
    return _log_out(result)


def _log_out(result: attempt_logs.AppendResult) -> dict[str, Any]:
    return {
        "result": result.outcome,
        "storedBytes": result.head.stored_bytes,
        "truncated": result.head.truncated,
        "closed": result.head.closed,
    }


@router.post("/api/v1/worker/ack/starting")
def ack_starting(body: FenceOnly, worker_id: WorkerDep, request: Request) -> dict[str, Any]:
    result, lease = _plane(request).ack_starting(body.fence.fence(worker_id))
    return _lease_out(result, lease)


@router.post("/api/v1/worker/ack/running")
def ack_running(body: RunningIn, worker_id: WorkerDep, request: Request) -> dict[str, Any]:
    result, lease = _plane(request).ack_running(
        body.fence.fence(worker_id),
        pid=body.pid,
        handle=body.handle,
        log_artifact_id=body.logArtifactId,
        callback_sequence=body.callbackSequence,
        callback_token_digest=body.callbackTokenDigest,
    )
    return _lease_out(result, lease)


@router.post("/api/v1/worker/ack/start-failure")
def ack_start_failure(body: StartFailureIn, worker_id: WorkerDep, request: Request) -> dict[str, Any]:
    outcome = _plane(request).ack_start_failure(body.fence.fence(worker_id), error_code=body.errorCode)
    return {"outcome": outcome}


@router.post("/api/v1/worker/renew")
def renew(body: RenewIn, worker_id: WorkerDep, request: Request) -> dict[str, Any]:
    lease = _plane(request).renew(body.fence.fence(worker_id), body.leaseMs)
    return _lease_out("renewed", lease)


@router.post("/api/v1/worker/complete")
def complete(body: CompleteIn, worker_id: WorkerDep, request: Request) -> dict[str, Any]:
    result, outcome = _plane(request).complete(
        body.fence.fence(worker_id),
        callback_sequence=body.callbackSequence,
        callback_token=body.callbackToken,
        exit_code=body.exitCode,
        stop_cause=body.stopCause,
    )
    return {"result": result, "outcome": outcome}


@router.post("/api/v1/worker/lost")
def report_lost(body: LostIn, worker_id: WorkerDep, request: Request) -> dict[str, Any]:
    return {"lost": _plane(request).report_lost(body.fence.fence(worker_id), error_code=body.errorCode)}


@router.post("/api/v1/worker/lease-status")
def lease_status(body: FenceOnly, worker_id: WorkerDep, request: Request) -> dict[str, Any]:
    lease = _plane(request).lease_status(body.fence.fence(worker_id))
    return _lease_out("leased", lease)


@router.post("/api/v1/worker/lease-control")
def control(body: FenceOnly, worker_id: WorkerDep, db: DbDep, request: Request) -> dict[str, Any]:
    """``run``, ``terminal``, ``pending`` (a stop whose dispatch cannot be settled yet: ask again) or
    ``stop_requested`` - answered only once the cancellation dispatch is committed as dispatched."""
    fence = body.fence.fence(worker_id)
    state = _state(request)
    answer = db.transaction(
        lambda tx: lease_control(tx, fence, owner=state.control_owner, lease_ms=state.cancel_lease_ms)
    )
    return {"decision": answer.decision, "graceMs": answer.grace_ms}


# -- lease steps in batches ---------------------------------------------------------------------------


class StepIn(Body):
    step: LeaseStep
    body: dict[str, Any]


class LogStepIn(Body):
    """A chunk of an attempt's log as a batch step (the fence names the attempt and the session)."""

    fence: FenceIn
    offset: int = Field(ge=0, le=attempt_logs.MAX_OFFSET)
    data: str = Field(default="", max_length=(attempt_logs.MAX_CHUNK_BYTES + 2) // 3 * 4)
    final: bool = False


class BatchIn(Body):
    steps: list[StepIn] = Field(min_length=1, max_length=MAX_BATCH_STEPS)


_STEP_BODIES: dict[str, type[Body]] = {
    "ack_starting": FenceOnly,
    "ack_running": RunningIn,
    "ack_start_failure": StartFailureIn,
    "renew": RenewIn,
    "complete": CompleteIn,
    "report_lost": LostIn,
    "lease_status": FenceOnly,
    "append_log": LogStepIn,
}


def _step_call(step: StepIn, worker_id: str, log_cap_bytes: int) -> LeaseCall:
    """The step's body, checked by the model of its own route (so a batch accepts exactly what the
    single calls accept); a fence naming another worker is refused here (403)."""
    try:
        parsed = _STEP_BODIES[step.step].model_validate(step.body)
    except PydanticValidationError as exc:
        raise ValidationFailed("invalid step body", step=step.step, errors=exc.error_count()) from None
    fence = parsed.fence.fence(worker_id)  # type: ignore[attr-defined]
    args: dict[str, Any]
    if isinstance(parsed, RunningIn):
        args = {
            "pid": parsed.pid,
            "handle": parsed.handle,
            "log_artifact_id": parsed.logArtifactId,
            "callback_sequence": parsed.callbackSequence,
            "callback_token_digest": parsed.callbackTokenDigest,
        }
    elif isinstance(parsed, StartFailureIn | LostIn):
        args = {"error_code": parsed.errorCode}
    elif isinstance(parsed, RenewIn):
        args = {"lease_ms": parsed.leaseMs}
    elif isinstance(parsed, CompleteIn):
        args = {
            "callback_sequence": parsed.callbackSequence,
            "callback_token": parsed.callbackToken,
            "exit_code": parsed.exitCode,
            "stop_cause": parsed.stopCause,
        }
    elif isinstance(parsed, LogStepIn):
        try:
            data = base64.b64decode(parsed.data, validate=True)
        except (binascii.Error, ValueError):
            raise ValidationFailed("data must be base64", field="data") from None
        args = {"offset": parsed.offset, "data": data, "final": parsed.final, "cap_bytes": log_cap_bytes}
    else:
        args = {}
    return LeaseCall(step=step.step, fence=fence, args=args)


def _step_out(step: str, answer: Any) -> dict[str, Any]:
    """One step's answer as its single route answers it."""
    if isinstance(answer, Ql3Error):
        return {"status": status_for(answer), "body": {"error": answer.to_dict()}}
    if step in ("ack_starting", "ack_running"):
        body = _lease_out(answer[0], answer[1])
    elif step == "renew":
        body = _lease_out("renewed", answer)
    elif step == "lease_status":
        body = _lease_out("leased", answer)
    elif step == "complete":
        body = {"result": answer[0], "outcome": answer[1]}
    elif step == "report_lost":
        body = {"lost": bool(answer)}
    elif step == "append_log":
        body = _log_out(answer)
    else:
        body = {"outcome": answer}
    return {"status": 200, "body": body}


@router.post("/api/v1/worker/batch")
def batch(body: BatchIn, worker_id: WorkerDep, request: Request) -> dict[str, Any]:
    """Up to ``MAX_BATCH_STEPS`` lease steps (any of the single lease routes, for any of this
    worker's attempts) in one request and one transaction; ``answers[i]`` is what the single route
    would have answered step ``i`` (``status`` and ``body``). One step's refusal never fails the
    others; a failure of the whole unit (5xx) is retried by the worker with every step, each
    replay-safe (docs/cluster.md "Batches")."""
    calls: list[LeaseCall | Ql3Error] = []
    for step in body.steps:
        try:
            calls.append(_step_call(step, worker_id, _state(request).log_cap_bytes))
        except Ql3Error as exc:
            calls.append(exc)
    valid = [c for c in calls if isinstance(c, LeaseCall)]
    answers = iter(_plane(request).run_batch(valid) if valid else [])
    out = []
    for step, call in zip(body.steps, calls, strict=True):
        out.append(_step_out(step.step, call if isinstance(call, Ql3Error) else next(answers)))
    return {"answers": out}


# -- worker credentials (owner, or admin of the default project) --------------------------------------


class WorkerTokenIn(Body):
    workerId: str = Field(min_length=1, max_length=128)
    expiresInS: int | None = None
    # the labels the worker may register with (replacing those bound before); none: unchanged
    labels: dict[str, str] | None = Field(default=None, max_length=32)


class LabelsIn(Body):
    labels: dict[str, str] = Field(max_length=32)


def _require_manage(tx: Transaction, principal: Principal) -> None:
    if principal.is_owner:
        return
    try:
        project = auth.resolve_project(tx, auth.DEFAULT_PROJECT)
    except NotFound:
        raise PermissionDenied(permission="worker.manage") from None
    role = auth.role_in(tx, principal, project)
    if role is None or not role_allows(role, "worker.manage"):
        raise PermissionDenied(permission="worker.manage")


def _token_out(record: credentials.WorkerToken) -> dict[str, Any]:
    return {
        "id": record.id,
        "worker_id": record.worker_id,
        "created_at_ms": record.created_at_ms,
        "expires_at_ms": record.expires_at_ms,
        "revoked_at_ms": record.revoked_at_ms,
        "last_used_at_ms": record.last_used_at_ms,
    }


@admin_router.post("/api/v1/worker-tokens", status_code=status.HTTP_201_CREATED)
def create_worker_token(body: WorkerTokenIn, db: DbDep, principal: PrincipalDep) -> dict[str, Any]:
    """A credential bound to one worker id; the token is shown in this response only."""

    def unit(tx: Transaction) -> dict[str, Any]:
        _require_manage(tx, principal)
        issued = credentials.issue(
            tx, body.workerId, expires_in_s=body.expiresInS, labels=body.labels, issued_by=principal.id
        )
        return {**_token_out(issued.record), "token": issued.token}

    return db.transaction(unit)


@admin_router.get("/api/v1/worker-tokens")
def list_worker_tokens(
    db: DbDep,
    principal: PrincipalDep,
    after: Annotated[str, Query(max_length=128)] = "",
) -> dict[str, Any]:
    def unit(tx: Transaction) -> dict[str, Any]:
        _require_manage(tx, principal)
        page = credentials.list_page(tx, after=after)
        nxt = page[-1].id if len(page) == credentials.MAX_PAGE else None
        return {"items": [_token_out(r) for r in page], "next_after": nxt}

    return db.transaction(unit, write=False)


@admin_router.post("/api/v1/worker-tokens/{token_id}/revoke")
def revoke_worker_token(token_id: str, db: DbDep, principal: PrincipalDep) -> dict[str, Any]:
    """Refused from the next request on; repeating it changes nothing."""

    def unit(tx: Transaction) -> dict[str, Any]:
        _require_manage(tx, principal)
        return _token_out(credentials.revoke(tx, token_id))

    return db.transaction(unit)


# -- the labels a worker may register with (owner, or admin of the default project) -------------------


def _labels_out(approval: worker_labels.LabelApproval) -> dict[str, Any]:
    return {
        "worker_id": approval.worker_id,
        "labels": approval.labels,
        "approved_by": approval.approved_by,
        "approved_at_ms": approval.approved_at_ms,
        "requested_labels": approval.requested_labels,
        "requested_at_ms": approval.requested_at_ms,
    }


@admin_router.get("/api/v1/worker-labels/{worker_id}")
def get_worker_labels(worker_id: str, db: DbDep, principal: PrincipalDep) -> dict[str, Any]:
    """The labels this worker id may register with (``approved_by`` null: bound by its first
    registration) and the labels of its last refused registration, if any."""

    def unit(tx: Transaction) -> dict[str, Any]:
        _require_manage(tx, principal)
        return _labels_out(worker_labels.get(tx, worker_id))

    return db.transaction(unit, write=False)


@admin_router.post("/api/v1/worker-labels/{worker_id}/approve")
def approve_worker_labels(
    worker_id: str, body: LabelsIn, db: DbDep, principal: PrincipalDep
) -> dict[str, Any]:
    """From now on sessions of this worker id register with exactly ``labels`` (its pending request
    is dropped); a session registered with other labels before keeps running until it registers again."""

    def unit(tx: Transaction) -> dict[str, Any]:
        _require_manage(tx, principal)
        return _labels_out(worker_labels.approve(tx, worker_id, body.labels, approved_by=principal.id))

    return db.transaction(unit)
