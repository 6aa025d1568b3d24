"""Run creation with an idempotency key: one run per (project, key), also under a race."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import pytest

from ql3.application import runs
from ql3.application.schedules import cron_key
from ql3.domain.errors import IdempotencyConflict, ReservedIdempotencyKey
from tests.support.builders import count, seed_project, seed_task, start_run
from tests.support.databases import Harness


def test_repeated_key_returns_the_existing_run_and_creates_nothing(harness: Harness) -> None:
    project = seed_project(harness.db)
    task = seed_task(harness.db, project)
    first, created = start_run(harness.db, project, task, key="nightly-2026-11-30")

    again, created_again = start_run(harness.db, project, task, key="nightly-2026-11-30")

    assert created and not created_again and again.id == first.id
    assert count(harness.db, "runs") == 1 and count(harness.db, "run_attempts") == 1
    assert count(harness.db, "run_events") == 2


def test_same_key_in_another_project_is_independent(harness: Harness) -> None:
    a = seed_project(harness.db)
    b = seed_project(harness.db, "other")
    start_run(harness.db, a, seed_task(harness.db, a), key="k")

    _, created = start_run(harness.db, b, seed_task(harness.db, b), key="k")

    assert created and count(harness.db, "runs") == 2


def test_same_key_for_another_task_is_a_conflict(harness: Harness) -> None:
    project = seed_project(harness.db)
    start_run(harness.db, project, seed_task(harness.db, project, "one"), key="k")

    with pytest.raises(IdempotencyConflict):
        start_run(harness.db, project, seed_task(harness.db, project, "two"), key="k")
    assert count(harness.db, "runs") == 1


def test_racing_creations_with_one_key_yield_one_run(harness: Harness) -> None:
    # Given several real connections racing on one key
    project = seed_project(harness.db)
    task = seed_task(harness.db, project)
    others = [harness.second_connection() for _ in range(3)]
    barrier = threading.Barrier(4)
    ids: list[str] = []
    errors: list[BaseException] = []

    def create(db: Any) -> None:
        barrier.wait()
        try:
            run, _ = start_run(db, project, task, key="race")
            ids.append(run.id)
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=create, args=(db,)) for db in [harness.db, *others]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for db in others:
        db.close()

    # Then every caller sees the same single run, and no duplicate attempt or event exists
    assert not errors
    assert len(ids) == 4 and len(set(ids)) == 1
    assert count(harness.db, "runs") == 1 and count(harness.db, "run_attempts") == 1
    assert count(harness.db, "run_events") == 2


def _create(db: Any, project: Any, task: Any, key: str, **fields: Any) -> tuple[Any, bool]:
    result: tuple[Any, bool] = db.transaction(
        lambda tx: runs.create_run(
            tx, runs.CreateRun(project_id=project.id, task=task, idempotency_key=key, **fields)
        )
    )
    return result


def test_a_repeated_key_with_another_request_is_a_conflict(harness: Harness) -> None:
    # Given a run created under a key with priority 1
    project = seed_project(harness.db)
    task = seed_task(harness.db, project)
    first, _ = _create(harness.db, project, task, "k", priority=1)

    # When the key comes again with priority 9, then again as the first request
    with pytest.raises(IdempotencyConflict):
        _create(harness.db, project, task, "k", priority=9)
    again, created = _create(harness.db, project, task, "k", priority=1)

    # Then the other request created nothing and the same request still returns the first run
    assert not created and again.id == first.id
    assert count(harness.db, "runs") == 1 and count(harness.db, "run_events") == 2


def test_a_repeated_key_for_a_disabled_task_is_compared_too(harness: Harness) -> None:
    project = seed_project(harness.db)
    task = seed_task(harness.db, project)
    first, _ = _create(harness.db, project, task, "k", priority=1)
    disabled = replace(task, enabled=False)

    assert _create(harness.db, project, disabled, "k", priority=1)[0].id == first.id
    with pytest.raises(IdempotencyConflict):
        _create(harness.db, project, disabled, "k", priority=2)


def test_a_run_stored_without_a_digest_is_replayed_as_before(harness: Harness) -> None:
    # A run created before request digests were kept: its repeats cannot be compared, so they replay.
    project = seed_project(harness.db)
    task = seed_task(harness.db, project)
    first, _ = _create(harness.db, project, task, "old", priority=1)
    harness.db.raw("UPDATE runs SET request_digest = NULL WHERE id = ?", (first.id,))

    again, created = _create(harness.db, project, task, "old", priority=5)

    assert not created and again.id == first.id


def test_the_servers_own_keys_still_create_runs(harness: Harness) -> None:
    # ql3: keys are refused from callers (validate_idempotency_key), never from the scheduler itself
    project = seed_project(harness.db)
    task = seed_task(harness.db, project)
    key = cron_key(task.id, 60_000)

    run, created = _create(harness.db, project, task, key, trigger_type="cron", scheduled_for_ms=60_000)
    again, created_again = _create(
        harness.db, project, task, key, trigger_type="cron", scheduled_for_ms=60_000
    )

    assert created and not created_again and again.id == run.id and run.idempotency_key == key
    with pytest.raises(ReservedIdempotencyKey):
        runs.validate_idempotency_key(key)
