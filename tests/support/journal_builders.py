"""Shared builders for the journal tests: a movable clock, offers, and walks through the states."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ql3.domain.journal import JournalOffer, JournalRecord, JournalState
from ql3.worker.journal.store import WorkerJournal

START_MS = 1_800_000_000_000
SPEC_DIGEST = hashlib.sha256(b"spec").hexdigest()
LEASE_TOKEN = "lease-token-" + "L" * 40
STEP_FIELDS: dict[str, dict[str, Any]] = {
    "launching": {
        "completion_callback_sequence": 1,
        "completion_token_digest": hashlib.sha256(b"callback-token").hexdigest(),
        "log_artifact_id": "log-1",
    },
    "started": {"executor_handle": "ql3lp1.eyJ2IjoxfQ", "executor_started_at_ms": START_MS},
    "recovery_required": {"recovery_reason": "lease_lost_local_execution_stopped"},
}


class Clock:
    def __init__(self) -> None:
        self.now = START_MS

    def __call__(self) -> int:
        return self.now


def make_offer(offer_id: str = "offer-1", **overrides: Any) -> JournalOffer:
    values: dict[str, Any] = {
        "offer_id": offer_id,
        "run_id": "run-1",
        "attempt_id": "attempt-" + offer_id,
        "lease_generation": 1,
        "execution_spec_digest": SPEC_DIGEST,
        "delivery_kind": "new_claim",
        "offer_json": json.dumps({"lease": {"token": LEASE_TOKEN, "version": 1}}),
    }
    values.update(overrides)
    return JournalOffer(**values)


def walk(journal: WorkerJournal, offer_id: str, *states: JournalState) -> JournalRecord:
    record = journal.get(offer_id)
    assert record is not None
    for state in states:
        record = journal.advance(
            offer_id, expected_revision=record.revision, to_state=state, **STEP_FIELDS.get(state, {})
        )
    return record


# The shortest way to reach each state from a fresh `accepted` record.
PATH_TO: dict[str, tuple[JournalState, ...]] = {
    "accepted": (),
    "starting_acknowledged": ("starting_acknowledged",),
    "launching": ("starting_acknowledged", "launching"),
    "started": ("starting_acknowledged", "launching", "started"),
    "running_acknowledged": ("starting_acknowledged", "launching", "started", "running_acknowledged"),
    "completion_acknowledged": (
        "starting_acknowledged",
        "launching",
        "started",
        "running_acknowledged",
        "completion_acknowledged",
    ),
    "start_failed": ("start_failed",),
    "start_failure_acknowledged": ("start_failed", "start_failure_acknowledged"),
    "recovery_required": ("starting_acknowledged", "launching", "recovery_required"),
}
