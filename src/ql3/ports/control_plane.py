"""The worker's view of the control plane. The embedded worker uses an in-process implementation; a
remote worker uses the HTTP one. Both reach the same application services and obey the same fences."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from ql3.domain.errors import Ql3Error
from ql3.domain.offers import LeaseFence


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionInfo:
    worker_id: str
    session_id: str
    generation: int
    status: str
    outcome: str


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseInfo:
    version: int
    expires_at_ms: int
    # The time the lease had left by the database clock when the control plane answered; None from a
    # control plane that does not say (the worker then keeps the fence deadline it had).
    remaining_ms: int | None = None


LeaseStep = Literal[
    "ack_starting",
    "ack_running",
    "ack_start_failure",
    "renew",
    "complete",
    "report_lost",
    "lease_status",
    "append_log",
]
LEASE_STEPS: tuple[LeaseStep, ...] = (
    "ack_starting",
    "ack_running",
    "ack_start_failure",
    "renew",
    "complete",
    "report_lost",
    "lease_status",
    "append_log",  # a chunk of the attempt's log; the one before its completion ends a settled log
)
MAX_BATCH_STEPS = 64  # steps in one batch (one transaction, one worker API request)


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseCall:
    """One step of the lease protocol for one attempt, as a batch carries it: ``args`` are the
    keyword arguments of the ``InProcessControlPlane`` method of the same name."""

    step: LeaseStep
    fence: LeaseFence
    args: dict[str, Any]


class ControlPlane(Protocol):
    def register(
        self,
        *,
        worker_id: str,
        session_id: str,
        capabilities: dict[str, Any],
        max_concurrent_runs: int,
        session_lease_ms: int,
    ) -> SessionInfo:
        """Register or resume a session. Same session + same content replays; a new session replaces
        the old one and bumps the generation. Raises Conflict on same session with other content."""
        ...

    def heartbeat(self, session: SessionInfo) -> SessionInfo:
        """Extend the session lease. Raises FenceConflict when the session was replaced or is offline."""
        ...

    def set_status(self, session: SessionInfo, status: str) -> SessionInfo:
        """``draining`` (capacity to zero first) or ``offline``."""
        ...

    def ack_starting(self, fence: LeaseFence) -> tuple[str, LeaseInfo]:
        """Attempt claimed -> starting under the full fence; idempotent replays answer already_*.
        The control plane persists the run deadline from the pinned task's timeout and its own clock."""
        ...

    def ack_running(
        self,
        fence: LeaseFence,
        *,
        pid: int,
        handle: str,
        log_artifact_id: str,
        callback_sequence: int,
        callback_token_digest: str,
    ) -> tuple[str, LeaseInfo]:
        """Attempt and Run -> running; identical replay idempotent, a different handle conflicts."""
        ...

    def ack_start_failure(self, fence: LeaseFence, *, error_code: str) -> str:
        """From starting: failed / cancelled / timed_out by the cancel facts; lease completed."""
        ...

    def renew(self, fence: LeaseFence, lease_ms: int) -> LeaseInfo:
        """Extend the lease before expiry (version +1). Raises FenceConflict with the reason otherwise."""
        ...

    def complete(
        self,
        fence: LeaseFence,
        *,
        callback_sequence: int,
        callback_token: str,
        exit_code: int,
        stop_cause: Literal["timeout", "fence"] | None = None,
    ) -> tuple[str, str]:
        """Apply a completion and return (result, status): ``applied`` (the run took it; the run's
        outcome), ``recorded`` (a late fact kept on its attempt only; the attempt's status) or
        ``already_terminal`` (nothing to record: a replay). Every answer is final: the receipt may be
        dropped. The authority is the callback token and the fence's identity; the lease need not be
        live (docs/contracts.md §2.4). ``stop_cause``: the host stopped the command itself, at its
        timeout deadline (``timeout``: the run is ``timed_out``; refused for an attempt without a
        deadline) or at its lease fence (``fence``: the attempt is lost, never failed)."""
        ...

    def report_lost(self, fence: LeaseFence, *, error_code: str) -> bool:
        """The worker proved its process exited without a receipt: the attempt becomes lost."""
        ...

    def lease_status(self, fence: LeaseFence) -> LeaseInfo:
        """The lease's current version and expiry for an exact authority whose version may lag."""
        ...

    def lease_control(self, fence: LeaseFence) -> str:
        """Probe for stop requests: ``run`` (keep going), ``stop_requested`` or ``terminal``."""
        ...


class ControlPlaneUnreachable(Ql3Error):
    """The control plane could not be reached; retry shortly."""

    code = "control_plane_unreachable"
    http_status = 503
    retryable = True
