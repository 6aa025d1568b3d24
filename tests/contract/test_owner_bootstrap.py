"""The first start creates the owner once: again on the same database, and when several replicas
start for the first time together (``ql3 control``, on PostgreSQL)."""

from __future__ import annotations

import threading
from typing import Any

from ql3.application import auth
from tests.support.builders import count
from tests.support.databases import Harness
from tests.support.waits import wait_for_lock_waiter


def test_a_later_start_finds_the_owner_and_creates_nothing(harness: Harness) -> None:
    first = harness.db.transaction(auth.bootstrap_cluster_owner)
    again = harness.db.transaction(auth.bootstrap_cluster_owner)

    assert first is not None and first.principal.is_owner and first.project.name == auth.DEFAULT_PROJECT
    assert again is None
    assert (count(harness.db, "principals"), count(harness.db, "projects")) == (1, 1)


def test_two_replicas_starting_together_create_one_owner(pg_harness: Harness) -> None:
    # PostgreSQL only: SQLite serialises writers, so there the race is the sequential case above.
    harness = pg_harness
    other = harness.second_connection()
    created = threading.Event()
    release = threading.Event()
    results: dict[str, Any] = {}
    errors: list[BaseException] = []

    def create_and_hold(tx: Any) -> Any:
        issued = auth.bootstrap_cluster_owner(tx)
        created.set()
        assert release.wait(30)
        return issued

    def replica(name: str, db: Any, fn: Any) -> None:
        try:
            results[name] = db.transaction(fn)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    # Given one replica that created the owner and has not committed yet
    first = threading.Thread(target=replica, args=("first", harness.db, create_and_hold))
    second = threading.Thread(target=replica, args=("second", other, auth.bootstrap_cluster_owner))
    first.start()
    try:
        assert created.wait(30)
        # When a second replica starts for the first time on another connection and has to wait
        second.start()
        wait_for_lock_waiter(harness.db, what="the second first start to wait on the first one")
    finally:
        release.set()
        first.join(30)
        if second.ident is not None:
            second.join(30)
        other.close()

    # Then only the first created an owner; the second found it
    assert errors == []
    assert results["first"] is not None and results["second"] is None
    assert count(harness.db, "principals") == 1
