"""Retention benchmark, run by hand: ``.venv/bin/python bench/retention.py [--runs 525600]``.

Simulates a year of a minutely task on an edge box's SQLite database (or, with ``--database-url``, a
fresh PostgreSQL database): 525,600 finished runs, each with one attempt, four events, a completed
lease and a small log file, inserted in bulk straight into the real schema (not through the
dispatcher). Then applies a retention policy with the real pruner and reports:
  * database and logs-directory sizes before and after pruning (and after a further month of runs,
    which reuses the pages pruning freed: the file stays bounded without VACUUM)
  * prune cost: wall time, per page (one write transaction) and per cycle (at most 8 pages), and
    the worst latency a concurrent small writer saw while the prune ran (the "no long write lock" claim)
Every loop is bounded; nothing leaves the temp directory.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from ql3.application import auth, retention, tasks
from ql3.application.retention import RetentionPruner
from ql3.execution.log_retention import LogDirectory
from ql3.storage.sqlite.adapter import SqliteDatabase

MINUTE_MS = 60_000
LOG_LINE = b"2026-01-01T00:00:00Z backup: 1 file copied, 0 errors\n"


class Clock:
    def __init__(self, now_ms: int) -> None:
        self.now = now_ms

    def __call__(self) -> int:
        return self.now


def dir_bytes(path: Path) -> tuple[int, int, int]:
    """(files, apparent bytes, allocated bytes) of a directory's regular files."""
    files = apparent = allocated = 0
    with os.scandir(path) as entries:
        for entry in entries:
            st = entry.stat(follow_symlinks=False)
            files += 1
            apparent += st.st_size
            allocated += st.st_blocks * 512
    return files, apparent, allocated


def db_bytes(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def progress(message: str) -> None:
    sys.stderr.write(f"{time.strftime('%H:%M:%S')} {message}\n")
    sys.stderr.flush()


TABLES = {
    "runs": (
        "id, project_id, task_id, task_revision, trigger_type, status, version, event_sequence,"
        " created_at_ms, queued_at_ms, started_at_ms, finished_at_ms, exit_code, updated_at_ms"
    ),
    "run_attempts": (
        "id, run_id, attempt, status, executor_type, worker_id, created_at_ms, started_at_ms,"
        " finished_at_ms, exit_code, callback_sequence"
    ),
    "run_events": "id, run_id, sequence, type, actor_type, payload_json, created_at_ms",
    "run_leases": (
        "attempt_id, run_id, status, version, lease_generation, worker_id, worker_session_id,"
        " worker_generation, lease_token_digest, acquired_at_ms, renewed_at_ms, expires_at_ms,"
        " completed_at_ms, updated_at_ms"
    ),
}


def simulated_rows(
    project_id: str, task_id: str, start_ms: int, first: int, last: int, logs: Path | None
) -> dict[str, list[tuple[Any, ...]]]:
    """The rows of runs ``first``..``last - 1`` (one a minute from ``start_ms``), and their log files."""
    rows: dict[str, list[tuple[Any, ...]]] = {table: [] for table in TABLES}
    for i in range(first, last):
        at = start_ms + i * MINUTE_MS
        run_id, attempt_id = str(uuid.uuid4()), str(uuid.uuid4())
        status = "failed" if i % 97 == 0 else "succeeded"
        rows["runs"].append(
            (run_id, project_id, task_id, 1, "cron", status, 4, 4, at, at, at + 50, at + 1250, 0, at + 1250)
        )
        rows["run_attempts"].append(
            (attempt_id, run_id, 1, status, "local_process", "w1", at, at + 50, at + 1250, 0, 3)
        )
        for seq, kind in enumerate(("run.queued", "run.dispatching", "run.running", f"run.{status}"), 1):
            rows["run_events"].append((str(uuid.uuid4()), run_id, seq, kind, "system", "{}", at + seq))
        rows["run_leases"].append(
            (
                attempt_id,
                run_id,
                "completed",
                1,
                1,
                "w1",
                "s1",
                1,
                "0" * 64,
                at,
                at,
                at + 30_000,
                at + 1250,
                at + 1250,
            )
        )
        if logs is not None:
            (logs / f"{attempt_id}.log").write_bytes(LOG_LINE * 2)
    return rows


def bulk_insert_sqlite(
    path: Path, project_id: str, task_id: str, start_ms: int, n: int, logs: Path | None
) -> float:
    """``n`` minutely finished runs from ``start_ms`` with their rows (and log files); returns seconds."""
    began = time.perf_counter()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    # The random (UUID) keys dirty pages all over every index: with SQLite's default 2 MiB cache they
    # spill to the WAL mid-transaction and are read back page by page, and the insert slows to a crawl
    # as the file grows. A large cache for this loader only (the server keeps its defaults), and a
    # checkpoint after each batch to keep the WAL small.
    conn.execute("PRAGMA cache_size=-1048576")
    batch = 10_000
    for first in range(0, n, batch):
        rows = simulated_rows(project_id, task_id, start_ms, first, min(n, first + batch), logs)
        if first and first % 100_000 == 0:
            progress(f"inserted {first:,} runs")
        with conn:
            for table, columns in TABLES.items():
                marks = ", ".join("?" * len(columns.split(",")))
                conn.executemany(f"INSERT INTO {table} ({columns}) VALUES ({marks})", rows[table])
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return time.perf_counter() - began


def bulk_insert_postgres(
    dsn: str, project_id: str, task_id: str, start_ms: int, n: int, logs: Path | None
) -> float:
    """The same rows through COPY, one transaction per batch; returns seconds."""
    import psycopg

    began = time.perf_counter()
    batch = 10_000
    with psycopg.connect(dsn) as conn:
        for first in range(0, n, batch):
            rows = simulated_rows(project_id, task_id, start_ms, first, min(n, first + batch), logs)
            if first and first % 100_000 == 0:
                progress(f"inserted {first:,} runs")
            with conn.transaction(), conn.cursor() as cur:
                for table, columns in TABLES.items():
                    with cur.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                        for row in rows[table]:
                            copy.write_row(row)
    return time.perf_counter() - began


class TimedPruner(RetentionPruner):
    """The real pruner, timing each page's delete (log unlinks + one write transaction)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.page_seconds: list[float] = []

    def delete_runs(self, run_ids: list[str]) -> tuple[int, int]:
        began = time.perf_counter()
        try:
            return super().delete_runs(run_ids)
        finally:
            self.page_seconds.append(time.perf_counter() - began)


def concurrent_writer(db: SqliteDatabase, project_id: str, stop: threading.Event, out: list[float]) -> None:
    """A small write every 20 ms while the prune runs; records each one's latency."""
    while not stop.is_set() and len(out) < 1_000_000:
        began = time.perf_counter()
        db.transaction(lambda tx: tx.run("project_bump_version", {"id": project_id}))
        out.append(time.perf_counter() - began)
        stop.wait(0.02)


class Backend:
    """The database under test: SQLite in the temp directory (default), or a fresh PostgreSQL database
    created from ``--database-url`` and dropped at the end."""

    def __init__(self, url: str | None, root: Path, span_ms: int) -> None:
        self.url = url
        self.created: str | None = None
        self.db: Any
        if url is None:
            self.path = root / "ql3.db"
            self.start_ms = 1_767_225_600_000  # 2026-01-01T00:00Z
            self.clock = Clock(self.start_ms + span_ms)
            self.db = SqliteDatabase(self.path, clock=self.clock)
        else:
            import psycopg
            from psycopg.conninfo import conninfo_to_dict, make_conninfo

            from ql3.storage.postgres.adapter import PostgresDatabase

            self.created = f"ql3_retention_{os.getpid()}"
            with psycopg.connect(url, autocommit=True) as admin:
                admin.execute(f'CREATE DATABASE "{self.created}"'.encode())
            info = conninfo_to_dict(url)
            info["dbname"] = self.created
            self.dsn = make_conninfo(**{k: str(v) for k, v in info.items() if v is not None})
            self.db = PostgresDatabase(self.dsn, min_size=1, max_size=4)
        self.db.migrate()
        if url is not None:
            now = int(self.db.transaction(lambda tx: tx.now_ms(), write=False))
            self.start_ms = now - span_ms

    @property
    def dialect(self) -> str:
        return "sqlite" if self.url is None else "postgresql"

    def insert(self, project_id: str, task_id: str, start_ms: int, n: int, logs: Path | None) -> float:
        if self.url is None:
            return bulk_insert_sqlite(self.path, project_id, task_id, start_ms, n, logs)
        return bulk_insert_postgres(self.dsn, project_id, task_id, start_ms, n, logs)

    def size_bytes(self) -> int:
        if self.url is None:
            return db_bytes(self.path)
        return int(self.db.raw("SELECT pg_database_size(current_database()) AS n")[0]["n"])

    def free_bytes(self) -> int | None:
        """SQLite's free-list pages (reused by new rows); PostgreSQL reports its space differently."""
        if self.url is not None:
            return None
        freelist = int(self.db.raw("PRAGMA freelist_count")[0]["freelist_count"])
        return freelist * int(self.db.raw("PRAGMA page_size")[0]["page_size"])

    def advance(self, ms: int) -> None:
        if self.url is None:
            self.clock.now += ms
        else:
            self.db.raw(f"UPDATE ql3_clock SET offset_ms = offset_ms + {int(ms)}")

    def close(self) -> None:
        self.db.close()
        if self.created is not None and self.url is not None:
            import psycopg

            with psycopg.connect(self.url, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{self.created}" WITH (FORCE)'.encode())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--runs", type=int, default=525_600, help="runs to simulate (default: a year, minutely)"
    )
    parser.add_argument("--days", type=int, default=30, help="the policy's keep_days (default 30)")
    parser.add_argument("--runs-per-task", type=int, default=None, help="the policy's runs_per_task")
    parser.add_argument("--log-bytes", type=int, default=None, help="the policy's log_bytes_per_run")
    parser.add_argument("--no-logs", action="store_true", help="do not create a log file per run")
    parser.add_argument("--page", type=int, default=200, help="runs per prune page (default 200)")
    parser.add_argument(
        "--database-url",
        default=None,
        help="postgresql://... of a server where the user may CREATE DATABASE: the benchmark creates"
        " its own database there and drops it afterwards (default: SQLite in a temp directory)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    if not 1 <= args.runs <= 2_000_000:
        parser.error("--runs must be between 1 and 2,000,000")
    if args.database_url is not None and not args.database_url.startswith(("postgresql://", "postgres://")):
        parser.error("--database-url must be a postgresql:// URL")

    with tempfile.TemporaryDirectory(prefix="ql3-retention-") as tmp:
        root = Path(tmp)
        logs = None if args.no_logs else root / "logs"
        if logs is not None:
            logs.mkdir()
        span_ms = args.runs * MINUTE_MS
        backend = Backend(args.database_url, root, span_ms)
        db = backend.db
        start_ms = backend.start_ms
        issued = db.transaction(auth.bootstrap_owner)
        assert issued is not None
        project = issued.project
        task = db.transaction(
            lambda tx: tasks.create_task(tx, project.id, "minutely", {"command": "true"})
        ).task

        insert_s = backend.insert(project.id, task.id, start_ms, args.runs, logs)
        before_db = backend.size_bytes()
        before_logs = dir_bytes(logs) if logs is not None else (0, 0, 0)

        db.transaction(
            lambda tx: retention.set_policy(
                tx,
                project,
                keep_days=args.days,
                runs_per_task=args.runs_per_task,
                log_bytes_per_run=args.log_bytes,
            )
        )
        pruner = TimedPruner(
            db, LogDirectory(logs) if logs is not None else None, page=args.page, max_pages=8
        )
        stop = threading.Event()
        writer_latencies: list[float] = []
        writer = threading.Thread(target=concurrent_writer, args=(db, project.id, stop, writer_latencies))
        writer.start()
        began = time.perf_counter()
        cycles = deleted = 0
        cycle_seconds: list[float] = []
        while cycles < 100_000:
            cycle_began = time.perf_counter()
            report = pruner.prune_once()
            cycle_seconds.append(time.perf_counter() - cycle_began)
            cycles += 1
            deleted += report.runs_deleted
            if cycles % 25 == 0:
                progress(f"pruned {deleted:,} runs in {cycles} cycles")
            if not report.more:
                break
        prune_s = time.perf_counter() - began
        stop.set()
        writer.join()
        after_db = backend.size_bytes()
        free_after = backend.free_bytes()
        after_logs = dir_bytes(logs) if logs is not None else (0, 0, 0)
        kept = int(db.raw("SELECT count(*) AS n FROM runs")[0]["n"])
        events_kept = int(db.raw("SELECT count(*) AS n FROM run_events")[0]["n"])

        # Another month of runs after the prune: the freed space is reused, the database barely grows.
        month = min(args.runs, args.days * 1440)
        backend.advance(month * MINUTE_MS)
        backend.insert(project.id, task.id, start_ms + span_ms, month, None)
        again = pruner.prune_once()
        while again.more:
            again = pruner.prune_once()
        regrown_db = backend.size_bytes()
        dialect = backend.dialect
        backend.close()

    pages = sorted(pruner.page_seconds)
    writes = sorted(writer_latencies)
    cycles_sorted = sorted(cycle_seconds)
    figures = {
        "database": dialect,
        "runs_simulated": args.runs,
        "policy": {
            "keep_days": args.days,
            "runs_per_task": args.runs_per_task,
            "log_bytes_per_run": args.log_bytes,
        },
        "insert_seconds": round(insert_s, 1),
        "db_mib_before": round(before_db / 2**20, 1),
        "db_mib_after_prune": round(after_db / 2**20, 1),
        "db_free_mib_after_prune": round(free_after / 2**20, 1) if free_after is not None else None,
        "db_mib_after_another_month": round(regrown_db / 2**20, 1),
        "log_files_before": before_logs[0],
        "log_mib_before": [round(before_logs[1] / 2**20, 1), round(before_logs[2] / 2**20, 1)],
        "log_files_after": after_logs[0],
        "log_mib_after": [round(after_logs[1] / 2**20, 1), round(after_logs[2] / 2**20, 1)],
        "runs_deleted": deleted,
        "runs_kept": kept,
        "events_kept": events_kept,
        "prune_seconds": round(prune_s, 1),
        "prune_runs_per_second": round(deleted / prune_s) if prune_s else None,
        "prune_cycles": cycles,
        "prune_pages": len(pages),
        "page_ms_p50": round(statistics.median(pages) * 1000, 1) if pages else None,
        "page_ms_p99": round(pages[max(0, int(len(pages) * 0.99) - 1)] * 1000, 1) if pages else None,
        "page_ms_max": round(pages[-1] * 1000, 1) if pages else None,
        "prune_ms_per_1000_runs": round(prune_s * 1000 * 1000 / deleted, 1) if deleted else None,
        "cycle_ms_p50": round(statistics.median(cycles_sorted) * 1000, 1) if cycles_sorted else None,
        "cycle_ms_max": round(cycles_sorted[-1] * 1000, 1) if cycles_sorted else None,
        "concurrent_writes": len(writes),
        "concurrent_write_ms_p50": round(statistics.median(writes) * 1000, 2) if writes else None,
        "concurrent_write_ms_p99": round(writes[int(len(writes) * 0.99) - 1] * 1000, 2) if writes else None,
        "concurrent_write_ms_max": round(writes[-1] * 1000, 2) if writes else None,
        "load_average": os.getloadavg()[0],
    }
    text = json.dumps(figures, indent=2)
    sys.stdout.write(text + "\n")
    if args.json is not None:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
