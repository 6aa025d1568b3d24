"""The journal's local delivery states, their transitions and what each transition must carry.

Pure rules, no I/O: the store (``store.py``) applies them inside one transaction per write
(docs/contracts.md §3).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Final, Literal, get_args

if TYPE_CHECKING:
    from ql3.worker.journal.records import JournalRecord

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


def resumable(current: JournalRecord, to_state: str) -> bool:
    """``recovery_required -> started`` only resolves an unknown launch outcome that has no handle yet."""
    if current.state != "recovery_required" or to_state != "started":
        return True
    return current.recovery_reason == "launch_outcome_unknown" and current.executor_handle is None
