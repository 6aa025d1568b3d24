"""Stopping local processes the worker may no longer run: a lost lease, a fenced session, or a stop
delivered through lease control (docs/cluster.md "Stop"). A process is signalled only after its
identity is re-proven (``execution/controller.py``); the old worker never writes ``lost``."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Final

from ql3.domain.journal import JournalRecord, RecoveryReason
from ql3.ports.control_plane import ControlPlane
from ql3.ports.execution import Journal, ProcessController
from ql3.worker.attempts import ActiveAttempt, ActiveAttempts, termination_grace_ms
from ql3.worker.config import MAX_SLOTS

log = logging.getLogger("ql3.worker")
_STOPPED: Final = frozenset({"termination_requested", "already_exited"})


class LocalStops:
    def __init__(
        self,
        *,
        client: ControlPlane,
        controller: ProcessController,
        attempts: ActiveAttempts,
        journal: Callable[[], Journal],
    ) -> None:
        self._client = client
        self._controller = controller
        self._attempts = attempts
        self._journal = journal
        # Called once a lease-loss stop has ended the process (attempt id, whether this worker signalled
        # it): its receipt is settled then, not left for the next restart (Settlement.settle_stopped).
        self.on_stopped: Callable[[str, bool], object] = lambda attempt_id, signalled: None

    def lease_lost(self, record: JournalRecord, active: ActiveAttempt) -> JournalRecord:
        """Stop the local process only on a full authority match; the old worker never writes lost."""
        reason: RecoveryReason = "lease_lost_local_execution_unverified"
        signalled = False
        with self._attempts.lock:
            active.lease_lost = True
        if record.executor_handle is not None:
            try:
                outcome = self._controller.stop(
                    record.executor_handle, None, grace_ms=termination_grace_ms(record)
                )
                if outcome.status in _STOPPED:
                    reason = "lease_lost_local_execution_stopped"
                    signalled = outcome.status == "termination_requested"
            except Exception as exc:  # the record stays as it was; the next maintain() pass tries again
                log.warning(
                    "local stop after lease loss failed",
                    extra={"action": "worker.lease_lost_stop_failed", "error": type(exc).__name__},
                )
                return record
        journal = self._journal()
        current = journal.get(record.offer_id)
        self._attempts.forget(record.attempt_id)
        if current is None:  # the exit watcher settled and pruned it meanwhile
            return record
        if current.state in ("completion_acknowledged", "recovery_required"):
            return current
        advanced = journal.advance(
            current.offer_id,
            expected_revision=current.revision,
            to_state="recovery_required",
            recovery_reason=reason,
        )
        if reason == "lease_lost_local_execution_stopped":
            self.on_stopped(record.attempt_id, signalled)
        return advanced

    def stop_all(self) -> None:
        """The session is fenced: every lease it held is gone, so whatever still runs of it stops."""
        for attempt_id, item in self._attempts.snapshot(MAX_SLOTS):
            record = self._journal().find_by_attempt(attempt_id)
            if record is not None:
                self.lease_lost(record, item)

    def control_stop(self, attempt_id: str) -> str:
        """Ask the control plane about a stop of one started attempt. ``stop_requested`` is answered
        only once the cancellation dispatch is settled; then the process identity is re-proven and
        the group signalled with the task's grace (in a thread: TERM -> grace -> KILL)."""
        with self._attempts.lock:
            active = self._attempts.get(attempt_id)
            if active is None:
                return "unknown"
            if active.stop_requested:
                return "stop_requested"
            fence, pid = active.fence, active.pid
        record = self._journal().find_by_attempt(attempt_id)
        if record is None or record.executor_handle is None:
            return "not_started"  # asked again once the running ACK committed
        decision = self._client.lease_control(fence)
        if decision != "stop_requested":
            return decision
        with self._attempts.lock:
            if active.stop_requested:
                return decision
            active.stop_requested = True
        threading.Thread(
            target=self._stop_process,
            args=(record.executor_handle, pid, termination_grace_ms(record)),
            name="ql3-stop",
            daemon=True,
        ).start()
        return decision

    def _stop_process(self, handle: str, pid: int | None, grace_ms: int) -> None:
        try:
            outcome = self._controller.stop(handle, pid, grace_ms=grace_ms)
            if outcome.status == "already_exited":
                # Its leader is gone, but a member that ignored a signal may live on in the group.
                self._controller.sweep_orphans(handle)
            log.info("stop signalled", extra={"action": "worker.stop", "status": outcome.status})
        except Exception as exc:  # the exit (or the lease) settles the run either way
            log.warning("stop failed", extra={"action": "worker.stop_failed", "error": type(exc).__name__})
