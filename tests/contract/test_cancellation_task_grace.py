"""The supervisor stops each run with its own task's grace (issue 8 item 5), and its claim lease
outlasts that grace, on both databases."""

from __future__ import annotations

from typing import Any

import pytest

from ql3.application import cancellation_supervisor
from tests.support.cancellation_builders import (
    PID_BASE,
    FakeOutcome,
    FakeSignal,
    dispatch_row,
    handle_of,
    request,
    running_runs,
)
from tests.support.databases import Harness


class LeaseWatchingSignal(FakeSignal):
    """Also records, while the stop is under way, how long the claim lease still has to run."""

    db: Any = None
    lease_left_ms: list[int]

    def __init__(self, db: Any) -> None:
        super().__init__()
        self.db = db
        self.lease_left_ms = []

    def __call__(self, handle: str, pid: int | None, grace_ms: int) -> FakeOutcome:
        def left(tx: Any) -> int:
            row = tx.one(
                "cancel_dispatch_get_in_project", {"run_id": self.run_id, "project_id": self.project_id}
            )
            return int(row["lease_expires_at_ms"]) - int(tx.now_ms())

        self.lease_left_ms.append(self.db.transaction(left, write=False))
        return super().__call__(handle, pid, grace_ms)

    run_id: str = ""
    project_id: str = ""


@pytest.mark.parametrize("grace_ms", [0, 1_000, 8_000, 120_000, 300_000])
def test_the_signal_gets_the_tasks_grace_and_the_claim_lease_outlasts_it(
    harness: Harness, grace_ms: int
) -> None:
    # Given a running run whose task declares its own TERM -> KILL grace, with a cancel intent
    project, (fence,) = running_runs(harness.db, grace_ms=grace_ms)
    request(harness.db, project, fence.run_id)
    signal = LeaseWatchingSignal(harness.db)
    signal.run_id = fence.run_id
    signal.project_id = project.id

    # When a cycle runs (the supervisor's own default is 5 s, with a 30 s claim lease)
    cancellation_supervisor.CancellationSupervisor(
        harness.db, signal=signal, owner="sup-a", lease_ms=30_000
    ).run_cycle()

    # Then the controller was asked for exactly the task's grace, under a lease that outlasts it
    assert signal.calls == [(handle_of(0), PID_BASE, grace_ms)]
    # (twice the grace, within the 5 min cap on any claim lease; a little slack for PostgreSQL's clock,
    # which moves between the claim and this read)
    (left,) = signal.lease_left_ms
    assert left >= min(300_000, max(30_000, 2 * grace_ms)) - 5_000
    assert dispatch_row(harness.db, fence.run_id)["status"] == "dispatched"
