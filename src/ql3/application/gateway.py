"""In-process ControlPlane: the embedded worker calls the application services directly."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from ql3.application import attempt_logs, cancellation, lease_expiry, lease_results, leases, runs, workers
from ql3.application.late_facts import StopCause
from ql3.domain.errors import Ql3Error, ValidationFailed
from ql3.domain.offers import LeaseFence
from ql3.domain.states import is_run_terminal
from ql3.domain.workers import parse_capabilities
from ql3.ports.control_plane import MAX_BATCH_STEPS, LeaseCall, LeaseInfo, SessionInfo
from ql3.ports.storage import Database, Savepoints, Transaction


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
        return self._db.transaction(lambda tx: _ack_starting(tx, fence))

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
        return self._db.transaction(
            lambda tx: _ack_running(
                tx,
                fence,
                pid=pid,
                handle=handle,
                log_artifact_id=log_artifact_id,
                callback_sequence=callback_sequence,
                callback_token_digest=callback_token_digest,
            )
        )

    def ack_start_failure(self, fence: LeaseFence, *, error_code: str) -> str:
        return self._db.transaction(lambda tx: _ack_start_failure(tx, fence, error_code=error_code))

    def renew(self, fence: LeaseFence, lease_ms: int) -> LeaseInfo:
        return self._db.transaction(lambda tx: _renew(tx, fence, lease_ms=lease_ms))

    def complete(
        self,
        fence: LeaseFence,
        *,
        callback_sequence: int,
        callback_token: str,
        exit_code: int,
        stop_cause: StopCause | None = None,
    ) -> tuple[str, str]:
        return self._db.transaction(
            lambda tx: _complete(
                tx,
                fence,
                callback_sequence=callback_sequence,
                callback_token=callback_token,
                exit_code=exit_code,
                stop_cause=stop_cause,
            )
        )

    def report_lost(self, fence: LeaseFence, *, error_code: str) -> bool:
        return self._db.transaction(lambda tx: _report_lost(tx, fence, error_code=error_code))

    def lease_status(self, fence: LeaseFence) -> LeaseInfo:
        return self._db.transaction(lambda tx: _lease_status(tx, fence))

    def append_log(
        self, fence: LeaseFence, *, offset: int, data: bytes, final: bool, cap_bytes: int
    ) -> attempt_logs.AppendResult:
        """A chunk of the attempt's log (``attempt_logs.append``, fenced by the worker's session);
        a remote worker sends the last one in the batch of the attempt's completion."""
        return self._db.transaction(
            lambda tx: _append_log(tx, fence, offset=offset, data=data, final=final, cap_bytes=cap_bytes)
        )

    def run_batch(self, calls: Sequence[LeaseCall]) -> list[Any]:
        """Several lease steps, of any attempts, in one transaction (docs/contracts.md "Batched
        lease steps"). Each step runs in a savepoint and has its own answer, what its method
        returns or the 4xx error it raised (a ``Ql3Error``): one attempt's refusal never fails or
        undoes another's step. An error that is not an answer (storage unavailable, contention past
        its retries) fails the whole unit, and every step is replay-safe, so the caller retries all.
        A batch of one is the single call, unchanged."""
        if not 1 <= len(calls) <= MAX_BATCH_STEPS:
            raise ValidationFailed("a batch has 1 to MAX_BATCH_STEPS steps", field="steps")
        if len(calls) == 1:
            try:
                return [getattr(self, calls[0].step)(calls[0].fence, **calls[0].args)]
            except Ql3Error as exc:
                if not is_answer(exc):
                    raise
                return [exc]

        def unit(tx: Transaction) -> list[Any]:
            if not isinstance(tx, Savepoints):
                raise TypeError("a batch needs a transaction with savepoints")
            answers: list[Any] = []
            for call in calls:
                try:
                    answers.append(tx.savepoint(partial(_run_step, call)))
                except Ql3Error as exc:
                    if not is_answer(exc):
                        raise
                    answers.append(exc)
            return answers

        return self._db.transaction(unit)

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


def is_answer(exc: Ql3Error) -> bool:
    """A refusal that answers one step (a 4xx), not a failure of the unit that carries it."""
    return 400 <= exc.http_status < 500 and not exc.retryable


# -- the lease steps, each inside a transaction it is given ----------------------------------------


def _ack_starting(tx: Transaction, fence: LeaseFence) -> tuple[str, LeaseInfo]:
    result, lease = lease_results.ack_starting(tx, fence)
    return result, _lease_info(lease, tx.now_ms())


def _ack_running(
    tx: Transaction,
    fence: LeaseFence,
    *,
    pid: int,
    handle: str,
    log_artifact_id: str,
    callback_sequence: int,
    callback_token_digest: str,
) -> tuple[str, LeaseInfo]:
    result, lease = lease_results.ack_running(
        tx,
        fence,
        pid=pid,
        handle=handle,
        log_artifact_id=log_artifact_id,
        callback_sequence=callback_sequence,
        callback_token_digest=callback_token_digest,
    )
    return result, _lease_info(lease, tx.now_ms())


def _ack_start_failure(tx: Transaction, fence: LeaseFence, *, error_code: str) -> str:
    return str(lease_results.ack_start_failure(tx, fence, error_code=error_code))


def _renew(tx: Transaction, fence: LeaseFence, *, lease_ms: int) -> LeaseInfo:
    return _lease_info(leases.renew(tx, fence, lease_ms), tx.now_ms())


def _complete(
    tx: Transaction,
    fence: LeaseFence,
    *,
    callback_sequence: int,
    callback_token: str,
    exit_code: int,
    stop_cause: StopCause | None = None,
) -> tuple[str, str]:
    result: tuple[str, str] = lease_results.complete(
        tx,
        fence,
        callback_sequence=callback_sequence,
        callback_token=callback_token,
        exit_code=exit_code,
        stop_cause=stop_cause,
    )
    return result


def _report_lost(tx: Transaction, fence: LeaseFence, *, error_code: str) -> bool:
    leases.check_fence(tx, fence, ignore_version=True)
    # A process stopped on a cancel intent (group KILLed, no receipt) ends cancelled / timed out.
    if cancellation.finalize_stopped(tx, fence.run_id, actor_id=fence.worker_id) != "not_eligible":
        return True
    return bool(
        lease_expiry.mark_lost(tx, fence.run_id, fence.attempt_id, error_code=error_code, actor_type="worker")
    )


def _lease_status(tx: Transaction, fence: LeaseFence) -> LeaseInfo:
    return _lease_info(leases.lease_status(tx, fence), tx.now_ms())


def _append_log(
    tx: Transaction, fence: LeaseFence, *, offset: int, data: bytes, final: bool, cap_bytes: int
) -> attempt_logs.AppendResult:
    return attempt_logs.append(
        tx,
        worker_id=fence.worker_id,
        session_id=fence.session_id,
        generation=fence.worker_generation,
        attempt_id=fence.attempt_id,
        offset=offset,
        data=data,
        final=final,
        cap_bytes=cap_bytes,
    )


def _run_step(call: LeaseCall, tx: Transaction) -> Any:
    return _STEPS[call.step](tx, call.fence, **call.args)


_STEPS: dict[str, Callable[..., Any]] = {
    "ack_starting": _ack_starting,
    "ack_running": _ack_running,
    "ack_start_failure": _ack_start_failure,
    "renew": _renew,
    "complete": _complete,
    "report_lost": _report_lost,
    "lease_status": _lease_status,
    "append_log": _append_log,
}
