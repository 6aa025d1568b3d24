"""``ql3 serve``'s settings: built once from the command line and the environment, validated before
anything is opened, then passed down frozen. Nothing below the CLI reads ``QL3_*`` variables.

A profile (``edge``, ``standalone``) fixes the budgets: how long an idle loop sleeps when nothing wakes
it, how many rows one cycle may read or change, and the HTTP connection budget. Behaviour is the same
on both; edge only does less per cycle and wakes less often when idle. See docs/configuration.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from ql3.application.sessions import SessionPolicy
from ql3.domain import approvals as approval_rules
from ql3.domain import cancellation as cancel_rules
from ql3.domain import leases as lease_rules
from ql3.domain import time_model
from ql3.domain.egress import EgressPolicy, parse_allow
from ql3.domain.errors import ConfigurationError, ValidationFailed

MAX_SLOTS: Final = 1024


class SettingsError(ConfigurationError):
    """The configuration is invalid."""

    def __init__(self, variable: str, message: str) -> None:
        super().__init__(f"{variable} {message}", variable=variable)
        self.variable = variable


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileBudgets:
    """What one profile allows per cycle, and how long its idle loops sleep without a wake-up."""

    name: str
    # idle backstops in seconds (a notification or a known due time wakes a loop sooner)
    dispatch_backstop_s: float
    expiry_backstop_s: float
    cancellation_backstop_s: float
    maintain_backstop_s: float
    cron_backstop_s: float
    actions_backstop_s: float
    notify_backstop_s: float
    retention_backstop_s: float
    # rows per cycle
    dispatch_page: int  # candidate and recovery pages of the run dispatcher
    dispatch_pages: int
    dispatch_claims: int
    cancel_page: int
    cancel_pages: int
    timeout_page: int
    expiry_page: int
    cron_page: int
    approvals_page: int
    # the embedded worker and the HTTP server
    max_slots: int
    default_slots_per_cpu: int
    default_slots_cap: int
    http_concurrency: int | None
    http_backlog: int

    def default_slots(self, cpus: int) -> int:
        return max(1, min(self.default_slots_cap, self.max_slots, max(2, cpus * self.default_slots_per_cpu)))

    def describe(self) -> list[str]:
        """The budgets as ``--help`` lists them."""
        concurrency = "unlimited" if self.http_concurrency is None else str(self.http_concurrency)
        slots = f"{self.default_slots_per_cpu} x CPU cores (2-{self.default_slots_cap})"
        return [
            f"idle backstops: dispatch {self.dispatch_backstop_s:g}s, lease expiry"
            f" {self.expiry_backstop_s:g}s, cancellation {self.cancellation_backstop_s:g}s, cron"
            f" {self.cron_backstop_s:g}s, approved actions {self.actions_backstop_s:g}s, worker"
            f" maintenance {self.maintain_backstop_s:g}s, notifications {self.notify_backstop_s:g}s,"
            f" retention {self.retention_backstop_s:g}s",
            f"rows per cycle: dispatch {self.dispatch_page} x {self.dispatch_pages} pages"
            f" ({self.dispatch_claims} claims), cancellation {self.cancel_page} x {self.cancel_pages},"
            f" timeouts {self.timeout_page}, lease expiry {self.expiry_page}, cron {self.cron_page},"
            f" approvals {self.approvals_page}",
            f"slots: default {slots}, at most {self.max_slots}; HTTP connections {concurrency},"
            f" backlog {self.http_backlog}",
        ]


PROFILES: Final[Mapping[str, ProfileBudgets]] = {
    "standalone": ProfileBudgets(
        name="standalone",
        dispatch_backstop_s=5.0,
        expiry_backstop_s=5.0,
        cancellation_backstop_s=5.0,
        maintain_backstop_s=10.0,
        cron_backstop_s=30.0,
        actions_backstop_s=5.0,
        notify_backstop_s=30.0,
        retention_backstop_s=600.0,
        dispatch_page=8,
        dispatch_pages=2,
        dispatch_claims=8,
        cancel_page=cancel_rules.DEFAULT_PAGE,
        cancel_pages=cancel_rules.DEFAULT_PAGES,
        timeout_page=16,
        expiry_page=16,
        cron_page=128,
        approvals_page=16,
        max_slots=MAX_SLOTS,
        default_slots_per_cpu=2,
        default_slots_cap=64,
        http_concurrency=None,
        http_backlog=2048,
    ),
    "edge": ProfileBudgets(
        name="edge",
        dispatch_backstop_s=30.0,
        expiry_backstop_s=30.0,
        cancellation_backstop_s=30.0,
        maintain_backstop_s=10.0,
        cron_backstop_s=60.0,
        actions_backstop_s=30.0,
        notify_backstop_s=60.0,
        retention_backstop_s=1800.0,
        dispatch_page=4,
        dispatch_pages=2,
        dispatch_claims=4,
        cancel_page=16,
        cancel_pages=2,
        timeout_page=8,
        expiry_page=8,
        cron_page=32,
        approvals_page=8,
        max_slots=16,
        default_slots_per_cpu=1,
        default_slots_cap=4,
        http_concurrency=64,
        http_backlog=64,
    ),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class EnvVar:
    """One integer ``QL3_*`` variable of ``ql3 serve``."""

    name: str
    default: int
    low: int
    high: int
    help: str

    def parse(self, environ: Mapping[str, str]) -> int:
        raw = environ.get(self.name)
        if raw is None or raw.strip() == "":
            return self.default
        try:
            value = int(raw.strip(), 10)
        except ValueError:
            raise SettingsError(self.name, f"must be an integer ({self.low}-{self.high})") from None
        if not self.low <= value <= self.high:
            raise SettingsError(self.name, f"must be {self.low}-{self.high}")
        return value


RUN_LEASE = EnvVar(
    name="QL3_RUN_LEASE_MS",
    default=30_000,
    low=lease_rules.RUN.min_ms,
    high=lease_rules.RUN.max_ms,
    help="run lease in ms: a run whose worker stops renewing is recovered after it",
)
CANCEL_LEASE = EnvVar(
    name="QL3_CANCEL_LEASE_MS",
    default=cancel_rules.DEFAULT_LEASE_MS,
    low=lease_rules.CANCELLATION.min_ms,
    high=lease_rules.CANCELLATION.max_ms,
    help="cancellation lease in ms: a stop whose signaller died is taken over after it"
    f" (more than twice the {cancel_rules.DEFAULT_GRACE_MS} ms stop grace)",
)
ACTION_LEASE = EnvVar(
    name="QL3_ACTION_LEASE_MS",
    default=approval_rules.DEFAULT_LEASE_MS,
    low=lease_rules.APPROVED_ACTION.min_ms,
    high=lease_rules.APPROVED_ACTION.max_ms,
    help="approved-action lease in ms: an action whose executor died is resolved after it",
)
NOTIFY_LEASE = EnvVar(
    name="QL3_NOTIFY_LEASE_MS",
    default=60_000,
    low=lease_rules.NOTIFICATION.min_ms,
    high=lease_rules.NOTIFICATION.max_ms,
    help="notification delivery lease in ms: a delivery whose sender died is retried after it",
)
LOG_CAP = EnvVar(
    name="QL3_LOG_CAP_BYTES",
    default=16 * 1024 * 1024,
    low=1024,
    high=1 << 40,
    help="the cap of one attempt's log: a worker's log file, and the quota of a shipped log on ql3"
    " control (give both the same value); past it a truncation marker stands in for the rest",
)
FENCE_MARGIN = EnvVar(
    name="QL3_FENCE_MARGIN_MS",
    default=time_model.DEFAULT_FENCE_MARGIN_MS,
    low=time_model.MIN_KILL_SLACK_MS,
    high=time_model.MAX_FENCE_MARGIN_MS,
    help="fence margin in ms: a run whose lease expired is retried no earlier than the expiry plus"
    " the task's grace plus this margin, when its old host's executor has stopped it"
    " (at least 500 ms plus about 1 % of the run lease, which an unset margin is raised to;"
    " docs/reliability.md)",
)
CRON_LATE = EnvVar(
    name="QL3_CRON_LATE_AFTER_MS",
    default=300_000,
    low=1_000,
    high=86_400_000,
    help="a cron run still queued (waiting for a free slot) this long after it was admitted raises a"
    " cron_late notification (docs/cron.md)",
)
SESSION_IDLE = EnvVar(
    name="QL3_SESSION_IDLE_S",
    default=12 * 3600,
    low=5,
    high=366 * 86400,
    help="a console session not used for this many seconds is signed out (docs/security.md)",
)
SESSION_MAX = EnvVar(
    name="QL3_SESSION_MAX_S",
    default=30 * 86400,
    low=5,
    high=366 * 86400,
    help="a console session ends this many seconds after sign-in however much it is used (at least"
    " QL3_SESSION_IDLE_S); its cookie lasts as long",
)
SIGNIN_MAX_FAILURES = EnvVar(
    name="QL3_SIGNIN_MAX_FAILURES",
    default=5,
    low=1,
    high=1000,
    help="failed sign-ins in a row that lock a user name for QL3_SIGNIN_LOCKOUT_S",
)
SIGNIN_ADDRESS_MAX_FAILURES = EnvVar(
    name="QL3_SIGNIN_ADDRESS_MAX_FAILURES",
    default=20,
    low=1,
    high=100_000,
    help="failed sign-ins from one client address (any names) that lock the address for QL3_SIGNIN_LOCKOUT_S",
)
SIGNIN_LOCKOUT = EnvVar(
    name="QL3_SIGNIN_LOCKOUT_S",
    default=900,
    low=1,
    high=86400,
    help="how long a locked user name or client address is refused sign-in, in seconds",
)
_CORE_VARS: Final = (RUN_LEASE, CANCEL_LEASE, ACTION_LEASE, NOTIFY_LEASE, LOG_CAP, FENCE_MARGIN, CRON_LATE)
SESSION_VARS: Final = (
    SESSION_IDLE,
    SESSION_MAX,
    SIGNIN_MAX_FAILURES,
    SIGNIN_ADDRESS_MAX_FAILURES,
    SIGNIN_LOCKOUT,
)
ENV_VARS: Final = _CORE_VARS + SESSION_VARS


def load_session_policy(environ: Mapping[str, str]) -> SessionPolicy:
    """The console sessions' lifetimes and the sign-in lock-out from QL3_SESSION_* / QL3_SIGNIN_*."""
    idle_s, max_s, failures, address_failures, lockout_s = (var.parse(environ) for var in SESSION_VARS)
    if idle_s > max_s:
        raise SettingsError(SESSION_IDLE.name, f"must be at most QL3_SESSION_MAX_S ({max_s})")
    return SessionPolicy(
        idle_ms=idle_s * 1000,
        max_ms=max_s * 1000,
        max_failures=failures,
        lockout_ms=lockout_s * 1000,
        address_max_failures=address_failures,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeSettings:
    """Everything ``ql3 serve`` runs with; frozen once validated."""

    budgets: ProfileBudgets
    home: Path
    database_url: str
    slots: int
    worker_id: str | None
    labels: Mapping[str, str] = field(default_factory=dict)
    run_lease_ms: int = RUN_LEASE.default
    cancel_lease_ms: int = CANCEL_LEASE.default
    action_lease_ms: int = ACTION_LEASE.default
    notify_lease_ms: int = NOTIFY_LEASE.default
    log_cap_bytes: int = LOG_CAP.default
    fence_margin_ms: int = FENCE_MARGIN.default
    cron_late_after_ms: int = CRON_LATE.default
    fault: str | None = None  # QL3_FAULT: crash injection for the fault tests only
    # Where notifications may go besides global addresses (--notify-allow, docs/notifications.md).
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    sessions: SessionPolicy = field(default_factory=SessionPolicy)

    @property
    def profile(self) -> str:
        return self.budgets.name


def resolve_home(environ: Mapping[str, str]) -> Path:
    """``$QL3_HOME`` (default ``~/.ql3``) as an absolute path: a relative one would otherwise end up
    under ``/`` in the default ``sqlite:///`` URL."""
    raw = environ.get("QL3_HOME")
    return (Path(raw).expanduser() if raw else Path.home() / ".ql3").absolute()


def check_database_url(url: str, source: str) -> str:
    """Only the scheme and the presence of a path or host are checked here; the URL is never echoed
    (it may hold a password)."""
    if url.startswith("sqlite:///"):
        if not url.removeprefix("sqlite:///").strip("/"):
            raise SettingsError(source, "needs a file path: sqlite:///ABSOLUTE/PATH")
        return url
    if url.startswith(("postgresql://", "postgres://")):
        return url
    raise SettingsError(source, "must be sqlite:///PATH or postgresql://...")


def load_serve_settings(
    environ: Mapping[str, str],
    *,
    profile: str,
    slots: int | None,
    worker_id: str | None,
    database_url: str | None,
    cpus: int,
    labels: Mapping[str, str] | None = None,
    notify_allow: Sequence[str] = (),
) -> ServeSettings:
    """Validate the flags and the ``QL3_*`` variables together; raise ``SettingsError`` naming the
    first offending variable or flag. Reads nothing but ``environ``."""
    if profile not in PROFILES:
        raise SettingsError("--profile", f"must be one of {', '.join(sorted(PROFILES))}")
    budgets = PROFILES[profile]
    if slots is not None and not 1 <= slots <= budgets.max_slots:
        raise SettingsError("--slots", f"must be 1-{budgets.max_slots} with --profile {profile}")
    home = resolve_home(environ)
    if database_url:
        url = check_database_url(database_url, "--database-url")
    elif environ.get("QL3_DATABASE_URL"):
        url = check_database_url(environ["QL3_DATABASE_URL"], "QL3_DATABASE_URL")
    else:
        url = f"sqlite:///{home / 'ql3.db'}"
    (
        run_lease_ms,
        cancel_lease_ms,
        action_lease_ms,
        notify_lease_ms,
        log_cap_bytes,
        fence_margin_ms,
        cron_late_after_ms,
    ) = (var.parse(environ) for var in _CORE_VARS)
    if not environ.get(FENCE_MARGIN.name, "").strip():
        # Unset: the default, raised to the floor a long run lease needs (never refused for it).
        fence_margin_ms = max(FENCE_MARGIN.default, time_model.min_fence_margin_ms(run_lease_ms))
    elif fence_margin_ms < time_model.min_fence_margin_ms(run_lease_ms):
        # The re-grant must wait until the old host's executor has stopped the run (the inequality
        # of domain/time_model.py); a margin below this floor could let two copies overlap.
        raise SettingsError(
            FENCE_MARGIN.name,
            f"must be at least {time_model.min_fence_margin_ms(run_lease_ms)} ms with a"
            f" {run_lease_ms} ms run lease",
        )
    if cancel_lease_ms <= cancel_rules.DEFAULT_GRACE_MS * 2:
        # The lease must outlast a TERM -> KILL window, or a live signaller could be taken over.
        raise SettingsError(
            CANCEL_LEASE.name, f"must be more than twice the stop grace ({cancel_rules.DEFAULT_GRACE_MS} ms)"
        )
    try:
        egress = parse_allow(notify_allow)
    except ValidationFailed as exc:
        raise SettingsError("--notify-allow", exc.message) from None
    sessions = load_session_policy(environ)
    return ServeSettings(
        sessions=sessions,
        egress=egress,
        budgets=budgets,
        home=home,
        database_url=url,
        slots=slots if slots is not None else budgets.default_slots(cpus),
        worker_id=worker_id,
        labels=dict(labels or {}),
        run_lease_ms=run_lease_ms,
        cancel_lease_ms=cancel_lease_ms,
        action_lease_ms=action_lease_ms,
        notify_lease_ms=notify_lease_ms,
        log_cap_bytes=log_cap_bytes,
        fence_margin_ms=fence_margin_ms,
        cron_late_after_ms=cron_late_after_ms,
        fault=environ.get("QL3_FAULT") or None,
    )
