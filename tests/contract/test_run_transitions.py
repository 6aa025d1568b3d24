"""Run state changes: CAS on the version, event sequence, atomic rollback, terminal immutability."""

from __future__ import annotations

import threading
from dataclasses import replace
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


def _dispatching(run: Any) -> list[runs.EventSpec]:
    return [runs.EventSpec(type="run.dispatching", actor_type="system", payload={"from": run.status})]


def test_a_write_from_a_stale_run_row_is_a_conflict_and_writes_nothing(harness: Harness) -> None:
    # Given a writer holding the run as it was before another change committed (version 0, now 1)
    project = seed_project(harness.db)
    run, _ = start_run(harness.db, project, seed_task(harness.db, project))
    stale = harness.db.transaction(lambda tx: runs.get_run(tx, project.id, run.id))
    harness.db.transaction(lambda tx: runs.transition(tx, run.id, 0, "dispatching", actor_type="system"))

    # When it writes from that row (write_run's own CAS, below the lock that transition() re-checks)
    with pytest.raises(RunVersionConflict):
        harness.db.transaction(
            lambda tx: runs.write_run(tx, stale, replace(stale, status="dispatching"), _dispatching(stale))
        )

    # Then nothing of it was written: neither the Run nor an event
    stored = harness.db.transaction(lambda tx: runs.get_run(tx, project.id, run.id))
    assert (stored.status, stored.version, stored.event_sequence) == ("dispatching", 1, 3)
    assert count(harness.db, "run_events") == 3


def test_an_event_only_write_bumps_only_version_and_sequence_and_is_fenced_on_the_version(
    harness: Harness,
) -> None:
    # Given a writer holding the run as it was before another change committed (version 0, now 1)
    project = seed_project(harness.db)
    run, _ = start_run(harness.db, project, seed_task(harness.db, project))
    stale = harness.db.transaction(lambda tx: runs.get_run(tx, project.id, run.id))
    moved = harness.db.transaction(
        lambda tx: runs.transition(tx, run.id, 0, "dispatching", actor_type="system")
    )
    note = [runs.EventSpec(type="attempt.starting", actor_type="worker", payload={"attempt": 1})]

    # When it appends an event without changing the run (the starting ACK's write) from that row
    with pytest.raises(RunVersionConflict):
        harness.db.transaction(lambda tx: runs.write_run(tx, stale, stale, note))

    # Then nothing of it was written
    stored = harness.db.transaction(lambda tx: runs.get_run(tx, project.id, run.id))
    assert (stored.version, stored.event_sequence) == (1, 3)
    assert count(harness.db, "run_events") == 3

    # And from the current row it moves the version and the sequence, and nothing else of the run
    written = harness.db.transaction(lambda tx: runs.write_run(tx, moved, moved, note))
    stored = harness.db.transaction(lambda tx: runs.get_run(tx, project.id, run.id))
    assert stored == written == replace(moved, version=2, event_sequence=4)
    assert count(harness.db, "run_events") == 4


def test_a_write_whose_attempt_changed_is_a_conflict_and_rolls_the_run_back(harness: Harness) -> None:
    # Given a writer that believes the attempt is starting while it is still claimed
    project = seed_project(harness.db)
    run, _ = start_run(harness.db, project, seed_task(harness.db, project))
    current = harness.db.transaction(lambda tx: runs.get_run(tx, project.id, run.id))
    attempt = harness.db.transaction(lambda tx: runs.latest_attempt(tx, run.id))
    assert attempt is not None and attempt.status == "claimed"
    believed = replace(attempt, status="starting")
    change = runs.AttemptChange(attempt=believed, new=replace(believed, status="running", pid=7))

    # When it writes the Run with that Attempt change
    with pytest.raises(Conflict, match="attempt changed concurrently"):
        harness.db.transaction(lambda tx: runs.write_run(tx, current, current, _dispatching(current), change))

    # Then the Run CAS that went first is rolled back with it, and no event was written
    stored = harness.db.transaction(lambda tx: runs.get_run(tx, project.id, run.id))
    assert (stored.version, stored.event_sequence) == (current.version, current.event_sequence)
    assert count(harness.db, "run_events") == 2
    after = harness.db.transaction(lambda tx: runs.latest_attempt(tx, run.id))
    assert after is not None and (after.status, after.pid) == ("claimed", None)


def test_a_write_whose_attempt_callback_sequence_moved_is_a_conflict(harness: Harness) -> None:
    # Given a writer holding the attempt at callback sequence 0 while another write moved it to 1
    # (the status stayed the same: only the sequence tells the two apart)
    project = seed_project(harness.db)
    run, _ = start_run(harness.db, project, seed_task(harness.db, project))
    current = harness.db.transaction(lambda tx: runs.get_run(tx, project.id, run.id))
    attempt = harness.db.transaction(lambda tx: runs.latest_attempt(tx, run.id))
    assert attempt is not None and attempt.callback_sequence == 0
    moved = replace(attempt, callback_sequence=1)
    harness.db.transaction(
        lambda tx: runs.write_run(tx, current, current, [], runs.AttemptChange(attempt=attempt, new=moved))
    )
    current = harness.db.transaction(lambda tx: runs.get_run(tx, project.id, run.id))
    stale = runs.AttemptChange(attempt=attempt, new=replace(attempt, worker_id="w1", callback_sequence=1))

    # When it writes from its stale attempt
    with pytest.raises(Conflict, match="attempt changed concurrently"):
        harness.db.transaction(lambda tx: runs.write_run(tx, current, current, _dispatching(current), stale))

    # Then nothing of it was written
    after = harness.db.transaction(lambda tx: runs.latest_attempt(tx, run.id))
    assert after == moved
    stored = harness.db.transaction(lambda tx: runs.get_run(tx, project.id, run.id))
    assert (stored.version, stored.event_sequence) == (current.version, current.event_sequence)


def test_a_write_stores_every_field_of_the_run_and_the_attempt_and_its_events_in_order(
    harness: Harness,
) -> None:
    # Given a queued run and its claimed attempt
    project = seed_project(harness.db)
    run, _ = start_run(harness.db, project, seed_task(harness.db, project))
    current = harness.db.transaction(lambda tx: runs.get_run(tx, project.id, run.id))
    attempt = harness.db.transaction(lambda tx: runs.latest_attempt(tx, run.id))
    assert attempt is not None
    new_run = replace(current, status="dispatching", error_code="E1", exit_code=3, started_at_ms=11)
    new_attempt = replace(attempt, worker_id="w1", deadline_at_ms=99, callback_sequence=2, error_code="E2")
    events = [
        runs.EventSpec(type="run.a", actor_type="system", payload={"from": "queued"}, dedupe_key="k1"),
        runs.EventSpec(type="run.b", actor_type="worker", actor_id="w1", attempt_id=attempt.id),
    ]

    # When one write changes both rows with two events
    written = harness.db.transaction(
        lambda tx: runs.write_run(
            tx, current, new_run, events, runs.AttemptChange(attempt=attempt, new=new_attempt)
        )
    )

    # Then the rows hold exactly what was written, and the events follow the run's sequence
    stored = harness.db.transaction(lambda tx: runs.get_run(tx, project.id, run.id))
    assert stored == written
    assert (stored.version, stored.event_sequence) == (current.version + 1, current.event_sequence + 2)
    assert (stored.status, stored.error_code, stored.exit_code, stored.started_at_ms) == (
        "dispatching",
        "E1",
        3,
        11,
    )
    after = harness.db.transaction(lambda tx: runs.latest_attempt(tx, run.id))
    assert after == new_attempt
    listed = harness.db.transaction(
        lambda tx: runs.list_events(tx, run.id, after=current.event_sequence, limit=10)
    )
    assert [(e.sequence, e.type, e.actor_type, e.actor_id, e.attempt_id, e.payload) for e in listed] == [
        (current.event_sequence + 1, "run.a", "system", None, None, {"from": "queued"}),
        (current.event_sequence + 2, "run.b", "worker", "w1", attempt.id, {}),
    ]
    keys = harness.db.raw("SELECT dedupe_key FROM run_events WHERE run_id = ? ORDER BY sequence", (run.id,))
    assert [k["dedupe_key"] for k in keys][-2:] == ["k1", None]


def test_a_write_changes_only_its_own_run_and_attempt(harness: Harness) -> None:
    # Given two queued runs at the same version, each with a claimed attempt at the same sequence
    project = seed_project(harness.db)
    task = seed_task(harness.db, project)
    mine, _ = start_run(harness.db, project, task)
    other, _ = start_run(harness.db, project, task)
    attempt = harness.db.transaction(lambda tx: runs.latest_attempt(tx, mine.id))
    other_attempt = harness.db.transaction(lambda tx: runs.latest_attempt(tx, other.id))
    assert attempt is not None and other_attempt is not None
    assert (mine.version, attempt.callback_sequence) == (other.version, other_attempt.callback_sequence)
    change = runs.AttemptChange(attempt=attempt, new=replace(attempt, worker_id="w1", callback_sequence=1))

    # When one write moves the first run and its attempt
    harness.db.transaction(
        lambda tx: runs.write_run(tx, mine, replace(mine, status="dispatching"), _dispatching(mine), change)
    )

    # Then the other run and its attempt are as they were (each CAS names its row, not only a version)
    stored = harness.db.transaction(lambda tx: runs.get_run(tx, project.id, other.id))
    assert (stored.status, stored.version, stored.event_sequence) == ("queued", other.version, 2)
    assert harness.db.transaction(lambda tx: runs.latest_attempt(tx, other.id)) == other_attempt
    moved = harness.db.transaction(lambda tx: runs.get_run(tx, project.id, mine.id))
    assert (moved.status, moved.version) == ("dispatching", mine.version + 1)


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
