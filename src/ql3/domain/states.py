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
    "queued": frozenset({"dispatching", "cancelled", "timed_out"}),
    # dispatching -> queued: an unstarted claim whose lease expired goes back to the queue (ql3 decision).
    "dispatching": frozenset({"queued", "running", "retry_wait", "failed", "cancelled", "lost", "timed_out"}),
    "running": frozenset(
        {"waiting_approval", "retry_wait", "succeeded", "failed", "cancelled", "timed_out", "lost"}
    ),
    "waiting_approval": frozenset({"running", "cancelled", "timed_out"}),
    "retry_wait": frozenset({"queued", "cancelled", "timed_out"}),
    "lost": frozenset({"queued", "failed", "cancelled", "retry_wait"}),
}

# What only a late fact of the previous attempt does (docs/contracts.md §2.4), besides the moves
# above: it ends a run whose retry had not started (the retry withdrawn), and it is the one change a
# terminal Run takes: a Run that ended ``failed`` only because its last attempt was lost takes that
# attempt's outcome; any other terminal Run keeps its status (the fact goes on its attempt and in an
# event). Nothing else moves a terminal Run.
_FACT_OUTCOMES: Final = frozenset({"succeeded", "failed", "cancelled", "timed_out"})
LATE_FACT_CORRECTIONS: Final[dict[str, frozenset[str]]] = {
    "queued": _FACT_OUTCOMES,
    "dispatching": _FACT_OUTCOMES,
    "retry_wait": _FACT_OUTCOMES,
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
