"""Offer intake behind the journal's crash barrier, the launch, and the activation ACKs
(docs/architecture.md "The life of a run", steps 3-7): verify, journal ``accepted``, starting ACK,
commit ``launching`` before the spawn, journal ``started``, running ACK."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

from ql3.domain import leases as lease_rules
from ql3.domain.digests import new_token, sha256_hex
from ql3.domain.errors import Conflict, FenceConflict, Ql3Error, ValidationFailed
from ql3.domain.journal import JournalOffer, JournalRecord, JournalUnavailable
from ql3.domain.offers import Offer
from ql3.domain.time_model import local_fence_deadline, timeout_deadline
from ql3.execution.identity import ProcessHandle
from ql3.execution.logs import log_path_for
from ql3.ports.control_plane import ControlPlaneUnreachable
from ql3.ports.execution import (
    ExitWatch,
    LaunchedProcess,
    Launcher,
    LaunchFailed,
    LaunchRejected,
    LaunchRequest,
    ShellCommand,
)
from ql3.worker.attempts import CALLBACK_SEQUENCE, ActiveAttempt, journal_offer_json
from ql3.worker.context import WorkerContext

# An offer received within this long of the request that claimed it holds a live lease: every run
# lease lasts at least RUN.min_ms (5 s) from a grant made after that request left. Kept well inside
# it, so a host clock off by its allowed rate error, or a slow intake queue, changes nothing.
FRESH_OFFER_S = 1.0
assert lease_rules.RUN.min_ms >= FRESH_OFFER_S * 1000 * 4

log = logging.getLogger("ql3.worker")
LaunchedT = TypeVar("LaunchedT", bound=LaunchedProcess)


class Intake(Generic[LaunchedT]):
    def __init__(
        self,
        context: WorkerContext,
        *,
        launcher: Launcher[LaunchedT],
        watcher: ExitWatch[LaunchedT],
        fault: Callable[[str], None],
    ) -> None:
        self._ctx = context
        self._launcher = launcher
        self._watcher = watcher
        self._fault = fault
        self._pool: ThreadPoolExecutor | None = None
        # The config is frozen: its directories are computed once, not per launch request.
        self._logs_dir = context.config.logs_dir
        self._receipts_dir = context.config.receipts_dir

    def open(self) -> None:
        self._pool = ThreadPoolExecutor(self._ctx.config.intake_threads, thread_name_prefix="ql3-intake")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=False)
            self._pool = None

    def submit(self, offer: Offer, *, asked_at: float | None = None) -> None:
        """Hand an offer to the intake threads (spawns overlap with the dispatcher's next claim).
        The queue is bounded by the worker's slots: every offer holds a lease counted against them.
        ``asked_at``: the monotonic time before the request that claimed this offer for the first
        time (see ``receive``)."""
        if self._pool is None:
            raise ValidationFailed("worker not started")
        self._pool.submit(self._receive_logged, offer, asked_at)

    def _receive_logged(self, offer: Offer, asked_at: float | None = None) -> None:
        try:
            self.receive(offer, asked_at=asked_at)
        except Exception as exc:  # the lease stays; recovery or expiry decides, never a blind retry
            log.warning(
                "offer intake failed", extra={"action": "worker.intake_failed", "error": type(exc).__name__}
            )

    def receive(self, offer: Offer, *, asked_at: float | None = None) -> str:
        """Verify, journal and start one offer. Returns the journal state it reached.

        ``asked_at``: the worker's monotonic clock read before the request that claimed this offer
        (never a replay of an earlier claim). Within ``FRESH_OFFER_S`` of it the lease is live by
        construction - it was granted after that instant and lasts at least ``RUN.min_ms`` - so the
        probe of the lease before the first journal write is skipped; any other offer is probed."""
        self._verify(offer)
        f = offer.fence
        journal = self._ctx.journal()
        fresh = asked_at is not None and time.monotonic() - asked_at < FRESH_OFFER_S
        if not fresh and journal.get(offer.offer_id) is None:
            # Before the first journal write: the lease must be live under this exact authority
            # (expired, replaced or fenced offers never reach the journal). Raises FenceConflict.
            self._ctx.client.lease_status(f)
        accepted = journal.accept(
            JournalOffer(
                offer_id=offer.offer_id,
                run_id=f.run_id,
                attempt_id=f.attempt_id,
                lease_generation=f.lease_generation,
                execution_spec_digest=offer.spec_digest,
                delivery_kind=offer.delivery_kind,
                offer_json=journal_offer_json(offer),
                lease_token=f.lease_token,
            )
        )
        record = accepted.record
        with self._ctx.attempts.lock:
            if self._ctx.attempts.get(record.attempt_id) is not None and not accepted.created:
                return record.state  # in-process duplicate: coalesced
            # The lease was checked live just now (lease_status) or claimed moments ago.
            self._ctx.attempts.put(
                record.attempt_id,
                ActiveAttempt(offer_id=record.offer_id, fence=f, renewed_at_ms=self._ctx.clock()),
            )
        self._fault("after_accept")
        if record.state == "accepted":
            self._ack_starting(record, offer)
        if record.state in ("accepted", "starting_acknowledged"):
            record = self._launch(record, offer)
        elif record.state == "started":
            record = self.ack_running(record)
        if record.state not in ("running_acknowledged", "started") and not self._awaits_started(
            record.attempt_id
        ):
            self._ctx.attempts.discard(record.attempt_id)
        return record.state

    def _verify(self, offer: Offer) -> None:
        session = self._ctx.session.current
        if session is None:
            raise ValidationFailed("worker not started")
        f = offer.fence
        if (f.worker_id, f.session_id, f.worker_generation) != (
            session.worker_id,
            session.session_id,
            session.generation,
        ):
            raise FenceConflict("offer is for another worker session", reason="worker_session_mismatch")
        if session.status == "draining" and offer.delivery_kind != "lease_recovery":
            raise FenceConflict("draining workers accept only lease recovery", reason="worker_unavailable")
        if offer.spec.digest() != offer.spec_digest or (offer.spec.run_id, offer.spec.attempt_id) != (
            f.run_id,
            f.attempt_id,
        ):
            raise ValidationFailed("offer spec does not match its digest or identity", field="spec")

    def _ack_starting(self, record: JournalRecord, offer: Offer) -> None:
        """The starting ACK; its journal step (``starting_acknowledged``) is committed with the
        ``launching`` barrier (``_launch``), so the ACK costs no commit of its own. A crash before that
        commit leaves ``accepted``, which recovery treats like ``starting_acknowledged`` (nothing was
        spawned; a redelivery sends the ACK again, which the control plane answers ``already_starting``)."""
        sent = self._ctx.host_clock()
        try:
            # The deadline is the control plane's: pinned timeout plus its clock, never ours.
            _, lease = self._ctx.client.ack_starting(offer.fence)
        except Ql3Error:
            # Nothing was spawned, whatever failed (a fence, a conflict, an unreachable control plane,
            # a lost database connection): without renewals the lease expires and the run is placed
            # again. Kept in the active set, the lease would be renewed forever and never run.
            self._ctx.attempts.forget(record.attempt_id)
            raise
        if lease.remaining_ms is not None:
            with self._ctx.attempts.lock:
                active = self._ctx.attempts.get(record.attempt_id)
                if active is not None:
                    active.fence_at_host_ms = local_fence_deadline(sent, lease.remaining_ms)
        self._fault("after_starting_ack")

    def _launch(self, record: JournalRecord, offer: Offer) -> JournalRecord:
        token = new_token()
        # The crash barrier: durable (fsynced) before the spawn below.
        record = self._ctx.journal().advance(
            record.offer_id,
            expected_revision=record.revision,
            to_state="launching",
            completion_callback_sequence=CALLBACK_SEQUENCE,
            completion_token_digest=sha256_hex(token),
            log_artifact_id=record.attempt_id,
            via="starting_acknowledged" if record.state == "accepted" else None,
        )
        self._fault("after_launching")
        fence_at = self._fence_at(record.attempt_id)
        if fence_at is not None and self._ctx.host_clock() >= fence_at:
            # Frozen between the starting ACK and here past the lease: the run may be retried
            # elsewhere already, so nothing may start (docs/reliability.md "Time").
            return self._start_failed(record, offer, LaunchFailed("lease_fence_passed"))
        try:
            launched = self._launcher.start(self._request(record, offer, token))
        except (LaunchRejected, LaunchFailed) as exc:
            return self._start_failed(record, offer, exc)
        started_host = self._ctx.host_clock()
        self._fault("spawned_before_started")
        handle = launched.handle.encode()
        with self._ctx.attempts.lock:
            active = self._ctx.attempts.get(record.attempt_id)
            if active is not None:
                active.handle, active.pid = handle, launched.pid
        started_at = self._ctx.clock()
        if self._ctx.deadlines is not None:
            # Armed before anything else can fail: the host keeps this attempt's time from its spawn.
            self._ctx.deadlines.arm(
                record.attempt_id,
                handle,
                timeout_at_ms=timeout_deadline(started_host, offer.spec.timeout_ms),
                fence_at_ms=self._fence_at(record.attempt_id),
                grace_ms=offer.spec.termination_grace_ms,
            )
        try:
            record = self._ctx.journal().advance(
                record.offer_id,
                expected_revision=record.revision,
                to_state="started",
                executor_handle=handle,
                executor_started_at_ms=started_at,
            )
        except JournalUnavailable:
            self._watcher.watch(launched)
            return self._started_pending(record, started_at)
        self._watcher.watch(launched)
        self._fault("after_spawn")
        record = self.ack_running(record)
        with self._ctx.attempts.lock:
            active = self._ctx.attempts.get(record.attempt_id)
            if active is not None and active.ack_pending:
                return record  # maintain() confirms it, then completes an exited process
            exited = active is not None and active.exited
            if active is not None:
                active.acked = True
        if exited:
            # The process finished before its running ACK was committed: complete it now.
            self._ctx.settlement.on_exit(record.attempt_id)
            latest = self._ctx.journal().get(record.offer_id)
            return latest or record
        return record

    def _fence_at(self, attempt_id: str) -> int | None:
        if not self._ctx.local_fence:
            return None
        with self._ctx.attempts.lock:
            active = self._ctx.attempts.get(attempt_id)
            return None if active is None else active.fence_at_host_ms

    def _started_pending(self, record: JournalRecord, started_at_ms: int) -> JournalRecord:
        """The journal could not take `started` (a full disk): the process runs all the same and is
        watched, and maintain() journals `started` once it can, then sends the running ACK (no
        completion is submitted before). A restart first resolves the `launching` row from the shim's
        launch identity, as after a crash in this window (docs/contracts.md section 3)."""
        log.warning(
            "started not journaled; retried by maintenance", extra={"action": "worker.started_pending"}
        )
        with self._ctx.attempts.lock:
            active = self._ctx.attempts.get(record.attempt_id)
            if active is not None:
                active.started_pending = started_at_ms
                active.ack_pending = True
        return record

    def _awaits_started(self, attempt_id: str) -> bool:
        with self._ctx.attempts.lock:
            active = self._ctx.attempts.get(attempt_id)
            return active is not None and active.started_pending is not None

    def _request(self, record: JournalRecord, offer: Offer, token: str) -> LaunchRequest:
        spec = offer.spec
        return LaunchRequest(
            run_id=record.run_id,
            attempt_id=record.attempt_id,
            command=ShellCommand(command=spec.command),
            working_directory=spec.working_directory or self._ctx.config.default_cwd,
            environment_policy=spec.environment_policy,
            environment=spec.launch_environment(),
            callback_token=token,
            callback_sequence=CALLBACK_SEQUENCE,
            log_path=log_path_for(self._logs_dir, record.attempt_id),
            receipt_dir=self._receipts_dir,
            log_cap_bytes=self._ctx.config.log_cap_bytes,
            started_at_ms=self._ctx.clock(),
            project_id=spec.project_id,
            script=spec.script,
        )

    def _start_failed(self, record: JournalRecord, offer: Offer, exc: Ql3Error) -> JournalRecord:
        """The executor refused or could not start the command: nothing runs, so the start failed."""
        journal = self._ctx.journal()
        record = journal.advance(record.offer_id, expected_revision=record.revision, to_state="start_failed")
        try:
            self._ctx.client.ack_start_failure(offer.fence, error_code="EXECUTOR_START_FAILED")
        except Ql3Error:
            log.warning(
                "start failure ACK failed",
                extra={
                    "action": "worker.start_failure_ack_failed",
                    "reason": getattr(exc, "code", "error"),
                },
            )
            return record
        self._ctx.attempts.forget(record.attempt_id)
        return journal.advance(
            record.offer_id,
            expected_revision=record.revision,
            to_state="start_failure_acknowledged",
            prune=True,
        )

    def ack_running(self, record: JournalRecord) -> JournalRecord:
        """Send the running ACK of a ``started`` record; a transient failure leaves ``ack_pending`` set
        for maintenance, a fence or an unreachable control plane stops the process."""
        active = self._ctx.attempts.for_record(record)
        assert record.executor_handle is not None and record.completion_token_digest is not None
        handle = ProcessHandle.decode(record.executor_handle)
        try:
            self._ctx.client.ack_running(
                active.fence,
                pid=handle.pid,
                handle=record.executor_handle,
                log_artifact_id=record.log_artifact_id or record.attempt_id,
                callback_sequence=record.completion_callback_sequence or CALLBACK_SEQUENCE,
                callback_token_digest=record.completion_token_digest,
            )
        except (FenceConflict, ControlPlaneUnreachable):
            # Unreachable past the call's whole retry window (a remote worker): the lease cannot be
            # proven ours any longer, so the process is stopped like on a lease loss.
            return self._ctx.stops.lease_lost(record, active)
        except Conflict:
            return self._ctx.journal().advance(
                record.offer_id,
                expected_revision=record.revision,
                to_state="recovery_required",
                recovery_reason="control_plane_terminal",
            )
        except Ql3Error as exc:
            # Transient (a lost database connection): the ACK may or may not have committed. The
            # record stays `started` and maintain() sends it again (an identical replay is
            # idempotent); until it is confirmed no completion is submitted, which would be refused.
            log.warning(
                "running ACK failed; retried by maintenance",
                extra={"action": "worker.running_ack_retry", "error": exc.code},
            )
            with self._ctx.attempts.lock:
                active.acked = False
                active.ack_pending = True
            return record
        with self._ctx.attempts.lock:
            active.ack_pending = False
        # No journal write: the record stays `started` (docs/contracts.md §3). After a crash a
        # `started` record sends this ACK again, which the control plane answers as an identical
        # replay (`already_running`), so a commit of `running_acknowledged` would protect nothing.
        current = self._ctx.journal().get(record.offer_id)
        assert current is not None
        return current  # a lease-loss stop may have moved it on meanwhile
