"""Settling an attempt from its receipt: complete with the journal's original authority, acknowledge,
delete. A process that exited without a trusted receipt is reported lost, after whatever survived of
its group is stopped (docs/contracts.md §3)."""

from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Final

from ql3.domain.errors import FenceConflict, Ql3Error
from ql3.domain.journal import JournalConflict, JournalRecord
from ql3.execution.identity import InvalidHandle, ProcessHandle, probe
from ql3.execution.receipts import (
    Receipt,
    ReceiptInvalid,
    delete_receipt,
    quarantine_receipt,
    read_receipt,
    unreserve_receipt,
)
from ql3.ports.control_plane import ControlPlane
from ql3.ports.execution import HostDeadlines, Journal, ProcessController
from ql3.worker.attempts import CALLBACK_SEQUENCE, ActiveAttempts

log = logging.getLogger("ql3.worker")
# Why the worker reports an attempt lost (the run's error_code): what it knows, not a lease expiry.
LOST_EXITED_WITHOUT_RECEIPT: Final = "RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT"


class Settlement:
    def __init__(
        self,
        *,
        client: ControlPlane,
        receipts_dir: Path,
        controller: ProcessController,
        attempts: ActiveAttempts,
        journal: Callable[[], Journal],
        deadlines: HostDeadlines | None = None,
    ) -> None:
        self._client = client
        self._deadlines = deadlines
        self._receipts_dir = receipts_dir
        self._controller = controller
        self._attempts = attempts
        self._journal = journal
        # Attempts being settled right now. The exit watcher and maintenance may both find an exited
        # process; a second settlement running beside the first would find the receipt already
        # consumed, take the attempt for one that exited without a receipt, and sweep the group
        # (whose background children a command that ended by itself keeps). One at a time, then.
        self._settling: set[str] = set()
        self._settling_lock = threading.Lock()

    def on_exit(self, attempt_id: str) -> None:
        """The exit watcher's callback: settle now, unless the running ACK is still on its way."""
        with self._attempts.lock:
            active = self._attempts.get(attempt_id)
            if active is not None:
                active.exited = True
                if not active.acked:
                    return  # the intake path completes it right after the running ACK
        try:
            self.settle(attempt_id)
        except Exception as exc:  # the watcher thread must keep running; maintain() retries
            log.warning(
                "completion failed", extra={"action": "worker.completion_failed", "error": type(exc).__name__}
            )

    def settle_or_defer(self, attempt_id: str) -> str:
        """``settle``, for maintenance: when a write it needs fails transiently (the control plane or
        its database, or the journal, cannot take it: a full disk, an outage), ``deferred``. Nothing is
        lost then: the receipt stays where it is and the attempt stays active, so the next maintenance
        pass (one per cycle, never a tight loop) settles it once the write goes through, with the
        command's real exit code (docs/operations.md "A full disk"). Other attempts of the pass go on."""
        try:
            return self.settle(attempt_id)
        except Ql3Error as exc:
            if not exc.retryable:
                raise
            reason = exc.code
        except OSError as exc:  # a receipt file the disk could not move (quarantine on a full disk)
            reason = errno_name(exc)
        log.warning(
            "completion deferred to the next maintenance pass",
            extra={"action": "worker.completion_deferred", "error": reason},
        )
        return "deferred"

    def settle(self, attempt_id: str) -> str:
        """Receipt first: complete with the journal's original authority, then acknowledge, then delete.
        ``settling`` when another thread is settling the same attempt (it finishes the work),
        ``stopping`` while a lost lease's stop owns it, ``fenced`` when it exited without a receipt
        and the lease was no longer ours (the row stays, ``recovery_required``)."""
        with self._attempts.lock:
            active = self._attempts.get(attempt_id)
            if active is not None and active.lease_lost:
                return "stopping"  # LocalStops.lease_lost stopped it and records why (recovery_required)
        with self._settling_lock:
            if attempt_id in self._settling:
                return "settling"
            self._settling.add(attempt_id)
        try:
            return self._settle(attempt_id)
        finally:
            with self._settling_lock:
                self._settling.discard(attempt_id)

    def _settle(self, attempt_id: str) -> str:
        record = self._journal().find_by_attempt(attempt_id)
        if record is None or record.completion_token_digest is None:
            return "unknown"
        if record.state in ("completion_acknowledged", "start_failure_acknowledged"):
            return record.state
        receipt = self._trusted_receipt(record)
        if receipt is None:
            return self._exited_without_receipt(record)
        return self._complete(record, receipt)

    def _trusted_receipt(self, record: JournalRecord) -> Receipt | None:
        assert record.completion_token_digest is not None
        try:
            return read_receipt(
                self._receipts_dir,
                record.attempt_id,
                expected_run_id=record.run_id,
                expected_sequence=record.completion_callback_sequence or CALLBACK_SEQUENCE,
                expected_token_digest=record.completion_token_digest,
            )
        except ReceiptInvalid:
            quarantine_receipt(self._receipts_dir, record.attempt_id)
            return None

    def _complete(self, record: JournalRecord, receipt: Receipt) -> str:
        attempt_id = record.attempt_id
        active = self._attempts.for_record(record)
        # Every answer is final, a late one included (its lease expired, the attempt lost, or this
        # worker's session replaced since): the control plane holds the fact, so the receipt goes.
        # Why the host executor stopped it, if it did (its marker is written before its signal, so a
        # receipt the signal caused always finds it): a timeout ends the run timed_out, a fence lost.
        cause = None if self._deadlines is None else self._deadlines.fired(attempt_id)
        result, _ = self._client.complete(
            active.fence,
            callback_sequence=receipt.callback_sequence,
            callback_token=receipt.token,
            exit_code=receipt.exit_code,
            stop_cause=cause,
        )
        if result == "recorded":
            log.info("late fact recorded", extra={"action": "worker.late_fact_recorded"})
        self._acknowledge(record)
        if self._deadlines is not None:
            self._deadlines.disarm(attempt_id)
        # Only a shim of an earlier version leaves a temp file: not one this process launched (pid set).
        delete_receipt(self._receipts_dir, attempt_id, legacy_temp=active.pid is None or active.adopted)
        self._attempts.forget(attempt_id)
        return "completion_acknowledged"

    def _acknowledge(self, record: JournalRecord) -> None:
        """``completion_acknowledged`` and the record's deletion, in one commit: the control plane
        holds the outcome now, so nothing is left to recover (the receipt is deleted after it)."""
        journal = self._journal()
        for _ in range(4):  # the running-ACK bookkeeping may advance the record concurrently
            current = journal.get(record.offer_id)
            if current is None:
                return
            if current.state == "completion_acknowledged":
                journal.prune(current.offer_id)  # acknowledged before a crash, not deleted yet
                return
            try:
                journal.advance(
                    current.offer_id,
                    expected_revision=current.revision,
                    to_state="completion_acknowledged",
                    prune=True,
                )
                return
            except JournalConflict:
                continue

    def _exited_without_receipt(self, record: JournalRecord) -> str:
        if record.executor_handle is None:
            return "no_handle"
        try:
            alive = probe(ProcessHandle.decode(record.executor_handle)) == "running"
        except InvalidHandle:
            alive = False
        if alive:
            return "running"
        # The shim publishes its receipt just before it exits: look again now that it is gone.
        receipt = self._trusted_receipt(record)
        if receipt is not None:
            return self._complete(record, receipt)
        # Our own shims take their group along when they die (exit watcher); a re-adopted one is not
        # our child, so whatever survived it is found and stopped here, before the run is reported.
        try:
            self._controller.sweep_orphans(record.executor_handle)
        except (InvalidHandle, OSError) as exc:
            log.warning(
                "orphan sweep failed",
                extra={"action": "worker.orphan_sweep_failed", "error": type(exc).__name__},
            )
        active = self._attempts.for_record(record)
        try:
            self._client.report_lost(active.fence, error_code=LOST_EXITED_WITHOUT_RECEIPT)
            reported = True
        except FenceConflict:
            reported = False  # the lease is not ours any more: the old worker never writes lost
        journal = self._journal()
        current = journal.get(record.offer_id)
        if current is not None and current.state in ("started", "running_acknowledged"):
            journal.advance(
                current.offer_id,
                expected_revision=current.revision,
                to_state="recovery_required",
                recovery_reason="process_exited_without_receipt",
            )
        # The process is gone and its reservation is still empty (looked at above): nothing fills it now.
        unreserve_receipt(self._receipts_dir, record.attempt_id)
        self._attempts.forget(record.attempt_id)
        if not reported:
            # Nobody holds the outcome: the row stays (recovery_required, pruned by age) as the
            # evidence that this attempt was started here, whatever the lease's next holder does.
            return "fenced"
        # The control plane holds the outcome now: nothing to recover.
        journal.prune(record.offer_id)
        if self._deadlines is not None:
            self._deadlines.disarm(record.attempt_id)
        return "lost"


def errno_name(exc: OSError) -> str:
    """``ENOSPC``... for a log field (never the message: it may carry a path)."""
    return errno.errorcode.get(exc.errno or 0, "os_error")
