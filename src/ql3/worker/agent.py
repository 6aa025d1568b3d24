"""The worker agent: offer intake behind the journal's crash barrier, launch, ACKs, renewal,
completion from receipts, and reconciliation after a restart (docs/contracts.md §3, docs/architecture.md
"The life of a run")."""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from ql3.domain import leases as lease_rules
from ql3.domain.digests import new_token, sha256_hex
from ql3.domain.errors import Conflict, FenceConflict, NotFound, Ql3Error, ValidationFailed
from ql3.domain.ids import new_id
from ql3.domain.offers import LeaseFence, Offer, spec_digest
from ql3.domain.workers import validate_worker_id
from ql3.execution.controller import DEFAULT_GRACE_MS, MAX_GRACE_MS, ProcessController, kill_orphans
from ql3.execution.identity import InvalidHandle, ProcessHandle, probe
from ql3.execution.launcher import (
    ExitWatcher,
    LaunchFailed,
    LaunchRejected,
    LaunchRequest,
    LocalLauncher,
    ShellCommand,
)
from ql3.execution.logs import log_path_for
from ql3.execution.receipts import (
    Receipt,
    ReceiptInvalid,
    delete_receipt,
    quarantine_receipt,
    read_launch_identity,
    read_receipt,
)
from ql3.ports.control_plane import ControlPlane, ControlPlaneUnreachable, SessionInfo
from ql3.worker.journal.errors import JournalConflict
from ql3.worker.journal.records import JournalOffer, JournalRecord
from ql3.worker.journal.states import RecoveryReason
from ql3.worker.journal.store import WorkerJournal

log = logging.getLogger("ql3.worker")
CALLBACK_SEQUENCE: Final = 1
RECEIPT_GRACE_MS: Final = 100
MAX_SLOTS: Final = 1024
# Why the worker reports an attempt lost (the run's error_code): what it knows, not a lease expiry.
LOST_LAUNCH_OUTCOME_UNKNOWN: Final = "RECOVERY_LAUNCH_OUTCOME_UNKNOWN"
LOST_EXITED_WITHOUT_RECEIPT: Final = "RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT"


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerConfig:
    worker_id: str
    home: Path
    slots: int = 4
    labels: dict[str, str] = field(default_factory=dict)
    session_lease_ms: int = 30_000
    run_lease_ms: int = 30_000
    log_cap_bytes: int = 16 * 1024 * 1024
    journal_capacity: int = 64
    intake_threads: int = 2
    journal_retention_ms: int = 3_600_000
    # Where a task without its own cwd runs (``ql3 serve``: $QL3_HOME/scripts); None: the worker's cwd.
    default_cwd: str | None = None

    def __post_init__(self) -> None:
        validate_worker_id(self.worker_id)
        if not 1 <= self.slots <= MAX_SLOTS:
            raise ValidationFailed("slots must be 1-1024", field="slots")
        if not 1 <= self.journal_capacity <= 1024 or self.journal_capacity < self.slots:
            raise ValidationFailed("journal capacity must cover the slots and be at most 1024")
        if not 60_000 <= self.journal_retention_ms <= 30 * 24 * 3_600_000:
            raise ValidationFailed("journal retention must be 1 min - 30 days", field="journal_retention_ms")
        if not 1 <= self.intake_threads <= 16:
            raise ValidationFailed("intake_threads must be 1-16", field="intake_threads")
        if not lease_rules.RUN.contains(self.run_lease_ms) or not lease_rules.SESSION.contains(
            self.session_lease_ms
        ):
            raise ValidationFailed("lease durations must be 5 s - 10 min")

    @property
    def logs_dir(self) -> Path:
        return self.home / "logs"

    @property
    def receipts_dir(self) -> Path:
        return self.home / "receipts"

    @property
    def capabilities(self) -> dict[str, Any]:
        caps: dict[str, Any] = {"executors": ["local_process"], "operatingSystem": "linux"}
        if self.labels:
            caps["labels"] = dict(self.labels)
        return caps


@dataclass(slots=True)
class _Active:
    """In-memory view of one attempt this worker is executing (bounded by the slots)."""

    offer_id: str
    fence: LeaseFence
    handle: str | None = None
    pid: int | None = None
    adopted: bool = False
    stop_requested: bool = False
    acked: bool = False  # running ACK committed: completion may be submitted
    ack_pending: bool = False  # the running ACK failed transiently: maintain() sends it again
    exited: bool = False  # the process exited; completion pending or to be retried
    renewed_at_ms: int | None = None  # the worker clock at the last successful renewal


# What the journal keeps of a spec: identity and stop policy. The command, working directory and
# environment values reach the launcher from the delivered offer only, and never touch the disk here.
_JOURNAL_SPEC_KEYS: Final = frozenset(
    {"runId", "attemptId", "projectId", "taskId", "taskRevision", "terminationGraceMs", "timeoutMs"}
)


def _journal_offer_json(offer: Offer) -> str:
    # The lease token travels beside it (``JournalOffer.lease_token``): the journal keeps it sealed.
    spec = {k: v for k, v in offer.spec.items() if k in _JOURNAL_SPEC_KEYS}
    return replace(offer, spec=spec, fence=replace(offer.fence, lease_token="")).to_json()


def _journal_offer(record: JournalRecord) -> Offer:
    """The stored offer with its lease token unsealed by the journal."""
    offer = Offer.from_json(json.loads(record.offer_json))
    return replace(offer, fence=replace(offer.fence, lease_token=record.lease_token or ""))


def _termination_grace_ms(record: JournalRecord) -> int:
    """The task's TERM -> KILL grace, as the offer carried it (``terminationGraceMs``)."""
    try:
        grace = json.loads(record.offer_json).get("spec", {}).get("terminationGraceMs")
    except (ValueError, AttributeError):
        grace = None
    if isinstance(grace, bool) or not isinstance(grace, int) or not 0 <= grace <= MAX_GRACE_MS:
        return DEFAULT_GRACE_MS
    return grace


class WorkerAgent:
    """One worker host. ``receive`` is synchronous up to the running ACK; completion arrives from the
    exit watcher thread; ``maintain`` (renewals, heartbeats, adopted processes) is a plain cycle run by a
    LifecycleRunner."""

    def __init__(
        self,
        client: ControlPlane,
        config: WorkerConfig,
        *,
        clock: Callable[[], int],
        launcher: LocalLauncher | None = None,
        controller: ProcessController | None = None,
        fault: Callable[[str], None] | None = None,
    ) -> None:
        self._client = client
        self.config = config
        self._clock = clock
        self._launcher = launcher or LocalLauncher()
        self._controller = controller or ProcessController()
        self._fault = fault or (lambda point: None)
        self._lock = threading.RLock()
        self._active: dict[str, _Active] = {}
        self._journal: WorkerJournal | None = None
        self._watcher = ExitWatcher(self._on_exit)
        self._intake: ThreadPoolExecutor | None = None
        self._last_renewal_ms = 0
        self.session: SessionInfo | None = None
        self.on_settled: Callable[[str], None] = lambda attempt_id: None

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def journal(self) -> WorkerJournal:
        assert self._journal is not None, "worker not started"
        return self._journal

    def _session_file(self) -> Path:
        return self.config.home / "session.json"

    def start(self) -> None:
        home = self.config.home
        for path in (home, self.config.logs_dir, self.config.receipts_dir):
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._journal = WorkerJournal.open(
            home / "journal.db", clock=self._clock, capacity=self.config.journal_capacity
        )
        session_id = self._load_session_id()
        self.session = self._client.register(
            worker_id=self.config.worker_id,
            session_id=session_id,
            capabilities=self.config.capabilities,
            max_concurrent_runs=self.config.slots,
            session_lease_ms=self.config.session_lease_ms,
        )
        self._save_session_id(self.session.session_id)
        self._watcher.start()
        self.reconcile()
        self._intake = ThreadPoolExecutor(self.config.intake_threads, thread_name_prefix="ql3-intake")

    def stop(self) -> None:
        """Processes keep running: they are re-adopted by the next start."""
        if self._intake is not None:
            self._intake.shutdown(wait=True, cancel_futures=False)
            self._intake = None
        self._watcher.stop()
        if self._journal is not None:
            self._journal.close()
            self._journal = None

    def _load_session_id(self) -> str:
        # Resuming our own session keeps the leases' authority across a restart of this host; a
        # session replaced by someone else is fenced and a fresh one is registered instead.
        try:
            data = json.loads(self._session_file().read_text())
            if data.get("worker_id") == self.config.worker_id and isinstance(data.get("session_id"), str):
                return str(data["session_id"])
        except (OSError, ValueError):
            pass
        return new_id()

    def _save_session_id(self, session_id: str) -> None:
        path = self._session_file()
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump({"worker_id": self.config.worker_id, "session_id": session_id}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    def has_adopted(self) -> bool:
        with self._lock:
            return any(a.adopted for a in self._active.values())

    @property
    def active_count(self) -> int:
        with self._lock:
            return len(self._active)

    # -- intake: the crash barrier ----------------------------------------------------------------

    def submit(self, offer: Offer) -> None:
        """Hand an offer to the intake threads (spawns overlap with the dispatcher's next claim).
        The queue is bounded by the worker's slots: every offer holds a lease counted against them."""
        if self._intake is None:
            raise ValidationFailed("worker not started")
        self._intake.submit(self._receive_logged, offer)

    def _receive_logged(self, offer: Offer) -> None:
        try:
            self.receive(offer)
        except Exception as exc:  # the lease stays; recovery or expiry decides, never a blind retry
            log.warning(
                "offer intake failed", extra={"action": "worker.intake_failed", "error": type(exc).__name__}
            )

    def receive(self, offer: Offer) -> str:
        """Verify, journal and start one offer. Returns the journal state it reached."""
        session = self.session
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
        if spec_digest(offer.spec) != offer.spec_digest or (
            offer.spec.get("runId"),
            offer.spec.get("attemptId"),
        ) != (f.run_id, f.attempt_id):
            raise ValidationFailed("offer spec does not match its digest or identity", field="spec")
        if self.journal.get(offer.offer_id) is None:
            # Before the first journal write: the lease must be live under this exact authority
            # (expired, replaced or fenced offers never reach the journal). Raises FenceConflict.
            self._client.lease_status(f)
        accepted = self.journal.accept(
            JournalOffer(
                offer_id=offer.offer_id,
                run_id=f.run_id,
                attempt_id=f.attempt_id,
                lease_generation=f.lease_generation,
                execution_spec_digest=offer.spec_digest,
                delivery_kind=offer.delivery_kind,
                offer_json=_journal_offer_json(offer),
                lease_token=f.lease_token,
            )
        )
        record = accepted.record
        with self._lock:
            if record.attempt_id in self._active and not accepted.created:
                return record.state  # in-process duplicate: coalesced
            # The lease was checked live just now (lease_status) or claimed moments ago.
            self._active[record.attempt_id] = _Active(
                offer_id=record.offer_id, fence=f, renewed_at_ms=self._clock()
            )
        self._fault("after_accept")
        if record.state == "accepted":
            record = self._ack_starting(record, offer)
        if record.state == "starting_acknowledged":
            record = self._launch(record, offer)
        elif record.state == "started":
            record = self._ack_running(record)
        if record.state not in ("running_acknowledged", "started"):
            with self._lock:
                self._active.pop(record.attempt_id, None)
        return record.state

    def _ack_starting(self, record: JournalRecord, offer: Offer) -> JournalRecord:
        try:
            # The deadline is the control plane's: pinned timeout plus its clock, never ours.
            self._client.ack_starting(offer.fence)
        except Ql3Error:
            # Nothing was spawned, whatever failed (a fence, a conflict, an unreachable control plane,
            # a lost database connection): without renewals the lease expires and the run is placed
            # again. Kept in the active set, the lease would be renewed forever and never run.
            self._forget(record.attempt_id)
            raise
        record = self.journal.advance(
            record.offer_id, expected_revision=record.revision, to_state="starting_acknowledged"
        )
        self._fault("after_starting_ack")
        return record

    def _launch(self, record: JournalRecord, offer: Offer) -> JournalRecord:
        spec = offer.spec
        token = new_token()
        record = self.journal.advance(
            record.offer_id,
            expected_revision=record.revision,
            to_state="launching",
            completion_callback_sequence=CALLBACK_SEQUENCE,
            completion_token_digest=sha256_hex(token),
            log_artifact_id=record.attempt_id,
        )
        self._fault("after_launching")
        request = LaunchRequest(
            run_id=record.run_id,
            attempt_id=record.attempt_id,
            command=ShellCommand(command=spec["command"]["command"]),
            working_directory=spec.get("workingDirectory") or self.config.default_cwd,
            environment_policy=spec.get("environmentPolicy", "inherit"),
            environment=dict(spec.get("environment", {})),
            callback_token=token,
            callback_sequence=CALLBACK_SEQUENCE,
            log_path=log_path_for(self.config.logs_dir, record.attempt_id),
            receipt_dir=self.config.receipts_dir,
            log_cap_bytes=self.config.log_cap_bytes,
            started_at_ms=self._clock(),
            project_id=spec.get("projectId"),
        )
        try:
            launched = self._launcher.start(request)
        except (LaunchRejected, LaunchFailed) as exc:
            record = self.journal.advance(
                record.offer_id, expected_revision=record.revision, to_state="start_failed"
            )
            try:
                self._client.ack_start_failure(offer.fence, error_code="EXECUTOR_START_FAILED")
            except Ql3Error:
                log.warning(
                    "start failure ACK failed",
                    extra={
                        "action": "worker.start_failure_ack_failed",
                        "reason": getattr(exc, "code", "error"),
                    },
                )
                return record
            self._forget(record.attempt_id)
            settled = self.journal.advance(
                record.offer_id, expected_revision=record.revision, to_state="start_failure_acknowledged"
            )
            self.journal.prune(record.offer_id)
            return settled
        self._fault("spawned_before_started")
        handle = launched.handle.encode()
        with self._lock:
            active = self._active.get(record.attempt_id)
            if active is not None:
                active.handle, active.pid = handle, launched.pid
        record = self.journal.advance(
            record.offer_id,
            expected_revision=record.revision,
            to_state="started",
            executor_handle=handle,
            executor_started_at_ms=self._clock(),
        )
        self._watcher.watch(launched)
        self._fault("after_spawn")
        record = self._ack_running(record)
        with self._lock:
            active = self._active.get(record.attempt_id)
            if active is not None and active.ack_pending:
                return record  # maintain() confirms it, then completes an exited process
            exited = active is not None and active.exited
            if active is not None:
                active.acked = True
        if exited:
            # The process finished before its running ACK was committed: complete it now.
            self._on_exit(record.attempt_id)
            latest = self.journal.get(record.offer_id)
            return latest or record
        return record

    def _ack_running(self, record: JournalRecord) -> JournalRecord:
        active = self._active_for(record)
        assert record.executor_handle is not None and record.completion_token_digest is not None
        handle = ProcessHandle.decode(record.executor_handle)
        try:
            self._client.ack_running(
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
            return self._lease_lost(record, active)
        except Conflict:
            return self.journal.advance(
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
            with self._lock:
                active.acked = False
                active.ack_pending = True
            return record
        with self._lock:
            active.ack_pending = False
        current = self.journal.get(record.offer_id)
        assert current is not None
        if current.state != "started":
            return current  # completion raced ahead of the ACK bookkeeping
        return self.journal.advance(
            record.offer_id, expected_revision=current.revision, to_state="running_acknowledged"
        )

    def _active_for(self, record: JournalRecord) -> _Active:
        with self._lock:
            active = self._active.get(record.attempt_id)
            if active is None:
                offer = _journal_offer(record)
                active = _Active(offer_id=record.offer_id, fence=offer.fence, handle=record.executor_handle)
                self._active[record.attempt_id] = active
            return active

    def _forget(self, attempt_id: str) -> None:
        with self._lock:
            self._active.pop(attempt_id, None)
        self.on_settled(attempt_id)

    # -- completion ------------------------------------------------------------------------------

    def _on_exit(self, attempt_id: str) -> None:
        with self._lock:
            active = self._active.get(attempt_id)
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

    def settle(self, attempt_id: str) -> str:
        """Receipt first: complete with the journal's original authority, then acknowledge, then delete."""
        record = self.journal.find_by_attempt(attempt_id)
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
                self.config.receipts_dir,
                record.attempt_id,
                expected_run_id=record.run_id,
                expected_sequence=record.completion_callback_sequence or CALLBACK_SEQUENCE,
                expected_token_digest=record.completion_token_digest,
            )
        except ReceiptInvalid:
            quarantine_receipt(self.config.receipts_dir, record.attempt_id)
            return None

    def _complete(self, record: JournalRecord, receipt: Receipt) -> str:
        attempt_id = record.attempt_id
        active = self._active_for(record)
        self._client.complete(
            active.fence,
            callback_sequence=receipt.callback_sequence,
            callback_token=receipt.token,
            exit_code=receipt.exit_code,
        )
        self._acknowledge(record)
        delete_receipt(self.config.receipts_dir, attempt_id)
        self.journal.prune(record.offer_id)
        self._forget(attempt_id)
        return "completion_acknowledged"

    def _acknowledge(self, record: JournalRecord) -> None:
        for _ in range(4):  # the running-ACK bookkeeping may advance the record concurrently
            current = self.journal.get(record.offer_id)
            assert current is not None
            if current.state == "completion_acknowledged":
                return
            try:
                self.journal.advance(
                    current.offer_id, expected_revision=current.revision, to_state="completion_acknowledged"
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
            kill_orphans(ProcessHandle.decode(record.executor_handle))
        except (InvalidHandle, OSError) as exc:
            log.warning(
                "orphan sweep failed",
                extra={"action": "worker.orphan_sweep_failed", "error": type(exc).__name__},
            )
        active = self._active_for(record)
        try:
            self._client.report_lost(active.fence, error_code=LOST_EXITED_WITHOUT_RECEIPT)
        except FenceConflict:
            pass
        current = self.journal.get(record.offer_id)
        if current is not None and current.state in ("started", "running_acknowledged"):
            self.journal.advance(
                current.offer_id,
                expected_revision=current.revision,
                to_state="recovery_required",
                recovery_reason="process_exited_without_receipt",
            )
        # The control plane holds the outcome now (or the lease was no longer ours): nothing to recover.
        self.journal.prune(record.offer_id)
        self._forget(record.attempt_id)
        return "lost"

    # -- stop through lease control (a remote worker, docs/cluster.md "Stop") ---------------------

    def control_stop(self, attempt_id: str) -> str:
        """Ask the control plane about a stop of one started attempt. ``stop_requested`` is answered
        only once the cancellation dispatch is settled; then the process identity is re-proven and
        the group signalled with the task's grace (in a thread: TERM -> grace -> KILL)."""
        with self._lock:
            active = self._active.get(attempt_id)
            if active is None:
                return "unknown"
            if active.stop_requested:
                return "stop_requested"
            fence, pid = active.fence, active.pid
        record = self.journal.find_by_attempt(attempt_id)
        if record is None or record.executor_handle is None:
            return "not_started"  # asked again once the running ACK committed
        decision = self._client.lease_control(fence)
        if decision != "stop_requested":
            return decision
        with self._lock:
            if active.stop_requested:
                return decision
            active.stop_requested = True
        threading.Thread(
            target=self._stop_process,
            args=(record.executor_handle, pid, _termination_grace_ms(record)),
            name="ql3-stop",
            daemon=True,
        ).start()
        return decision

    def _stop_process(self, handle: str, pid: int | None, grace_ms: int) -> None:
        try:
            outcome = self._controller.stop(handle, pid, grace_ms=grace_ms)
            log.info("stop signalled", extra={"action": "worker.stop", "status": outcome.status})
        except Exception as exc:  # the exit (or the lease) settles the run either way
            log.warning("stop failed", extra={"action": "worker.stop_failed", "error": type(exc).__name__})

    # -- lease loss ------------------------------------------------------------------------------

    def _lease_lost(self, record: JournalRecord, active: _Active) -> JournalRecord:
        """Stop the local process only on a full authority match; the old worker never writes lost."""
        reason: RecoveryReason = "lease_lost_local_execution_unverified"
        if record.executor_handle is not None:
            try:
                outcome = self._controller.stop(
                    record.executor_handle, None, grace_ms=_termination_grace_ms(record)
                )
                if outcome.status in ("termination_requested", "already_exited"):
                    reason = "lease_lost_local_execution_stopped"
            except Exception as exc:  # the record stays as it was; the next maintain() pass tries again
                log.warning(
                    "local stop after lease loss failed",
                    extra={"action": "worker.lease_lost_stop_failed", "error": type(exc).__name__},
                )
                return record
        current = self.journal.get(record.offer_id)
        self._forget(record.attempt_id)
        if current is None:  # the exit watcher settled and pruned it meanwhile
            return record
        if current.state in ("completion_acknowledged", "recovery_required"):
            return current
        return self.journal.advance(
            current.offer_id,
            expected_revision=current.revision,
            to_state="recovery_required",
            recovery_reason=reason,
        )

    # -- maintenance: renewals, heartbeats, adopted processes ------------------------------------

    def maintain(self) -> bool:
        """One bounded pass: when due, heartbeat and renew every active lease; always settle
        processes that exited (re-adopted ones are not our children, so they are polled here).

        A lease that could not be renewed for half its duration (the control plane or its database
        unreachable: renewals are due every third) can no longer be proven ours: its process is
        stopped, as on a fenced renewal, before the server's expiry may hand the run to another
        worker. The age is read after the failed call, which may itself have taken a while."""
        session = self.session
        if session is None:
            return False
        now = self._clock()
        renew_due = now - self._last_renewal_ms >= self.config.run_lease_ms // 3
        unreachable: Ql3Error | None = None
        if renew_due:
            try:
                self.session = replace(self._client.heartbeat(session), outcome=session.outcome)
            except FenceConflict:
                # Replaced or offline: every lease we hold is gone. Stop what we run (same authority
                # only), never re-register by ourselves, and never write `lost` for the old session.
                log.warning("session fenced", extra={"action": "worker.session_fenced"})
                self._fenced_stop_all()
                return False
            except Ql3Error as exc:  # transient: renewals are still tried, leases still guarded
                unreachable = exc
            else:
                self._last_renewal_ms = now
                # Settled journal rows (receipts already deleted at acknowledgement) are pruned in
                # bounded batches, so the journal does not grow with the number of runs.
                self.journal.retention(older_than_ms=self.config.journal_retention_ms, limit=64)
        with self._lock:
            active = list(self._active.items())[:MAX_SLOTS]
        for attempt_id, item in active:
            if item.renewed_at_ms is None:
                item.renewed_at_ms = now
            if renew_due:
                try:
                    info = self._client.renew(item.fence, self.config.run_lease_ms)
                    with self._lock:
                        if attempt_id in self._active:
                            self._active[attempt_id].fence = replace(item.fence, lease_version=info.version)
                            self._active[attempt_id].renewed_at_ms = now
                except FenceConflict as exc:
                    record = self.journal.find_by_attempt(attempt_id)
                    if exc.details.get("reason") in ("not_leased",):
                        # The attempt ended on the server (completed, or lost by expiry): a process
                        # that still runs is no longer ours to run.
                        if self.settle(attempt_id) == "running" and record is not None:
                            self._lease_lost(record, item)
                        continue
                    if record is not None:
                        self._lease_lost(record, item)
                    continue
                except Ql3Error as exc:
                    unreachable = unreachable or exc
                    if self._clock() - item.renewed_at_ms >= self.config.run_lease_ms // 2:
                        record = self.journal.find_by_attempt(attempt_id)
                        if record is not None:
                            log.warning("lease unrenewable", extra={"action": "worker.self_fence"})
                            self._lease_lost(record, item)
                    continue
            if item.ack_pending:
                self._retry_running_ack(attempt_id, item)
            elif item.adopted or item.exited:
                self.settle(attempt_id)
        if unreachable is not None:
            raise unreachable  # the loop runner records the failure and backs off
        return False

    def _retry_running_ack(self, attempt_id: str, item: _Active) -> None:
        """Send a running ACK that failed transiently again; once confirmed, an exited (or
        re-adopted) process is settled. Without it the completion would be refused forever: the
        control plane accepts a receipt only after it holds the callback digest."""
        record = self.journal.find_by_attempt(attempt_id)
        if record is None or record.state != "started":
            with self._lock:
                item.ack_pending = False
            return
        record = self._ack_running(record)
        if item.ack_pending:
            return  # still failing: the next pass tries again (the lease is renewed meanwhile)
        if record.state not in ("started", "running_acknowledged"):
            self._forget(attempt_id)  # lost (stopped) or handed to recovery
            return
        with self._lock:
            item.acked = True
        if item.adopted or item.exited:
            self.settle(attempt_id)

    def session_fenced(self) -> None:
        """The control plane refused this session (replaced, offline): stop what it held, as a fenced
        heartbeat does, and take no more work until a new session is registered."""
        self._fenced_stop_all()

    def _fenced_stop_all(self) -> None:
        with self._lock:
            active = list(self._active.items())[:MAX_SLOTS]
        for attempt_id, item in active:
            record = self.journal.find_by_attempt(attempt_id)
            if record is not None:
                self._lease_lost(record, item)
        self.session = None  # no more intake or maintenance until an operator restarts the worker

    # -- restart ---------------------------------------------------------------------------------

    def reconcile(self) -> dict[str, int]:
        """After a restart: launching is never re-spawned; receipts first; live processes re-adopted."""
        counts: dict[str, int] = {}
        for record in self.journal.startup_recovery():
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
        offer = _journal_offer(record)
        fence = offer.fence
        if fence.session_id != (self.session.session_id if self.session else None):
            return "session_fenced"
        if record.state == "recovery_required" and record.executor_handle is None:
            if record.recovery_reason != "launch_outcome_unknown":
                return record.recovery_reason or "recovery_required"  # never re-spawned
            # Killed between the spawn and `started`: the shim may have left its identity. With it the
            # record resumes as `started` (receipt first, else re-adoption); it is never spawned again.
            record = self._resolve_launch(record)
        try:
            info = self._client.renew(fence, self.config.run_lease_ms)
            fence = replace(fence, lease_version=info.version)
        except FenceConflict as exc:
            if exc.details.get("reason") != "version_mismatch":
                return self._settle_stale(record, fence)
            fence = self._resume_version(fence)
        if record.executor_handle is None:
            return self._launch_unknown(record, fence)
        with self._lock:
            self._active[record.attempt_id] = _Active(
                offer_id=record.offer_id,
                fence=fence,
                handle=record.executor_handle,
                adopted=True,
                acked=True,
                renewed_at_ms=self._clock(),  # renewed just above
            )
        if record.state == "started":
            # The running ACK may never have been committed: the control plane needs the handle (to
            # stop it) and the token digest (to accept its receipt) before anything else.
            record = self._ack_running(record)
            if record.state not in ("started", "running_acknowledged"):
                self._forget(record.attempt_id)
                return record.recovery_reason or record.state
            with self._lock:
                if self._active[record.attempt_id].ack_pending:
                    return "running_ack_pending"  # maintain() sends it again, then settles
        return self.settle(record.attempt_id)

    def _resolve_launch(self, record: JournalRecord) -> JournalRecord:
        handle = read_launch_identity(self.config.receipts_dir, record.attempt_id)
        if handle is None:
            return record
        return self.journal.advance(
            record.offer_id,
            expected_revision=record.revision,
            to_state="started",
            executor_handle=handle.encode(),
            executor_started_at_ms=self._clock(),
        )

    def _launch_unknown(self, record: JournalRecord, fence: LeaseFence) -> str:
        """No receipt and no trace of the shim: nothing can be proven to run, so the attempt is lost."""
        try:
            self._client.report_lost(fence, error_code=LOST_LAUNCH_OUTCOME_UNKNOWN)
        except FenceConflict:
            pass
        self.journal.prune(record.offer_id)
        self._forget(record.attempt_id)
        return "lost"

    def _resume_version(self, fence: LeaseFence) -> LeaseFence:
        info = self._client.lease_status(fence)
        return replace(fence, lease_version=info.version)

    def _settle_stale(self, record: JournalRecord, fence: LeaseFence) -> str:
        active = _Active(
            offer_id=record.offer_id, fence=fence, handle=record.executor_handle, adopted=True, acked=True
        )
        with self._lock:
            self._active[record.attempt_id] = active
        try:
            state = self.settle(record.attempt_id)
        except (FenceConflict, NotFound):  # NotFound: a database restored from before this run
            state = "stale"
        if record.executor_handle is not None and state in ("running", "stale"):
            # The lease is gone, so the run is no longer ours: what still runs of it must stop.
            self._lease_lost(record, active)
        else:
            self._forget(record.attempt_id)
        return state
