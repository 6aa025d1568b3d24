"""Reconciliation after a restart (docs/contracts.md §3): ``launching`` is never spawned again;
receipts are read first; processes proven alive by their identity are re-adopted; what cannot be
proven to run is reported lost."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Final

from ql3.domain.errors import FenceConflict, NotFound, Ql3Error
from ql3.domain.journal import JournalRecord
from ql3.domain.offers import LeaseFence
from ql3.domain.time_model import local_fence_deadline, timeout_deadline
from ql3.execution.receipts import delete_launch_identity, read_launch_identity, unreserve_receipt
from ql3.worker.attempts import ActiveAttempt, journal_offer
from ql3.worker.context import AckRunning, WorkerContext

log = logging.getLogger("ql3.worker")
# Why the worker reports an attempt lost (the run's error_code): what it knows, not a lease expiry.
LOST_LAUNCH_OUTCOME_UNKNOWN: Final = "RECOVERY_LAUNCH_OUTCOME_UNKNOWN"


class Reconciliation:
    def __init__(self, context: WorkerContext, *, ack_running: AckRunning) -> None:
        self._ctx = context
        self._ack_running = ack_running

    @property
    def _receipts_dir(self) -> Path:
        return self._ctx.config.receipts_dir

    def reconcile(self) -> dict[str, int]:
        """After a restart: launching is never re-spawned; receipts first; live processes re-adopted."""
        counts: dict[str, int] = {}
        for record in self._ctx.journal().startup_recovery():
            try:
                outcome = self._reconcile_one(record)
            except Ql3Error as exc:  # one record the control plane cannot settle must not stop the start
                log.warning(
                    "startup recovery of one attempt failed",
                    extra={"action": "worker.reconcile_failed", "error": exc.code},
                )
                outcome = "reconcile_failed"
            counts[outcome] = counts.get(outcome, 0) + 1
        return counts

    def _reconcile_one(self, record: JournalRecord) -> str:
        offer = journal_offer(record)
        fence = offer.fence
        session = self._ctx.session.current
        if fence.session_id != (session.session_id if session else None):
            # A session this home registered before (replaced since: a restart with other slots or
            # labels, or a fenced session re-registered): none of its leases is ours any more. A
            # receipt is still its attempt's fact; a process that still runs is stopped (the old
            # session never writes lost) and its receipt settled (Settlement.settle_stopped).
            if record.executor_handle is None:
                return "session_fenced"
            return self._settle_stale(record, fence)
        if record.state == "recovery_required" and record.executor_handle is None:
            if record.recovery_reason != "launch_outcome_unknown":
                return record.recovery_reason or "recovery_required"  # never re-spawned
            # Killed between the spawn and `started`: the shim may have left its identity. With it the
            # record resumes as `started` (receipt first, else re-adoption); it is never spawned again.
            record = self._resolve_launch(record)
        sent = self._ctx.host_clock()
        try:
            info = self._ctx.client.renew(fence, self._ctx.config.run_lease_ms)
            fence = replace(fence, lease_version=info.version)
        except FenceConflict as exc:
            if exc.details.get("reason") != "version_mismatch":
                return self._settle_stale(record, fence)
            info = self._ctx.client.lease_status(fence)
            fence = replace(fence, lease_version=info.version)
        fence_at = (
            local_fence_deadline(sent, info.remaining_ms)
            if info.remaining_ms is not None and self._ctx.local_fence
            else None
        )
        if record.executor_handle is None:
            return self._launch_unknown(record, fence)
        self._ctx.attempts.put(
            record.attempt_id,
            ActiveAttempt(
                offer_id=record.offer_id,
                fence=fence,
                handle=record.executor_handle,
                adopted=True,
                acked=True,
                renewed_at_ms=self._ctx.clock(),  # renewed just above
                fence_at_host_ms=fence_at,
            ),
        )
        self._rearm(record, fence_at)
        if record.state == "started":
            # The running ACK may never have been committed: the control plane needs the handle (to
            # stop it) and the token digest (to accept its receipt) before anything else.
            record = self._ack_running(record)
            if record.state not in ("started", "running_acknowledged"):
                self._ctx.attempts.forget(record.attempt_id)
                return record.recovery_reason or record.state
            with self._ctx.attempts.lock:
                if self._ctx.attempts.by_attempt[record.attempt_id].ack_pending:
                    return "running_ack_pending"  # maintain() sends it again, then settles
        return self._ctx.settlement.settle(record.attempt_id)

    def _rearm(self, record: JournalRecord, fence_at: int | None) -> None:
        """The board keeps a re-adopted attempt's deadlines across our restart; the fence moves with
        the renewal above. Without an entry (killed between the spawn and arming it) it is armed
        again, its timeout counted from the start the journal recorded (docs/reliability.md "Time")."""
        board = self._ctx.deadlines
        if board is None or record.executor_handle is None:
            return
        if board.armed(record.attempt_id):
            if fence_at is not None:
                board.move_fence(record.attempt_id, fence_at)
            return
        spec = journal_offer(record).spec
        elapsed = max(0, self._ctx.clock() - (record.executor_started_at_ms or self._ctx.clock()))
        board.arm(
            record.attempt_id,
            record.executor_handle,
            timeout_at_ms=timeout_deadline(self._ctx.host_clock() - elapsed, spec.timeout_ms),
            fence_at_ms=fence_at,
            grace_ms=spec.termination_grace_ms,
        )

    def _resolve_launch(self, record: JournalRecord) -> JournalRecord:
        handle = read_launch_identity(self._receipts_dir, record.attempt_id)
        if handle is None:
            return record
        return self._ctx.journal().advance(
            record.offer_id,
            expected_revision=record.revision,
            to_state="started",
            executor_handle=handle.encode(),
            executor_started_at_ms=self._ctx.clock(),
        )

    def _launch_unknown(self, record: JournalRecord, fence: LeaseFence) -> str:
        """No receipt and no trace of the shim: nothing can be proven to run, so the attempt is lost.

        A shim whose launcher died before sending its start ticks leaves its identity file empty (it
        never starts the command); being no evidence, it goes with the journal row, once the loss is
        reported, so a restart loop never accumulates them."""
        try:
            self._ctx.client.report_lost(fence, error_code=LOST_LAUNCH_OUTCOME_UNKNOWN)
        except FenceConflict:
            pass
        delete_launch_identity(self._receipts_dir, record.attempt_id)
        unreserve_receipt(self._receipts_dir, record.attempt_id)  # reserved by a launch cut short
        self._ctx.journal().prune(record.offer_id)
        self._ctx.attempts.forget(record.attempt_id)
        return "lost"

    def _settle_stale(self, record: JournalRecord, fence: LeaseFence) -> str:
        active = ActiveAttempt(
            offer_id=record.offer_id, fence=fence, handle=record.executor_handle, adopted=True, acked=True
        )
        self._ctx.attempts.put(record.attempt_id, active)
        try:
            state = self._ctx.settlement.settle(record.attempt_id)
        except (FenceConflict, NotFound):  # NotFound: a database restored from before this run
            state = "stale"
        if record.executor_handle is not None and state in ("running", "stale"):
            # The lease is gone, so the run is no longer ours: what still runs of it must stop.
            self._ctx.stops.lease_lost(record, active)
        else:
            self._ctx.attempts.forget(record.attempt_id)
        return state
