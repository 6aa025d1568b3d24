"""The worker journal's vocabulary (docs/contracts.md §3): its local delivery states and their
transitions, the records it takes in and hands out, and its typed errors.

Pure, no I/O. The SQLite adapter (``worker/journal/``) applies these rules inside one transaction per
write; the worker reaches it through the ``Journal`` port (``ports/execution.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, Literal, get_args

from ql3.domain.errors import Ql3Error

JournalState = Literal[
    "accepted",
    "starting_acknowledged",
    "launching",
    "started",
    "running_acknowledged",
    "completion_acknowledged",
    "start_failed",
    "start_failure_acknowledged",
    "recovery_required",
]
DeliveryKind = Literal["new_claim", "lease_recovery"]
RecoveryReason = Literal[
    "launch_outcome_unknown",
    "control_plane_already_running",
    "control_plane_terminal",
    "lease_lost_local_execution_stopped",
    "lease_lost_local_execution_unverified",
    "process_exited_without_receipt",
    "completion_refused",
]
AuditClass = Literal[
    "no_local_execution", "converged", "settled", "launch_reconciler", "execution_reconciler"
]

STATES: Final[frozenset[str]] = frozenset(get_args(JournalState))
DELIVERY_KINDS: Final[frozenset[str]] = frozenset(get_args(DeliveryKind))
RECOVERY_REASONS: Final[frozenset[str]] = frozenset(get_args(RecoveryReason))
TERMINAL_STATES: Final[frozenset[str]] = frozenset({"completion_acknowledged", "start_failure_acknowledged"})
IN_FLIGHT_STATES: Final[frozenset[str]] = frozenset(
    {"accepted", "starting_acknowledged", "launching", "started", "running_acknowledged"}
)
# A lease_recovery redelivery may refresh the stored offer only before anything was spawned.
REFRESHABLE_STATES: Final[frozenset[str]] = frozenset({"accepted", "starting_acknowledged"})

AUDIT_CLASSES: Final[Mapping[str, AuditClass]] = MappingProxyType(
    {
        "accepted": "no_local_execution",
        "starting_acknowledged": "no_local_execution",
        "start_failed": "no_local_execution",
        "start_failure_acknowledged": "converged",
        "completion_acknowledged": "settled",
        "launching": "launch_reconciler",
        "recovery_required": "launch_reconciler",
        "started": "execution_reconciler",
        "running_acknowledged": "execution_reconciler",
    }
)
RECONCILE_CLASSES: Final[frozenset[str]] = frozenset({"launch_reconciler", "execution_reconciler"})

TRANSITIONS: Final[Mapping[str, frozenset[str]]] = MappingProxyType(
    {
        "accepted": frozenset({"starting_acknowledged", "start_failed", "recovery_required"}),
        "starting_acknowledged": frozenset({"launching", "start_failed", "recovery_required"}),
        # An explicit executor rejection is a known outcome: nothing runs, so the start failed.
        "launching": frozenset({"started", "start_failed", "recovery_required"}),
        # A trusted receipt found before the running ACK completes the run directly.
        "started": frozenset({"running_acknowledged", "completion_acknowledged", "recovery_required"}),
        "running_acknowledged": frozenset({"completion_acknowledged", "recovery_required"}),
        "start_failed": frozenset({"start_failure_acknowledged"}),
        # Completion beats every recovery reason, the lease-lost ones included. ``started`` only
        # resolves an unknown launch outcome with the handle found afterwards (see ``advance``).
        "recovery_required": frozenset({"completion_acknowledged", "started"}),
        "completion_acknowledged": frozenset(),
        "start_failure_acknowledged": frozenset(),
    }
)
REQUIRED_FIELDS: Final[Mapping[str, frozenset[str]]] = MappingProxyType(
    {
        "launching": frozenset(
            {"completion_callback_sequence", "completion_token_digest", "log_artifact_id"}
        ),
        "started": frozenset({"executor_handle", "executor_started_at_ms"}),
        "recovery_required": frozenset({"recovery_reason"}),
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class JournalOffer:
    """An offer as received, already verified against the worker's session and lease."""

    offer_id: str
    run_id: str
    attempt_id: str
    lease_generation: int
    execution_spec_digest: str
    delivery_kind: DeliveryKind
    offer_json: str = field(repr=False)
    # The lease token: stored sealed, never in ``offer_json`` and never in a repr.
    lease_token: str | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class JournalRecord:
    """One journal row: the offer, its local delivery state and the facts written on the way."""

    offer_id: str
    run_id: str
    attempt_id: str
    lease_generation: int
    execution_spec_digest: str
    delivery_kind: DeliveryKind
    state: JournalState
    revision: int
    offer_json: str = field(repr=False)
    accepted_at_ms: int
    updated_at_ms: int
    executor_started_at_ms: int | None = None
    log_artifact_id: str | None = None
    completion_callback_sequence: int | None = None
    completion_token_digest: str | None = field(default=None, repr=False)
    executor_handle: str | None = field(default=None, repr=False)
    recovery_reason: RecoveryReason | None = None
    completion_acknowledged_at_ms: int | None = None
    # Unsealed on read (the file holds only ``lease_token_sealed``).
    lease_token: str | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class AcceptResult:
    """The stored record and whether this call created it (False for a deduplicated redelivery)."""

    record: JournalRecord
    created: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class JournalAudit:
    """Read-only classification of every record; holds counts and offer ids only, never offers."""

    total: int
    counts: Mapping[AuditClass, int]
    needs_reconciliation: tuple[str, ...]


def resumable(current: JournalRecord, to_state: str) -> bool:
    """``recovery_required -> started`` only resolves an unknown launch outcome that has no handle yet."""
    if current.state != "recovery_required" or to_state != "started":
        return True
    return current.recovery_reason == "launch_outcome_unknown" and current.executor_handle is None


class JournalError(Ql3Error):
    """The worker journal failed."""

    code = "journal_error"


class JournalInvalid(JournalError, ValueError):
    """The journal request is invalid."""

    code = "journal_invalid"
    http_status = 422


class JournalConflict(JournalError):
    """The journal record does not match the expected identity, revision or state."""

    code = "journal_conflict"
    http_status = 409


class JournalFull(JournalError):
    """The worker journal is at capacity."""

    code = "journal_full"
    http_status = 503
    retryable = True


class JournalLocked(JournalError):
    """The worker journal is owned by another journal instance."""

    code = "journal_locked"
    http_status = 503
    retryable = True


class JournalBudgetExceeded(JournalError):
    """The worker journal holds more records than the scan budget allows."""

    code = "journal_budget_exceeded"


class JournalClosed(JournalError):
    """The worker journal is closed."""

    code = "journal_closed"


class JournalCompromised(JournalError):
    """The worker journal lost its single-owner lock and refuses every operation."""

    code = "journal_compromised"


class JournalUnavailable(JournalError):
    """The worker journal cannot be read or written."""

    code = "journal_unavailable"
    http_status = 503
    retryable = True
