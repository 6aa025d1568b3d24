"""Run and Attempt state machines (docs/contracts.md §2)."""

from __future__ import annotations

from typing import Final, Literal

RunStatus = Literal[
    "created",
    "queued",
    "dispatching",
    "running",
    "waiting_approval",
    "retry_wait",
    "lost",
    "succeeded",
    "failed",
    "cancelled",
    "timed_out",
]
AttemptStatus = Literal[
    "claimed", "starting", "running", "succeeded", "failed", "cancelled", "timed_out", "lost"
]

RUN_TERMINAL: Final = frozenset({"succeeded", "failed", "cancelled", "timed_out"})
ATTEMPT_TERMINAL: Final = frozenset({"succeeded", "failed", "cancelled", "timed_out", "lost"})
ATTEMPT_ACTIVE: Final = frozenset({"claimed", "starting", "running"})

RUN_TRANSITIONS: Final[dict[str, frozenset[str]]] = {
    "created": frozenset({"queued", "cancelled"}),
    # queued/dispatching/retry_wait -> succeeded/failed: a late fact of the previous attempt
    # withdraws a retry that had not started (docs/contracts.md §2.4).
    "queued": frozenset({"dispatching", "succeeded", "failed", "cancelled", "timed_out"}),
    # dispatching -> queued: an unstarted claim whose lease expired goes back to the queue (ql3 decision).
    "dispatching": frozenset(
        {"queued", "running", "retry_wait", "succeeded", "failed", "cancelled", "lost", "timed_out"}
    ),
    "running": frozenset(
        {"waiting_approval", "retry_wait", "succeeded", "failed", "cancelled", "timed_out", "lost"}
    ),
    "waiting_approval": frozenset({"running", "cancelled", "timed_out"}),
    "retry_wait": frozenset({"queued", "succeeded", "failed", "cancelled", "timed_out"}),
    "lost": frozenset({"queued", "failed", "cancelled", "retry_wait"}),
}

# The one change a terminal Run takes (docs/contracts.md §2.4): a Run that ended ``failed`` only
# because its last attempt was lost takes that attempt's late fact (its outcome); a Run ended by a
# cancel intent or a later attempt keeps its status (the fact is recorded on its attempt and in an
# event). Nothing else moves a terminal Run.
LATE_FACT_CORRECTIONS: Final[dict[str, frozenset[str]]] = {
    "failed": frozenset({"succeeded", "failed", "timed_out"}),
    "succeeded": frozenset({"succeeded"}),
    "cancelled": frozenset({"cancelled"}),
    "timed_out": frozenset({"timed_out"}),
}

ATTEMPT_TRANSITIONS: Final[dict[str, frozenset[str]]] = {
    "claimed": frozenset({"starting", "cancelled", "lost"}),
    "starting": frozenset({"running", "failed", "cancelled", "timed_out", "lost"}),
    "running": frozenset({"succeeded", "failed", "cancelled", "timed_out", "lost"}),
}


def run_transition_allowed(current: str, to: str) -> bool:
    return to in RUN_TRANSITIONS.get(current, frozenset())


def attempt_transition_allowed(current: str, to: str) -> bool:
    return to in ATTEMPT_TRANSITIONS.get(current, frozenset())


def late_fact_correction_allowed(current: str, to: str) -> bool:
    return to in LATE_FACT_CORRECTIONS.get(current, frozenset())


def is_run_terminal(status: str) -> bool:
    return status in RUN_TERMINAL
