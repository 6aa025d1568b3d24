"""In-process ControlPlane: the embedded worker calls the application services directly."""

from __future__ import annotations

from typing import Any

from ql3.application import cancellation, lease_expiry, lease_results, leases, runs, workers
from ql3.application.late_facts import StopCause
from ql3.domain.offers import LeaseFence
from ql3.domain.states import is_run_terminal
from ql3.domain.workers import parse_capabilities
from ql3.ports.control_plane import LeaseInfo, SessionInfo
from ql3.ports.storage import Database


def _info(session: workers.WorkerSession, outcome: str) -> SessionInfo:
    return SessionInfo(
        worker_id=session.worker_id,
        session_id=session.session_id,
        generation=session.generation,
        status=session.status,
        outcome=outcome,
    )


class InProcessControlPlane:
    def __init__(self, db: Database) -> None:
        self._db = db

    def register(
        self,
        *,
        worker_id: str,
        session_id: str,
        capabilities: dict[str, Any],
        max_concurrent_runs: int,
        session_lease_ms: int,
    ) -> SessionInfo:
        caps = parse_capabilities(capabilities)
        reg = self._db.transaction(
            lambda tx: workers.register(
                tx,
                worker_id=worker_id,
                session_id=session_id,
                capabilities=caps,
                max_concurrent_runs=max_concurrent_runs,
                session_lease_ms=session_lease_ms,
            )
        )
        return _info(reg.session, reg.outcome)

    def heartbeat(self, session: SessionInfo) -> SessionInfo:
        s = self._db.transaction(
            lambda tx: workers.heartbeat(tx, session.worker_id, session.session_id, session.generation)
        )
        return _info(s, "heartbeat")

    def set_status(self, session: SessionInfo, status: str) -> SessionInfo:
        if status == "draining":
            s = self._db.transaction(
                lambda tx: workers.drain(tx, session.worker_id, session.session_id, session.generation)
            )
        else:
            s = self._db.transaction(
                lambda tx: workers.go_offline(tx, session.worker_id, session.session_id, session.generation)
            )
        return _info(s, status)

    def ack_starting(self, fence: LeaseFence) -> tuple[str, LeaseInfo]:
        (result, lease), now = self._db.transaction(
            lambda tx: (lease_results.ack_starting(tx, fence), tx.now_ms())
        )
        return result, _lease_info(lease, now)

    def ack_running(
        self,
        fence: LeaseFence,
        *,
        pid: int,
        handle: str,
        log_artifact_id: str,
        callback_sequence: int,
        callback_token_digest: str,
    ) -> tuple[str, LeaseInfo]:
        (result, lease), now = self._db.transaction(
            lambda tx: (
                lease_results.ack_running(
                    tx,
                    fence,
                    pid=pid,
                    handle=handle,
                    log_artifact_id=log_artifact_id,
                    callback_sequence=callback_sequence,
                    callback_token_digest=callback_token_digest,
                ),
                tx.now_ms(),
            )
        )
        return result, _lease_info(lease, now)

    def ack_start_failure(self, fence: LeaseFence, *, error_code: str) -> str:
        return str(
            self._db.transaction(lambda tx: lease_results.ack_start_failure(tx, fence, error_code=error_code))
        )

    def renew(self, fence: LeaseFence, lease_ms: int) -> LeaseInfo:
        lease, now = self._db.transaction(lambda tx: (leases.renew(tx, fence, lease_ms), tx.now_ms()))
        return _lease_info(lease, now)

    def complete(
        self,
        fence: LeaseFence,
        *,
        callback_sequence: int,
        callback_token: str,
        exit_code: int,
        stop_cause: StopCause | None = None,
    ) -> tuple[str, str]:
        result: tuple[str, str] = self._db.transaction(
            lambda tx: lease_results.complete(
                tx,
                fence,
                callback_sequence=callback_sequence,
                callback_token=callback_token,
                exit_code=exit_code,
                stop_cause=stop_cause,
            )
        )
        return result

    def report_lost(self, fence: LeaseFence, *, error_code: str) -> bool:
        def fn(tx: Any) -> bool:
            leases.check_fence(tx, fence, ignore_version=True)
            # A process stopped on a cancel intent (group KILLed, no receipt) ends cancelled / timed out.
            if cancellation.finalize_stopped(tx, fence.run_id, actor_id=fence.worker_id) != "not_eligible":
                return True
            return lease_expiry.mark_lost(
                tx, fence.run_id, fence.attempt_id, error_code=error_code, actor_type="worker"
            )

        return bool(self._db.transaction(fn))

    def lease_status(self, fence: LeaseFence) -> LeaseInfo:
        lease, now = self._db.transaction(lambda tx: (leases.lease_status(tx, fence), tx.now_ms()))
        return _lease_info(lease, now)

    def lease_control(self, fence: LeaseFence) -> str:
        def fn(tx: Any) -> str:
            run = runs.lock_run(tx, fence.run_id)
            if is_run_terminal(run.status):
                return "terminal"
            return "stop_requested" if run.cancel_requested_at_ms is not None else "run"

        return str(self._db.transaction(fn, write=False))


def _lease_info(lease: Any, now_ms: int) -> LeaseInfo:
    """The lease as the worker sees it, with the time it has left by the database clock at ``now_ms``
    (the host's executor derives its local fence deadline from it: domain/time_model.py)."""
    return LeaseInfo(
        version=lease.version,
        expires_at_ms=lease.expires_at_ms,
        remaining_ms=max(0, lease.expires_at_ms - now_ms),
    )
