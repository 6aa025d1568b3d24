"""Console page-load benchmark, run by hand: ``.venv/bin/python bench/console_pages.py``.

Loads 10,000 tasks (each with a cron schedule) and 1,000,000 finished runs straight into a fresh
database with bulk SQL (executemany on SQLite; ``--database-url`` for a fresh PostgreSQL database
created and dropped here, loaded with COPY), starts a real ``ql3 serve`` on it, signs in through the
console's form in Chromium (Playwright, ``--chromium``, default /usr/bin/chromium) and opens each
console page with a full page load, reporting the time from navigation to the page's content being
visible (its heading and main list drawn), median of ``--repeat`` loads.

The first task is created through the API, so its revision (spec, keyed content digest) and schedule
are the server's own; the other tasks copy them under new ids and names. Runs spread over the last
365 days across all tasks (100 each), 95 % succeeded, 4 % failed, 1 % timed out; none is running, so
the "running now" card must find that out without reading the million rows.
Every loop is bounded; nothing leaves the temp directory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

DAY_MS = 86_400_000
ROOT = Path(__file__).resolve().parents[1]
QL3 = [sys.executable, "-m", "ql3.cli.main"]

# (name, hash route, a selector that is only drawn with the page's content)
PAGES: list[tuple[str, str, str]] = [
    ("overview", "#/", "#view h1 ~ .grid section"),
    ("tasks", "#/tasks", "#view table tbody tr"),
    ("tasks, searched", "#/tasks?q=task-0042", "#view table tbody tr"),
    ("tasks, page 20", "#/tasks?cursor=task-00380", "#view table tbody tr"),
    ("task page", "#/tasks/task-00500", "#view h1"),
    ("runs", "#/runs", "#view table tbody tr"),
    ("runs, one task", "#/runs?task=task-00777", "#view table tbody tr"),
    ("runs, failed", "#/runs?status=failed", "#view table tbody tr"),
    ("runs, failed 24 h", "#/runs?status=failed,timed_out&range=24h", "#view table tbody tr"),
    ("approvals", "#/approvals", "#view h1"),
    ("actions", "#/actions", "#view h1"),
    ("cancellations", "#/cancellations", "#view h1"),
    ("workers", "#/workers", "#view h1"),
    ("tokens", "#/tokens", "#view h1"),
    ("dependencies", "#/deps", "#view h1"),
    ("variables", "#/variables", "#view h1"),
    ("scripts", "#/scripts", "#view h1"),
    ("subscriptions", "#/subscriptions", "#view h1"),
]


def progress(message: str) -> None:
    sys.stderr.write(f"{time.strftime('%H:%M:%S')} {message}\n")
    sys.stderr.flush()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def id_at(ms: int) -> str:
    """A UUIDv7-shaped id for an instant, like the server's own ids (sortable by time)."""
    rand = uuid.uuid4().int & ((1 << 74) - 1)
    value = (
        (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | (rand >> 62) << 64 | 0b10 << 62 | (rand & ((1 << 62) - 1))
    )
    return str(uuid.UUID(int=value))


class Server:
    def __init__(self, home: Path, database_url: str | None) -> None:
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("QL3_")}
        env["QL3_HOME"] = str(home)
        extra = ["--database-url", database_url] if database_url else []
        # outside the temp directory, so a failed start can still be read
        self.log = open(Path(tempfile.gettempdir()) / f"ql3-console-bench-serve-{self.port}.log", "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            [*QL3, "serve", "--listen", f"127.0.0.1:{self.port}", "--slots", "1", "--no-access-log", *extra],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"ql3 serve exited: see {self.log.name}")
            try:
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError("ql3 serve did not start in 180 s")

    def token(self) -> str:
        return str(json.loads((self.home / "credentials").read_text())["token"])

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        self.log.close()


def api(server: Server, method: str, path: str, **kwargs: Any) -> Any:
    resp = httpx.request(
        method,
        f"{server.url}/api/v1/projects/default{path}",
        headers={"Authorization": f"Bearer {server.token()}"},
        timeout=30,
        **kwargs,
    )
    resp.raise_for_status()
    return resp.json()


def task_rows(template: dict[str, Any], n: int, now_ms: int) -> dict[str, list[tuple[Any, ...]]]:
    """Rows for tasks task-00001..task-{n-1} copying the template task's revision and schedule."""
    out: dict[str, list[tuple[Any, ...]]] = {"tasks": [], "task_revisions": [], "task_schedules": []}
    for i in range(1, n):
        task_id = id_at(now_ms - 400 * DAY_MS + i)
        created = now_ms - 400 * DAY_MS
        out["tasks"].append((task_id, template["project_id"], f"task-{i:05d}", 1, 1, created, created))
        out["task_revisions"].append((task_id, 1, template["spec_json"], template["content_digest"], created))
        # fires spread over the next days, none due while the benchmark runs
        fire = now_ms + DAY_MS + i * 60_000
        out["task_schedules"].append(
            (task_id, template["project_id"], 1, template["cron_expr"], fire, 0, now_ms, fire)
        )
    return out


TASK_COLUMNS = {
    "tasks": "id, project_id, name, enabled, revision, created_at_ms, updated_at_ms",
    "task_revisions": "task_id, revision, spec_json, content_digest, created_at_ms",
    "task_schedules": (
        "task_id, project_id, task_revision, cron_expr, next_fire_at_ms, state_version, updated_at_ms,"
        " next_occurrence_ms"
    ),
}
RUN_COLUMNS = (
    "id, project_id, task_id, task_revision, trigger_type, status, version, event_sequence,"
    " created_at_ms, queued_at_ms, started_at_ms, finished_at_ms, exit_code, updated_at_ms"
)


def run_rows(
    project_id: str, task_ids: list[str], first: int, last: int, now_ms: int, total: int
) -> Iterator[tuple[Any, ...]]:
    span = 365 * DAY_MS
    for i in range(first, last):
        at = now_ms - span + (span * i) // total
        task_id = task_ids[i % len(task_ids)]
        k = i % 100
        status, code = ("failed", 1) if k < 4 else ("timed_out", None) if k == 4 else ("succeeded", 0)
        trigger = "cron" if i % 3 else "manual"
        yield (
            id_at(at),
            project_id,
            task_id,
            1,
            trigger,
            status,
            4,
            4,
            at,
            at,
            at + 50,
            at + 1250,
            code,
            at + 1250,
        )


class Sqlite:
    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute("PRAGMA cache_size=-1048576")  # this loader only; the server keeps its own

    def one(self, sql: str, *args: Any) -> dict[str, Any]:
        cur = self.conn.execute(sql.replace("%s", "?"), args)
        names = [d[0] for d in cur.description]
        row = cur.fetchone()
        return dict(zip(names, row, strict=True))

    def column(self, sql: str, *args: Any) -> list[Any]:
        return [r[0] for r in self.conn.execute(sql.replace("%s", "?"), args)]

    def load(self, table: str, columns: str, rows: list[tuple[Any, ...]]) -> None:
        marks = ", ".join("?" * len(columns.split(",")))
        with self.conn:
            self.conn.executemany(f"INSERT INTO {table} ({columns}) VALUES ({marks})", rows)

    def finish(self) -> None:
        self.conn.execute("ANALYZE")
        self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self.conn.close()


class Postgres:
    def __init__(self, dsn: str) -> None:
        import psycopg
        from psycopg.rows import dict_row

        self.conn = psycopg.connect(dsn, row_factory=dict_row)

    def one(self, sql: str, *args: Any) -> dict[str, Any]:
        row = self.conn.execute(sql, args).fetchone()
        assert row is not None
        return dict(row)

    def column(self, sql: str, *args: Any) -> list[Any]:
        return [next(iter(r.values())) for r in self.conn.execute(sql, args)]

    def load(self, table: str, columns: str, rows: list[tuple[Any, ...]]) -> None:
        with (
            self.conn.transaction(),
            self.conn.cursor() as cur,
            cur.copy(f"COPY {table} ({columns}) FROM STDIN") as copy,
        ):
            for row in rows:
                copy.write_row(row)

    def finish(self) -> None:
        self.conn.commit()
        self.conn.autocommit = True
        self.conn.execute("VACUUM ANALYZE")
        self.conn.close()


def load(db: Sqlite | Postgres, tasks: int, runs: int, now_ms: int) -> dict[str, float]:
    began = time.perf_counter()
    template = db.one(
        "SELECT t.id, t.project_id, r.spec_json, r.content_digest, s.cron_expr FROM tasks t"
        " JOIN task_revisions r ON r.task_id = t.id AND r.revision = t.revision"
        " JOIN task_schedules s ON s.task_id = t.id WHERE t.name = %s",
        "task-00000",
    )
    made = task_rows(template, tasks, now_ms)
    for table, columns in TASK_COLUMNS.items():
        db.load(table, columns, made[table])
    task_s = time.perf_counter() - began
    task_ids = [template["id"], *(row[0] for row in made["tasks"])]
    batch = 50_000
    for first in range(0, runs, batch):
        db.load(
            "runs",
            RUN_COLUMNS,
            list(run_rows(template["project_id"], task_ids, first, min(runs, first + batch), now_ms, runs)),
        )
        if first and first % 200_000 == 0:
            progress(f"inserted {first:,} runs")
    runs_s = time.perf_counter() - began - task_s
    db.finish()
    return {"tasks_s": round(task_s, 1), "runs_s": round(runs_s, 1)}


def measure(server: Server, chromium: str, repeat: int, widths: list[int]) -> list[dict[str, Any]]:
    from playwright.sync_api import sync_playwright

    results: list[dict[str, Any]] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=chromium, headless=True, args=["--headless", "--no-sandbox", "--disable-gpu"]
        )
        try:
            for width in widths:
                context = browser.new_context(viewport={"width": width, "height": 800})
                page = context.new_page()
                page.set_default_timeout(120_000)
                page.goto(server.url + "/#/")
                page.fill("#signin-token", server.token())
                page.click("form.signin button[type=submit]")
                page.wait_for_selector("#view h1")
                for name, route, ready in PAGES:
                    samples: list[float] = []
                    for _ in range(repeat):
                        page.goto("about:blank")
                        began = time.perf_counter()
                        page.goto(server.url + "/" + route)
                        page.wait_for_selector(ready, state="visible")
                        samples.append(time.perf_counter() - began)
                    row = {
                        "page": name,
                        "route": route,
                        "width": width,
                        "median_s": round(statistics.median(samples), 3),
                        "max_s": round(max(samples), 3),
                    }
                    progress(f"{width}px {name}: {row['median_s']} s")
                    results.append(row)
                context.close()
        finally:
            browser.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=10_000, help="tasks to load (default 10,000)")
    parser.add_argument("--runs", type=int, default=1_000_000, help="runs to load (default 1,000,000)")
    parser.add_argument("--repeat", type=int, default=3, help="loads of each page (median reported)")
    parser.add_argument("--widths", default="1280", help="viewport widths, comma separated (default 1280)")
    parser.add_argument("--chromium", default=os.environ.get("QL3_CHROMIUM", "/usr/bin/chromium"))
    parser.add_argument(
        "--database-url",
        default=None,
        help="postgresql://... where the user may CREATE DATABASE: a fresh database is created and dropped"
        " (default: SQLite in a temp directory)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    if not 100 <= args.tasks <= 100_000 or not 0 <= args.runs <= 5_000_000 or not 1 <= args.repeat <= 20:
        parser.error("--tasks 100..100000, --runs 0..5000000, --repeat 1..20")
    widths = [int(w) for w in args.widths.split(",")]

    with tempfile.TemporaryDirectory(prefix="ql3-console-bench-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir(mode=0o700)
        dsn = None
        created = None
        if args.database_url:
            import psycopg
            from psycopg.conninfo import conninfo_to_dict

            created = f"ql3_console_bench_{os.getpid()}"
            with psycopg.connect(args.database_url, autocommit=True) as admin:
                admin.execute(f'CREATE DATABASE "{created}"'.encode())
            info = conninfo_to_dict(args.database_url)
            user, host, port = (
                info.get("user") or "postgres",
                info.get("host") or "127.0.0.1",
                info.get("port") or "5432",
            )
            dsn = f"postgresql://{quote(str(user))}@{quote(str(host), safe='')}:{port}/{created}"
        try:
            server = Server(home, dsn)
            try:
                api(
                    server,
                    "POST",
                    "/tasks",
                    json={"name": "task-00000", "command": "true", "cron": "0 3 * * *"},
                )
            finally:
                server.stop()
            now_ms = int(time.time() * 1000)
            progress(f"loading {args.tasks:,} tasks and {args.runs:,} runs")
            db: Sqlite | Postgres = Postgres(dsn) if dsn else Sqlite(home / "ql3.db")
            loaded = load(db, args.tasks, args.runs, now_ms)
            progress(f"loaded: {loaded}")
            server = Server(home, dsn)
            try:
                results = measure(server, args.chromium, args.repeat, widths)
            finally:
                server.stop()
        finally:
            if created and args.database_url:
                import psycopg

                with psycopg.connect(args.database_url, autocommit=True) as admin:
                    admin.execute(f'DROP DATABASE IF EXISTS "{created}" WITH (FORCE)'.encode())
    report = {
        "database": "postgresql" if args.database_url else "sqlite",
        "tasks": args.tasks,
        "runs": args.runs,
        "load": loaded,
        "pages": results,
        "load_1m_after": os.getloadavg()[0],
    }
    print(f"| page | {report['database']} median s | max s |")
    print("| --- | ---: | ---: |")
    for row in results:
        print(f"| {row['page']} ({row['width']} px) | {row['median_s']:.3f} | {row['max_s']:.3f} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
