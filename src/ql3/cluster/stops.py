"""Stopping a remote worker's run through lease control (docs/cluster.md "Stop", ADR-0457).

A replica cannot prove a remote process's identity, so it never signals one. The worker's
lease-control call is the only trigger: under the full lease fence, the control plane claims the
run's durable cancellation dispatch and commits ``termination_requested`` (the
``run.cancel_dispatched`` event) *before* it answers ``stop_requested``; the worker then re-proves
the process identity and signals the group with the task's grace. A later call replays the settled
dispatch. A dispatch that another holder leases, that backs off, or that is blocked fails closed:
the stop is not released (``pending``) and the worker asks again.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Final, Literal

from ql3.application import cancellation, leases
from ql3.application.runs import lock_run
from ql3.application.tasks import get_revision
from ql3.domain import cancellation as rules
from ql3.domain.errors import FenceConflict, NotFound, ValidationFailed
from ql3.domain.model import Run
from ql3.domain.offers import LeaseFence
from ql3.domain.states import is_run_terminal
from ql3.domain.tasks import build_spec
from ql3.ports import channels
from ql3.ports.storage import Database, Transaction

Decision = Literal["run", "stop_requested", "terminal", "pending"]
STOP_PAGE: Final = 64
MAX_WAIT_MS: Final = 20_000
WAKE_CHANNELS: Final = (channels.CANCELLATIONS,)
# The supervisor of ``ql3 control`` signals nothing itself: no worker can have this id (it is not a
# valid worker id), so every started attempt is left to its worker's lease control.
NO_LOCAL_WORKER: Final = "(remote workers stop through lease control)"


@dataclass(frozen=True, slots=True, kw_only=True)
class ControlAnswer:
    decision: Decision
    grace_ms: int | None = None


def lease_control(tx: Transaction, fence: LeaseFence, *, owner: str, lease_ms: int) -> ControlAnswer:
    """One transaction. Lock order Run -> (lease) -> Attempt -> dispatch."""
    run = lock_run(tx, fence.run_id)
    if is_run_terminal(run.status):
        return ControlAnswer(decision="terminal")
    try:
        leases.check_fence(tx, fence, ignore_version=True)
    except FenceConflict as exc:
        if exc.details.get("reason") == "not_leased":
            return ControlAnswer(decision="terminal")
        raise
    if run.cancel_requested_at_ms is None:
        return ControlAnswer(decision="run")
    token = secrets.token_urlsafe(32)
    claimed = cancellation.claim(
        tx,
        run_id=run.id,
        owner=owner,
        token=token,
        lease_ms=lease_ms,
        requested_at_ms=run.cancel_requested_at_ms,
    )
    if claimed.attempt_id is not None and claimed.attempt_id != fence.attempt_id:
        return ControlAnswer(decision="pending")  # bound to another attempt: never this one's stop
    grace = _grace_ms(tx, run)
    if claimed.status == "dispatched":
        return ControlAnswer(decision="stop_requested", grace_ms=grace)  # settled before: replay
    if claimed.status != "claimed":
        # leased (another holder), not_due, blocked, binding_conflict, not_eligible: fail closed.
        return ControlAnswer(decision="pending")
    assert claimed.dispatch_version is not None
    cancellation.record_result(
        tx,
        run_id=run.id,
        attempt_id=fence.attempt_id,
        owner=owner,
        token=token,
        expected_version=claimed.dispatch_version,
        result="termination_requested",
        controller_ran=True,
    )
    return ControlAnswer(decision="stop_requested", grace_ms=grace)


def _grace_ms(tx: Transaction, run: Run) -> int:
    """The pinned revision's TERM -> KILL grace (informational: the worker uses its offer's)."""
    try:
        return build_spec(get_revision(tx, run.task_id, run.task_revision).spec).grace_ms
    except (NotFound, ValidationFailed):
        return rules.DEFAULT_GRACE_MS


class StopWatch:
    """The worker's long-poll for stop intents on its runs, woken by commits on ``cancellations``."""

    def __init__(
        self,
        db: Database,
        *,
        counters: Callable[[tuple[str, ...]], dict[str, int]],
        wait_past: Callable[[dict[str, int], float], bool],
        notify: Callable[[str], None],
    ) -> None:
        self._db = db
        self._counters = counters
        self._wait_past = wait_past
        self._notify = notify
        self._closing = False

    def close(self) -> None:
        """Long-polls in flight answer at once (graceful shutdown)."""
        self._closing = True
        self._notify(channels.CANCELLATIONS)

    def wait(self, worker_id: str, session_id: str, *, wait_ms: int, known: frozenset[str]) -> list[str]:
        """Attempts with a stop intent, beyond those the worker says it already handles (``known``)."""
        if isinstance(wait_ms, bool) or not 0 <= wait_ms <= MAX_WAIT_MS:
            raise ValidationFailed(f"waitMs must be 0-{MAX_WAIT_MS}", field="waitMs")
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            marks = self._counters(WAKE_CHANNELS)
            found = self._db.transaction(
                partial(
                    cancellation.stop_requests, worker_id=worker_id, session_id=session_id, limit=STOP_PAGE
                ),
                write=False,
            )
            fresh = [a for a in found if a not in known]
            remaining = deadline - time.monotonic()
            if fresh or remaining <= 0 or self._closing:
                return fresh
            self._wait_past(marks, remaining)
