"""A stop a crash cut short (docs/reliability.md): the cancel was claimed and signalled, the run ended,
and the process holding the lease died inside the TERM -> KILL grace. A new supervisor of the same
worker finishes it at once; live leases, other workers' attempts and live runs are left alone."""

from __future__ import annotations

from typing import Any

from ql3.application import cancellation_supervisor, lease_results
from ql3.domain.offers import LeaseFence
from tests.support.cancellation_builders import (
    PID_BASE,
    FakeSignal,
    claim,
    dispatch_row,
    events,
    handle_of,
    request,
    running_runs,
)
from tests.support.databases import Harness

WORKER = "w1"  # the worker of running_runs()


def _supervisor(db: Any, finish: Any, *, worker: str | None = WORKER, owner: str = "sup-new") -> Any:
    return cancellation_supervisor.CancellationSupervisor(
        db, signal=FakeSignal(), finish=finish, owner=owner, local_worker_id=worker
    )


def _stop_interrupted_after_the_run_ended(harness: Harness, fence: LeaseFence, project: Any) -> None:
    """Cancel intent, a claim by the old process (its lease live for 60 s), then the run's completion."""
    request(harness.db, project, fence.run_id)
    claim(harness.db, fence.run_id, owner="sup-old", lease_ms=60_000)
    harness.db.transaction(
        lambda tx: lease_results.complete(
            tx, fence, callback_sequence=1, callback_token="cb-token", exit_code=143
        )
    )


def test_a_new_supervisor_finishes_a_stop_its_predecessor_left_inside_the_grace(harness: Harness) -> None:
    # Given a run cancelled and ended while its stop's lease is still held by a dead supervisor
    project, (fence,) = running_runs(harness.db)
    _stop_interrupted_after_the_run_ended(harness, fence, project)
    assert harness.db.raw("SELECT status FROM runs WHERE id = ?", (fence.run_id,))[0]["status"] == "cancelled"
    before = len(events(harness.db, fence.run_id))
    finish = FakeSignal(default="already_exited")
    harness.advance_clock(2_000)  # the restart

    # When the restarted server's supervisor runs its first cycle (the old lease has not expired)
    report = _supervisor(harness.db, finish).run_cycle()

    # Then it finished the stop on the attempt's handle once and settled the dispatch; the run is untouched
    assert finish.calls == [(handle_of(0), PID_BASE, 5_000)]
    assert report.results == {"already_exited": 1} and report.signals == 1
    row = dispatch_row(harness.db, fence.run_id)
    assert (row["status"], row["last_result"], row["lease_owner"]) == ("dispatched", "already_exited", None)
    assert len(events(harness.db, fence.run_id)) == before
    # And later cycles never finish it again
    _supervisor(harness.db, finish).run_cycle()
    assert len(finish.calls) == 1


def test_a_lease_taken_by_this_supervisor_is_left_to_its_own_stop(harness: Harness) -> None:
    # Given a supervisor that already ran once (its start time is fixed), then a stop leased after that
    project, (fence,) = running_runs(harness.db)
    finish = FakeSignal(default="already_exited")
    supervisor = _supervisor(harness.db, finish, owner="sup-old")
    supervisor.run_cycle()
    harness.advance_clock(1_000)
    _stop_interrupted_after_the_run_ended(harness, fence, project)

    # When it runs again while its lease is live, nothing is finished
    supervisor.run_cycle()
    assert finish.calls == []
    assert dispatch_row(harness.db, fence.run_id)["status"] == "leased"

    # Then once that lease expired (its holder hung or died), the stop is finished after all
    harness.advance_clock(60_000)
    supervisor.run_cycle()
    assert len(finish.calls) == 1
    assert dispatch_row(harness.db, fence.run_id)["status"] == "dispatched"


def test_another_workers_attempt_and_a_live_run_are_not_touched(harness: Harness) -> None:
    # Given an interrupted stop of a terminal run, and a live run whose cancel is being stopped
    project, (ended, live) = running_runs(harness.db, 2)
    _stop_interrupted_after_the_run_ended(harness, ended, project)
    request(harness.db, project, live.run_id)
    claim(harness.db, live.run_id, owner="sup-old", lease_ms=60_000)
    finish = FakeSignal(default="already_exited")
    harness.advance_clock(2_000)

    # When a supervisor of another worker runs, and then one without a finisher
    _supervisor(harness.db, finish, worker="other-worker").run_cycle()
    cancellation_supervisor.CancellationSupervisor(
        harness.db, signal=FakeSignal(), owner="sup-new", local_worker_id=WORKER
    ).run_cycle()

    # Then neither finished anything, and the live run's lease is left to expire as before
    assert finish.calls == []
    assert dispatch_row(harness.db, ended.run_id)["status"] == "leased"
    assert dispatch_row(harness.db, live.run_id)["lease_owner"] == "sup-old"
