"""The only place that wires adapters to services."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from ql3.domain.errors import ConfigurationError
from ql3.ports.storage import Database
from ql3.storage.migrations import MigrationState
from ql3.storage.notify import LocalNotifier


class ManagedDatabase(Database, Protocol):
    notifier: LocalNotifier

    def migrate(self) -> list[int]: ...
    def migration_status(self) -> list[MigrationState]: ...


def ql3_home() -> Path:
    return Path(os.environ.get("QL3_HOME") or Path.home() / ".ql3")


def default_database_url(home: Path) -> str:
    return f"sqlite:///{home / 'ql3.db'}"


def open_database(url: str) -> ManagedDatabase:
    """``sqlite:///abs/path`` (edge, standalone) or ``postgresql://...`` (cluster)."""
    if url.startswith("sqlite:///"):
        from ql3.storage.sqlite.adapter import SqliteDatabase

        path = Path(url.removeprefix("sqlite://"))
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        return SqliteDatabase(path)
    if url.startswith(("postgresql://", "postgres://")):
        from ql3.storage.postgres.adapter import PostgresDatabase

        return PostgresDatabase(url)
    raise ConfigurationError("unsupported database URL scheme (use sqlite:/// or postgresql://)")


# -- the standalone runtime: dispatcher, embedded worker, scanners ------------------------------------

PROFILES: dict[str, dict[str, float]] = {
    # backstop cadences in seconds: how long an idle loop sleeps when nothing wakes it
    "edge": {
        "dispatch": 30.0,
        "expiry": 30.0,
        "maintain": 10.0,
        "cron": 60.0,
        "cron_page": 4,
        "actions": 30.0,
    },
    "standalone": {
        "dispatch": 5.0,
        "expiry": 5.0,
        "maintain": 10.0,
        "cron": 30.0,
        "cron_page": 16,
        "actions": 5.0,
    },
}


WAKE_CHANNELS = ("runs", "schedules", "cancellations", "approved_actions", "retries")


def lease_secret(home: Path) -> bytes:
    """The control-plane secret that derives run lease tokens (so the database holds digests only)."""
    path = home / "lease.secret"
    try:
        data = path.read_bytes()
        if len(data) >= 32:
            return data
    except FileNotFoundError:
        pass
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, os.urandom(32))
        os.fsync(fd)
    finally:
        os.close(fd)
    return path.read_bytes()


def fault_point(point: str) -> None:
    """Crash injection for the fault tests: ``QL3_FAULT=<point>`` ends the process there, like kill -9."""
    if os.environ.get("QL3_FAULT") == point:
        os._exit(137)


@dataclass
class StandaloneRuntime:
    """Everything ``ql3 serve`` runs besides HTTP; ``loops`` are started in order, stopped in reverse."""

    dispatcher: Any
    worker: Any
    loops: list[Any]
    db: Any = None

    def start(self) -> None:
        listen = getattr(self.db, "start_listening", None)
        if listen is not None:
            # PostgreSQL: other replicas' commits wake our loops through LISTEN/NOTIFY.
            listen(list(WAKE_CHANNELS))
        self.worker.start()
        for loop in self.loops:
            loop.start()

    def stop(self) -> None:
        for loop in reversed(self.loops):
            loop.stop()
        self.worker.stop()


def build_standalone_runtime(
    db: ManagedDatabase,
    home: Path,
    *,
    profile: str = "standalone",
    slots: int | None = None,
    worker_id: str | None = None,
    default_cwd: Path | None = None,
) -> StandaloneRuntime:
    import socket
    import time

    from ql3.application import approvals, cancellation, leases, schedules
    from ql3.application.approved_actions import ApprovedActionDispatcher, RecoveryResolver, RunCreateHandler
    from ql3.application.cancellation import CancellationSupervisor
    from ql3.application.cron import CronScheduler
    from ql3.application.dispatcher import DispatchBudget, RunDispatcher
    from ql3.application.gateway import InProcessControlPlane
    from ql3.application.lifecycle import LifecycleRunner
    from ql3.domain.errors import Conflict
    from ql3.execution.controller import ProcessController
    from ql3.worker.agent import WorkerAgent, WorkerConfig

    if profile not in PROFILES:
        raise ConfigurationError("unknown profile")
    cadence = PROFILES[profile]
    clock = getattr(db, "clock", None) or (lambda: time.time_ns() // 1_000_000)
    run_lease_ms = int(os.environ.get("QL3_RUN_LEASE_MS", "30000"))
    wid = worker_id or f"embedded-{socket.gethostname()}"[:128]
    dispatcher = RunDispatcher(
        db,
        lease_secret=lease_secret(home),
        budget=DispatchBudget(lease_ms=run_lease_ms),
        incarnation_started_ms=clock(),
        local_worker_id=wid,
    )
    worker = WorkerAgent(
        InProcessControlPlane(db),
        WorkerConfig(
            worker_id=wid,
            home=home / "worker",
            slots=slots if slots is not None else max(2, (os.cpu_count() or 2) * 2),
            run_lease_ms=run_lease_ms,
            default_cwd=None if default_cwd is None else str(default_cwd),
        ),
        clock=clock,
        fault=fault_point,
    )
    notifier = db.notifier

    def dispatch_cycle() -> bool:
        if worker.active_count >= worker.config.slots:
            return False
        result = dispatcher.dispatch_once()
        if result.offer is None:
            return result.truncated
        fault_point("after_claim")
        worker.submit(result.offer)
        return True

    def expiry_cycle() -> bool:
        did = False
        for attempt_id in db.transaction(lambda tx: leases.expired_page(tx, 16), write=False):
            db.transaction(partial(leases.expire_lease, attempt_id=attempt_id))
            did = True
        for run_id in db.transaction(lambda tx: leases.retry_due_page(tx, 16), write=False):
            db.transaction(partial(leases.admit_retry, run_id=run_id))
            did = True
        return did

    scheduler = CronScheduler(db, page=int(cadence["cron_page"]))

    def cron_cycle() -> bool:
        return len(scheduler.schedule_once().decisions) >= int(cadence["cron_page"])

    def cron_wait(backstop_s: float) -> bool:
        # Sleep until the earliest occurrence (or a task change), never longer than the backstop.
        earliest = db.transaction(schedules.earliest_fire_at, write=False)
        delay = backstop_s if earliest is None else max(0.0, (earliest - clock()) / 1000)
        return db.wait_for("schedules", min(backstop_s, delay + 0.001))

    owner = f"{wid}-control"[:128]  # this process's identity as lease owner of control-plane work
    action_lease_ms = int(os.environ.get("QL3_ACTION_LEASE_MS", "60000"))
    action_dispatcher = ApprovedActionDispatcher(
        db, [RunCreateHandler()], owner, lease_ms=action_lease_ms, fault=fault_point
    )
    resolver = RecoveryResolver(db, [RunCreateHandler()], owner)

    def actions_cycle() -> bool:
        """Consume approved requests, run due approved actions, resolve crashed ones from evidence."""
        consumed = 0
        for approval_id in db.transaction(
            lambda tx: approvals.unconsumed_approved(tx, limit=16), write=False
        ):
            with contextlib.suppress(Conflict):  # a concurrent consumer won; nothing to do
                db.transaction(
                    partial(approvals.consume, approval_id=approval_id, consumption_id=f"auto.{approval_id}")
                )
                consumed += 1
        batch = action_dispatcher.dispatch_batch()
        resolved = resolver.resolve_batch()
        return consumed > 0 or len(batch.items) >= 16 or len(resolved.items) >= 16

    supervisor = CancellationSupervisor(
        db,
        signal=ProcessController().stop,
        owner=owner,
        lease_ms=int(os.environ.get("QL3_CANCEL_LEASE_MS", "30000")),
        fault=fault_point,
        local_worker_id=wid,
    )

    def cancellation_cycle() -> bool:
        timeouts = cancellation.timeout_cycle(db)
        report = supervisor.run_cycle()
        return timeouts.truncated or report.stop_reason == "page_limit"

    def cancellation_wait(backstop_s: float) -> bool:
        # Sleep until the next deadline, backoff or lease expiry (or a new intent), within the backstop.
        row = db.transaction(lambda tx: tx.one("cancel_next_wake"), write=False) or {}
        due = [int(v) for v in row.values() if v is not None]
        delay = backstop_s if not due else max(0.0, (min(due) - clock()) / 1000)
        return db.wait_for("cancellations", min(backstop_s, delay + 0.001))

    worker.on_settled = lambda attempt_id: notifier.notify("runs")

    def loop(
        name: str,
        cycle: Callable[[], bool],
        channel: str,
        backstop_s: float,
        wait: Callable[[float], bool] | None = None,
    ) -> LifecycleRunner:
        """A loop woken by commits on ``channel`` (or its own ``wait``), with a slow backstop."""
        return LifecycleRunner(
            name,
            cycle,
            wake=wait or (lambda t: db.wait_for(channel, t)),
            backstop_s=backstop_s,
            interrupt=lambda: notifier.notify(channel),
        )

    def maintain_wait(backstop_s: float) -> bool:
        # Re-adopted processes (from a previous incarnation) are not our children: poll them.
        return db.wait_for("maintain", min(backstop_s, 0.5) if worker.has_adopted() else backstop_s)

    loops = [
        loop("dispatcher", dispatch_cycle, "runs", cadence["dispatch"]),
        loop(
            "worker-maintain", lambda: bool(worker.maintain()), "maintain", cadence["maintain"], maintain_wait
        ),
        loop("lease-expiry", expiry_cycle, "retries", cadence["expiry"]),
        loop("cancellation", cancellation_cycle, "cancellations", cadence["expiry"], cancellation_wait),
        loop("approved-actions", actions_cycle, "approved_actions", cadence["actions"]),
        loop("cron", cron_cycle, "schedules", cadence["cron"], cron_wait),
    ]
    return StandaloneRuntime(dispatcher=dispatcher, worker=worker, loops=loops, db=db)
