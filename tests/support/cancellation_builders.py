"""Builders for the cancellation contract tests: running runs, intents, fake controllers."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from ql3.application import cancellation, lease_results
from ql3.domain.digests import sha256_hex
from ql3.domain.model import Project
from ql3.domain.offers import LeaseFence
from tests.support.builders import seed_task, start_run
from tests.support.execution_builders import dispatcher, queued, register

LONG_MS = 600_000  # run leases and worker sessions outlive every clock jump in these tests


# Pids distinctive enough that a scan for them cannot match a timestamp or an id by accident.
PID_BASE = 3_141_592


def handle_of(i: int) -> str:
    return f"ql3lp1.handle-{i}"


def claimed_runs(db: Any, n: int = 1, **spec: Any) -> tuple[Project, list[LeaseFence]]:
    """``n`` runs dispatched to one worker (Attempt still ``claimed``, Run ``dispatching``)."""
    register(db, slots=64, lease_ms=LONG_MS)
    project, _, _ = queued(db, n, **spec)
    fences: list[LeaseFence] = []
    d = dispatcher(db, lease_ms=LONG_MS)
    for _ in range(n):
        offer = d.dispatch_once().offer
        assert offer is not None
        fences.append(offer.fence)
    return project, fences


def start_fence(db: Any, fence: LeaseFence, i: int = 0) -> None:
    db.transaction(lambda tx: lease_results.ack_starting(tx, fence))
    db.transaction(
        lambda tx: lease_results.ack_running(
            tx,
            fence,
            pid=PID_BASE + i,
            handle=handle_of(i),
            log_artifact_id=f"log-{i}",
            callback_sequence=1,
            callback_token_digest=sha256_hex("cb-token"),
        )
    )


def running_runs(db: Any, n: int = 1, **spec: Any) -> tuple[Project, list[LeaseFence]]:
    """``n`` running runs; run ``i`` has pid ``PID_BASE + i`` and handle ``handle_of(i)``."""
    project, fences = claimed_runs(db, n, **spec)
    for i, fence in enumerate(fences):
        start_fence(db, fence, i)
    return project, fences


def running_in(db: Any, project: Project, n: int, *, first: int = 0, task: str = "job2") -> list[LeaseFence]:
    """``n`` more running runs in ``project`` (the worker is already registered); handles from ``first``."""
    created = seed_task(db, project, name=task)
    for _ in range(n):
        start_run(db, project, created)
    d = dispatcher(db, lease_ms=LONG_MS)
    fences: list[LeaseFence] = []
    for i in range(n):
        offer = d.dispatch_once().offer
        assert offer is not None
        start_fence(db, offer.fence, first + i)
        fences.append(offer.fence)
    return fences


def request(db: Any, project: Project, run_id: str, reason: str = "user") -> str:
    result: str = db.transaction(
        lambda tx: cancellation.request_cancel(
            tx, project.id, run_id, reason=reason, actor_type="user", actor_id="alice"
        )
    )
    return result


def new_token() -> str:
    return secrets.token_urlsafe(32)


def claim(
    db: Any, run_id: str, owner: str = "sup-a", token: str | None = None, lease_ms: int = 30_000
) -> Any:
    tok = token or new_token()
    return db.transaction(
        lambda tx: cancellation.claim(tx, run_id=run_id, owner=owner, token=tok, lease_ms=lease_ms)
    )


def record(
    db: Any,
    outcome: Any,
    result: str,
    *,
    owner: str = "sup-a",
    token: str | None = None,
    controller_ran: bool = True,
    retry_base_ms: int = 1_000,
    retry_max_ms: int = 60_000,
) -> Any:
    return db.transaction(
        lambda tx: cancellation.record_result(
            tx,
            run_id=outcome.run_id,
            attempt_id=outcome.attempt_id,
            owner=owner,
            token=token if token is not None else outcome.token,
            expected_version=outcome.dispatch_version,
            result=result,
            controller_ran=controller_ran,
            retry_base_ms=retry_base_ms,
            retry_max_ms=retry_max_ms,
        )
    )


def dispatch_row(db: Any, run_id: str) -> dict[str, Any]:
    found = db.raw("SELECT * FROM cancellation_dispatches WHERE run_id = ?", (run_id,))
    assert len(found) == 1
    return dict(found[0])


def events(db: Any, run_id: str) -> list[dict[str, Any]]:
    found = db.raw("SELECT * FROM run_events WHERE run_id = ? ORDER BY sequence", (run_id,))
    return [dict(r) | {"payload": json.loads(r["payload_json"])} for r in found]


@dataclass(frozen=True)
class FakeOutcome:
    status: str
    term_signal_sent: bool = False
    kill_signal_sent: bool = False


@dataclass
class FakeSignal:
    """Records every call; answers per handle (default ``termination_requested``) or raises."""

    answers: dict[str, str] = field(default_factory=dict)
    default: str = "termination_requested"
    raises: bool = False
    calls: list[tuple[str, int | None, int]] = field(default_factory=list)
    outcomes: list[FakeOutcome] = field(default_factory=list)

    def __call__(self, handle: str, pid: int | None, grace_ms: int) -> FakeOutcome:
        self.calls.append((handle, pid, grace_ms))
        if self.raises:
            raise OSError("controller exploded")
        status = self.answers.get(handle, self.default)
        # Like the real controller: a signal is sent only after every identity proof matched.
        outcome = FakeOutcome(status=status, term_signal_sent=status == "termination_requested")
        self.outcomes.append(outcome)
        return outcome

    @property
    def signals_sent(self) -> int:
        return sum(1 for o in self.outcomes if o.term_signal_sent or o.kill_signal_sent)
