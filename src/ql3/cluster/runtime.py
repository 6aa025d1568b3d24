"""The runtime of one ``ql3 control`` replica: the control loops without an embedded worker, and the
worker API (pull, ACKs, lease control) mounted on the HTTP app (docs/cluster.md)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from fastapi import FastAPI

from ql3.application.settings import ServeSettings
from ql3.bootstrap import WAKE_CHANNELS, ManagedDatabase, _outcome_loops, fault_injector
from ql3.cluster.pull import PullBudget, PullService
from ql3.cluster.stops import NO_LOCAL_WORKER, StopWatch

CANCELLATION_STUCK_AFTER_S = 300.0
# Each attached worker holds up to two long-polls (pull and stops), each in a worker thread of the
# HTTP server for up to 20 s: the pool is sized so that 100 workers still leave room for the API.
HTTP_THREADS = 256


@dataclass
class WorkerApi:
    """What the worker routes need, installed on the app's state."""

    control_plane: Any
    pull_service: PullService
    stop_watch: StopWatch
    control_owner: str
    cancel_lease_ms: int

    def install(self, app: FastAPI) -> None:
        from ql3.cluster import routes

        app.state.control_plane = self.control_plane
        app.state.pull_service = self.pull_service
        app.state.stop_watch = self.stop_watch
        app.state.control_owner = self.control_owner
        app.state.cancel_lease_ms = self.cancel_lease_ms
        app.include_router(routes.router)
        app.include_router(routes.admin_router)


@dataclass
class ControlRuntime:
    """Loops started in order and stopped in reverse; long-polls are released first on stop."""

    db: Any
    loops: list[Any]
    api: WorkerApi
    closers: list[Callable[[], None]] = field(default_factory=list)

    def start(self) -> None:
        with contextlib.suppress(RuntimeError):  # outside an event loop (tests): nothing to size
            import anyio.to_thread

            anyio.to_thread.current_default_thread_limiter().total_tokens = HTTP_THREADS
        listen = getattr(self.db, "start_listening", None)
        if listen is not None:
            listen(list(WAKE_CHANNELS))  # other replicas' commits wake our loops and long-polls
        for loop in self.loops:
            loop.start()

    def stop(self) -> None:
        for close in self.closers:
            close()
        for loop in reversed(self.loops):
            loop.stop()


def build_control_runtime(db: ManagedDatabase, settings: ServeSettings, *, replica_id: str) -> ControlRuntime:
    """Every control-plane loop of ``ql3 serve`` except the dispatcher and the embedded worker:
    lease expiry and lost retry, timeouts and the cancellation supervisor (which signals nothing
    itself: remote workers stop through lease control), approved actions, cron, notifications and
    retention. Correct with any number of replicas: each step is a fenced, locked transaction."""
    from ql3.application import approvals, cancellation, leases, schedules
    from ql3.application.approved_actions import ApprovedActionDispatcher, RecoveryResolver, RunCreateHandler
    from ql3.application.cancellation import CancellationSupervisor
    from ql3.application.cron import CronScheduler
    from ql3.application.gateway import InProcessControlPlane
    from ql3.application.lifecycle import LifecycleRunner
    from ql3.domain.errors import Conflict

    budgets = settings.budgets
    fault_point = fault_injector(settings.fault)
    notifier = db.notifier
    owner = replica_id

    clock: Callable[[], int] = getattr(db, "clock", None) or (lambda: time.time_ns() // 1_000_000)

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
        earliest, now = db.transaction(lambda tx: (schedules.earliest_fire_at(tx), tx.now_ms()), write=False)
        delay = backstop_s if earliest is None else max(0.0, (earliest - now) / 1000)
        return db.wait_for("schedules", min(backstop_s, delay + 0.001))

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
        consumed = 0
        for approval_id in db.transaction(
            lambda tx: approvals.unconsumed_approved(tx, limit=budgets.approvals_page), write=False
        ):
            with contextlib.suppress(Conflict):  # a concurrent consumer (another replica) won
                db.transaction(
                    partial(approvals.consume, approval_id=approval_id, consumption_id=f"auto.{approval_id}")
                )
                consumed += 1
        batch = action_dispatcher.dispatch_batch()
        resolved = resolver.resolve_batch()
        page = budgets.approvals_page
        return consumed > 0 or len(batch.items) >= page or len(resolved.items) >= page

    supervisor = CancellationSupervisor(
        db,
        signal=None,
        owner=owner,
        page=budgets.cancel_page,
        pages=budgets.cancel_pages,
        lease_ms=settings.cancel_lease_ms,
        fault=fault_point,
        local_worker_id=NO_LOCAL_WORKER,
    )

    def cancellation_cycle() -> bool:
        timeouts = cancellation.timeout_cycle(db, page=budgets.timeout_page)
        report = supervisor.run_cycle()
        return timeouts.truncated or report.stop_reason == "page_limit"

    def cancellation_wait(backstop_s: float) -> bool:
        due, now = db.transaction(lambda tx: (supervisor.next_wake_ms(tx), tx.now_ms()), write=False)
        delay = backstop_s if due is None else max(0.0, (due - now) / 1000)
        return notifier.wait_any(("cancellations", "attempts"), min(backstop_s, delay + 0.001))

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
            interrupt=lambda: notifier.notify(channel),
            stuck_after_s=stuck_after_s,
        )

    loops = [
        loop("lease-expiry", expiry_cycle, "retries", budgets.expiry_backstop_s),
        loop(
            "cancellation",
            cancellation_cycle,
            "cancellations",
            budgets.cancellation_backstop_s,
            cancellation_wait,
            stuck_after_s=CANCELLATION_STUCK_AFTER_S,
        ),
        loop("approved-actions", actions_cycle, "approved_actions", budgets.actions_backstop_s),
        loop("cron", cron_cycle, "schedules", budgets.cron_backstop_s, cron_wait),
    ]
    loops.extend(_outcome_loops(db, settings, owner, clock, loop, fault_point))
    pull_service = PullService(db, budget=PullBudget(lease_ms=settings.run_lease_ms))
    stop_watch = StopWatch(
        db, counters=notifier.counters, wait_past=notifier.wait_past, notify=notifier.notify
    )
    api = WorkerApi(
        control_plane=InProcessControlPlane(db),
        pull_service=pull_service,
        stop_watch=stop_watch,
        control_owner=owner,
        cancel_lease_ms=settings.cancel_lease_ms,
    )
    return ControlRuntime(db=db, loops=loops, api=api, closers=[pull_service.close, stop_watch.close])
