"""Cron admission of a busy minute, run by hand:
``.venv/bin/python bench/cron_admission.py [--tasks 1000] [--database-url postgresql://.../postgres]``.

Creates ``--tasks`` tasks on ``* * * * *`` (through the real task use case) in a fresh database (a
temporary SQLite file, or a new PostgreSQL database made with the admin DSN given), then freezes the
database clock 10 ms after the next minute boundary and times what the cron loop does there: the real
``CronScheduler.schedule_once()`` at the serve profile's page, cycle after cycle, until no schedule is
due. Reports the time from the first cycle to the last run created, the cycles (one write
transaction each) and the runs per second. ``--edit-race N``: meanwhile another connection publishes a
new revision of N of the due tasks (the edit race of issue 35); every task must still get exactly one
run for the boundary, the edited ones with their old revision. Nothing is left behind.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

from ql3.application import auth, tasks
from ql3.application.cron import CronScheduler
from ql3.application.settings import PROFILES
from ql3.storage.postgres.adapter import PostgresDatabase
from ql3.storage.sqlite.adapter import SqliteDatabase

MINUTE_MS = 60_000


class Clock:
    def __init__(self, now_ms: int) -> None:
        self.now = now_ms

    def __call__(self) -> int:
        return self.now


def _seed(db: Any, n: int) -> None:
    project_id = str(db.transaction(lambda tx: auth.create_project(tx, "bench").id))
    batch = 100
    for start in range(0, n, batch):

        def unit(tx: Any, first: int = start) -> None:
            for i in range(first, min(n, first + batch)):
                tasks.create_task(tx, project_id, f"t{i:05d}", {"command": "true", "cron": "* * * * *"})

        db.transaction(unit)


def _edits(db: Any, n: int, errors: list[BaseException], go: threading.Event) -> threading.Thread:
    def edit() -> None:
        go.wait()
        try:
            project_id = str(db.transaction(lambda tx: auth.resolve_project(tx, "bench").id))
            for i in range(n - 1, -1, -1):  # from the end of the due order: the scheduler gets there last
                name = f"t{i * 7 % 1000:05d}"
                db.transaction(
                    lambda tx, ref=name: tasks.edit_task(tx, project_id, ref, {"command": "echo v2"})
                )
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    return threading.Thread(target=edit)


def _check(db: Any, n: int) -> dict[str, Any]:
    rows = db.raw("SELECT task_id, count(*) AS n, max(task_revision) AS rev FROM runs GROUP BY task_id")
    return {
        "tasks_with_runs": len(rows),
        "double_runs": sum(1 for r in rows if int(r["n"]) != 1),
        "edited_tasks_run_at_revision_1": sum(1 for r in rows if int(r["rev"]) == 1) - (len(rows) - n),
    }


def _admit(db: Any, page: int, editor: Any = None, edits: int = 0) -> dict[str, Any]:
    scheduler = CronScheduler(db, page=page)
    cycles = admitted = 0
    errors: list[BaseException] = []
    go = threading.Event()
    thread = None if editor is None else _edits(editor, edits, errors, go)
    if thread is not None:
        thread.start()
    go.set()
    started = time.perf_counter()
    while True:
        report = scheduler.schedule_once()
        cycles += 1
        admitted += report.admitted
        if not report.decisions:
            break
    elapsed = time.perf_counter() - started
    result: dict[str, Any] = {"admitted": admitted, "cycles": cycles - 1, "seconds": round(elapsed, 3)}
    if thread is not None:
        thread.join(120)
        result["edit_errors"] = [type(e).__name__ for e in errors]
        result["admitted"] = int(db.raw("SELECT count(*) AS n FROM runs")[0]["n"])
        result.update(_check(db, edits))
    return result


def run_sqlite(n: int, page: int, edits: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        clock = Clock(int(time.time() * 1000))
        db = SqliteDatabase(Path(tmp) / "ql3.db", clock=clock)
        db.migrate()
        _seed(db, n)
        boundary = (clock.now // MINUTE_MS + 1) * MINUTE_MS
        # Every cursor at that boundary (a seed that crossed a minute would leave some a minute earlier:
        # two occurrences due, one of them a recorded misfire, which is not the busy minute timed here).
        db.raw("UPDATE task_schedules SET next_occurrence_ms = ?, next_fire_at_ms = ?", (boundary, boundary))
        clock.now = boundary + 10
        editor = SqliteDatabase(Path(tmp) / "ql3.db", clock=clock) if edits else None
        result = _admit(db, page, editor, edits)
        if editor is not None:
            editor.close()
        db.close()
    return {"database": "sqlite", **result}


def run_postgres(admin: str, n: int, page: int, edits: int) -> dict[str, Any]:
    name = "ql3_cron_bench_" + uuid.uuid4().hex[:8]
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"'.encode())
    try:
        info = psycopg.conninfo.conninfo_to_dict(admin)
        info["dbname"] = name
        dsn = psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in info.items() if v})
        db = PostgresDatabase(dsn)
        db.migrate()
        _seed(db, n)
        # Freeze the database clock 10 ms after the next boundary (as tests/support/databases.py does).
        db.raw("UPDATE ql3_clock SET offset_ms = ((ql3_now_ms() / 60000) + 1) * 60000 + 10")
        db.raw(
            "UPDATE task_schedules SET next_occurrence_ms = (SELECT offset_ms - 10 FROM ql3_clock),"
            " next_fire_at_ms = (SELECT offset_ms - 10 FROM ql3_clock)"
        )
        db.raw(
            "CREATE OR REPLACE FUNCTION ql3_now_ms() RETURNS BIGINT LANGUAGE sql STABLE AS"
            " $$ SELECT offset_ms FROM ql3_clock WHERE singleton $$"
        )
        editor = PostgresDatabase(dsn, min_size=1, max_size=2) if edits else None
        result = _admit(db, page, editor, edits)
        if editor is not None:
            editor.close()
        db.close()
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())
    return {"database": "postgres", **result}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--page", type=int, default=PROFILES["standalone"].cron_page)
    parser.add_argument("--database-url", help="PostgreSQL admin DSN (CREATE DATABASE); default: SQLite")
    parser.add_argument("--edit-race", type=int, default=0, metavar="N", help="edit N due tasks meanwhile")
    args = parser.parse_args()
    if args.database_url:
        result = run_postgres(args.database_url, args.tasks, args.page, args.edit_race)
    else:
        result = run_sqlite(args.tasks, args.page, args.edit_race)
    result["tasks"] = args.tasks
    result["page"] = args.page
    result["runs_per_s"] = round(result["admitted"] / max(result["seconds"], 1e-9))
    print(json.dumps(result))
    ok = result["admitted"] == args.tasks and not result.get("double_runs") and not result.get("edit_errors")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
