"""One time authority: deadlines and the restart boundary come from the database clock, so shifting it
against this host's clock by minutes changes neither timeouts nor recovery.

On PostgreSQL ``advance_clock`` moves ``ql3_now_ms()`` away from the host clock; on SQLite the injected
clock already runs far from it (and is the one clock the server uses there).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ql3.application import cancellation, tasks
from ql3.application.gateway import InProcessControlPlane
from ql3.application.settings import load_serve_settings
from ql3.bootstrap import build_standalone_runtime
from ql3.domain.digests import sha256_hex
from tests.support.builders import seed_project, seed_task, start_run
from tests.support.databases import Harness
from tests.support.execution_builders import SECRET, dispatcher, queued, register

MINUTES = 60_000
SHIFTS = pytest.mark.parametrize("shift_ms", [-10 * MINUTES, 10 * MINUTES], ids=["behind", "ahead"])


@SHIFTS
def test_a_deadline_is_the_pinned_timeout_from_the_database_clock(harness: Harness, shift_ms: int) -> None:
    # Given a database clock minutes away from this host's, and a started run of a 60 s task
    harness.advance_clock(shift_ms)
    register(harness.db, lease_ms=600_000)
    queued(harness.db, timeout_ms=60_000)
    offer = dispatcher(harness.db, lease_ms=600_000).dispatch_once().offer
    assert offer is not None
    plane = InProcessControlPlane(harness.db)
    before = harness.now_ms()
    assert plane.ack_starting(offer.fence)[0] == "starting"
    after = harness.now_ms()
    plane.ack_running(
        offer.fence,
        pid=3_141_592,
        handle="ql3lp1.time",
        log_artifact_id="log",
        callback_sequence=1,
        callback_token_digest=sha256_hex("cb"),
    )

    # Then the persisted deadline is 60 s of database time after the start
    (row,) = harness.db.raw("SELECT deadline_at_ms FROM run_attempts WHERE id = ?", (offer.fence.attempt_id,))
    assert before + 60_000 <= int(row["deadline_at_ms"]) <= after + 60_000

    # And the timeout fires after 60 s of database time, not before
    assert cancellation.timeout_cycle(harness.db).scanned == 0
    harness.advance_clock(59_000)
    assert cancellation.timeout_cycle(harness.db).scanned == 0
    harness.advance_clock(1_000 + (after - before))
    assert cancellation.timeout_cycle(harness.db).requested == 1
    (run,) = harness.db.raw("SELECT cancel_reason FROM runs WHERE id = ?", (offer.fence.run_id,))
    assert run["cancel_reason"] == "timeout"


def test_a_task_without_a_timeout_has_no_deadline(harness: Harness) -> None:
    register(harness.db, lease_ms=600_000)
    queued(harness.db)
    offer = dispatcher(harness.db, lease_ms=600_000).dispatch_once().offer
    assert offer is not None

    InProcessControlPlane(harness.db).ack_starting(offer.fence)

    (row,) = harness.db.raw("SELECT deadline_at_ms FROM run_attempts WHERE id = ?", (offer.fence.attempt_id,))
    assert row["deadline_at_ms"] is None


def _runtime(harness: Harness, home: Path) -> object:
    home.mkdir(parents=True, exist_ok=True)
    (home / "lease.secret").write_bytes(SECRET)  # the same secret as the test dispatchers
    settings = load_serve_settings(
        {"QL3_HOME": str(home)}, profile="standalone", slots=4, worker_id="w1", database_url=None, cpus=2
    )
    return build_standalone_runtime(harness.db, settings)


@SHIFTS
def test_a_restarted_server_recovers_exactly_the_leases_claimed_before_it_started(
    harness: Harness, shift_ms: int, tmp_path: Path
) -> None:
    # Given a database clock minutes away from this host's and a worker with a claimed, unstarted run
    harness.advance_clock(shift_ms)
    register(harness.db, "w1", lease_ms=600_000)
    queued(harness.db, 2)
    earlier = dispatcher(harness.db, lease_ms=600_000).dispatch_once().offer
    assert earlier is not None
    harness.advance_clock(1)

    # When the server restarts, and another incarnation claims the second run after that
    runtime = _runtime(harness, tmp_path / "home")
    harness.advance_clock(1)
    later = dispatcher(harness.db, lease_ms=600_000).dispatch_once().offer
    assert later is not None

    # Then the restarted dispatcher re-delivers the lease claimed before it started, with the same
    # offer id, and only that one: the later lease is not "recovered" by an incarnation that never had it
    first = runtime.dispatcher.dispatch_once()  # type: ignore[attr-defined]
    assert first.reason == "recovered"
    assert first.offer is not None and first.offer.offer_id == earlier.offer_id
    second = runtime.dispatcher.dispatch_once()  # type: ignore[attr-defined]
    assert second.offer is None or second.offer.fence.attempt_id != later.fence.attempt_id


def test_a_deadline_comes_from_the_runs_own_task_and_pinned_revision(harness: Harness) -> None:
    # Given another task with two revisions (10 and 20 minutes), and a task whose first revision
    # (1 minute) was edited to 2 minutes before its run was created (the run is pinned to revision 2)
    register(harness.db, lease_ms=600_000)
    project = seed_project(harness.db)
    other = seed_task(harness.db, project, name="other", timeout_ms=10 * MINUTES)
    harness.db.transaction(lambda tx: tasks.edit_task(tx, project.id, other.id, {"timeout_ms": 20 * MINUTES}))
    task = seed_task(harness.db, project, name="job", timeout_ms=MINUTES)
    edited = harness.db.transaction(
        lambda tx: tasks.edit_task(tx, project.id, task.id, {"timeout_ms": 2 * MINUTES})
    )
    run, _ = start_run(harness.db, project, edited.task)
    assert run.task_revision == 2
    offer = dispatcher(harness.db, lease_ms=600_000).dispatch_once().offer
    assert offer is not None and offer.fence.run_id == run.id

    # When it starts
    before = harness.now_ms()
    assert InProcessControlPlane(harness.db).ack_starting(offer.fence)[0] == "starting"
    after = harness.now_ms()

    # Then its deadline is its own pinned revision's 2 minutes, not the other task's or revision 1's
    (row,) = harness.db.raw("SELECT deadline_at_ms FROM run_attempts WHERE id = ?", (offer.fence.attempt_id,))
    assert before + 2 * MINUTES <= int(row["deadline_at_ms"]) <= after + 2 * MINUTES
