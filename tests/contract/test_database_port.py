"""The storage port itself (ports/storage.py), on both databases: commit and rollback, the
transaction's one observation time, read-only units that really are read-only, notifications only
after commit, isolation between two real connections, and a query catalogue that names every query
the code runs."""

from __future__ import annotations

import ast
import functools
import threading
from pathlib import Path
from typing import Any

import pytest

from ql3.domain.errors import Conflict, ReadOnlyTransaction
from ql3.domain.ids import new_id
from ql3.storage.queries import catalogue
from tests.support.builders import count
from tests.support.databases import Harness

SRC = Path(__file__).resolve().parents[2] / "src" / "ql3"


def _insert(tx: Any, name: str) -> int:
    return int(tx.run("project_insert", {"id": new_id(), "name": name, "now": tx.now_ms()}))


def test_a_unit_commits_when_it_returns(harness: Harness) -> None:
    before = count(harness.db, "projects")

    assert harness.db.transaction(lambda tx: _insert(tx, "kept")) == 1

    assert count(harness.db, "projects") == before + 1


def test_an_exception_rolls_the_whole_unit_back_and_is_re_raised(harness: Harness) -> None:
    before = count(harness.db, "projects")

    class Boom(Exception):
        pass

    def fn(tx: Any) -> None:
        _insert(tx, "first")
        _insert(tx, "second")
        raise Boom

    with pytest.raises(Boom):
        harness.db.transaction(fn)

    assert count(harness.db, "projects") == before


def test_an_integrity_violation_is_a_conflict_and_writes_nothing(harness: Harness) -> None:
    harness.db.transaction(lambda tx: _insert(tx, "dup"))
    before = count(harness.db, "projects")
    pid = new_id()

    def twice(tx: Any) -> None:
        tx.run("project_insert", {"id": pid, "name": "other", "now": tx.now_ms()})
        first = _principal(tx, "p1")
        tx.run("principal_insert", first)
        tx.run("principal_insert", {**_principal(tx, "p2"), "token_digest": first["token_digest"]})

    with pytest.raises(Conflict):
        harness.db.transaction(twice)
    assert count(harness.db, "projects") == before


def _principal(tx: Any, name: str) -> dict[str, Any]:
    return {
        "id": new_id(),
        "name": name,
        "kind": "user",
        "is_owner": 0,
        "token_digest": new_id(),
        "now": tx.now_ms(),
        "expires_at_ms": None,
        "issued_by": None,
    }


def test_a_unit_observes_one_time_and_the_clock_moves_between_units(harness: Harness) -> None:
    first, again = harness.db.transaction(lambda tx: (tx.now_ms(), tx.now_ms()), write=False)
    harness.advance_clock(5_000)
    later = harness.db.transaction(lambda tx: tx.now_ms(), write=False)

    assert first == again
    assert later >= first + 5_000


def test_a_read_only_unit_refuses_a_write_and_the_connection_writes_again_afterwards(
    harness: Harness,
) -> None:
    before = count(harness.db, "projects")

    with pytest.raises(ReadOnlyTransaction):
        harness.db.transaction(lambda tx: _insert(tx, "sneaky"), write=False)

    assert count(harness.db, "projects") == before
    assert harness.db.transaction(lambda tx: _insert(tx, "after")) == 1  # the same thread's connection
    assert count(harness.db, "projects") == before + 1


def test_a_notification_wakes_a_waiter_only_after_commit(harness: Harness) -> None:
    harness.db.wait_for("port_test", 0)  # nothing pending

    def rolled_back(tx: Any) -> None:
        tx.notify("port_test")
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        harness.db.transaction(rolled_back)
    assert harness.db.wait_for("port_test", 0.2) is False

    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(harness.db.wait_for("port_test", 30)))
    waiter.start()
    harness.db.transaction(lambda tx: tx.notify("port_test"))
    waiter.join(timeout=30)
    assert woke == [True]


def test_an_uncommitted_write_is_invisible_to_another_connection(harness: Harness) -> None:
    other = harness.second_connection()
    try:
        before = count(other, "projects")
        written, release = threading.Event(), threading.Event()

        def slow(tx: Any) -> None:
            _insert(tx, "pending")
            written.set()
            assert release.wait(30)

        writer = threading.Thread(target=harness.db.transaction, args=(slow,))
        writer.start()
        assert written.wait(30)
        seen_during = other.transaction(
            lambda tx: tx.all("project_list", {"after": "", "limit": 500}), write=False
        )
        release.set()
        writer.join(timeout=30)

        assert "pending" not in {p["name"] for p in seen_during}
        assert count(other, "projects") == before + 1
    finally:
        other.close()


def _queries_named_in_src() -> set[str]:
    names: set[str] = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("one", "all", "run", "one_then_commit", "all_then_commit")
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "tx"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                names.add(node.args[0].value)
    return names


# Queries that call a PostgreSQL function doing what SQLite runs as several of the shared named
# statements (which both catalogues keep); the contract tests run the behaviour on both databases.
POSTGRES_ONLY = {
    "lease_claim": "ql3_claim (migration 0010): lease_claims.claim; SQLite runs the claim's statements",
    "lease_claim_batch": "ql3_claim_batch (migration 0013): lease_claims.claim_many; SQLite runs claim each",
    "run_write": "ql3_write_run (migration 0011): runs.write_run; SQLite runs run_cas, attempt_cas, events",
    "lease_claim_last": "ql3_claim_or_raise (migration 0015): lease_claims.claim, last; SQLite: lease_claim",
    "lease_result": "ql3_lease_result (migration 0014): the ACKs and completion; SQLite runs their steps",
    "run_insert_page_all": "a cron page's runs, attempts, events, policies; SQLite: run_insert_page, ...",
}


def test_every_query_the_code_runs_exists_in_both_dialects_and_both_name_the_same_queries() -> None:
    sqlite, postgres = catalogue("sqlite"), catalogue("postgres")
    used = _queries_named_in_src()

    assert len(used) > 100  # the scan sees the code
    assert sorted(used - set(sqlite) - set(POSTGRES_ONLY)) == []
    assert sorted(used - set(postgres)) == []
    assert set(sqlite) == set(postgres) - set(POSTGRES_ONLY)
    assert set(POSTGRES_ONLY) <= used  # every exception is still called


# Queries read with ``all`` whose size is bounded by the schema rather than by a LIMIT.
BOUNDED_WITHOUT_LIMIT = {
    "stats_runs_by_bucket": "one row per bucket and outcome (GROUP BY; at most 28 buckets of 11 statuses)",
    "stats_busy_by_bucket": "one row per bucket (at most 28: the 7-day range in 6-hour buckets)",
    "worker_snapshot_one": "one worker by its primary key",
    "notify_outbox_counts": "one row per delivery status (GROUP BY status)",
    "lease_claim_batch": "one row per claim passed in (lease_claims.claim_many refuses more than 64)",
    "metrics_parked_counts": "one row per loop and reason of parked_items, at most 500 rows a loop"
    " (application/parking.py)",
    "task_active_page": "at most one row per task id passed in (a cron page: application/cron.py HARD_PAGE)",
    "run_insert_page_all": "at most one row per run passed in (a cron page: application/cron.py HARD_PAGE)",
}


def test_every_query_that_returns_many_rows_is_limited() -> None:
    """The port promises: every query that returns many rows is LIMITed (bounded loops)."""
    for dialect in ("sqlite", "postgres"):
        unbounded = [
            name
            for name, sql in catalogue(dialect).items()
            if sql.lstrip().upper().startswith(("SELECT", "WITH"))
            and "LIMIT" not in sql.upper()
            and _returns_many(name)
            and name not in BOUNDED_WITHOUT_LIMIT
        ]
        assert unbounded == [], dialect


def _returns_many(name: str) -> bool:
    return name in _names_used_with_all()


@functools.cache
def _names_used_with_all() -> frozenset[str]:
    """Every query name passed to ``tx.all(...)`` somewhere in src/ (src/ parsed once per session)."""
    used_with_all: set[str] = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "all"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                used_with_all.add(node.args[0].value)
    return frozenset(used_with_all)


def _wakes(listener: Any, notifier: Any, channel: str, tries: int = 40) -> bool:
    """Commit a notification on ``notifier`` until ``listener`` wakes (its LISTEN may still be connecting)."""
    for _ in range(tries):
        notifier.transaction(lambda tx: tx.notify(channel))
        if listener.wait_for(channel, 0.5):
            return True
    return False


def test_a_commit_on_one_replica_wakes_another_and_the_listener_survives_a_terminated_backend(
    pg_harness: Harness,
) -> None:
    listener, other = pg_harness.db, pg_harness.second_connection()
    try:
        listener.start_listening(["port_test"])
        assert _wakes(listener, other, "port_test")

        # When the listening backend is terminated (a failover, an operator, idle timeouts)
        terminated = other.transaction(lambda tx: _terminate_listeners(tx))
        assert terminated >= 1

        # Then the listener reconnects and other replicas' commits wake it again
        assert _wakes(listener, other, "port_test")
    finally:
        other.close()


def test_a_replica_is_not_woken_again_by_its_own_notification_coming_back(pg_harness: Harness) -> None:
    """A commit posts its channels to its own notifier; the same NOTIFY, relayed back over LISTEN, must
    not count a second time (every loop of the process would wake again for nothing)."""
    listener, other = pg_harness.db, pg_harness.second_connection()
    try:
        listener.start_listening(["port_test", "port_mark"])
        assert _wakes(listener, other, "port_mark")  # the LISTEN is up
        before = listener.notifier.counters(("port_test",))["port_test"]

        listener.transaction(lambda tx: tx.notify("port_test"))
        # PostgreSQL delivers to a listener in commit order and the relay posts one at a time: once
        # the later commit of another replica arrived, the echo of ours was relayed or skipped.
        assert _wakes(listener, other, "port_mark")

        assert listener.notifier.counters(("port_test",))["port_test"] == before + 1
        # And the other replica's commits on the same channel still arrive
        assert _wakes(listener, other, "port_test")
    finally:
        other.close()


def _terminate_listeners(tx: Any) -> int:
    rows = tx._conn.execute(
        "SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity"
        " WHERE datname = current_database() AND query LIKE 'LISTEN ql3_%' AND pid <> pg_backend_pid()"
    ).fetchall()
    return sum(1 for r in rows if r["ok"])
