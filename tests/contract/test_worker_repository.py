"""repositories/workers.py on SQLite and PostgreSQL: the session writes are compare-and-sets on the
version the caller read, and one that lost writes nothing."""

from __future__ import annotations

from ql3.domain.workers import parse_capabilities
from ql3.ports.storage import Transaction
from ql3.repositories import workers as repo
from tests.support.databases import Harness
from tests.support.execution_builders import register

NEW_SESSION = "01900000-0000-7000-8000-000000000002"


def _stale(harness: Harness) -> repo.WorkerRecord:
    """The worker as read before a heartbeat moved its version on."""
    session = register(harness.db, "w1")
    before: repo.WorkerRecord | None = harness.db.transaction(
        lambda tx: repo.get_worker(tx, "w1"), write=False
    )
    assert before is not None

    def beat(tx: Transaction) -> bool:
        now = tx.now_ms()
        return repo.update_session(
            tx,
            before,
            session_id=session.session_id,
            generation=session.generation,
            status="online",
            last_heartbeat_at_ms=now,
            lease_expires_at_ms=now + 30_000,
            now=now,
        )

    assert harness.db.transaction(beat)
    return before


def test_a_session_replacement_from_a_stale_read_is_refused_and_writes_nothing(harness: Harness) -> None:
    stale = _stale(harness)
    caps = parse_capabilities({"executors": ["local_process"]})

    def replace(tx: Transaction) -> bool:
        return repo.replace_session(
            tx,
            worker_id="w1",
            session_id=NEW_SESSION,
            capabilities_json=caps.to_json(),
            capabilities_hash=caps.digest(),
            max_concurrent_runs=2,
            session_lease_ms=30_000,
            now=tx.now_ms(),
            expected_version=stale.version,
        )

    assert harness.db.transaction(replace) is False
    after = harness.db.transaction(lambda tx: repo.get_worker(tx, "w1"), write=False)
    assert after is not None
    assert (after.session_id, after.generation, after.version) == (
        stale.session_id,
        stale.generation,
        stale.version + 1,
    )


def test_a_session_update_from_a_stale_read_is_refused_and_writes_nothing(harness: Harness) -> None:
    stale = _stale(harness)

    def offline(tx: Transaction) -> bool:
        now = tx.now_ms()
        return repo.update_session(
            tx,
            stale,
            session_id=stale.session_id,
            generation=stale.generation,
            status="offline",
            last_heartbeat_at_ms=now,
            lease_expires_at_ms=now,
            now=now,
        )

    assert harness.db.transaction(offline) is False
    after = harness.db.transaction(lambda tx: repo.get_worker(tx, "w1"), write=False)
    assert after is not None
    assert (after.status, after.version) == ("online", stale.version + 1)
