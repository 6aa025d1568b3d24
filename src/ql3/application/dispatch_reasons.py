"""What the dispatcher saw: the reasons its cycles gave for not placing a run, kept in memory so a user
can read them where a run is shown (docs/dispatch.md, "What the dispatcher saw").

A cycle's result names, for each run it examined and could not place, why (``no_match``,
``plans_unavailable``, ``claim_raced``, ``claim_budget_exhausted``, ``recovery_plans_unavailable``),
and what stopped the cycle as a whole (``no_workers``, ``no_capacity``, ``scan_budget_exhausted``,
``claim_budget_exhausted``, ``recovery_budget_exhausted``): ``DispatchResult.notes``. The board keeps
them deduplicated per run with the time each was last seen, bounded in runs and in reasons per run
(the least recently seen go first), forgets a run's reasons once a cycle offers it, and counts every
observation by reason for ``/metrics``. ``observe`` answers the runs whose latest reason changed, so
the loop logs one line per change, not one per cycle. Thread-safe: the dispatch loop writes, the API
reads.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, Literal

from ql3.domain.errors import ValidationFailed

# Every reason a cycle can note (the metric's label values: a fixed set, never an id).
REASONS: Final = (
    "no_workers",
    "no_capacity",
    "no_match",
    "plans_unavailable",
    "claim_raced",
    "claim_budget_exhausted",
    "scan_budget_exhausted",
    "recovery_plans_unavailable",
    "recovery_budget_exhausted",
)
MAX_RUNS: Final = 1024
MAX_REASONS: Final = len(REASONS)

Scope = Literal["run", "cycle"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SeenReason:
    """One reason as the board keeps it: ``scope`` ``run`` was said of this run, ``cycle`` of a whole
    cycle (every queued run waited for it)."""

    reason: str
    scope: Scope
    first_seen_ms: int
    last_seen_ms: int
    count: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReasonChange:
    """The latest reason of a run (``run_id`` None: of the cycle) is now ``reason``, was ``previous``."""

    run_id: str | None
    reason: str
    previous: str | None


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class DispatchReasons:
    def __init__(
        self,
        *,
        clock: Callable[[], int] = _wall_ms,
        max_runs: int = MAX_RUNS,
        max_reasons: int = MAX_REASONS,
    ) -> None:
        if max_runs < 1 or max_reasons < 1:
            raise ValidationFailed("the board needs room for one run and one reason")
        self._clock = clock
        self._max_runs = max_runs
        self._max_reasons = max_reasons
        self._lock = threading.Lock()
        # run id -> reason -> what was seen, and the cycle's reasons; least recently seen first.
        self._runs: OrderedDict[str, OrderedDict[str, SeenReason]] = OrderedDict()
        self._cycle: OrderedDict[str, SeenReason] = OrderedDict()
        # The latest reason of each run, to tell a change from a repeat.
        self._latest: dict[str | None, str] = {}
        self._totals: Counter[str] = Counter()

    def observe(
        self, notes: Iterable[tuple[str | None, str]], offered: Iterable[str] = ()
    ) -> list[ReasonChange]:
        """Record one cycle: its ``notes`` ((run id or None, reason) pairs) and the runs it offered
        (their reasons are forgotten). Answers the runs whose latest reason changed."""
        now = self._clock()
        changes: list[ReasonChange] = []
        with self._lock:
            for offered_id in offered:
                self._runs.pop(offered_id, None)
                self._latest.pop(offered_id, None)
            for run_id, reason in notes:
                if reason not in REASONS:
                    raise ValidationFailed(f"unknown dispatch reason {reason!r}", field="reason")
                self._totals[reason] += 1
                self._note(run_id, reason, now)
                previous = self._latest.get(run_id)
                if previous != reason:
                    self._latest[run_id] = reason
                    changes.append(ReasonChange(run_id=run_id, reason=reason, previous=previous))
        return changes

    def _note(self, run_id: str | None, reason: str, now: int) -> None:
        if run_id is None:
            reasons = self._cycle
        else:
            found = self._runs.get(run_id)
            if found is None:
                if len(self._runs) >= self._max_runs:
                    oldest, _ = self._runs.popitem(last=False)
                    self._latest.pop(oldest, None)
                found = self._runs[run_id] = OrderedDict()
            self._runs.move_to_end(run_id)
            reasons = found
        seen = reasons.pop(reason, None)
        if seen is None and len(reasons) >= self._max_reasons:
            reasons.popitem(last=False)
        reasons[reason] = SeenReason(
            reason=reason,
            scope="cycle" if run_id is None else "run",
            first_seen_ms=now if seen is None else seen.first_seen_ms,
            last_seen_ms=now,
            count=1 if seen is None else seen.count + 1,
        )

    def for_run(self, run_id: str, *, cycle_since_ms: int | None = None) -> list[SeenReason]:
        """The run's own reasons, then (when ``cycle_since_ms`` is given: the run waits since then)
        the cycle's reasons last seen at or after it; each list most recently seen first."""
        with self._lock:
            own = list(self._runs.get(run_id, {}).values())
            cycle = (
                [s for s in self._cycle.values() if s.last_seen_ms >= cycle_since_ms]
                if cycle_since_ms is not None
                else []
            )
        # Kept least recently seen first: reversed, ties of the same millisecond stay most recent first.
        return sorted(reversed(own), key=lambda s: -s.last_seen_ms) + sorted(
            reversed(cycle), key=lambda s: -s.last_seen_ms
        )

    def totals(self) -> dict[str, int]:
        """Every reason observed since start, by reason (zeros included)."""
        with self._lock:
            return {reason: self._totals[reason] for reason in REASONS}

    def runs_held(self) -> int:
        with self._lock:
            return len(self._runs)
