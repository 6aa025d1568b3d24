"""The runtime of one ``ql3 control`` replica: the control loops without an embedded worker, and the
worker API (pull, ACKs, lease control) mounted on the HTTP app (docs/cluster.md)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI

from ql3.application import attempt_logs
from ql3.application.settings import ServeSettings
from ql3.bootstrap import ManagedDatabase, egress_policy, fault_injector
from ql3.cluster.auth_cache import WorkerAuthCache
from ql3.cluster.pull import PullBudget, PullService
from ql3.cluster.stops import NO_LOCAL_WORKER, StopWatch
from ql3.domain.egress import EgressPolicy
from ql3.ports import channels
from ql3.vcs.git import GitCli

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
    log_cap_bytes: int = attempt_logs.DEFAULT_CAP_BYTES  # the quota of a shipped log

    def install(self, app: FastAPI) -> None:
        from ql3.cluster import routes

        app.state.control_plane = self.control_plane
        app.state.pull_service = self.pull_service
        app.state.stop_watch = self.stop_watch
        app.state.control_owner = self.control_owner
        app.state.cancel_lease_ms = self.cancel_lease_ms
        app.state.log_cap_bytes = attempt_logs.check_cap(self.log_cap_bytes)
        app.state.worker_auth_cache = WorkerAuthCache()
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
            listen(list(channels.RELAYED))  # other replicas' commits wake our loops and long-polls
        for loop in self.loops:
            loop.start()

    def stop(self) -> None:
        for close in self.closers:
            close()
        for loop in reversed(self.loops):
            loop.stop()


def build_control_runtime(
    db: ManagedDatabase,
    settings: ServeSettings,
    *,
    replica_id: str,
    egress: EgressPolicy | None = None,
    console_url: str | None = None,
) -> ControlRuntime:
    """Every control-plane loop of ``ql3 serve`` except the dispatcher and the embedded worker:
    lease expiry and lost retry, timeouts and the cancellation supervisor (which signals nothing
    itself: remote workers stop through lease control), approved actions, cron, notifications and
    retention. Correct with any number of replicas: each step is a fenced, locked transaction.
    ``console_url``: this replica's URL, the link a run's notifications carry (None: no link)."""
    from ql3.application.control_loops import Adapters, control_loops
    from ql3.application.gateway import InProcessControlPlane
    from ql3.application.variables import SharedEnvironments
    from ql3.bootstrap import variables_box
    from ql3.notify.senders import ChannelSender

    notifier = db.notifier
    clock: Callable[[], int] = getattr(db, "clock", None) or (lambda: time.time_ns() // 1_000_000)
    loops = control_loops(
        db,
        notifier,
        settings,
        owner=replica_id,
        clock=clock,
        fault=fault_injector(settings.fault),
        # A replica has no worker and no log files: remote workers stop their own processes through
        # lease control, and ship their logs to the database (docs/cluster.md "Log shipping").
        adapters=Adapters(
            sender=ChannelSender(egress=egress or egress_policy(settings)),
            logs=None,
            signal=None,
            finish=None,
            local_worker_id=NO_LOCAL_WORKER,
            git=GitCli(),
            box=variables_box(settings.home),
            console_url=console_url,
        ),
    )
    # Project variables travel in offers over the authenticated worker channel (docs/variables.md).
    shared = SharedEnvironments(db, variables_box(settings.home))
    pull_service = PullService(db, budget=PullBudget(lease_ms=settings.run_lease_ms), shared=shared)
    stop_watch = StopWatch(
        db, counters=notifier.counters, wait_past=notifier.wait_past, notify=notifier.notify
    )
    api = WorkerApi(
        control_plane=InProcessControlPlane(db),
        pull_service=pull_service,
        stop_watch=stop_watch,
        control_owner=replica_id,
        cancel_lease_ms=settings.cancel_lease_ms,
        log_cap_bytes=settings.log_cap_bytes,
    )
    return ControlRuntime(db=db, loops=loops, api=api, closers=[pull_service.close, stop_watch.close])
