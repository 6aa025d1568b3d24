"""Cron admission of a busy minute, run by hand:
``.venv/bin/python bench/cron_admission.py [--tasks 1000] [--database-url postgresql://.../postgres]``.

Creates ``--tasks`` tasks on ``* * * * *`` (through the real task use case) in a fresh database (a
temporary SQLite file, or a new PostgreSQL database made with the admin DSN given), then freezes the
database clock 10 ms after the next minute boundary and times what the cron loop does there: the real
``CronScheduler.schedule_once()`` at the serve profile's page, cycle after cycle, until no schedule is
due. Reports the time from the first cycle to the last run created, the cycles (one write
transaction each) and the runs per second. Nothing is left behind.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
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


def _admit(db: Any, page: int) -> dict[str, Any]:
    scheduler = CronScheduler(db, page=page)
    cycles = admitted = 0
    started = time.perf_counter()
    while True:
        report = scheduler.schedule_once()
        cycles += 1
        admitted += report.admitted
        if not report.decisions:
            break
    elapsed = time.perf_counter() - started
    return {"admitted": admitted, "cycles": cycles - 1, "seconds": round(elapsed, 3)}


def run_sqlite(n: int, page: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        clock = Clock(int(time.time() * 1000))
        db = SqliteDatabase(Path(tmp) / "ql3.db", clock=clock)
        db.migrate()
        _seed(db, n)
        clock.now = (clock.now // MINUTE_MS + 1) * MINUTE_MS + 10
        result = _admit(db, page)
        db.close()
    return {"database": "sqlite", **result}


def run_postgres(admin: str, n: int, page: int) -> dict[str, Any]:
    name = "ql3_cron_bench_" + uuid.uuid4().hex[:8]
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"'.encode())
    try:
        info = psycopg.conninfo.conninfo_to_dict(admin)
        info["dbname"] = name
        db = PostgresDatabase(psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in info.items() if v}))
        db.migrate()
        _seed(db, n)
        # Freeze the database clock 10 ms after the next boundary (as tests/support/databases.py does).
        db.raw("UPDATE ql3_clock SET offset_ms = ((ql3_now_ms() / 60000) + 1) * 60000 + 10")
        db.raw(
            "CREATE OR REPLACE FUNCTION ql3_now_ms() RETURNS BIGINT LANGUAGE sql STABLE AS"
            " $$ SELECT offset_ms FROM ql3_clock WHERE singleton $$"
        )
        result = _admit(db, page)
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
    args = parser.parse_args()
    if args.database_url:
        result = run_postgres(args.database_url, args.tasks, args.page)
    else:
        result = run_sqlite(args.tasks, args.page)
    result["tasks"] = args.tasks
    result["page"] = args.page
    result["runs_per_s"] = round(result["admitted"] / max(result["seconds"], 1e-9))
    print(json.dumps(result))
    return 0 if result["admitted"] == args.tasks else 1


if __name__ == "__main__":
    sys.exit(main())
