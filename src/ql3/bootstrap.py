"""The only place that wires adapters to services."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from ql3.application.settings import ServeSettings, resolve_home
from ql3.domain.errors import ConfigurationError
from ql3.execution.run_as import TaskUser as TaskUser  # re-exported for ``ql3 serve --run-as``
from ql3.execution.run_as import TaskUsers as TaskUsers
from ql3.execution.run_as import resolve_task_user as resolve_task_user
from ql3.ports.storage import Database
from ql3.storage.migrations import MigrationState
from ql3.storage.notify import LocalNotifier


class ManagedDatabase(Database, Protocol):
    notifier: LocalNotifier

    def migrate(self) -> list[int]: ...
    def migration_status(self) -> list[MigrationState]: ...


def ql3_home() -> Path:
    return resolve_home(os.environ)


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

CANCELLATION_STUCK_AFTER_S = 300.0
WAKE_CHANNELS = ("runs", "schedules", "cancellations", "attempts", "approved_actions", "retries")


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


def fault_injector(armed: str | None) -> Callable[[str], None]:
    """Crash injection for the fault tests: with ``QL3_FAULT=<point>`` the process ends at that point,
    like kill -9. Unarmed, the injector does nothing."""

    def fault_point(point: str) -> None:
        if armed is not None and armed == point:
            os._exit(137)

    return fault_point


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
    settings: ServeSettings,
    *,
    run_as: TaskUser | None = None,
    task_users: TaskUsers | None = None,
    default_cwd: Path | None = None,
) -> StandaloneRuntime:
    """Wire the dispatcher, the embedded worker and the control loops with ``settings``' budgets.
    ``run_as``: a ``TaskUser`` the embedded worker's commands run as (None: the server's own user);
    ``task_users``: the same per project (wins over ``run_as``)."""
    import socket
    import time

    from ql3.application import approvals, cancellation, leases, schedules
    from ql3.application.approved_action_handlers import RunCreateHandler
    from ql3.application.approved_action_recovery import RecoveryResolver
    from ql3.application.approved_action_runner import ApprovedActionDispatcher
    from ql3.application.cancellation import CancellationSupervisor
    from ql3.application.cron import CronScheduler
    from ql3.application.dispatcher import DispatchBudget, RunDispatcher
    from ql3.application.gateway import InProcessControlPlane
    from ql3.application.lifecycle import LifecycleRunner
    from ql3.domain.errors import Conflict
    from ql3.execution.controller import ProcessController, finish_stop
    from ql3.execution.launcher import LocalLauncher
    from ql3.worker.agent import WorkerAgent, WorkerConfig

    budgets = settings.budgets
    home = settings.home
    fault_point = fault_injector(settings.fault)
    clock = getattr(db, "clock", None) or (lambda: time.time_ns() // 1_000_000)
    wid = settings.worker_id or f"embedded-{socket.gethostname()}"[:128]
    dispatcher = RunDispatcher(
        db,
        lease_secret=lease_secret(home),
        budget=DispatchBudget(
            recovery_page=budgets.dispatch_page,
            recovery_pages=budgets.dispatch_pages,
            candidate_page=budgets.dispatch_page,
            candidate_pages=budgets.dispatch_pages,
            claims=budgets.dispatch_claims,
            lease_ms=settings.run_lease_ms,
        ),
        # The restart boundary is compared with lease acquisition times, so it is read from the
        # same clock that wrote them (the database's), never from this host's.
        incarnation_started_ms=db.transaction(lambda tx: tx.now_ms(), write=False),
        local_worker_id=wid,
    )
    worker = WorkerAgent(
        InProcessControlPlane(db),
        WorkerConfig(
            worker_id=wid,
            home=home / "worker",
            slots=settings.slots,
            labels=dict(settings.labels),
            run_lease_ms=settings.run_lease_ms,
            journal_capacity=max(64, settings.slots),
            default_cwd=None if default_cwd is None else str(default_cwd),
        ),
        clock=clock,
        fault=fault_point,
        launcher=(
            LocalLauncher(run_as=run_as, task_users=task_users)
            if run_as is not None or task_users is not None
            else None
        ),
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
        page = budgets.expiry_page
        for attempt_id in db.transaction(lambda tx: leases.expired_page(tx, page), write=False):
            db.transaction(partial(leases.expire_lease, attempt_id=attempt_id))
            did = True
        for run_id in db.transaction(lambda tx: leases.retry_due_page(tx, page), write=False):
            db.transaction(partial(leases.admit_retry, run_id=run_id))
            did = True
        return did

    scheduler = CronScheduler(db, page=budgets.cron_page)

    def cron_cycle() -> bool:
        return len(scheduler.schedule_once().decisions) >= budgets.cron_page

    def cron_wait(backstop_s: float) -> bool:
        # Sleep until the earliest occurrence (or a task change), never longer than the backstop. The
        # delay is measured on the database's clock, the one the scheduler decides due-ness with.
        earliest, now = db.transaction(lambda tx: (schedules.earliest_fire_at(tx), tx.now_ms()), write=False)
        delay = backstop_s if earliest is None else max(0.0, (earliest - now) / 1000)
        return db.wait_for("schedules", min(backstop_s, delay + 0.001))

    owner = f"{wid}-control"[:128]  # this process's identity as lease owner of control-plane work
    action_dispatcher = ApprovedActionDispatcher(
        db,
        [RunCreateHandler()],
        owner,
        page=budgets.approvals_page,
        lease_ms=settings.action_lease_ms,
        fault=fault_point,
    )
    resolver = RecoveryResolver(db, [RunCreateHandler()], owner, page=budgets.approvals_page)

    def actions_cycle() -> bool:
        """Consume approved requests, run due approved actions, resolve crashed ones from evidence."""
        consumed = 0
        for approval_id in db.transaction(
            lambda tx: approvals.unconsumed_approved(tx, limit=budgets.approvals_page), write=False
        ):
            with contextlib.suppress(Conflict):  # a concurrent consumer won; nothing to do
                db.transaction(
                    partial(approvals.consume, approval_id=approval_id, consumption_id=f"auto.{approval_id}")
                )
                consumed += 1
        batch = action_dispatcher.dispatch_batch()
        resolved = resolver.resolve_batch()
        page = budgets.approvals_page
        return consumed > 0 or len(batch.items) >= page or len(resolved.items) >= page

    stopper = ProcessController()
    supervisor = CancellationSupervisor(
        db,
        signal=stopper.stop,
        finish=partial(finish_stop, stopper),
        owner=owner,
        page=budgets.cancel_page,
        pages=budgets.cancel_pages,
        lease_ms=settings.cancel_lease_ms,
        fault=fault_point,
        local_worker_id=wid,
    )

    def cancellation_cycle() -> bool:
        timeouts = cancellation.timeout_cycle(db, page=budgets.timeout_page)
        report = supervisor.run_cycle()
        return timeouts.truncated or report.stop_reason == "page_limit"

    def cancellation_wait(backstop_s: float) -> bool:
        # Sleep until the next deadline, backoff or lease expiry, within the backstop, measured on the
        # database's clock (the timeout scan compares deadlines with it). A new intent wakes us on
        # "cancellations"; a new deadline (the starting ACK) on "attempts", so we re-plan at once.
        due, now = db.transaction(lambda tx: (supervisor.next_wake_ms(tx), tx.now_ms()), write=False)
        delay = backstop_s if due is None else max(0.0, (due - now) / 1000)
        return notifier.wait_any(("cancellations", "attempts"), min(backstop_s, delay + 0.001))

    worker.on_settled = lambda attempt_id: notifier.notify("runs")

    def loop(
        name: str,
        cycle: Callable[[], bool],
        channel: str,
        backstop_s: float,
        wait: Callable[[float], bool] | None = None,
        stuck_after_s: float | None = None,
    ) -> LifecycleRunner:
        """A loop woken by commits on ``channel`` (or its own ``wait``), with a slow backstop."""
        return LifecycleRunner(
            name,
            cycle,
            wake=wait or (lambda t: db.wait_for(channel, t)),
            backstop_s=backstop_s,
            interrupt=lambda: notifier.notify(channel),
            stuck_after_s=stuck_after_s,
        )

    def maintain_wait(backstop_s: float) -> bool:
        # Re-adopted processes (from a previous incarnation) are not our children: poll them.
        return db.wait_for("maintain", min(backstop_s, 0.5) if worker.has_adopted() else backstop_s)

    loops = [
        loop("dispatcher", dispatch_cycle, "runs", budgets.dispatch_backstop_s),
        loop(
            "worker-maintain",
            lambda: bool(worker.maintain()),
            "maintain",
            budgets.maintain_backstop_s,
            maintain_wait,
        ),
        loop("lease-expiry", expiry_cycle, "retries", budgets.expiry_backstop_s),
        loop(
            "cancellation",
            cancellation_cycle,
            "cancellations",
            budgets.cancellation_backstop_s,
            cancellation_wait,
            # One cycle waits out the TERM -> KILL grace of every stop it sends, so a busy cycle may
            # legitimately last minutes; only a longer silence counts as stuck.
            stuck_after_s=CANCELLATION_STUCK_AFTER_S,
        ),
        loop("approved-actions", actions_cycle, "approved_actions", budgets.actions_backstop_s),
        loop("cron", cron_cycle, "schedules", budgets.cron_backstop_s, cron_wait),
    ]
    loops.extend(_outcome_loops(db, settings, owner, clock, loop, fault_point))
    return StandaloneRuntime(dispatcher=dispatcher, worker=worker, loops=loops, db=db)


# -- notifications and retention (docs/notifications.md, docs/retention.md) ---------------------------


def _outcome_loops(
    db: ManagedDatabase,
    settings: ServeSettings,
    owner: str,
    clock: Callable[[], int],
    loop: Callable[..., Any],
    fault_point: Callable[[str], None],
) -> list[Any]:
    """The notification delivery loop and the retention loop, built with the runtime's loop helper."""
    from ql3.application import notifications, retention
    from ql3.execution.log_retention import LogDirectory
    from ql3.notify.senders import ChannelSender

    budget = notifications.DeliveryBudget(lease_ms=settings.notify_lease_ms)
    deliverer = notifications.NotificationDeliverer(
        db, ChannelSender(), owner, budget=budget, fault=fault_point
    )

    def notify_cycle() -> bool:
        return deliverer.deliver_batch().claimed >= budget.page

    def notify_wait(backstop_s: float) -> bool:
        # Sleep until the next retry or lease expiry (or a new outcome), within the backstop.
        due = deliverer.next_due_ms()
        delay = backstop_s if due is None else max(0.0, (due - clock()) / 1000)
        return db.wait_for(notifications.CHANNEL, min(backstop_s, delay + 0.001))

    pruner = retention.RetentionPruner(db, LogDirectory(settings.home / "worker" / "logs"))
    budgets = settings.budgets
    return [
        loop("notifications", notify_cycle, notifications.CHANNEL, budgets.notify_backstop_s, notify_wait),
        loop("retention", lambda: pruner.prune_once().more, retention.CHANNEL, budgets.retention_backstop_s),
    ]
