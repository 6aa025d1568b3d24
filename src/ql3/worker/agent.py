"""The worker agent: one worker host, assembled from its parts (docs/contracts.md §3,
docs/architecture.md "The life of a run"):

- ``session``: the session registered (or resumed) with the control plane;
- ``intake``: offer intake behind the journal's crash barrier, the launch and the activation ACKs;
- ``settlement``: completion from receipts, or a lost report for a process that left none;
- ``maintenance``: heartbeats, renewals, running ACKs sent again, exited processes settled;
- ``reconciliation``: what a restart finds in the journal;
- ``stops``: stopping local processes on a lost lease, a fenced session, or a lease-control stop;
- ``attempts``: the in-memory active set they share.

The parts depend on the execution ports (``ports/execution.py``) only; this module is the worker's
composition root, the one that names the adapters: the default launcher, exit watcher and process
controller, and the journal it opens at start.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ql3.domain.offers import Offer
from ql3.execution.controller import ProcessController
from ql3.execution.deadlines import host_clock_ms
from ql3.execution.launcher import ExitWatcher, Launched, LocalLauncher
from ql3.ports.control_plane import ControlPlane, SessionInfo
from ql3.ports.execution import HostDeadlines, Launcher
from ql3.ports.execution import ProcessController as ProcessControllerPort
from ql3.worker.attempts import ActiveAttempts
from ql3.worker.config import WorkerConfig
from ql3.worker.context import WorkerContext
from ql3.worker.intake import Intake
from ql3.worker.journal.store import WorkerJournal
from ql3.worker.maintenance import Maintenance
from ql3.worker.reconciliation import Reconciliation
from ql3.worker.session import WorkerSession
from ql3.worker.settlement import Settlement
from ql3.worker.stops import LocalStops


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
        launcher: Launcher[Launched] | None = None,
        controller: ProcessControllerPort | None = None,
        fault: Callable[[str], None] | None = None,
        deadlines: HostDeadlines | None = None,
        host_clock: Callable[[], int] = host_clock_ms,
        local_fence: bool = True,
    ) -> None:
        self.config = config
        self._clock = clock
        self._deadlines = deadlines
        self._journal: WorkerJournal | None = None
        self._session = WorkerSession(client, config)
        self._attempts = ActiveAttempts()
        process_controller = controller or ProcessController()
        self._stops = LocalStops(
            client=client,
            controller=process_controller,
            attempts=self._attempts,
            journal=self._current_journal,
        )
        self._settlement = Settlement(
            client=client,
            receipts_dir=config.receipts_dir,
            controller=process_controller,
            attempts=self._attempts,
            journal=self._current_journal,
            deadlines=deadlines,
        )
        self._stops.on_stopped = self._settle_stopped_soon
        self._watcher = ExitWatcher(self._settlement.on_exit)
        context = WorkerContext(
            client=client,
            config=config,
            clock=clock,
            session=self._session,
            attempts=self._attempts,
            journal=self._current_journal,
            settlement=self._settlement,
            stops=self._stops,
            deadlines=deadlines,
            host_clock=host_clock,
            local_fence=local_fence,
        )
        self._intake: Intake[Launched] = Intake(
            context,
            launcher=launcher or LocalLauncher(),
            watcher=self._watcher,
            fault=fault or (lambda point: None),
        )
        self._maintenance = Maintenance(context, ack_running=self._intake.ack_running)
        self._reconciliation = Reconciliation(context, ack_running=self._intake.ack_running)

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def journal(self) -> WorkerJournal:
        return self._current_journal()

    def _current_journal(self) -> WorkerJournal:
        assert self._journal is not None, "worker not started"
        return self._journal

    @property
    def session(self) -> SessionInfo | None:
        return self._session.current

    @session.setter
    def session(self, value: SessionInfo | None) -> None:
        self._session.current = value

    @property
    def on_settled(self) -> Callable[[str], None]:
        """Called with the attempt id whenever an attempt leaves the active set (a slot is free)."""
        return self._attempts.on_settled

    @on_settled.setter
    def on_settled(self, callback: Callable[[str], None]) -> None:
        self._attempts.on_settled = callback

    def start(self) -> None:
        home = self.config.home
        for path in (home, self.config.logs_dir, self.config.receipts_dir):
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._journal = WorkerJournal.open(
            home / "journal.db", clock=self._clock, capacity=self.config.journal_capacity
        )
        if self._deadlines is not None:
            # Before anything runs: the executor keeps the time of every attempt from its spawn on.
            self._deadlines.start()
        self._session.register()
        self._watcher.start()
        self.reconcile()
        self._intake.open()

    def stop(self) -> None:
        """Processes keep running: they are re-adopted by the next start."""
        self._intake.close()
        self._watcher.stop()
        if self._deadlines is not None:
            self._deadlines.release()
        if self._journal is not None:
            self._journal.close()
            self._journal = None

    def _settle_stopped_soon(self, attempt_id: str, signalled: bool) -> None:
        """A lease-loss stop ended a process: settle its receipt in a thread of its own (the completion
        may wait for an unreachable control plane; maintenance and intake, which stopped it, must not)."""
        threading.Thread(
            target=self._settlement.settle_stopped,
            args=(attempt_id, signalled),
            name="ql3-stopped-receipt",
            daemon=True,
        ).start()

    def has_adopted(self) -> bool:
        return self._attempts.has_adopted()

    @property
    def active_count(self) -> int:
        return len(self._attempts)

    def is_active(self, attempt_id: str) -> bool:
        return self._attempts.get(attempt_id) is not None

    # -- the parts' entry points -----------------------------------------------------------------

    def submit(self, offer: Offer, *, asked_at: float | None = None) -> None:
        """Hand an offer to the intake threads (spawns overlap with the dispatcher's next claim);
        ``asked_at``: see ``OfferIntake.receive``."""
        self._intake.submit(offer, asked_at=asked_at)

    def receive(self, offer: Offer, *, asked_at: float | None = None) -> str:
        """Verify, journal and start one offer. Returns the journal state it reached."""
        return self._intake.receive(offer, asked_at=asked_at)

    def settle(self, attempt_id: str) -> str:
        """Receipt first: complete with the journal's original authority, then acknowledge, then delete."""
        return self._settlement.settle(attempt_id)

    def control_stop(self, attempt_id: str) -> str:
        """Ask the control plane about a stop of one started attempt (docs/cluster.md "Stop")."""
        return self._stops.control_stop(attempt_id)

    def maintain(self) -> bool:
        """One bounded maintenance pass (see ``Maintenance.maintain``)."""
        return self._maintenance.maintain()

    def session_fenced(self) -> None:
        """The control plane refused this session (replaced, offline): stop what it held, as a fenced
        heartbeat does, and take no more work until a new session is registered."""
        self._maintenance.session_fenced()

    def reconcile(self) -> dict[str, int]:
        """After a restart: launching is never re-spawned; receipts first; live processes re-adopted."""
        return self._reconciliation.reconcile()
