"""The worker's maintenance cycle: heartbeat and renew every active lease when due, guard leases that
cannot be renewed, send a running ACK that failed transiently again, and settle exited (or re-adopted)
processes. One bounded pass per call, run by a LifecycleRunner."""

from __future__ import annotations

import logging
from dataclasses import replace

from ql3.domain.errors import FenceConflict, Ql3Error
from ql3.domain.journal import JournalRecord, JournalUnavailable
from ql3.domain.time_model import local_fence_deadline
from ql3.worker.attempts import ActiveAttempt
from ql3.worker.config import MAX_SLOTS
from ql3.worker.context import AckRunning, WorkerContext

log = logging.getLogger("ql3.worker")


class Maintenance:
    def __init__(self, context: WorkerContext, *, ack_running: AckRunning) -> None:
        self._ctx = context
        self._ack_running = ack_running
        self.last_renewal_ms = 0  # the worker clock at the last successful heartbeat

    def maintain(self) -> bool:
        """One bounded pass: when due, heartbeat and renew every active lease; always settle
        processes that exited (re-adopted ones are not our children, so they are polled here).

        A lease that could not be renewed for half its duration (the control plane or its database
        unreachable: renewals are due every third) can no longer be proven ours: its process is
        stopped, as on a fenced renewal, before the server's expiry may hand the run to another
        worker. The age is read after the failed call, which may itself have taken a while."""
        session = self._ctx.session.current
        if session is None:
            return False
        if self._ctx.deadlines is not None:
            # A killed executor is started again; it re-reads the board and stops what is past due.
            self._ctx.deadlines.ensure_executor()
        now = self._ctx.clock()
        renew_due = now - self.last_renewal_ms >= self._ctx.config.run_lease_ms // 3
        unreachable: Ql3Error | None = None
        if renew_due:
            try:
                self._ctx.session.current = replace(
                    self._ctx.client.heartbeat(session), outcome=session.outcome
                )
            except FenceConflict:
                # Replaced or offline: every lease we hold is gone. Stop what we run (same authority
                # only), never re-register by ourselves, and never write `lost` for the old session.
                log.warning("session fenced", extra={"action": "worker.session_fenced"})
                self.session_fenced()
                return False
            except Ql3Error as exc:  # transient: renewals are still tried, leases still guarded
                unreachable = exc
            else:
                self.last_renewal_ms = now
                # Settled journal rows (receipts already deleted at acknowledgement) are pruned in
                # bounded batches, so the journal does not grow with the number of runs.
                self._ctx.journal().retention(older_than_ms=self._ctx.config.journal_retention_ms, limit=64)
                # Receipts of attempts stopped after a lease loss that could not be sent then.
                self._ctx.settlement.retry_stopped()
        for attempt_id, item in self._ctx.attempts.snapshot(MAX_SLOTS):
            if item.renewed_at_ms is None:
                item.renewed_at_ms = now
            if renew_due:
                renewed, failure = self._renew(attempt_id, item, now)
                unreachable = unreachable or failure
                if not renewed:
                    continue
            if item.ack_pending:
                self._retry_running_ack(attempt_id, item)
            elif item.adopted or item.exited:
                self._ctx.settlement.settle_or_defer(attempt_id)
        if unreachable is not None:
            raise unreachable  # the loop runner records the failure and backs off
        return False

    def _renew(self, attempt_id: str, item: ActiveAttempt, now: int) -> tuple[bool, Ql3Error | None]:
        """Renew one lease: (True, None) when renewed; (False, error) when this pass leaves it (lost,
        stopped, or unrenewable for now, with the transient error to report)."""
        sent = self._ctx.host_clock()
        try:
            info = self._ctx.client.renew(item.fence, self._ctx.config.run_lease_ms)
            with self._ctx.attempts.lock:
                current = self._ctx.attempts.by_attempt.get(attempt_id)
                if current is not None:
                    current.fence = replace(item.fence, lease_version=info.version)
                    current.renewed_at_ms = now
                    if info.remaining_ms is not None:
                        current.fence_at_host_ms = local_fence_deadline(sent, info.remaining_ms)
            if info.remaining_ms is not None and self._ctx.deadlines is not None and self._ctx.local_fence:
                self._ctx.deadlines.move_fence(attempt_id, local_fence_deadline(sent, info.remaining_ms))
        except FenceConflict as exc:
            record = self._ctx.journal().find_by_attempt(attempt_id)
            if exc.details.get("reason") in ("not_leased",) or item.exited:
                # The attempt ended on the server (completed, or lost by expiry), or its process
                # already exited: its receipt is still the attempt's fact (a late fact, docs/contracts.md
                # §2.4), and a process that still runs is no longer ours to run.
                if self._settle_first(attempt_id) == "running" and record is not None:
                    self._ctx.stops.lease_lost(record, item)
                return False, None
            if record is not None:
                self._ctx.stops.lease_lost(record, item)
            return False, None
        except Ql3Error as exc:
            assert item.renewed_at_ms is not None
            # An exited process has nothing left to stop: its receipt waits for the completion.
            if (
                self._ctx.clock() - item.renewed_at_ms >= self._ctx.config.run_lease_ms // 2
                and not item.exited
            ):
                record = self._ctx.journal().find_by_attempt(attempt_id)
                if record is not None:
                    log.warning("lease unrenewable", extra={"action": "worker.self_fence"})
                    self._ctx.stops.lease_lost(record, item)
            return False, exc
        return True, None

    def _retry_running_ack(self, attempt_id: str, item: ActiveAttempt) -> None:
        """Send a running ACK that failed transiently again; once confirmed, an exited (or
        re-adopted) process is settled. Without it the completion would be refused forever: the
        control plane accepts a receipt only after it holds the callback digest."""
        record = self._ctx.journal().find_by_attempt(attempt_id)
        if record is not None and record.state == "launching" and item.started_pending is not None:
            record = self._journal_started(record, item)
            if record is None:
                return  # the journal still cannot take it: the next pass tries again
        if record is None or record.state != "started":
            with self._ctx.attempts.lock:
                item.ack_pending = False
            return
        record = self._ack_running(record)
        if item.ack_pending:
            return  # still failing: the next pass tries again (the lease is renewed meanwhile)
        if record.state not in ("started", "running_acknowledged"):
            self._ctx.attempts.forget(attempt_id)  # lost (stopped) or handed to recovery
            return
        with self._ctx.attempts.lock:
            # Under the lock the exit watcher takes: either it sees `acked` and settles, or we see
            # `exited` here and settle; never both.
            item.acked = True
            settle_now = item.adopted or item.exited
        if settle_now:
            self._ctx.settlement.settle_or_defer(attempt_id)

    def _journal_started(self, record: JournalRecord, item: ActiveAttempt) -> JournalRecord | None:
        """Journal the `started` row intake could not (Intake._started_pending); None while the journal
        still cannot take a write."""
        assert item.handle is not None and item.started_pending is not None
        try:
            record = self._ctx.journal().advance(
                record.offer_id,
                expected_revision=record.revision,
                to_state="started",
                executor_handle=item.handle,
                executor_started_at_ms=item.started_pending,
            )
        except JournalUnavailable:
            return None
        item.started_pending = None
        return record

    def _settle_first(self, attempt_id: str) -> str:
        """Settle from the receipt, if there is one; ``running`` when the process still runs, ``deferred``
        when the control plane cannot take it now, ``refused`` when it refuses it (never raises)."""
        try:
            return self._ctx.settlement.settle_or_defer(attempt_id)
        except Ql3Error:
            return "refused"

    def session_fenced(self) -> None:
        """The control plane refused this session (replaced, offline): stop what it held, and take no
        more work until an operator restarts the worker (a new session is registered then). A process
        that already exited is stopped by nobody: its receipt is submitted first, as its attempt's
        late fact (the session is not its authority; its callback token is)."""
        for attempt_id, item in self._ctx.attempts.snapshot(MAX_SLOTS):
            if item.exited and not item.ack_pending:
                self._settle_first(attempt_id)
        self._ctx.stops.stop_all()
        self._ctx.session.current = None
