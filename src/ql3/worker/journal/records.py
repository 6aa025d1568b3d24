"""What the journal takes in and hands out: frozen records that never show a secret in a repr."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ql3.worker.journal.states import AuditClass, DeliveryKind, JournalState, RecoveryReason


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
