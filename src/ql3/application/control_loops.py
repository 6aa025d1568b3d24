"""The control plane's loops, built once for ``ql3 serve`` and ``ql3 control`` (docs/architecture.md).

Every loop is a ``LifecycleRunner``: woken by commits on its channel (or by its own wait, which sleeps
until the next due time measured on the database's clock), with a slow backstop, bounded pages and a
health record. The adapters they need (the stop signal, the notification sender, the log files) are
passed in, so this module stays inside the application layer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Final, Protocol

from ql3.application import (
    approvals,
    cancellation,
    lease_expiry,
    notifications,
    retention,
    schedules,
    subscription_credentials,
    subscriptions,
)
from ql3.application.approved_action_handlers import RunCreateHandler
from ql3.application.approved_action_recovery import RecoveryResolver
from ql3.application.approved_action_runner import ApprovedActionDispatcher
from ql3.application.cancellation_supervisor import CancellationSupervisor, SignalFn
from ql3.application.cron import CronScheduler
from ql3.application.lifecycle import LifecycleRunner
from ql3.application.parking import ItemGuard
from ql3.application.settings import ServeSettings
from ql3.domain.errors import Conflict
from ql3.ports import channels
from ql3.ports.logs import LogFiles
from ql3.ports.notifications import NotificationSender
from ql3.ports.secrets import SecretBox
from ql3.ports.storage import Database
from ql3.ports.vcs import GitFetcher

# One cancellation cycle waits out the TERM -> KILL grace of every stop it sends, so a busy cycle may
# legitimately last minutes; only a longer silence counts as stuck.
CANCELLATION_STUCK_AFTER_S: Final = 300.0
# Scheduled syncs are minutes apart at most; a commit on ``subscriptions`` re-plans sooner.
SUBSCRIPTIONS_BACKSTOP_S: Final = 60.0


class Wakeups(Protocol):
    """The process-local wake-up board the database adapters post commits to."""

    def notify(self, channel: str) -> None: ...

    def wait_any(self, channels: tuple[str, ...], timeout_s: float) -> bool: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Adapters:
    """What the loops reach outside the application: ``signal``/``finish`` stop a local process group
    (None on a replica without a worker: remote workers stop through lease control)."""

    sender: NotificationSender
    logs: LogFiles | None
    signal: SignalFn | None
    finish: SignalFn | None
    local_worker_id: str
    git: GitFetcher | None = None  # the subscription loop's fetcher (docs/scripts.md); None: no loop
    box: SecretBox | None = None  # opens subscription credentials (the project secrets' key)
    # This server's URL as a link in a run's notifications (None: sent without a link).
    console_url: str | None = None


LoopFactory = Callable[..., LifecycleRunner]


def loop_factory(db: Database, wakeups: Wakeups) -> LoopFactory:
    """``loop(name, cycle, channel, backstop_s, wait=None, stuck_after_s=None)``: a loop woken by commits
    on ``channel`` (or by its own ``wait``), with a slow backstop."""

    def loop(
        name: str,
        cycle: Callable[[], bool],
        channel: str,
        backstop_s: float,
        wait: Callable[[float], bool] | None = None,
        stuck_after_s: float | None = None,
    ) -> LifecycleRunner:
        return LifecycleRunner(
            name,
            cycle,
            wake=wait or (lambda t: db.wait_for(channel, t)),
            backstop_s=backstop_s,
            interrupt=lambda: wakeups.notify(channel),
            stuck_after_s=stuck_after_s,
        )

    return loop


def _delay_s(due_ms: int | None, now_ms: int, backstop_s: float) -> float:
    """How long to sleep: until ``due_ms`` (1 ms past it), never longer than the backstop."""
    delay = backstop_s if due_ms is None else max(0.0, (due_ms - now_ms) / 1000)
    return min(backstop_s, delay + 0.001)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Wiring:
    """What every loop builder below takes: the database, its wake-ups, the settings, this process's
    lease-owner name, the host clock (for the outbox's due times only), the fault hook, the adapters."""

    db: Database
    wakeups: Wakeups
    settings: ServeSettings
    owner: str
    clock: Callable[[], int]
    fault: Callable[[str], None]
    adapters: Adapters
    loop: LoopFactory


def control_loops(
    db: Database,
    wakeups: Wakeups,
    settings: ServeSettings,
    *,
    owner: str,
    clock: Callable[[], int],
    fault: Callable[[str], None],
    adapters: Adapters,
) -> list[LifecycleRunner]:
    """Lease expiry and lost retry, timeouts and cancellation, approved actions, cron, notifications
    and retention, in that order. ``owner`` names this process as lease owner of control-plane work.
    Correct with any number of processes on one database: each step is a fenced, locked transaction."""
    w = _Wiring(
        db=db,
        wakeups=wakeups,
        settings=settings,
        owner=owner,
        clock=clock,
        fault=fault,
        adapters=adapters,
        loop=loop_factory(db, wakeups),
    )
    return [
        _expiry_loop(w),
        _cancellation_loop(w),
        _actions_loop(w),
        _cron_loop(w),
        _notifications_loop(w),
        _retention_loop(w),
        *([] if adapters.git is None else [_subscriptions_loop(w, adapters.git)]),
    ]


def _expiry_loop(w: _Wiring) -> LifecycleRunner:
    """Expired run leases (each in its own fenced transaction), then lost runs due their retry."""
    db, page = w.db, w.settings.budgets.expiry_page
    guard = ItemGuard(db, "lease-expiry")
    # After a pause of this whole process, its own embedded worker first gets one lease to renew in.
    watch = lease_expiry.PauseWatch(slack_s=w.settings.run_lease_ms / 6000)
    own = lease_expiry.PauseDeferral(worker_id=w.adapters.local_worker_id, lease_ms=w.settings.run_lease_ms)

    def expiry_cycle() -> bool:
        # A parked item drops out of its page until its retry time, so "did" never spins on it.
        guard.new_cycle()
        did, paused = False, watch.paused()
        for attempt_id in db.transaction(lambda tx: lease_expiry.expired_page(tx, page), write=False):
            paused = watch.paused() or paused
            expire = partial(
                lease_expiry.expire_lease,
                attempt_id=attempt_id,
                fence_margin_ms=w.settings.fence_margin_ms,
                defer=own if paused else None,
            )
            guard.run(
                "lease",
                attempt_id,
                partial(db.transaction, expire),
            )
            did = True
        for run_id in db.transaction(lambda tx: lease_expiry.retry_due_page(tx, page), write=False):
            guard.run(
                "retry", run_id, partial(db.transaction, partial(lease_expiry.admit_retry, run_id=run_id))
            )
            did = True
        return did

    def expiry_wait(backstop_s: float) -> bool:
        watch.waiting(backstop_s)
        return db.wait_for(channels.RETRIES, backstop_s)

    return w.loop(
        "lease-expiry", expiry_cycle, channels.RETRIES, w.settings.budgets.expiry_backstop_s, expiry_wait
    )


def _cancellation_loop(w: _Wiring) -> LifecycleRunner:
    """Timeouts become cancel intents; the supervisor dispatches the intents' stops."""
    db, budgets = w.db, w.settings.budgets
    guard = ItemGuard(db, "cancellation")
    supervisor = CancellationSupervisor(
        db,
        signal=w.adapters.signal,
        finish=w.adapters.finish,
        owner=w.owner,
        page=budgets.cancel_page,
        pages=budgets.cancel_pages,
        lease_ms=w.settings.cancel_lease_ms,
        fault=w.fault,
        local_worker_id=w.adapters.local_worker_id,
        guard=guard,
    )

    def cancellation_cycle() -> bool:
        guard.new_cycle()
        timeouts = cancellation.timeout_cycle(db, page=budgets.timeout_page, guard=guard)
        report = supervisor.run_cycle()
        return timeouts.truncated or report.stop_reason == "page_limit"

    def cancellation_wait(backstop_s: float) -> bool:
        # Until the next deadline, backoff or lease expiry, on the database's clock. A new intent wakes
        # us on "cancellations"; a new deadline (the starting ACK) on "attempts", so we re-plan at once.
        due, now = db.transaction(lambda tx: (supervisor.next_wake_ms(tx), tx.now_ms()), write=False)
        return w.wakeups.wait_any((channels.CANCELLATIONS, channels.ATTEMPTS), _delay_s(due, now, backstop_s))

    return w.loop(
        "cancellation",
        cancellation_cycle,
        channels.CANCELLATIONS,
        budgets.cancellation_backstop_s,
        cancellation_wait,
        stuck_after_s=CANCELLATION_STUCK_AFTER_S,
    )


def _actions_loop(w: _Wiring) -> LifecycleRunner:
    """Approved requests are consumed into actions, due actions run, crashed ones resolved."""
    db, page = w.db, w.settings.budgets.approvals_page
    guard = ItemGuard(db, "approved-actions")
    action_dispatcher = ApprovedActionDispatcher(
        db,
        [RunCreateHandler()],
        w.owner,
        page=page,
        lease_ms=w.settings.action_lease_ms,
        fault=w.fault,
        guard=guard,
    )
    resolver = RecoveryResolver(db, [RunCreateHandler()], w.owner, page=page, guard=guard)

    def consume(approval_id: str) -> bool:
        with contextlib.suppress(Conflict):  # a concurrent consumer (another process) won, or it expired
            db.transaction(
                partial(approvals.consume, approval_id=approval_id, consumption_id=f"auto.{approval_id}")
            )
            return True
        return False

    def actions_cycle() -> bool:
        """Consume approved requests, run due approved actions, resolve crashed ones from evidence. A
        request that cannot be consumed (its requester was revoked) is parked, not retried each cycle."""
        guard.new_cycle()
        consumed = 0
        for approval_id in db.transaction(
            lambda tx: approvals.unconsumed_approved(tx, limit=page), write=False
        ):
            # A parked request leaves the page until its retry time: counting it as progress never spins.
            consumed += guard.run("approval", approval_id, partial(consume, approval_id)) is not False
        batch = action_dispatcher.dispatch_batch()
        resolved = resolver.resolve_batch()
        return consumed > 0 or len(batch.items) >= page or len(resolved.items) >= page

    return w.loop(
        "approved-actions", actions_cycle, channels.APPROVED_ACTIONS, w.settings.budgets.actions_backstop_s
    )


def _cron_loop(w: _Wiring) -> LifecycleRunner:
    """Due schedule occurrences become runs; the loop sleeps until the earliest next one."""
    db, budgets = w.db, w.settings.budgets
    guard = ItemGuard(db, "cron")
    scheduler = CronScheduler(db, page=budgets.cron_page, guard=guard)
    started: list[int] = []
    late_watermark: list[tuple[int, str]] = []

    def cron_cycle() -> bool:
        guard.new_cycle()
        if not started:  # the first cycle of this server: its start epoch and the --on-start runs
            epoch = scheduler.begin_start()
            scheduler.fire_on_start(epoch)
            started.append(epoch)
        report = scheduler.schedule_once()
        # Cron runs still waiting for a slot past the lateness bound (at least every backstop).
        watermark = scheduler.notify_late(
            w.settings.cron_late_after_ms, late_watermark[0] if late_watermark else None
        )
        late_watermark[:] = [watermark]
        return report.more or len(report.decisions) >= budgets.cron_page

    def cron_wait(backstop_s: float) -> bool:
        # Until the earliest occurrence (or a task change), on the clock the scheduler decides with.
        earliest, now = db.transaction(lambda tx: (schedules.earliest_fire_at(tx), tx.now_ms()), write=False)
        return db.wait_for(channels.SCHEDULES, _delay_s(earliest, now, backstop_s))

    def clean_stop() -> None:
        # Drained on a clean stop: the next start opens a new epoch (docs/cron.md, "--on-start").
        if started:
            scheduler.clean_stop()

    return LifecycleRunner(
        "cron",
        cron_cycle,
        wake=cron_wait,
        backstop_s=budgets.cron_backstop_s,
        interrupt=lambda: w.wakeups.notify(channels.SCHEDULES),
        on_drained=clean_stop,
    )


def _notifications_loop(w: _Wiring) -> LifecycleRunner:
    """The outbox's due notifications are delivered under a lease, retried with backoff."""
    delivery = notifications.DeliveryBudget(lease_ms=w.settings.notify_lease_ms)
    guard = ItemGuard(w.db, "notifications")
    deliverer = notifications.NotificationDeliverer(
        w.db,
        w.adapters.sender,
        w.owner,
        budget=delivery,
        fault=w.fault,
        guard=guard,
        # A run's outcome goes out with its link and last log lines (docs/notifications.md).
        excerpts=notifications.RunExcerpts(
            console_url=w.adapters.console_url, logs=w.adapters.logs, box=w.adapters.box
        ),
    )

    def notify_cycle() -> bool:
        guard.new_cycle()
        return deliverer.deliver_batch().claimed >= delivery.page

    def notify_wait(backstop_s: float) -> bool:
        # Until the next retry or lease expiry (or a new outcome), within the backstop.
        return w.db.wait_for(channels.NOTIFICATIONS, _delay_s(deliverer.next_due_ms(), w.clock(), backstop_s))

    return w.loop(
        "notifications",
        notify_cycle,
        channels.NOTIFICATIONS,
        w.settings.budgets.notify_backstop_s,
        notify_wait,
    )


def _retention_loop(w: _Wiring) -> LifecycleRunner:
    """Runs, their rows and log files past a project's retention are pruned, a bounded page at a time."""
    guard = ItemGuard(w.db, "retention")
    pruner = retention.RetentionPruner(w.db, w.adapters.logs, guard=guard)

    def retention_cycle() -> bool:
        guard.new_cycle()
        return pruner.prune_once().more

    return w.loop(
        "retention",
        retention_cycle,
        channels.RETENTION,
        w.settings.budgets.retention_backstop_s,
    )


def _subscriptions_loop(w: _Wiring, git: GitFetcher) -> LifecycleRunner:
    """Subscriptions whose scheduled sync is due are fetched and applied (docs/scripts.md); the loop
    sleeps until the earliest one. A sync's git may take up to its timeout: the loop is stuck only
    past that."""
    syncer = subscriptions.Syncer(w.db, git, box=w.adapters.box)
    sealed = [False]

    def subscriptions_cycle() -> bool:
        if not sealed[0]:  # credentials an older version stored in plaintext, sealed once per process
            subscription_credentials.seal_stored(w.db, w.adapters.box)
            sealed[0] = True
        return syncer.sync_due() >= subscriptions.DUE_PAGE

    def subscriptions_wait(backstop_s: float) -> bool:
        earliest, now = syncer.earliest_due()
        return w.db.wait_for(channels.SUBSCRIPTIONS, _delay_s(earliest, now, backstop_s))

    return w.loop(
        "subscriptions",
        subscriptions_cycle,
        channels.SUBSCRIPTIONS,
        SUBSCRIPTIONS_BACKSTOP_S,
        subscriptions_wait,
        stuck_after_s=subscriptions.DUE_PAGE * subscriptions.FETCH_TIMEOUT_S + 60,
    )
