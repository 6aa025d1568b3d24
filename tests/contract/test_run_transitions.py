"""Run state changes: CAS on the version, event sequence, atomic rollback, terminal immutability."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from ql3.application import runs
from ql3.domain.errors import Conflict, InvalidRunTransition, RunVersionConflict
from tests.support.builders import count, seed_project, seed_task, start_run
from tests.support.databases import Harness


def test_created_run_is_queued_with_a_claimed_attempt_and_two_events(harness: Harness) -> None:
    project = seed_project(harness.db)
    task = seed_task(harness.db, project)

    run, created = start_run(harness.db, project, task)

    assert created and run.status == "queued" and run.version == 0 and run.event_sequence == 2
    events = harness.db.transaction(lambda tx: runs.list_events(tx, run.id, after=0, limit=10))
    assert [(e.sequence, e.type) for e in events] == [(1, "run.created"), (2, "run.queued")]
    attempt = harness.db.transaction(lambda tx: runs.latest_attempt(tx, run.id))
    assert attempt is not None and attempt.status == "claimed" and attempt.attempt == 1


def test_transition_bumps_version_and_sequence_and_appends_one_event(harness: Harness) -> None:
    project = seed_project(harness.db)
    run, _ = start_run(harness.db, project, seed_task(harness.db, project))

    moved = harness.db.transaction(
        lambda tx: runs.transition(tx, run.id, 0, "dispatching", actor_type="system")
    )

    assert (moved.status, moved.version, moved.event_sequence) == ("dispatching", 1, 3)
    stored = harness.db.transaction(lambda tx: runs.get_run(tx, project.id, run.id))
    assert (stored.status, stored.version, stored.event_sequence) == ("dispatching", 1, 3)
    assert count(harness.db, "run_events") == 3


def test_stale_version_is_a_conflict_and_writes_nothing(harness: Harness) -> None:
    project = seed_project(harness.db)
    run, _ = start_run(harness.db, project, seed_task(harness.db, project))
    harness.db.transaction(lambda tx: runs.transition(tx, run.id, 0, "dispatching", actor_type="system"))

    with pytest.raises(RunVersionConflict):
        harness.db.transaction(lambda tx: runs.transition(tx, run.id, 0, "cancelled", actor_type="user"))

    stored = harness.db.transaction(lambda tx: runs.get_run(tx, project.id, run.id))
    assert stored.status == "dispatching" and stored.version == 1
    assert count(harness.db, "run_events") == 3


@pytest.mark.parametrize("target", ["succeeded", "waiting_approval", "created"])
def test_disallowed_transition_is_refused(harness: Harness, target: str) -> None:
    project = seed_project(harness.db)
    run, _ = start_run(harness.db, project, seed_task(harness.db, project))

    with pytest.raises(InvalidRunTransition):
        harness.db.transaction(lambda tx: runs.transition(tx, run.id, 0, target, actor_type="system"))

    assert count(harness.db, "run_events") == 2


def test_terminal_runs_are_immutable(harness: Harness) -> None:
    project = seed_project(harness.db)
    run, _ = start_run(harness.db, project, seed_task(harness.db, project))
    done = harness.db.transaction(lambda tx: runs.transition(tx, run.id, 0, "cancelled", actor_type="user"))

    for target in ("queued", "cancelled", "failed"):
        with pytest.raises(InvalidRunTransition):
            harness.db.transaction(
                lambda tx, t=target: runs.transition(tx, run.id, done.version, t, actor_type="system")
            )
    assert harness.db.transaction(lambda tx: runs.get_run(tx, project.id, run.id)).status == "cancelled"


def test_failed_event_append_rolls_back_the_state_change(harness: Harness) -> None:
    # Given a conflicting event already occupying the next sequence number
    project = seed_project(harness.db)
    run, _ = start_run(harness.db, project, seed_task(harness.db, project))
    harness.db.raw(
        "INSERT INTO run_events (id, run_id, sequence, type, actor_type, payload_json, created_at_ms)"
        " VALUES ('planted', ?, 3, 'run.planted', 'system', '{}', 0)",
        (run.id,),
    )

    # When a transition tries to append its event at that sequence
    with pytest.raises(Conflict):
        harness.db.transaction(lambda tx: runs.transition(tx, run.id, 0, "dispatching", actor_type="system"))

    # Then the Run itself did not move
    stored = harness.db.transaction(lambda tx: runs.get_run(tx, project.id, run.id))
    assert (stored.status, stored.version, stored.event_sequence) == ("queued", 0, 2)


def test_event_payload_outside_the_allowlist_rolls_back(harness: Harness) -> None:
    project = seed_project(harness.db)
    run, _ = start_run(harness.db, project, seed_task(harness.db, project))

    def leak(tx: Any) -> None:
        current = runs.lock_run(tx, run.id)
        runs.write_run(
            tx,
            current,
            current,
            [runs.EventSpec(type="run.reconciled", actor_type="system", payload={"command": "secret"})],
        )

    with pytest.raises(Exception, match="allowlist"):
        harness.db.transaction(leak)
    assert harness.db.transaction(lambda tx: runs.get_run(tx, project.id, run.id)).version == 0


def test_two_concurrent_transitions_exactly_one_wins(harness: Harness) -> None:
    # Given two real connections that both read version 0
    project = seed_project(harness.db)
    run, _ = start_run(harness.db, project, seed_task(harness.db, project))
    other = harness.second_connection()
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def attempt(db: Any, target: str) -> None:
        def fn(tx: Any) -> Any:
            return runs.transition(tx, run.id, 0, target, actor_type="system")

        barrier.wait()
        try:
            db.transaction(fn)
            outcomes.append("won")
        except RunVersionConflict:
            outcomes.append("conflict")

    # When both try to move it at the same time
    threads = [
        threading.Thread(target=attempt, args=(harness.db, "dispatching")),
        threading.Thread(target=attempt, args=(other, "cancelled")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    other.close()

    # Then exactly one committed and the loser got a conflict; no orphan events
    assert sorted(outcomes) == ["conflict", "won"]
    stored = harness.db.transaction(lambda tx: runs.get_run(tx, project.id, run.id))
    assert stored.version == 1 and stored.event_sequence == 3
    assert count(harness.db, "run_events") == 3
