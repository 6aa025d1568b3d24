"""Statements given a JSON array of ids read those rows by key, whatever the tables hold
(docs/dispatch.md, "Several offers per cycle"; docs/retention.md): PostgreSQL's ``ql3_claim_batch``
(migration 0018) and the retention pages (``storage/postgres/retention.sql``).

Both matched the ids with ``IN (SELECT ... FROM jsonb_array_elements(...))``. The planner, blind to the
array's size, estimated it at 100 elements and, once the tables held a few thousand rows of history,
read all of ``runs`` and ``run_attempts`` sequentially for every dispatch cycle (and every retention
page), so their cost grew with the history. The server's own per-transaction counters
(``pg_stat_xact_user_tables``) show what a statement read."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from ql3.domain.digests import sha256_hex
from ql3.domain.ids import new_id
from ql3.storage.queries import catalogue
from tests.support.databases import Harness
from tests.support.execution_builders import queued, register

HISTORY = 5_000  # finished runs, each with its attempt and completed lease
BATCH = 8
WARM_UP_BATCHES = 6  # PL/pgSQL settles on a generic plan after five executions
TABLES = ("runs", "run_attempts", "run_leases")


@pytest.fixture
def pg(pg_harness: Harness) -> Harness:
    return pg_harness


def _history(conn: psycopg.Connection[Any], project_id: str, task_id: str, n: int) -> None:
    """``n`` finished runs (attempt, two events, completed lease) in set-based statements."""
    conn.execute(
        "INSERT INTO runs (id, project_id, task_id, task_revision, trigger_type, status, version,"
        " event_sequence, created_at_ms, queued_at_ms, started_at_ms, finished_at_ms, exit_code,"
        " updated_at_ms)"
        " SELECT 'h-run-' || g, %s, %s, 1, 'cron', 'succeeded', 4, 2, g, g, g + 10, g + 20, 0, g + 20"
        " FROM generate_series(1, %s) g",
        (project_id, task_id, n),
    )
    conn.execute(
        "INSERT INTO run_attempts (id, run_id, attempt, status, executor_type, worker_id, created_at_ms,"
        " started_at_ms, finished_at_ms, exit_code, callback_sequence)"
        " SELECT 'h-att-' || g, 'h-run-' || g, 1, 'succeeded', 'local_process', 'w1', g, g + 10, g + 20,"
        " 0, 3 FROM generate_series(1, %s) g",
        (n,),
    )
    conn.execute(
        "INSERT INTO run_events (id, run_id, sequence, type, actor_type, payload_json, created_at_ms)"
        " SELECT 'h-evt-' || g || '-' || s, 'h-run-' || g, s, 'run.x', 'system', '{}', g"
        " FROM generate_series(1, %s) g, generate_series(1, 2) s",
        (n,),
    )
    conn.execute(
        "INSERT INTO run_leases (attempt_id, run_id, status, version, lease_generation, worker_id,"
        " worker_session_id, worker_generation, lease_token_digest, acquired_at_ms, renewed_at_ms,"
        " expires_at_ms, completed_at_ms, updated_at_ms)"
        " SELECT 'h-att-' || g, 'h-run-' || g, 'completed', 1, 1, 'w1', 's1', 1, repeat('0', 64), g, g,"
        " g + 30000, g + 20, g + 20 FROM generate_series(1, %s) g",
        (n,),
    )


def _reads(conn: psycopg.Connection[Any]) -> dict[str, tuple[int, int]]:
    """Rows read by sequential scans, and index scans, per table, in this transaction so far."""
    return {
        str(row[0]): (int(row[1]), int(row[2] or 0))
        for row in conn.execute("SELECT relname, seq_tup_read, idx_scan FROM pg_stat_xact_user_tables")
    }


def _history_db(pg: Harness) -> tuple[Any, Any]:
    project, task, _ = queued(pg.db, n=BATCH)
    with psycopg.connect(pg.db.dsn, autocommit=True) as conn:
        _history(conn, project.id, task.id, HISTORY)
        conn.execute("ANALYZE")
    return project, task


def _claims(conn: psycopg.Connection[Any], session: Any) -> list[dict[str, Any]]:
    """The arguments of one claim for each of the next ``BATCH`` queued runs (oldest ids first)."""
    pending = conn.execute(
        "SELECT r.id, a.id FROM runs r JOIN run_attempts a ON a.run_id = r.id"
        " WHERE r.status = 'queued' ORDER BY r.id LIMIT %s",
        (BATCH,),
    ).fetchall()
    assert len(pending) == BATCH
    return [
        {
            "run_id": run_id,
            "attempt_id": attempt_id,
            "worker_id": session.worker_id,
            "session_id": session.session_id,
            "worker_generation": session.generation,
            "generation": 1,
            "token_digest": sha256_hex(f"token-{run_id}"),
            "event_id": new_id(),
            "payload_json": "{}",
        }
        for run_id, attempt_id in pending
    ]


def _claim_batch(conn: psycopg.Connection[Any], claims: list[dict[str, Any]]) -> list[str]:
    rows = conn.execute(
        "SELECT claim_status FROM ql3_claim_batch(%s::jsonb, %s) ORDER BY ord", (json.dumps(claims), 600_000)
    ).fetchall()
    return [str(r[0]) for r in rows]


def test_a_claim_batch_reads_its_rows_by_key_however_much_history_the_tables_hold(pg: Harness) -> None:
    # Given a worker, queued runs, one connection that has already claimed six batches while the
    # tables were small (PL/pgSQL keeps the plans it made then), and then thousands of finished runs
    # with their attempts and leases, analyzed
    session = register(pg.db, "w1", slots=1024, lease_ms=600_000)
    project, task, _ = queued(pg.db, n=BATCH * WARM_UP_BATCHES + BATCH)
    with psycopg.connect(pg.db.dsn) as conn:
        for _ in range(WARM_UP_BATCHES):
            assert _claim_batch(conn, _claims(conn, session)) == ["claimed"] * BATCH
            conn.commit()
        with psycopg.connect(pg.db.dsn, autocommit=True) as other:
            _history(other, project.id, task.id, HISTORY)
            other.execute("ANALYZE")
        claims = _claims(conn, session)
        conn.commit()

        # When one call claims the next batch, in a transaction of its own
        answers = _claim_batch(conn, claims)
        read = _reads(conn)
        conn.rollback()

    # Then every claim succeeded, and no row of the history was read: each table was reached through
    # its keys, never scanned
    assert answers == ["claimed"] * BATCH
    for table in TABLES:
        seq_rows, index_scans = read.get(table, (0, 0))
        assert seq_rows == 0, f"{table}: {seq_rows} rows read by sequential scans for {BATCH} claims"
        assert index_scans > 0, f"{table} was never reached through an index"


# The retention statements of one page, in the order repositories/retention.py runs them, with what
# each is given (a page of run ids, or of their attempt ids).
RETENTION_PAGE = (
    ("retention_attempt_ids", "ids"),
    ("retention_delete_log_chunks", "attempt_ids"),
    ("retention_delete_attempt_logs", "attempt_ids"),
    ("retention_delete_run_leases", "attempt_ids"),
    ("retention_delete_cancellation_audit", "ids"),
    ("retention_delete_cancellation_dispatches", "ids"),
    ("retention_delete_run_retry_policies", "ids"),
    ("retention_delete_run_events", "ids"),
    ("retention_delete_run_attempts", "ids"),
    ("retention_delete_runs", "ids"),
)


def test_a_retention_page_reads_its_rows_by_key_however_much_history_the_tables_hold(pg: Harness) -> None:
    # Given thousands of finished runs with their attempts, events and leases
    _history_db(pg)
    queries = catalogue("postgres")
    page = [f"h-run-{g}" for g in range(1, 101)]
    attempts = [f"h-att-{g}" for g in range(1, 101)]

    # When one page of 100 runs goes through every retention statement, in one transaction
    with psycopg.connect(pg.db.dsn) as conn:
        changed: dict[str, int] = {}
        for name, given in RETENTION_PAGE:
            params: dict[str, Any] = {given: json.dumps(page if given == "ids" else attempts), "limit": 1000}
            cur = conn.execute(queries[name].encode(), params)
            changed[name] = len(cur.fetchall()) if cur.description else cur.rowcount
        read = _reads(conn)
        conn.rollback()

    # Then the page's rows went, and no other row of the history was read sequentially
    assert changed["retention_attempt_ids"] == 100
    assert changed["retention_delete_run_events"] == 200
    assert changed["retention_delete_runs"] == 100
    scanned = {table: rows for table, (rows, _) in read.items() if rows}
    assert scanned == {}, f"rows read by sequential scans for one page of 100 runs: {scanned}"
