"""Where one offer's time goes on PostgreSQL: ``dispatch_once()`` (8 offers a cycle, 16 workers, a
backlog of 10,000) split into the client's CPU, the backends' CPU and, per statement, the server's
execution time (issue 11; figures in bench/README.md).

The backends' CPU is read from ``/proc/<pid>/stat`` of the bench database's backends, so the server
must run on this machine. The per-statement table needs ``pg_stat_statements`` preloaded, with nested
statements tracked (the claim is plpgsql, its statements are nested)::

    ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements';   -- then restart the server
    ALTER SYSTEM SET pg_stat_statements.track = 'all'; SELECT pg_reload_conf();
    -- and afterwards: ALTER SYSTEM RESET ...; restart again (tracking costs a few per cent)

Without it only the CPU split is printed. Run (about 30 s)::

    .venv/bin/python bench/pg_claim_profile.py     # QL3_BENCH_PG_DSN: a user that may CREATE DATABASE
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ql3_bench as qb  # the bench's database, seed and budget helpers

from ql3.application.dispatcher import RunDispatcher

STATEMENTS = """
SELECT s.calls, s.total_exec_time, s.toplevel, regexp_replace(s.query, '\\s+', ' ', 'g') AS query
FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
WHERE d.datname LIKE 'ql3_bench_%%'
ORDER BY s.total_exec_time DESC LIMIT %s
"""


def _backend_cpu_s(admin: str) -> float:
    """User and system CPU of every backend connected to a bench database, in seconds."""
    ticks = 0
    with psycopg.connect(admin, autocommit=True) as conn:
        query = "SELECT pid FROM pg_stat_activity WHERE datname LIKE 'ql3_bench_%'"
        pids = [r[0] for r in conn.execute(query)]
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def _has_statements(admin: str) -> bool:
    with psycopg.connect(admin, autocommit=True) as conn:
        preload = conn.execute("SHOW shared_preload_libraries").fetchone()
        if preload is None or "pg_stat_statements" not in str(preload[0]):
            return False
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT pg_stat_statements_reset()")
    return True


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--offers", type=int, default=3_000)
    parser.add_argument("--offers-per-cycle", type=int, default=8)
    parser.add_argument("--top", type=int, default=20, help="statements listed")
    args = parser.parse_args()
    if not 1 <= args.offers <= args.queued:
        parser.error("--offers must be between 1 and --queued")
    admin = qb._pg_admin()
    with qb.database("postgres") as db:
        qb.seed(db, args.queued)
        d = RunDispatcher(
            db, lease_secret=b"b" * 32, budget=qb._budget(args.offers_per_cycle), incarnation_started_ms=0
        )
        d.dispatch_once()  # warm the spec cache and the recovery walk
        statements = _has_statements(admin)
        backend0 = _backend_cpu_s(admin)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        done = 0
        while done < args.offers:
            got = len(d.dispatch_once().offers)
            if got == 0:
                break
            done += got
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        backend = _backend_cpu_s(admin) - backend0
        per = 1000 / max(1, done)
        print(
            f"{done} offers, {done / wall:.1f} offers/s: per offer {wall * per:.3f} ms wall,"
            f" {cpu * per:.3f} ms client CPU, {backend * per:.3f} ms backend CPU"
        )
        if not statements:
            print("pg_stat_statements is not preloaded: no per-statement table (see --help)")
            return 0
        rows: list[Any]
        with psycopg.connect(admin, autocommit=True) as conn:
            rows = conn.execute(STATEMENTS.encode(), (args.top,)).fetchall()
        print("| calls / offer | µs / offer | top level | statement |\n| ---: | ---: | --- | --- |")
        for calls, total_ms, toplevel, query in rows:
            text = str(query)[:100].replace("|", "\\|")
            level = "yes" if toplevel else "nested"
            print(f"| {calls / done:.2f} | {total_ms * 1000 / done:.1f} | {level} | `{text}` |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
