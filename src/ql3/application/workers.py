"""Worker sessions: registration with monotonic generations, heartbeats, drain and offline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from ql3.application.tasks import get_revision
from ql3.domain import leases as lease_rules
from ql3.domain.errors import Conflict, FenceConflict, NotFound, Ql3Error, ValidationFailed
from ql3.domain.ids import is_id
from ql3.domain.model import Run
from ql3.domain.tasks import TaskSpec, build_spec
from ql3.domain.workers import (
    WAITING_REASONS,
    Capabilities,
    FleetWorker,
    Placement,
    WaitingReason,
    WorkerSnapshot,
    capability_mismatch,
    effective_placement,
    parse_capabilities,
    validate_worker_id,
    waiting_reason,
)
from ql3.ports.storage import Transaction
from ql3.repositories import metrics as metrics_repo
from ql3.repositories import workers as repo
from ql3.repositories.workers import WorkerRecord, WorkerStatus

MAX_WORKER_PAGE: Final = 64
MAX_REQUIREMENT_PAGES: Final = 16  # placement warnings look at no more than 1,024 workers
MAX_WAITING_REVISIONS: Final = 256  # the metric classifies the queued runs of at most this many revisions


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSession:
    worker_id: str
    session_id: str
    generation: int
    version: int
    status: str
    lease_expires_at_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Registration:
    session: WorkerSession
    outcome: str  # registered | replayed | replaced


def _session(worker: WorkerRecord) -> WorkerSession:
    return WorkerSession(
        worker_id=worker.worker_id,
        session_id=worker.session_id,
        generation=worker.generation,
        version=worker.version,
        status=worker.status,
        lease_expires_at_ms=worker.lease_expires_at_ms,
    )


def register(
    tx: Transaction,
    *,
    worker_id: str,
    session_id: str,
    capabilities: Capabilities,
    max_concurrent_runs: int,
    session_lease_ms: int,
) -> Registration:
    """First registration is generation 1; the same session with the same content replays; the same
    session with other content conflicts; a new session atomically replaces the old one and bumps the
    generation, which fences everything the old session held."""
    validate_worker_id(worker_id)
    if not is_id(session_id):
        raise ValidationFailed("session id must be a lowercase UUIDv7", field="session_id")
    if isinstance(max_concurrent_runs, bool) or not 1 <= max_concurrent_runs <= 1024:
        raise ValidationFailed("max_concurrent_runs must be 1-1024", field="max_concurrent_runs")
    lease_rules.SESSION.validate(session_lease_ms, field="session_lease_ms")
    now = tx.now_ms()
    content: dict[str, Any] = {
        "worker_id": worker_id,
        "session_id": session_id,
        "capabilities_json": capabilities.to_json(),
        "capabilities_hash": capabilities.digest(),
        "max_concurrent_runs": max_concurrent_runs,
        "session_lease_ms": session_lease_ms,
        "now": now,
    }
    if repo.insert_worker(tx, **content):
        return Registration(session=_get(tx, worker_id), outcome="registered")
    current = repo.lock_worker(tx, worker_id)
    assert current is not None
    if current.session_id == session_id:
        same = (
            current.capabilities_hash == content["capabilities_hash"]
            and current.max_concurrent_runs == max_concurrent_runs
        )
        if not same:
            # A restarted worker with other slots or labels registers a new session instead
            # (worker/session.py); anything else presenting this session id is refused.
            raise Conflict(
                "the session was registered with different content", reason="session_content_changed"
            )
        # A replay also revives the session's liveness (a restarted host resuming its own session).
        repo.update_session(
            tx,
            current,
            session_id=session_id,
            generation=current.generation,
            status="online" if current.status != "draining" else "draining",
            last_heartbeat_at_ms=now,
            lease_expires_at_ms=now + session_lease_ms,
            now=now,
        )
        return Registration(session=_get(tx, worker_id), outcome="replayed")
    if not repo.replace_session(tx, **content, expected_version=current.version):
        raise Conflict("the worker changed concurrently")
    return Registration(session=_get(tx, worker_id), outcome="replaced")


def _get(tx: Transaction, worker_id: str) -> WorkerSession:
    worker = repo.get_worker(tx, worker_id)
    if worker is None:
        raise NotFound("worker not found")
    return _session(worker)


def current_session(tx: Transaction, worker_id: str, session_id: str, generation: int) -> WorkerSession:
    """The worker's current session if it matches the presented authority, else a fence error."""
    worker = repo.get_worker(tx, worker_id)
    if worker is None:
        raise FenceConflict("worker unknown", reason="worker_unavailable")
    session = _session(worker)
    if session.session_id != session_id:
        raise FenceConflict(reason="worker_session_mismatch")
    if session.generation != generation:
        raise FenceConflict(reason="worker_generation_mismatch")
    return session


def _update(
    tx: Transaction, worker_id: str, session_id: str, generation: int, status: WorkerStatus
) -> WorkerSession:
    worker = repo.lock_worker(tx, worker_id)
    if worker is None:
        raise FenceConflict(reason="worker_unavailable")
    session = _session(worker)
    if session.session_id != session_id:
        raise FenceConflict(reason="worker_session_mismatch")
    if session.generation != generation:
        raise FenceConflict(reason="worker_generation_mismatch")
    if session.status == "offline" and status != "offline":
        raise FenceConflict("the session is offline", reason="worker_unavailable")
    now = tx.now_ms()
    alive = status != "offline"
    repo.update_session(
        tx,
        worker,
        session_id=session_id,
        generation=generation,
        status=status,
        last_heartbeat_at_ms=now,
        lease_expires_at_ms=now + worker.session_lease_ms if alive else now,
        now=now,
    )
    return _get(tx, worker_id)


def heartbeat(tx: Transaction, worker_id: str, session_id: str, generation: int) -> WorkerSession:
    """Extend the session lease; keeps ``draining`` as it is."""
    worker = repo.get_worker(tx, worker_id)
    status: WorkerStatus = worker.status if worker else "online"
    return _update(tx, worker_id, session_id, generation, status)


def drain(
    tx: Transaction, worker_id: str, session_id: str | None = None, generation: int | None = None
) -> WorkerSession:
    """Capacity goes to zero first: a draining worker gets no new claims, only lease recovery."""
    worker = repo.get_worker(tx, worker_id)
    if worker is None:
        raise NotFound("worker not found")
    return _update(
        tx, worker_id, session_id or worker.session_id, generation or worker.generation, "draining"
    )


def go_offline(tx: Transaction, worker_id: str, session_id: str, generation: int) -> WorkerSession:
    return _update(tx, worker_id, session_id, generation, "offline")


def snapshot_page(tx: Transaction, *, after: str, limit: int, last: bool = False) -> list[WorkerSnapshot]:
    """Eligible workers (online, live session lease), keyset by worker id. ``last``: the read is the
    unit's last statement (on PostgreSQL it goes with the COMMIT; a further page opens a new read
    transaction)."""
    if not 1 <= limit <= MAX_WORKER_PAGE:
        raise ValidationFailed("worker page out of range")
    return repo.eligible_workers(tx, after=after, limit=limit, last=last)


def snapshot_one(tx: Transaction, *, worker_id: str, last: bool = False) -> list[WorkerSnapshot]:
    """The one named worker if it is eligible (online, live session lease), else nothing."""
    return repo.eligible_worker(tx, worker_id, last=last)


def worker_view(worker: WorkerRecord, now: int) -> dict[str, Any]:
    """Management view of one worker: no session ids, tokens or capability hashes.

    ``slots`` is its capacity and ``busy`` its live run leases (``max_concurrent_runs`` and
    ``active_runs`` are the older names of the same two numbers).
    """
    caps = worker.capabilities
    live = worker.lease_expires_at_ms > now or worker.status == "offline"
    slots, busy = worker.max_concurrent_runs, worker.active_leases
    return {
        "id": worker.worker_id,
        "status": worker.status if live else "expired",
        "generation": worker.generation,
        "slots": slots,
        "busy": busy,
        "max_concurrent_runs": slots,
        "active_runs": busy,
        "labels": caps.get("labels", {}),
        "executors": caps.get("executors", []),
        "last_heartbeat_at_ms": worker.last_heartbeat_at_ms,
    }


def list_workers(tx: Transaction, *, after: str = "", limit: int = MAX_WORKER_PAGE) -> list[dict[str, Any]]:
    """Management view of one page of workers by id."""
    if not 1 <= limit <= MAX_WORKER_PAGE:
        raise ValidationFailed("limit out of range", field="limit")
    now = tx.now_ms()
    return [worker_view(worker, now) for worker in repo.list_workers(tx, after=after, limit=limit)]


def show_worker(tx: Transaction, worker_id: str) -> dict[str, Any]:
    worker = repo.get_worker(tx, worker_id)
    if worker is None:
        raise NotFound("worker not found")
    return worker_view(worker, tx.now_ms())


def requirement_met(tx: Transaction, placement: Placement) -> bool | None:
    """Whether any registered worker that is not offline meets the placement's requirements.

    Bounded: after ``MAX_REQUIREMENT_PAGES`` pages it answers None (unknown) rather than scan on.
    """
    after = ""
    for _ in range(MAX_REQUIREMENT_PAGES):
        page = repo.list_workers(tx, after=after, limit=MAX_WORKER_PAGE)
        for worker in page:
            if worker.status == "offline":
                continue
            if capability_mismatch(placement, parse_capabilities(worker.capabilities)) is None:
                return True
        if len(page) < MAX_WORKER_PAGE:
            return False
        after = page[-1].worker_id
    return None


class WaitingReasons:
    """Why queued runs wait, computed when read (docs/dispatch.md): one bounded look at the
    registered workers per instance, one parsed placement per task revision. Writes nothing."""

    def __init__(self, tx: Transaction) -> None:
        self._tx = tx
        self._fleet: list[FleetWorker] | None = None
        self._placements: dict[tuple[str, int], Placement | None] = {}

    def _workers(self) -> list[FleetWorker]:
        if self._fleet is None:
            now = self._tx.now_ms()
            fleet: list[FleetWorker] = []
            after = ""
            for _ in range(MAX_REQUIREMENT_PAGES):
                page = repo.list_workers(self._tx, after=after, limit=MAX_WORKER_PAGE)
                for worker in page:
                    status = worker.status
                    if status != "offline" and worker.lease_expires_at_ms > now:
                        fleet.append(
                            FleetWorker(
                                status=status,
                                capabilities=parse_capabilities(worker.capabilities),
                                free_slots=worker.max_concurrent_runs - worker.active_leases,
                            )
                        )
                if len(page) < MAX_WORKER_PAGE:
                    break
                after = page[-1].worker_id
            self._fleet = fleet
        return self._fleet

    def _placement(self, task_id: str, revision: int) -> Placement | None:
        key = (task_id, revision)
        if key not in self._placements:
            self.know_revision(task_id, revision, build_spec(get_revision(self._tx, task_id, revision).spec))
        return self._placements[key]

    def know_revision(self, task_id: str, revision: int, spec: TaskSpec) -> None:
        """The spec of that revision, as the caller read it in this transaction (no second read)."""
        try:
            self._placements[(task_id, revision)] = effective_placement(
                spec.executor, spec.require, spec.prefer
            )
        except Ql3Error:
            self._placements[(task_id, revision)] = None

    def for_revision(self, task_id: str, revision: int) -> WaitingReason:
        return waiting_reason(self._placement(task_id, revision), self._workers())

    def reason(self, run: Run) -> WaitingReason | None:
        """The waiting reason of a queued run, None for any other status."""
        if run.status != "queued":
            return None
        return self.for_revision(run.task_id, run.task_revision)


def queued_by_reason(tx: Transaction) -> dict[str, int]:
    """Queued runs counted by waiting reason (every reason present, zeros included).

    Bounded: classifies the queued runs of the ``MAX_WAITING_REVISIONS`` task revisions with the most
    queued runs; the total of queued runs is the runs-by-status gauge.
    """
    counts: dict[str, int] = dict.fromkeys(WAITING_REASONS, 0)
    reasons = WaitingReasons(tx)
    for queued in metrics_repo.count_queued_by_revision(tx, limit=MAX_WAITING_REVISIONS):
        counts[reasons.for_revision(queued.task_id, queued.task_revision)] += queued.queued
    return counts
