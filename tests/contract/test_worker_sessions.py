"""Worker sessions: registration, replay, replacement fencing, drain and capabilities."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from ql3.application import workers
from ql3.domain.errors import Conflict, FenceConflict, ValidationFailed
from ql3.domain.ids import new_id
from ql3.domain.workers import parse_capabilities
from tests.support.databases import Harness
from tests.support.execution_builders import register


def test_first_registration_is_generation_one(harness: Harness) -> None:
    session = register(harness.db)

    assert (session.generation, session.version, session.status) == (1, 0, "online")


def test_same_session_same_content_replays(harness: Harness) -> None:
    sid = new_id()
    register(harness.db, session_id=sid)

    again = register(harness.db, session_id=sid)

    assert again.generation == 1 and again.session_id == sid


def test_same_session_other_content_conflicts(harness: Harness) -> None:
    sid = new_id()
    register(harness.db, session_id=sid)

    with pytest.raises(Conflict) as caught:
        register(harness.db, session_id=sid, slots=8)

    # The reason a restarted worker reads to register a new session instead (worker/session.py)
    assert caught.value.details.get("reason") == "session_content_changed"


def test_new_session_replaces_and_fences_the_old_one(harness: Harness) -> None:
    old = register(harness.db)

    new = register(harness.db)

    assert new.generation == 2 and new.session_id != old.session_id
    with pytest.raises(FenceConflict) as err:
        harness.db.transaction(lambda tx: workers.heartbeat(tx, "w1", old.session_id, old.generation))
    assert err.value.details["reason"] == "worker_session_mismatch"


def test_generation_is_monotonic_under_racing_registrations(harness: Harness) -> None:
    register(harness.db)
    others = [harness.second_connection() for _ in range(3)]
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def race(db: Any) -> None:
        barrier.wait()
        try:
            register(db)
        except Conflict as exc:  # a concurrent replacement may lose the CAS; it must not corrupt
            errors.append(exc)

    threads = [threading.Thread(target=race, args=(db,)) for db in [harness.db, *others]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for db in others:
        db.close()

    final = harness.db.transaction(lambda tx: workers._get(tx, "w1"))
    assert final.generation == 1 + (4 - len(errors))
    assert final.version == final.generation - 1


def test_drain_zeroes_capacity_and_keeps_heartbeating(harness: Harness) -> None:
    session = register(harness.db)

    drained = harness.db.transaction(lambda tx: workers.drain(tx, "w1", session.session_id, 1))
    beat = harness.db.transaction(lambda tx: workers.heartbeat(tx, "w1", session.session_id, 1))

    assert drained.status == "draining" and beat.status == "draining"
    assert harness.db.transaction(lambda tx: workers.snapshot_page(tx, after="", limit=8)) == []


def test_expired_and_offline_workers_are_not_eligible(harness: Harness) -> None:
    session = register(harness.db, lease_ms=5_000)
    w2 = register(harness.db, "w2")
    harness.db.transaction(lambda tx: workers.go_offline(tx, "w2", w2.session_id, w2.generation))

    harness.advance_clock(5_001)

    assert harness.db.transaction(lambda tx: workers.snapshot_page(tx, after="", limit=8)) == []
    assert session.generation == 1


@pytest.mark.parametrize(
    "caps",
    [
        {"executors": []},
        {"executors": ["local_process", "local_process"]},
        {"executors": ["Bad Type"]},
        {"executors": ["local_process"], "surprise": 1},
        {"executors": ["local_process"], "runtimes": [{"name": "python", "semver": "3.11"}]},
        {"executors": ["local_process"], "labels": {f"k{i}": "v" for i in range(33)}},
        {"executors": ["local_process"], "labels": {"zone": "a\nb"}},
        {"executors": ["local_process"], "features": ["x"] * 2},
    ],
)
def test_malformed_capabilities_are_refused(caps: dict[str, Any]) -> None:
    with pytest.raises(ValidationFailed):
        parse_capabilities(caps)


@pytest.mark.parametrize("worker_id", ["", "-lead", "a b", "x" * 129])
def test_invalid_worker_ids_are_refused_and_write_nothing(harness: Harness, worker_id: str) -> None:
    with pytest.raises(ValidationFailed):
        register(harness.db, worker_id)
    assert harness.db.raw("SELECT count(*) AS n FROM workers")[0]["n"] == 0
