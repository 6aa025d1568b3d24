"""Settling an attempt from its receipt: complete with the journal's original authority, acknowledge,
delete. A process that exited without a trusted receipt is reported lost, after whatever survived of
its group is stopped (docs/contracts.md §3)."""

from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Final, Literal

from ql3.domain.errors import FenceConflict, NotFound, PermissionDenied, Ql3Error, ValidationFailed
from ql3.domain.journal import JournalConflict, JournalRecord
from ql3.execution.identity import InvalidHandle, ProcessHandle, probe
from ql3.execution.receipts import (
    Receipt,
    ReceiptInvalid,
    delete_launch_identity,
    delete_receipt,
    quarantine_receipt,
    read_receipt,
    unreserve_receipt,
)
from ql3.ports.control_plane import ControlPlane, ControlPlaneUnreachable
from ql3.ports.execution import HostDeadlines, Journal, ProcessController
from ql3.worker.attempts import CALLBACK_SEQUENCE, ActiveAttempts, journal_offer

log = logging.getLogger("ql3.worker")
# Why the worker reports an attempt lost (the run's error_code): what it knows, not a lease expiry.
LOST_EXITED_WITHOUT_RECEIPT: Final = "RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT"
# The control plane's definite "no" to a receipt: it will never take this fact (a wrong callback token
# or sequence, another holder, an attempt it does not know, a value it refuses). Sending it again
# changes nothing, so the receipt goes like an accepted one; the journal row stays as the evidence.
REFUSALS: Final = (FenceConflict, NotFound, PermissionDenied, ValidationFailed)
MAX_STOPPED_PENDING: Final = 1024


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
        # Attempts stopped after a lease loss whose receipt could not be sent yet (the control plane
        # unreachable): attempt id -> whether this worker signalled it. Maintenance sends them again.
        self._stopped_pending: dict[str, bool] = {}

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

    def settle_stopped(self, attempt_id: str, signalled: bool) -> str:
        """After a lease-loss stop (``LocalStops.lease_lost``): the process group is gone, so whatever
        it left is settled now rather than at the next restart. A receipt the shim published is the
        attempt's fact (docs/contracts.md §2.4), sent with stop cause ``fence`` when this worker
        signalled the command (it did not end by itself), then deleted with the launch identity;
        without one, the empty reservation and the identity go (the old worker never writes lost; the
        row stays ``recovery_required`` as the evidence). Never raises: a transient failure keeps the
        receipt and maintenance sends it again (``retry_stopped``)."""
        with self._settling_lock:
            if attempt_id in self._settling:
                return "settling"
            self._settling.add(attempt_id)
        error = None
        try:
            state = self._settle_stopped(attempt_id, signalled)
        except Ql3Error as exc:
            state, error = "deferred", exc.code
        except OSError as exc:  # the journal or a receipt file the disk could not move
            state, error = "deferred", errno_name(exc)
        except Exception as exc:  # e.g. the journal closed by a stop meanwhile: the next start settles it
            state = "deferred"
            log.warning(
                "receipt deferred",
                extra={"action": "worker.stopped_receipt_later", "error": type(exc).__name__},
            )
        finally:
            with self._settling_lock:
                self._settling.discard(attempt_id)
        if error is not None:
            log.warning("receipt deferred", extra={"action": "worker.stopped_receipt_later", "error": error})
        with self._settling_lock:
            if state == "deferred" and len(self._stopped_pending) < MAX_STOPPED_PENDING:
                self._stopped_pending[attempt_id] = signalled
            else:
                self._stopped_pending.pop(attempt_id, None)
        return state

    def retry_stopped(self, limit: int = 16) -> None:
        """Maintenance: send again the receipts of stopped attempts that could not be sent."""
        with self._settling_lock:
            pending = list(self._stopped_pending.items())[:limit]
        for attempt_id, signalled in pending:
            self.settle_stopped(attempt_id, signalled)

    def _settle_stopped(self, attempt_id: str, signalled: bool) -> str:
        record = self._journal().find_by_attempt(attempt_id)
        if record is None or record.state != "recovery_required" or record.completion_token_digest is None:
            return "settled"  # settled meanwhile (the exit watcher), or nothing was ever reserved
        receipt = self._trusted_receipt(record)
        if receipt is None:
            # The group is gone (the stop returned once it was): nothing fills the reservation now.
            unreserve_receipt(self._receipts_dir, attempt_id)
            delete_launch_identity(self._receipts_dir, attempt_id)
            return "no_receipt"
        return self._complete(record, receipt, stopped="fence" if signalled else True)

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

    def _complete(
        self, record: JournalRecord, receipt: Receipt, *, stopped: Literal["fence"] | bool = False
    ) -> str:
        """``stopped``: the attempt left the active set (a lease-loss stop): its fence is the journal's
        and it is not made active again; ``"fence"`` when this worker's signal ended the command."""
        attempt_id = record.attempt_id
        if stopped:
            fence, legacy_temp = journal_offer(record).fence, True
        else:
            active = self._attempts.for_record(record)
            # Only a shim of an earlier version leaves a temp file: not one this process launched.
            fence, legacy_temp = active.fence, active.pid is None or active.adopted
        # Every answer is final, a late one included (its lease expired, the attempt lost, or this
        # worker's session replaced since): the control plane holds the fact, so the receipt goes.
        # Why the host executor stopped it, if it did (its marker is written before its signal, so a
        # receipt the signal caused always finds it): a timeout ends the run timed_out, a fence lost.
        cause = None if self._deadlines is None else self._deadlines.fired(attempt_id)
        if cause is None and stopped == "fence":
            cause = "fence"  # stopped for its lease: lost retry decides, never a failure of the command
        try:
            result, _ = self._client.complete(
                fence,
                callback_sequence=receipt.callback_sequence,
                callback_token=receipt.token,
                exit_code=receipt.exit_code,
                stop_cause=cause,
            )
        except REFUSALS as exc:
            if exc.details.get("reason") == "running_ack_missing":
                # Not a refusal: the running ACK is not on record yet. The receipt stays and the
                # attempt stays active; the next maintenance pass settles it again.
                raise ControlPlaneUnreachable(reason="running_ack_missing") from exc
            return self._refused(record, exc, active=not stopped)
        if result == "recorded":
            log.info("late fact recorded", extra={"action": "worker.late_fact_recorded"})
        self._acknowledge(record)
        if self._deadlines is not None:
            self._deadlines.disarm(attempt_id)
        delete_receipt(self._receipts_dir, attempt_id, legacy_temp=legacy_temp)
        if not stopped:
            self._attempts.forget(attempt_id)
        return "completion_acknowledged"

    def _refused(self, record: JournalRecord, exc: Ql3Error, *, active: bool) -> str:
        """The control plane will never take this receipt: it goes (with the launch identity), the row
        stays ``recovery_required`` (``completion_refused``) as the evidence, pruned like the others."""
        reason = exc.details.get("reason") if isinstance(exc.details, dict) else None
        log.warning(
            "receipt refused by the control plane",
            extra={"action": "worker.receipt_refused", "error": exc.code, "reason": reason},
        )
        journal = self._journal()
        current = journal.get(record.offer_id)
        if current is not None and current.state in ("started", "running_acknowledged"):
            journal.advance(
                current.offer_id,
                expected_revision=current.revision,
                to_state="recovery_required",
                recovery_reason="completion_refused",
            )
        if self._deadlines is not None:
            self._deadlines.disarm(record.attempt_id)
        delete_receipt(self._receipts_dir, record.attempt_id)
        if active:
            self._attempts.forget(record.attempt_id)
        return "refused"

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
        # The process is gone and its reservation is still empty (looked at above): nothing fills it now,
        # and its launch identity is no evidence of anything any more (the journal holds its handle).
        unreserve_receipt(self._receipts_dir, record.attempt_id)
        delete_launch_identity(self._receipts_dir, record.attempt_id)
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
