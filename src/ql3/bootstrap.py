"""The only place that wires adapters to services."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ql3.application.settings import ServeSettings, resolve_home
from ql3.domain.egress import EgressPolicy
from ql3.domain.errors import ConfigurationError
from ql3.execution.run_as import TaskUser as TaskUser  # re-exported for ``ql3 serve --run-as``
from ql3.execution.run_as import TaskUsers as TaskUsers
from ql3.execution.run_as import resolve_task_user as resolve_task_user
from ql3.ports import channels
from ql3.ports.storage import Database
from ql3.ports.vcs import GitFetcher
from ql3.storage.migrations import MigrationState, chain
from ql3.storage.notify import LocalNotifier
from ql3.storage.sqlite import backup as _sqlite_backup
from ql3.vcs.git import GitCli

if TYPE_CHECKING:
    from ql3.application.dispatcher import RunDispatcher
    from ql3.execution.launcher import LocalLauncher
    from ql3.storage.secret_box import AesGcmBox
    from ql3.worker.agent import WorkerAgent


class ManagedDatabase(Database, Protocol):
    """The database as ``ql3 serve`` holds it: the port, its wake-up board, its migrations, and the
    host clock the embedded worker times its own renewals with (a test database's fake clock)."""

    notifier: LocalNotifier
    clock: Callable[[], int]

    def migrate(self) -> list[int]: ...
    def migration_status(self) -> list[MigrationState]: ...


def expected_schema_version(dialect: str) -> int:
    """The schema version this binary expects: the last migration of its chain (for /readyz)."""
    return chain(dialect)[-1].version


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


def variables_box(home: Path) -> AesGcmBox:
    """The sealer of project secrets, keyed by ``$QL3_HOME/variables.key`` (created 0600 on first use;
    docs/variables.md). Every replica of a cluster needs the same key file."""
    from ql3.storage.secret_box import AesGcmBox, load_or_create_key

    return AesGcmBox(load_or_create_key(home))


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
    # What the dispatcher saw (application/dispatch_reasons.py), read by the API and /metrics.
    dispatch_reasons: Any = None

    def start(self) -> None:
        listen = getattr(self.db, "start_listening", None)
        if listen is not None:
            # PostgreSQL: other replicas' commits wake our loops through LISTEN/NOTIFY.
            listen(list(channels.RELAYED))
        self.worker.start()
        for loop in self.loops:
            loop.start()

    def stop(self) -> None:
        for loop in reversed(self.loops):
            loop.stop()
        self.worker.stop()


def task_launcher(task_users: TaskUsers, *, notify_url: str | None = None) -> LocalLauncher:
    """The launcher of a remote worker whose commands run as task users (``ql3 worker --run-as``);
    ``notify_url``: where a task's ``ql3 notify`` reaches the API (docs/notifications.md)."""
    from ql3.execution.launcher import LocalLauncher

    return LocalLauncher(task_users=task_users, notify_url=notify_url)


def egress_policy(settings: ServeSettings, listen_host: str | None = None) -> EgressPolicy:
    """The notification egress policy of a server: what ``--notify-allow`` opened, and this host's own
    addresses (with ``listen_host``'s) refused like loopback (docs/notifications.md "Egress policy")."""
    from ql3.notify.egress import own_addresses

    return settings.egress.with_own(own_addresses([listen_host] if listen_host else []))


def build_standalone_runtime(
    db: ManagedDatabase,
    settings: ServeSettings,
    *,
    run_as: TaskUser | None = None,
    task_users: TaskUsers | None = None,
    default_cwd: Path | None = None,
    egress: EgressPolicy | None = None,
    notify_url: str | None = None,
) -> StandaloneRuntime:
    """Wire the dispatcher, the embedded worker and the control loops with ``settings``' budgets.
    ``run_as``: a ``TaskUser`` the embedded worker's commands run as (None: the server's own user);
    ``task_users``: the same per project (wins over ``run_as``); ``egress``: where notifications may go
    (default: ``settings``' policy with this host's own addresses, ``egress_policy``); ``notify_url``:
    this server's URL as its tasks reach it (``ql3 notify`` in a task, docs/notifications.md)."""
    import socket

    from ql3.application.control_loops import Adapters, control_loops, loop_factory
    from ql3.application.dispatch_reasons import DispatchReasons
    from ql3.application.embedded_dispatch import EmbeddedDispatch
    from ql3.execution.controller import ProcessController, finish_stop
    from ql3.execution.log_retention import LogDirectory
    from ql3.notify.senders import ChannelSender

    budgets = settings.budgets
    home = settings.home
    fault_point = fault_injector(settings.fault)
    wid = settings.worker_id or f"embedded-{socket.gethostname()}"[:128]
    dispatcher = _embedded_dispatcher(db, settings, wid)
    worker = _embedded_worker(
        db,
        settings,
        wid,
        fault=fault_point,
        run_as=run_as,
        task_users=task_users,
        default_cwd=default_cwd,
        notify_url=notify_url,
    )
    notifier = db.notifier
    reasons = DispatchReasons()
    # One wake-up of the dispatcher per run, not three (application/embedded_dispatch.py).
    embedded = EmbeddedDispatch(
        dispatcher.dispatch_once,
        active_count=lambda: worker.active_count,
        slots=worker.config.slots,
        submit=worker.submit,
        wakeups=notifier,
        fault=fault_point,
        reasons=reasons,
    )
    worker.on_settled = embedded.on_settled

    # Renewals are due every third of the run lease: the pass comes at least that often, whatever
    # the backstop (a 5 s lease is renewed every 1.7 s, not every 10).
    renew_every_s = settings.run_lease_ms / 3000

    def maintain_wait(backstop_s: float) -> bool:
        # Re-adopted processes (from a previous incarnation) are not our children: poll them.
        cadence = min(backstop_s, renew_every_s)
        return db.wait_for(channels.MAINTAIN, min(cadence, 0.5) if worker.has_adopted() else cadence)

    loop = loop_factory(db, notifier)
    stopper = ProcessController()
    loops = [
        loop("dispatcher", embedded.cycle, channels.RUNS, budgets.dispatch_backstop_s, embedded.wait),
        loop(
            "worker-maintain",
            lambda: bool(worker.maintain()),
            channels.MAINTAIN,
            budgets.maintain_backstop_s,
            maintain_wait,
        ),
        *control_loops(
            db,
            notifier,
            settings,
            owner=f"{wid}-control"[:128],  # this process's identity as lease owner of control-plane work
            clock=db.clock,
            fault=fault_point,
            adapters=Adapters(
                sender=ChannelSender(egress=egress or egress_policy(settings)),
                logs=LogDirectory(home / "worker" / "logs"),
                # A stop that finds the leader already gone still KILLs what survived of the
                # attempt in its group (a child that ignores TERM, its shell killed a moment before):
                # the same rule as the stop a crash cut short.
                signal=partial(finish_stop, stopper),
                finish=partial(finish_stop, stopper),
                local_worker_id=wid,
                git=GitCli(),
                box=variables_box(home),
                console_url=notify_url,  # the link a script's own message carries too
            ),
        ),
    ]
    return StandaloneRuntime(
        dispatcher=dispatcher, worker=worker, loops=loops, db=db, dispatch_reasons=reasons
    )


def _embedded_dispatcher(db: ManagedDatabase, settings: ServeSettings, wid: str) -> RunDispatcher:
    """The run dispatcher of ``ql3 serve`` with the settings' budgets, offering to worker ``wid``."""
    from ql3.application.dispatcher import HARD_CLAIMS, DispatchBudget, RunDispatcher
    from ql3.application.variables import SharedEnvironments

    budgets = settings.budgets
    home = settings.home
    return RunDispatcher(
        db,
        lease_secret=lease_secret(home),
        budget=DispatchBudget(
            recovery_page=budgets.dispatch_page,
            recovery_pages=budgets.dispatch_pages,
            candidate_page=budgets.dispatch_page,
            candidate_pages=budgets.dispatch_pages,
            claims=budgets.dispatch_claims,
            # As many offers per cycle as the worker has slots (the claims above still bound it).
            max_offers_per_cycle=min(settings.slots, HARD_CLAIMS),
            lease_ms=settings.run_lease_ms,
        ),
        # The restart boundary is compared with lease acquisition times, so it is read from the
        # same clock that wrote them (the database's), never from this host's.
        incarnation_started_ms=db.transaction(lambda tx: tx.now_ms(), write=False),
        local_worker_id=wid,
        shared=SharedEnvironments(db, variables_box(home)),
    )


def _embedded_worker(
    db: ManagedDatabase,
    settings: ServeSettings,
    wid: str,
    *,
    fault: Callable[[str], None],
    run_as: TaskUser | None,
    task_users: TaskUsers | None,
    default_cwd: Path | None,
    notify_url: str | None = None,
) -> WorkerAgent:
    """The embedded worker ``wid``: its journal under ``$QL3_HOME/worker``, commands as ``run_as`` (or
    the project's task user), talking to the control plane in process."""
    from ql3.application.gateway import InProcessControlPlane
    from ql3.execution.deadlines import DeadlineBoard
    from ql3.execution.launcher import LocalLauncher
    from ql3.worker.agent import WorkerAgent
    from ql3.worker.config import WorkerConfig

    home = settings.home
    return WorkerAgent(
        InProcessControlPlane(db),
        WorkerConfig(
            worker_id=wid,
            home=home / "worker",
            slots=settings.slots,
            labels=dict(settings.labels),
            run_lease_ms=settings.run_lease_ms,
            log_cap_bytes=settings.log_cap_bytes,
            journal_capacity=max(64, settings.slots),
            default_cwd=None if default_cwd is None else str(default_cwd),
        ),
        clock=db.clock,
        fault=fault,
        launcher=LocalLauncher(run_as=run_as, task_users=task_users, notify_url=notify_url),
        # The host executor keeps each attempt's deadlines (docs/reliability.md "Time").
        deadlines=DeadlineBoard(home / "worker" / "executor"),
        # On SQLite this process is the only control plane: nothing can re-grant a run while it is
        # frozen, and its own worker renews before its expiry scanner runs, so only timeouts are kept.
        local_fence=not settings.database_url.startswith("sqlite:"),
    )


def git_fetcher() -> GitFetcher:
    """The subscriptions' fetcher: the ``git`` command (docs/scripts.md)."""
    return GitCli()


sqlite_backup = _sqlite_backup  # the CLI's `ql3 db backup|restore` (its only way to the storage layer)
