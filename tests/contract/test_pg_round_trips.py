"""The PostgreSQL adapter's short units (docs/dispatch.md, "dispatch on PostgreSQL"): a pooled
connection whose backend was terminated does not fail the next unit, a connection lost after the
unit's first exchange is StorageUnavailable and the unit is never re-run, the claim still takes the
Run and Attempt row locks, and one offer costs a bounded number of round trips."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from ql3.application import leases
from ql3.domain.errors import StorageBusy, StorageUnavailable
from ql3.domain.ids import new_id
from ql3.domain.offers import derive_lease_token
from ql3.storage.postgres.adapter import PostgresDatabase
from tests.support.builders import count
from tests.support.databases import Harness
from tests.support.execution_builders import SECRET, dispatcher, queued, register
from tests.support.round_trips import count_round_trips

# BEGIN + clock + candidate page, two worker pages, COMMIT; BEGIN + clock + Run lock, Attempt lock,
# worker lock, lease insert with the counter, Run CAS, Attempt CAS, event, COMMIT (was 33).
ROUND_TRIPS_PER_OFFER = 12


@pytest.fixture
def pg(pg_harness: Harness) -> Harness:
    return pg_harness


def _terminate(harness: Harness, pids: list[int]) -> None:
    """pg_terminate_backend, then wait (bounded) until the backends are gone."""
    with psycopg.connect(harness.db.dsn, autocommit=True) as admin:
        for pid in pids:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        for _ in range(500):
            row = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)
            ).fetchone()
            if row is not None and row[0] == 0:
                return
            time.sleep(0.01)
    pytest.fail(f"backends {pids} did not go away")


def _insert_project(tx: Any, name: str) -> int:
    return int(tx.run("project_insert", {"id": new_id(), "name": name, "now": tx.now_ms()}))


def test_a_pooled_connection_whose_backend_was_terminated_does_not_fail_the_next_unit(pg: Harness) -> None:
    # Given a pool of two idle connections whose backends are then terminated
    db = PostgresDatabase(pg.db.dsn, min_size=2, max_size=2)
    try:
        with db.pool.connection() as a, db.pool.connection() as b:
            pids = [a.info.backend_pid, b.info.backend_pid]
        _terminate(pg, pids)
        before = count(pg.db, "projects")
        calls: list[int] = []

        def unit(tx: Any) -> int:
            calls.append(1)
            return _insert_project(tx, f"after-{len(calls)}")

        # When the next unit of work runs
        assert db.transaction(unit) == 1

        # Then it committed once, on a fresh connection, after failing only at its first exchange
        assert count(pg.db, "projects") == before + 1
        assert 2 <= len(calls) <= 3
    finally:
        db.close()


def test_a_connection_lost_after_the_first_exchange_is_unavailable_and_not_re_run(pg: Harness) -> None:
    db = PostgresDatabase(pg.db.dsn, min_size=1, max_size=2)
    try:
        before = count(pg.db, "projects")
        calls: list[int] = []

        def unit(tx: Any) -> None:
            calls.append(1)
            _insert_project(tx, "lost")
            _terminate(pg, [tx._conn.info.backend_pid])
            _insert_project(tx, "never")

        # When the unit's backend dies after its first statement was answered
        with pytest.raises(StorageUnavailable):
            db.transaction(unit)

        # Then the unit was not run again and nothing of it was committed
        assert calls == [1]
        assert count(pg.db, "projects") == before
    finally:
        db.close()


def _claim(harness: Harness, run_id: str, attempt_id: str) -> Any:
    w = harness.db.raw("SELECT * FROM workers")[0]
    return harness.db.transaction(
        lambda tx: leases.claim(
            tx,
            run_id=run_id,
            attempt_id=attempt_id,
            worker_id=w["worker_id"],
            session_id=w["session_id"],
            worker_generation=int(w["generation"]),
            token_for_generation=lambda g: derive_lease_token(SECRET, attempt_id, g),
            lease_ms=600_000,
        )
    )


@pytest.mark.parametrize(
    ("table", "statement"),
    [("runs", "FROM runs WHERE id = $1 FOR UPDATE"), ("run_attempts", "FOR UPDATE OF a")],
)
def test_the_claim_locks_the_run_then_the_attempt_before_writing(
    pg: Harness, table: str, statement: str
) -> None:
    # Given a queued run whose Run (or Attempt) row another connection holds locked
    register(pg.db, "w1", slots=4, lease_ms=600_000)
    _, _, (run,) = queued(pg.db)
    attempt_id = pg.db.raw("SELECT id FROM run_attempts WHERE run_id = ?", (run.id,))[0]["id"]
    key = run.id if table == "runs" else attempt_id
    outcome: list[Any] = []
    with psycopg.connect(pg.db.dsn) as holder:
        holder.execute(f"SELECT 1 FROM {table} WHERE id = %s FOR UPDATE", (key,))
        me = holder.info.backend_pid

        def claim() -> None:
            try:
                outcome.append(_claim(pg, run.id, attempt_id).status)
            except StorageBusy as exc:  # lock_timeout (1 s) passed before the holder let go
                outcome.append(exc)

        # When a claim runs meanwhile
        worker = threading.Thread(target=claim)
        worker.start()
        waiting: str | None = None
        with psycopg.connect(pg.db.dsn, autocommit=True) as watch:
            for _ in range(200):
                row = watch.execute(
                    "SELECT query FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock' AND %s = ANY(pg_blocking_pids(pid))",
                    (me,),
                ).fetchone()
                if row is not None:
                    waiting = str(row[0])
                    break
                time.sleep(0.005)
        # Then it waits on that row lock in its locking statement, before it wrote anything
        assert waiting is not None and statement in waiting, waiting
        assert count(pg.db, "run_leases") == 0
        holder.rollback()
    worker.join(10)
    assert outcome and (outcome[0] == "claimed" or isinstance(outcome[0], StorageBusy))

    # And once the lock is released the run is claimed (by that claim or this one)
    if outcome[0] != "claimed":
        assert _claim(pg, run.id, attempt_id).status == "claimed"
    assert count(pg.db, "run_leases") == 1


@pytest.fixture
def round_trips() -> Iterator[list[int]]:
    with count_round_trips() as counter:
        yield counter


def test_one_offer_costs_a_bounded_number_of_round_trips(pg: Harness, round_trips: list[int]) -> None:
    # Given 16 workers (two snapshot pages) and queued runs, past statement preparation
    for i in range(16):
        register(pg.db, f"w{i:02d}", slots=64, lease_ms=600_000)
    queued(pg.db, n=20)
    d = dispatcher(pg.db, lease_ms=600_000)
    for _ in range(10):
        assert d.dispatch_once().offer is not None

    # When one more offer is made
    round_trips[0] = 0
    assert d.dispatch_once().offer is not None

    # Then it took at most the budgeted exchanges with the server
    assert round_trips[0] <= ROUND_TRIPS_PER_OFFER, round_trips[0]
