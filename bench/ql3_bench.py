"""ql3 benchmarks, run by hand (never from the test suite): ``.venv/bin/python bench/ql3_bench.py``.

Measures, on this machine in one run (medians of --repeat repetitions where it says so):
  1. dispatch throughput: offers/s from 10,000 queued runs to 16 workers (SQLite and PostgreSQL,
     repetitions interleaved), and PostgreSQL round trips per offer (``--dispatch-only``: just these)
  2. end to end: runs/s of a task whose command is ``true`` through a real ``ql3 serve``
  3. idle latency from ``run start`` (HTTP request sent) to the command starting: p50 / p99
  4. cost of one dispatch_once() with 1,000 and with 100,000 queued runs, and their ratio
  5. peak RSS of an idle ``ql3 serve`` and of one holding 100,000 queued runs
  6. cancel latency from request to process group gone (p50 / p99) on an idle server
  7. write transactions and rows changed per cancellation on SQLite
Every loop is bounded in count and time; all traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
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
import psycopg

from ql3.application import auth, runs, tasks, workers
from ql3.application.dispatcher import DispatchBudget, RunDispatcher
from ql3.domain.ids import new_id
from ql3.domain.workers import parse_capabilities
from ql3.storage.postgres.adapter import PostgresDatabase
from ql3.storage.sqlite.adapter import SqliteDatabase

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the round-trip counter is shared with the test suite
from tests.support.round_trips import count_round_trips  # noqa: E402

PHASE_TIMEOUT_S = 300.0


def _pg_admin() -> str:
    return os.environ.get("QL3_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


@contextlib.contextmanager
def database(kind: str) -> Iterator[Any]:
    if kind == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            db = SqliteDatabase(Path(tmp) / "bench.db")
            db.migrate()
            try:
                yield db
            finally:
                db.close()
        return
    admin = _pg_admin()
    name = f"ql3_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"'.encode())
    info = psycopg.conninfo.conninfo_to_dict(admin)
    info["dbname"] = name
    db = PostgresDatabase(psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in info.items()}), max_size=4)
    try:
        db.migrate()
        yield db
    finally:
        db.close()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


def seed(db: Any, queued: int, *, workers_n: int = 16, require: dict[str, str] | None = None) -> None:
    token = db.transaction(auth.bootstrap_owner)
    project = token.project
    spec: dict[str, Any] = {"command": "true"}
    if require:
        spec["require"] = require
    task = db.transaction(lambda tx: tasks.create_task(tx, project.id, "bench", spec)).task
    for i in range(workers_n):
        db.transaction(
            lambda tx, i=i: workers.register(
                tx,
                worker_id=f"w{i:02d}",
                session_id=new_id(),
                capabilities=parse_capabilities({"executors": ["local_process"]}),
                max_concurrent_runs=1024,
                session_lease_ms=600_000,
            )
        )
    batch = 2000
    for start in range(0, queued, batch):
        n = min(batch, queued - start)

        def create(tx: Any, n: int = n) -> None:
            for _ in range(n):
                runs.create_run(tx, runs.CreateRun(project_id=project.id, task=task))

        db.transaction(create)


def _budget(offers_per_cycle: int) -> DispatchBudget:
    return DispatchBudget(lease_ms=600_000, max_offers_per_cycle=offers_per_cycle)


def bench_dispatch_throughput(kind: str, queued: int, claims: int, offers_per_cycle: int) -> float:
    with database(kind) as db:
        seed(db, queued)
        d = RunDispatcher(
            db, lease_secret=b"b" * 32, budget=_budget(offers_per_cycle), incarnation_started_ms=0
        )
        start = time.perf_counter()
        done = 0
        deadline = start + PHASE_TIMEOUT_S
        while done < claims and time.perf_counter() < deadline:
            done += len(d.dispatch_once().offers)
        return done / (time.perf_counter() - start)


def bench_round_trips(queued: int, claims: int, offers_per_cycle: int) -> float:
    """Mean PostgreSQL round trips (pool checks included) per offer of dispatch_once()."""
    with database("postgres") as db:
        seed(db, queued)
        d = RunDispatcher(
            db, lease_secret=b"b" * 32, budget=_budget(offers_per_cycle), incarnation_started_ms=0
        )
        d.dispatch_once()  # warm the spec cache and the recovery walk
        offers = 0
        with count_round_trips() as counter:
            while offers < claims:
                offers += len(d.dispatch_once().offers)
        return counter[0] / max(1, offers)


def bench_dispatch_cost(kind: str, queued: int, calls: int) -> float:
    """Mean milliseconds of one dispatch_once() that claims one run from a backlog of ``queued``."""
    with database(kind) as db:
        seed(db, queued)
        d = RunDispatcher(
            db, lease_secret=b"b" * 32, budget=DispatchBudget(lease_ms=600_000), incarnation_started_ms=0
        )
        d.dispatch_once()  # warm caches and the recovery walk
        start = time.perf_counter()
        for _ in range(calls):
            d.dispatch_once()
        return (time.perf_counter() - start) / calls * 1000


# -- a real ql3 serve ----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Serve:
    def __init__(self, home: Path, *extra: str) -> None:
        self.home = home
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("QL3_")}
        env["QL3_HOME"] = str(home)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ql3.cli.main", "serve", "--listen", f"127.0.0.1:{port}", *extra],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    break
            time.sleep(0.05)
        token = json.loads((home / "credentials").read_text())["token"]
        self.client = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
        )

    def rss_kb(self, field: str = "VmRSS") -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        return -1

    def stop(self) -> None:
        self.client.close()
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def bench_end_to_end(n: int, slots: int) -> float:
    """Runs/s of ``true`` through a real ``ql3 serve``, measured like the peers: the backlog is
    enqueued first (one transaction, not timed), then the server is spawned; wall time runs from the
    spawn (so it includes start-up) to the last run finishing."""
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        home.mkdir(mode=0o700)
        db = SqliteDatabase(home / "ql3.db")
        db.migrate()
        token = db.transaction(auth.bootstrap_owner)
        project = token.project
        task = db.transaction(lambda tx: tasks.create_task(tx, project.id, "t", {"command": "true"})).task

        def enqueue(tx: Any) -> None:
            for _ in range(n):
                runs.create_run(tx, runs.CreateRun(project_id=project.id, task=task))

        db.transaction(enqueue)
        (home / "credentials").write_text(json.dumps({"url": "http://127.0.0.1:1", "token": token.token}))
        start = time.perf_counter()
        serve = Serve(home, "--slots", str(slots))
        try:
            deadline = start + PHASE_TIMEOUT_S
            while time.perf_counter() < deadline:
                done = db.raw("SELECT count(*) AS n FROM runs WHERE status IN ('succeeded', 'failed')")[0][
                    "n"
                ]
                if done >= n:
                    break
                time.sleep(0.02)
            elapsed = time.perf_counter() - start
            return n / elapsed
        finally:
            db.close()
            serve.stop()


def bench_idle_latency(samples: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        serve = Serve(Path(tmp) / "home")
        try:
            marks = Path(tmp) / "marks"
            marks.mkdir()
            command = f'date +%s%N > {marks}/"$QL3_RUN_ID"'
            serve.client.post("/api/v1/projects/default/tasks", json={"name": "lat", "command": command})
            latencies: list[float] = []
            for _ in range(samples):
                time.sleep(0.2)  # idle between samples
                sent = time.time_ns()
                run_id = serve.client.post("/api/v1/projects/default/tasks/lat/runs", json={}).json()["id"]
                path = marks / run_id
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and not (path.exists() and path.read_text().strip()):
                    time.sleep(0.002)
                latencies.append((int(path.read_text()) - sent) / 1e6)
            latencies.sort()
            return statistics.median(latencies), latencies[
                min(len(latencies) - 1, int(len(latencies) * 0.99))
            ]
        finally:
            serve.stop()


def bench_rss(backlog: int) -> tuple[int, int, int]:
    """(idle VmRSS kB, VmRSS kB after ``backlog`` queued unplaceable runs and 10 s of cycles, VmHWM kB)."""
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        serve = Serve(home)
        try:
            time.sleep(3)
            idle = serve.rss_kb()
            db = SqliteDatabase(home / "ql3.db")
            project = db.transaction(lambda tx: auth.resolve_project(tx, "default"))
            task = db.transaction(
                lambda tx: tasks.create_task(
                    tx, project.id, "parked", {"command": "true", "require": {"never": "1"}}
                )
            ).task
            for start in range(0, backlog, 5000):
                n = min(5000, backlog - start)

                def create(tx: Any, n: int = n) -> None:
                    for _ in range(n):
                        runs.create_run(tx, runs.CreateRun(project_id=project.id, task=task))

                db.transaction(create)
            db.close()
            time.sleep(10)
            return idle, serve.rss_kb(), serve.rss_kb("VmHWM")
        finally:
            serve.stop()


def _pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def _group_alive(pgid: int) -> bool:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                    return True
    return False


def bench_cancel_latency(samples: int) -> tuple[float, float]:
    """Milliseconds from the cancel request being sent to the last process of the group being gone."""
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        serve = Serve(home)
        try:
            serve.client.post("/api/v1/projects/default/tasks", json={"name": "s", "command": "sleep 60"})
            db = SqliteDatabase(home / "ql3.db")
            latencies: list[float] = []
            for _ in range(samples):
                run_id = serve.client.post("/api/v1/projects/default/tasks/s/runs", json={}).json()["id"]
                deadline = time.monotonic() + 30
                pid = None
                while time.monotonic() < deadline and pid is None:
                    row = db.raw(
                        "SELECT pid FROM run_attempts WHERE run_id = ? AND status = 'running'", (run_id,)
                    )
                    pid = row[0]["pid"] if row else None
                    time.sleep(0.01)
                assert pid is not None
                time.sleep(0.2)  # idle server
                sent = time.perf_counter()
                serve.client.post(f"/api/v1/projects/default/runs/{run_id}/cancel")
                while time.perf_counter() - sent < 30 and _group_alive(pid):
                    time.sleep(0.001)
                latencies.append((time.perf_counter() - sent) * 1000)
            db.close()
            latencies.sort()
            return statistics.median(latencies), latencies[
                min(len(latencies) - 1, int(len(latencies) * 0.99))
            ]
        finally:
            serve.stop()


class _CountingSqlite(SqliteDatabase):
    """Counts write transactions and changed rows (sqlite3 ``total_changes``) across all threads."""

    writes = 0
    rows = 0

    def _transaction(self, fn: Any, conn: Any, *, write: bool) -> Any:
        # Counted on the connection the unit really uses (the shared writer, under its lock).
        before = conn.total_changes
        result = super()._transaction(fn, conn, write=write)
        if write:
            type(self).writes += 1
        type(self).rows += conn.total_changes - before
        return result


def bench_cancel_writes(repeat: int) -> tuple[float, float]:
    """(write transactions, rows changed) on SQLite from the cancel request to the run being cancelled."""
    from ql3.application import cancellation
    from ql3.application.settings import load_serve_settings
    from ql3.bootstrap import build_standalone_runtime

    figures: list[tuple[int, int]] = []
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        db = _CountingSqlite(home / "ql3.db")
        db.migrate()
        project = db.transaction(auth.bootstrap_owner).project
        task = db.transaction(lambda tx: tasks.create_task(tx, project.id, "s", {"command": "sleep 60"})).task
        settings = load_serve_settings(
            {"QL3_HOME": str(home)}, profile="standalone", slots=4, worker_id=None, database_url=None, cpus=2
        )
        runtime = build_standalone_runtime(db, settings)
        runtime.start()
        try:
            for _ in range(repeat):
                run, _ = db.transaction(
                    lambda tx: runs.create_run(tx, runs.CreateRun(project_id=project.id, task=task))
                )
                deadline = time.monotonic() + 30
                while (
                    time.monotonic() < deadline
                    and db.transaction(
                        lambda tx, r=run.id: runs.get_run(tx, project.id, r), write=False
                    ).status
                    != "running"
                ):
                    time.sleep(0.01)
                time.sleep(0.3)
                _CountingSqlite.writes = _CountingSqlite.rows = 0
                db.transaction(
                    lambda tx, r=run.id: cancellation.request_cancel(
                        tx, project.id, r, reason="user", actor_type="user"
                    )
                )
                while (
                    time.monotonic() < deadline + 30
                    and db.transaction(
                        lambda tx, r=run.id: runs.get_run(tx, project.id, r), write=False
                    ).status
                    != "cancelled"
                ):
                    time.sleep(0.005)
                time.sleep(0.2)  # let the dispatch result commit too
                figures.append((_CountingSqlite.writes, _CountingSqlite.rows))
        finally:
            runtime.stop()
            db.close()
    return statistics.median(f[0] for f in figures), statistics.median(f[1] for f in figures)


# -- end to end through an instrumented ``ql3 serve``, on SQLite and PostgreSQL ----------------------

INSTRUMENTED = ROOT / "bench" / "ql3_instrumented.py"
TICK_MS = 1000.0 / os.sysconf("SC_CLK_TCK")
TERMINAL_SQL = (
    "SELECT count(*) AS n FROM runs WHERE status IN ('succeeded', 'failed', 'cancelled', 'timed_out')"
)


def cpu_ticks(pid: int) -> tuple[int, int]:
    """(utime + stime of the process itself, cutime + cstime of its reaped children) in clock ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return utime + stime, cutime + cstime


def proc_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return -1


def load_1m() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


class Store:
    """A fresh ql3 database (SQLite file in the home, or a PostgreSQL database of its own), migrated,
    with the owner, a task ``t`` whose command is ``true``, and the credentials file of the home."""

    def __init__(self, kind: str, home: Path) -> None:
        self.kind = kind
        self.home = home
        home.mkdir(mode=0o700, parents=True)
        self.pg_name = ""
        self.url: str | None = None
        if kind == "sqlite":
            self.db: Any = SqliteDatabase(home / "ql3.db")
        else:
            admin = _pg_admin()
            self.pg_name = f"ql3_bench_{uuid.uuid4().hex[:8]}"
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{self.pg_name}"'.encode())
            info = psycopg.conninfo.conninfo_to_dict(admin)
            user, host = info.get("user") or "postgres", info.get("host") or "127.0.0.1"
            port = info.get("port") or "5432"
            self.url = f"postgresql://{quote(str(user))}@{quote(str(host), safe='')}:{port}/{self.pg_name}"
            self.db = PostgresDatabase(self.url, max_size=2)
        self.db.migrate()
        token = self.db.transaction(auth.bootstrap_owner)
        self.project = token.project
        self.task = self.db.transaction(
            lambda tx: tasks.create_task(tx, self.project.id, "t", {"command": "true"})
        ).task
        (home / "credentials").write_text(json.dumps({"url": "http://127.0.0.1:1", "token": token.token}))
        (home / "credentials").chmod(0o600)
        self.polls = 0
        self._pg: psycopg.Connection[Any] | None = None
        if self.url:
            self._pg = psycopg.connect(self.url, autocommit=True)

    def enqueue(self, n: int, batch: int = 5000) -> None:
        for start in range(0, n, batch):
            k = min(batch, n - start)

            def create(tx: Any, k: int = k) -> None:
                for _ in range(k):
                    runs.create_run(tx, runs.CreateRun(project_id=self.project.id, task=self.task))

            self.db.transaction(create)

    def terminal(self) -> int:
        self.polls += 1
        if self._pg is not None:
            row = self._pg.execute(TERMINAL_SQL).fetchone()
            return int(row[0]) if row else 0
        return int(self.db.raw(TERMINAL_SQL)[0]["n"])

    def pg_counters(self) -> dict[str, int]:
        """This database's committed transactions and the cluster's WAL syncs and writes (the WAL
        counters are cluster-wide: other sessions on the same server add to them)."""
        if self._pg is None:
            return {}
        self._pg.execute("SELECT pg_stat_clear_snapshot()")
        row = self._pg.execute(
            "SELECT d.xact_commit, w.wal_sync, w.wal_write FROM pg_stat_database d, pg_stat_wal w"
            " WHERE d.datname = current_database()"
        ).fetchone()
        assert row is not None
        return {"xact_commit": int(row[0]), "wal_sync": int(row[1]), "wal_write": int(row[2])}

    def close(self) -> None:
        if self._pg is not None:
            self._pg.close()
        self.db.close()
        if self.pg_name:
            with psycopg.connect(_pg_admin(), autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.pg_name}" WITH (FORCE)'.encode())


class InstrumentedServe:
    """``ql3 serve`` under bench/ql3_instrumented.py (counters, optionally cProfile) on a Store."""

    def __init__(
        self,
        store: Store,
        slots: int,
        profile: Path | None = None,
        *,
        stages: bool = False,
        sql_stats: bool = False,
    ) -> None:
        self.store = store
        self.stats = store.home.parent / f"stats-{uuid.uuid4().hex[:6]}.json"
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("QL3_")}
        env["QL3_HOME"] = str(store.home)
        argv = [sys.executable, str(INSTRUMENTED), str(self.stats)]
        if profile is not None:
            argv += ["--profile", str(profile)]
        if stages:
            argv += ["--stages"]
        if sql_stats:
            argv += ["--sql-stats"]
        argv += ["--", "serve", "--listen", f"127.0.0.1:{port}", "--slots", str(slots)]
        if store.url:
            argv += ["--database-url", store.url]
        self.log = store.home.parent / f"serve-{uuid.uuid4().hex[:6]}.log"
        self.spawned = time.perf_counter()
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.client: httpx.Client | None = None

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.proc.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    token = json.loads((self.store.home / "credentials").read_text())["token"]
                    self.client = httpx.Client(
                        base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
                    )
                    return
            time.sleep(0.05)
        raise RuntimeError(f"ql3 serve did not become healthy: {self.log_tail()}")

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:]

    def counters(self) -> dict[str, Any]:
        with contextlib.suppress(FileNotFoundError):
            self.stats.unlink()
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(FileNotFoundError, ValueError):
                data: dict[str, Any] = json.loads(self.stats.read_text())
                return data
            time.sleep(0.02)
        raise RuntimeError("no counters from the instrumented server")

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def wait_terminal(store: Store, serve: InstrumentedServe, n: int, poll_s: float = 0.02) -> float:
    """perf_counter() when ``n`` runs are terminal (bounded by PHASE_TIMEOUT_S)."""
    deadline = time.perf_counter() + PHASE_TIMEOUT_S
    while time.perf_counter() < deadline:
        if store.terminal() >= n:
            return time.perf_counter()
        if serve.proc.poll() is not None:
            raise RuntimeError(f"ql3 serve exited with {serve.proc.returncode}: {serve.log_tail()}")
        time.sleep(poll_s)
    raise RuntimeError(f"{n} runs not finished within {PHASE_TIMEOUT_S} s")


def sql_top(before: dict[str, Any], after: dict[str, Any], runs_n: int, top: int) -> dict[str, Any]:
    """Per run, from two ``--sql-stats`` snapshots: statements and their wall time by database, and
    the ``top`` statements by total time (count per run, us per run, us per call)."""
    b, a = before.get("sql", {}), after.get("sql", {})
    delta = {k: (v[0] - b.get(k, [0, 0])[0], v[1] - b.get(k, [0, 0])[1]) for k, v in a.items()}
    delta = {k: v for k, v in delta.items() if v[0] > 0}
    by_db: dict[str, list[float]] = {}
    for key, (n, ns) in delta.items():
        db = key.split("|", 1)[0]
        tot = by_db.setdefault(db, [0.0, 0.0])
        tot[0] += n / runs_n
        tot[1] += ns / 1e6 / runs_n
    rows = sorted(delta.items(), key=lambda kv: kv[1][1], reverse=True)[:top]
    return {
        "per_run_by_database": {
            db: {"statements": round(v[0], 2), "ms": round(v[1], 3)} for db, v in by_db.items()
        },
        "top": [
            {
                "statement": key,
                "per_run": round(n / runs_n, 3),
                "us_per_run": round(ns / 1e3 / runs_n, 1),
                "us_per_call": round(ns / 1e3 / n, 1),
            }
            for key, (n, ns) in rows
        ],
    }


def print_sql_top(label: str, stats: dict[str, Any]) -> None:
    print(f"{label}: per run {json.dumps(stats['per_run_by_database'])}", flush=True)
    print(f"{'per run':>8} {'us/run':>8} {'us/call':>8}  statement", flush=True)
    for row in stats["top"]:
        print(f"{row['per_run']:8.2f} {row['us_per_run']:8.1f} {row['us_per_call']:8.1f}  {row['statement']}")


def e2e_backlog(
    kind: str,
    n: int,
    slots: int,
    *,
    queued: int | None = None,
    profile: Path | None = None,
    sql_stats: int = 0,
) -> dict[str, Any]:
    """``queued`` (default ``n``) runs of ``true`` enqueued first (not timed); then the server is spawned
    and the wall time runs from the spawn to the ``n``-th run finishing, like the peers' figure."""
    queued = n if queued is None else queued
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(kind, Path(tmp) / "home")
        serve: InstrumentedServe | None = None
        try:
            store.enqueue(queued)
            serve = InstrumentedServe(store, slots, profile, sql_stats=sql_stats > 0)
            end = wait_terminal(store, serve, n, poll_s=0.02 if kind == "sqlite" else 0.05)
            wall = end - serve.spawned
            counters = serve.counters()
            sql = sql_top({}, counters, n, sql_stats) if sql_stats else None
            threads = {
                name: round((user + system) * TICK_MS / n, 3)
                for name, (user, system) in sorted(counters.get("threads", {}).items())
                if user + system
            }
            cpu_self, cpu_children = cpu_ticks(serve.proc.pid)
            hwm = proc_kb(serve.proc.pid, "VmHWM")
            return {
                "runs": n,
                "queued": queued,
                "slots": slots,
                "wall_s": round(wall, 3),
                "runs_per_s": round(n / wall, 1),
                "cpu_ms_per_run_server": round(cpu_self * TICK_MS / n, 3),
                "cpu_ms_per_run_with_children": round((cpu_self + cpu_children) * TICK_MS / n, 3),
                "peak_rss_mb": round(hwm / 1024, 1),
                "cpu_ms_per_run_by_thread": threads,
                "load_1m_after": load_1m(),
                **({"sql": sql} if sql is not None else {}),
            }
        finally:
            if serve is not None:
                serve.stop()
            store.close()


def e2e_live(kind: str, n: int, slots: int, *, sql_stats: int = 0) -> dict[str, Any]:
    """A producer submits ``n`` runs one by one through the API (``POST .../runs``) while the server
    runs them; runs/s from the first request to the last run finishing. CPU, transactions and fsyncs
    are counted over that window (the server's idle loops and the API requests included)."""
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(kind, Path(tmp) / "home")
        serve: InstrumentedServe | None = None
        try:
            serve = InstrumentedServe(store, slots, sql_stats=sql_stats > 0)
            serve.wait_healthy()
            assert serve.client is not None
            time.sleep(1.5)  # idle: PostgreSQL flushes a backend's statistics at most once a second
            pg0, c0 = store.pg_counters(), serve.counters()
            polls0 = store.polls
            cpu0 = cpu_ticks(serve.proc.pid)
            start = time.perf_counter()
            for _ in range(n):
                serve.client.post("/api/v1/projects/default/tasks/t/runs", json={}).raise_for_status()
            submitted = time.perf_counter()
            end = wait_terminal(store, serve, n, poll_s=0.02 if kind == "sqlite" else 0.05)
            cpu1 = cpu_ticks(serve.proc.pid)
            c1 = serve.counters()
            hwm = proc_kb(serve.proc.pid, "VmHWM")
            polls = store.polls - polls0
            serve.stop()  # the backends exit and flush their statistics
            serve = None
            time.sleep(0.5)
            pg1 = store.pg_counters()
            out: dict[str, Any] = {
                "runs": n,
                "slots": slots,
                "wall_s": round(end - start, 3),
                "runs_per_s": round(n / (end - start), 1),
                "submit_per_s": round(n / (submitted - start), 1),
                "cpu_ms_per_run_server": round((cpu1[0] - cpu0[0]) * TICK_MS / n, 3),
                "cpu_ms_per_run_with_children": round(
                    (cpu1[0] - cpu0[0] + cpu1[1] - cpu0[1]) * TICK_MS / n, 3
                ),
                "peak_rss_mb": round(hwm / 1024, 1),
                "load_1m_after": load_1m(),
            }
            delta = {k: c1.get(k, 0) - c0.get(k, 0) for k in set(c0) | set(c1) if k not in ("sql", "threads")}
            units = sum(v for k, v in delta.items() if k.endswith("_units"))
            out["transactions_per_run"] = round(units / n, 2)
            out["transactions_per_run_detail"] = {
                k: round(v / n, 2) for k, v in sorted(delta.items()) if not isinstance(v, dict)
            }
            if sql_stats:
                out["sql"] = sql_top(c0, c1, n, sql_stats)
            if kind == "sqlite":
                # WAL mode: a commit fsyncs only with synchronous=FULL (the journal's crash barrier);
                # the rest of the server's commits use NORMAL; Python's os.fsync calls are counted too.
                full = sum(v for k, v in delta.items() if k.startswith("sqlite_full_commits"))
                out["fsyncs_per_run"] = round((full + delta.get("python_fsyncs", 0)) / n, 2)
                out["fsyncs_how"] = "synchronous=FULL commits + os.fsync calls (checkpoints not counted)"
            else:
                # the bench's own completion polls are autocommit transactions on the same database
                xacts = pg1["xact_commit"] - pg0["xact_commit"] - polls
                out["pg_xact_commit_per_run"] = round(xacts / n, 2)
                out["fsyncs_per_run"] = round((pg1["wal_sync"] - pg0["wal_sync"]) / n, 2)
                out["pg_wal_write_per_run"] = round((pg1["wal_write"] - pg0["wal_write"]) / n, 2)
                out["fsyncs_how"] = "pg_stat_wal.wal_sync delta (cluster-wide: other sessions included)"
                # the journal is SQLite whatever the control plane's database is
                full = sum(v for k, v in delta.items() if k.startswith("sqlite_full_commits"))
                out["journal_fsyncs_per_run"] = round((full + delta.get("python_fsyncs", 0)) / n, 2)
            return out
        finally:
            if serve is not None:
                serve.stop()
            store.close()


# The stages of one idle run, in their order on its way to the spawn (bench/ql3_instrumented.py).
STAGES = (
    "api_authenticate",
    "api_authenticated",
    "api_authorize",
    "api_create_run",
    "notify_runs",
    "dispatch_start",
    "dispatch_offer",
    "intake_receive",
    "lease_checked",
    "journal_accepted",
    "ack_starting_done",
    "journal_launching",
    "spawn_start",
    "spawn_done",
)


def _stage_breakdown(events: list[tuple[str, int]], sent: list[int], started: list[int]) -> dict[str, Any]:
    """Per sample, the first instant of each stage in (sent, command started]; the median (and p90)
    of each step from the previous stage, and the counts of ``runs`` notifications and dispatch
    cycles per sample over the whole interval up to the next sample (the completion's included)."""
    steps: dict[str, list[float]] = {}
    wakes: list[int] = []
    cycles: list[int] = []
    for i, (t0, t1) in enumerate(zip(sent, started, strict=True)):
        until = sent[i + 1] if i + 1 < len(sent) else None
        first: dict[str, int] = {}
        for name, at in events:
            if t0 < at <= t1 and name not in first:
                first[name] = at
        window = [n for n, at in events if t0 < at and (until is None or at < until)]
        wakes.append(window.count("notify_runs"))
        cycles.append(window.count("dispatch_start"))
        prev_name, prev = "sent", t0
        for name in (*STAGES, "command"):
            at = t1 if name == "command" else first.get(name)
            if at is None:
                continue
            steps.setdefault(f"{prev_name} -> {name}", []).append((at - prev) / 1e6)
            prev_name, prev = name, at
    out: dict[str, Any] = {}
    for key, values in steps.items():
        values.sort()
        out[key] = {
            "n": len(values),
            "p50_ms": round(statistics.median(values), 2),
            "p90_ms": round(values[min(len(values) - 1, int(len(values) * 0.9))], 2),
        }
    # the last sample's completion may come after the final snapshot: counted over the others only
    if len(wakes) > 1:
        wakes, cycles = wakes[:-1], cycles[:-1]
    out["runs_notifications_per_run"] = round(statistics.mean(wakes), 2)
    out["dispatch_cycles_per_run"] = round(statistics.mean(cycles), 2)
    return out


def idle_latency(kind: str, samples: int) -> dict[str, Any]:
    """``POST .../runs`` sent to the command's first instruction (``date +%s%N``), server idle; with
    the time of each stage in between (``--stages`` of bench/ql3_instrumented.py)."""
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(kind, Path(tmp) / "home")
        serve: InstrumentedServe | None = None
        try:
            marks = Path(tmp) / "marks"
            marks.mkdir()
            command = f'date +%s%N > {marks}/"$QL3_RUN_ID"'
            store.db.transaction(
                lambda tx: tasks.create_task(tx, store.project.id, "lat", {"command": command})
            )
            serve = InstrumentedServe(store, 8, stages=True)
            serve.wait_healthy()
            assert serve.client is not None
            latencies: list[float] = []
            sent_at: list[int] = []
            started_at: list[int] = []
            for _ in range(samples):
                time.sleep(0.2)
                sent = time.time_ns()
                run_id = serve.client.post("/api/v1/projects/default/tasks/lat/runs", json={}).json()["id"]
                path = marks / run_id
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and not (path.exists() and path.read_text().strip()):
                    time.sleep(0.002)
                started = int(path.read_text())
                latencies.append((started - sent) / 1e6)
                sent_at.append(sent)
                started_at.append(started)
            time.sleep(0.2)  # the last run's completion
            events = [(str(n), int(t)) for n, t in serve.counters().get("stages", [])]
            latencies.sort()
            return {
                "samples": samples,
                "p50_ms": round(statistics.median(latencies), 2),
                "p99_ms": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 2),
                "idle_rss_mb": round(proc_kb(serve.proc.pid, "VmRSS") / 1024, 1),
                "load_1m_after": load_1m(),
                "stages": _stage_breakdown(events, sent_at, started_at),
            }
        finally:
            if serve is not None:
                serve.stop()
            store.close()


def _component(file: str, name: str) -> str:
    """A readable owner for a profiled function: a ql3 module, a library, or a C built-in."""
    if "_CountingConnection.execute" in name or "sqlite3" in name:
        return "sqlite3 (C: executing statements, fetching rows)"
    if file == "~":
        if "posix_spawn" in name or "waitpid" in name or "pidfd" in name:
            return "process spawn / reap (C)"
        if "lock" in name or "acquire" in name:
            return "locks / thread waits (C)"
        if "psycopg" in name or "pq" in name:
            return "psycopg (C)"
        if "builtins." in name:
            return "Python built-ins (isinstance, getattr, len, compile, exec...)"
        return "C: " + name.strip("<>")
    if "/ql3/" in file:
        return "ql3/" + file.split("/ql3/", 1)[1]
    if "site-packages/" in file:
        return file.split("site-packages/", 1)[1].split("/", 1)[0]
    if "bench/ql3_instrumented" in file:
        return "bench counters (instrumentation)"
    return "stdlib " + Path(file).name


def profile_report(path: Path, runs_n: int, top: int = 25) -> str:
    """The merged cProfile (CPU time per thread) as a readable top list, per run."""
    import io
    import pstats

    stats = pstats.Stats(str(path))
    total = sum(v[2] for v in stats.stats.values())  # type: ignore[attr-defined]
    lines = [
        f"cProfile of ql3 serve, every thread, CPU time (time.thread_time); {runs_n} runs;"
        f" {total * 1000 / runs_n:.2f} ms of profiled CPU per run (profiler overhead and start-up included)",
    ]
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)  # type: ignore[attr-defined]
    by_module: dict[str, float] = {}
    for (file, _line, name), (_cc, _nc, tt, _ct, _callers) in rows:
        by_module[_component(file, name)] = by_module.get(_component(file, name), 0.0) + tt
    lines.append("")
    lines.append("-- own CPU time by component (sum of tottime), ms per run --")
    for component, tt in sorted(by_module.items(), key=lambda kv: kv[1], reverse=True)[:top]:
        lines.append(f"{tt * 1000 / runs_n:8.3f}  {100 * tt / total:5.1f} %  {component}")
    lines.append("")
    lines.append("-- functions by own CPU time --")
    lines.append(f"{'tottime ms/run':>14} {'cum ms/run':>10} {'calls/run':>9}  function")
    for (file, line, name), (_cc, nc, tt, ct, _callers) in rows[:top]:
        if "_CountingConnection.execute" in name:
            name = "sqlite3 statements (the C execute under the counting subclass)"
        short = file.split("site-packages/")[-1].split("/src/")[-1]
        per_run = f"{tt * 1000 / runs_n:14.3f} {ct * 1000 / runs_n:10.3f} {nc / runs_n:9.1f}"
        lines.append(f"{per_run}  {short}:{line}({name})")
    cum = io.StringIO()
    pstats.Stats(str(path), stream=cum).sort_stats("cumulative").print_stats(40)
    return "\n".join(lines) + "\n\n-- by cumulative time --\n" + cum.getvalue()


def _median_rep(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """runs/s: the median over the repetitions (as for the peers); the other figures (CPU, counters,
    RSS) are those of the repetition at the lower median; every repetition's runs/s is kept."""
    ordered = sorted(reps, key=lambda r: r["runs_per_s"])
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    chosen["runs_per_s_reps"] = [r["runs_per_s"] for r in reps]
    chosen["runs_per_s_of_this_rep"] = chosen["runs_per_s"]
    chosen["runs_per_s"] = round(statistics.median(chosen["runs_per_s_reps"]), 1)
    return chosen


def bench_flat(kind: str, runs: int, backlog: int, repeat: int) -> dict[str, Any]:
    """The first ``runs`` runs with ``runs`` queued and with ``backlog`` queued, the two sizes
    interleaved ``repeat`` times (one repetition of each moves by 10-15 % here from run to run); the
    ratios of the medians: runs/s (large / small) and server CPU per run (large / small)."""
    reps: dict[int, list[dict[str, Any]]] = {runs: [], backlog: []}
    for _ in range(repeat):
        for queued in (runs, backlog):
            reps[queued].append(e2e_backlog(kind, runs, 8, queued=queued))
            print(
                f"[{kind}] first {runs} runs with {queued} queued: {reps[queued][-1]['runs_per_s']} runs/s,"
                f" {reps[queued][-1]['cpu_ms_per_run_server']} ms server CPU a run",
                flush=True,
            )
    flat: dict[str, Any] = {str(q): _median_rep(r) for q, r in reps.items()}
    small, large = flat[str(runs)], flat[str(backlog)]
    flat["ratio"] = round(large["runs_per_s"] / small["runs_per_s"], 3)
    cpu = {q: statistics.median(x["cpu_ms_per_run_server"] for x in r) for q, r in reps.items()}
    flat["cpu_ratio"] = round(cpu[backlog] / cpu[runs], 3)
    return flat


def bench_e2e(args: argparse.Namespace, out: dict[str, Any]) -> None:
    kinds = [k for k in args.kinds.split(",") if k]
    for kind in kinds:
        res: dict[str, Any] = {}
        print(f"[{kind}] backlog: {args.e2e_runs} runs, --slots 8, {args.repeat} repetitions", flush=True)
        res["backlog"] = _median_rep([e2e_backlog(kind, args.e2e_runs, 8) for _ in range(args.repeat)])
        print(f"[{kind}]   {res['backlog']['runs_per_s_reps']} runs/s", flush=True)
        print(f"[{kind}] live producer: {args.e2e_runs} runs through the API", flush=True)
        res["live"] = _median_rep([e2e_live(kind, args.e2e_runs, 8) for _ in range(args.repeat)])
        print(f"[{kind}]   {res['live']['runs_per_s_reps']} runs/s", flush=True)
        res["latency"] = idle_latency(kind, args.latency_samples)
        print(f"[{kind}] idle start latency {res['latency']}", flush=True)
        res["slots"] = {}
        for slots in (1, 64):
            res["slots"][str(slots)] = e2e_backlog(kind, args.slots_runs, slots)
            print(f"[{kind}] --slots {slots}: {res['slots'][str(slots)]['runs_per_s']} runs/s", flush=True)
        res["slots"]["8"] = res["backlog"]
        if kind in args.flat_kinds.split(","):
            res["flat"] = bench_flat(kind, args.flat_runs, args.flat_backlog, args.repeat)
        out[f"e2e_{kind}"] = res
    if args.profile:
        results = args.json.parent if args.json else Path(tempfile.gettempdir())
        results.mkdir(parents=True, exist_ok=True)
        path = results / "ql3-profile-sqlite.pstats"
        print(f"[sqlite] profile: {args.e2e_runs} runs under cProfile", flush=True)
        out["profile_run"] = e2e_backlog("sqlite", args.e2e_runs, 8, profile=path)
        report = profile_report(path, args.e2e_runs)
        (results / "ql3-profile-sqlite.txt").write_text(report)
        print("\n".join(report.splitlines()[:30]), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--e2e-runs", type=int, default=2000)
    parser.add_argument("--slots-runs", type=int, default=1000, help="runs per --slots 1 / 64 measurement")
    parser.add_argument("--flat-runs", type=int, default=1000, help="runs timed in the backlog-flatness pair")
    parser.add_argument("--flat-backlog", type=int, default=100_000, help="the large backlog of that pair")
    parser.add_argument("--flat-kinds", default="sqlite,postgres", help="databases for the flatness pair")
    parser.add_argument("--kinds", default="sqlite,postgres", help="databases for the end-to-end part")
    parser.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--latency-samples", type=int, default=50)
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--dispatch-only",
        action="store_true",
        help="only the dispatch parts (throughput, round trips per offer on PostgreSQL)",
    )
    parser.add_argument(
        "--no-dispatch", action="store_true", help="skip the dispatch throughput and round-trip parts"
    )
    parser.add_argument(
        "--extras",
        action="store_true",
        help="also dispatch_once cost with 1,000 / --backlog queued, cancel latency and writes, RSS with"
        " --backlog queued (the 2026-11-30 figures)",
    )
    parser.add_argument("--claims", type=int, default=2000, help="offers per throughput repetition")
    parser.add_argument(
        "--offers-per-cycle",
        type=int,
        default=8,
        help="the dispatcher's max_offers_per_cycle in the dispatch throughput part (1: one offer a cycle)",
    )
    parser.add_argument(
        "--latency-only",
        action="store_true",
        help="only the idle start latency with its stages, --repeat times per database in --kinds",
    )
    parser.add_argument(
        "--sql-stats",
        type=int,
        default=0,
        metavar="N",
        help="only a backlog and a live-producer run per database in --kinds (--e2e-runs runs, --repeat"
        " times), each statement counted and timed by the instrumented server; prints the top N per run",
    )
    args = parser.parse_args()
    out: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "nproc": os.cpu_count(),
        "load_1m_start": load_1m(),
        "args": {k: str(v) for k, v in vars(args).items()},
    }

    def save() -> None:
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(out, indent=2))

    if args.sql_stats:
        for rep in range(args.repeat):
            for kind in [k for k in args.kinds.split(",") if k]:
                for phase in ("backlog", "live"):
                    if phase == "backlog":
                        res = e2e_backlog(kind, args.e2e_runs, 8, sql_stats=args.sql_stats)
                    else:
                        res = e2e_live(kind, args.e2e_runs, 8, sql_stats=args.sql_stats)
                    out.setdefault(f"sql_{kind}_{phase}", []).append(res)
                    rate, load = res["runs_per_s"], res["load_1m_after"]
                    print(f"[{kind}] rep {rep + 1} {phase}: {rate} runs/s, load {load}")
                    print_sql_top(f"[{kind}] {phase}", res["sql"])
                    save()
        return 0
    if args.latency_only:
        for rep in range(args.repeat):
            for kind in [k for k in args.kinds.split(",") if k]:  # interleaved, so both see the same load
                res = idle_latency(kind, args.latency_samples)
                out.setdefault(f"latency_{kind}", []).append(res)
                print(f"[{kind}] rep {rep + 1}: idle start latency {json.dumps(res, indent=1)}", flush=True)
                save()
        return 0
    if not args.no_dispatch:
        for _ in range(args.repeat):
            for kind in ("sqlite", "postgres"):  # interleaved, so both see the same load
                out.setdefault(f"dispatch_offers_per_s_{kind}_runs", []).append(
                    round(bench_dispatch_throughput(kind, args.queued, args.claims, args.offers_per_cycle), 1)
                )
        for kind in ("sqlite", "postgres"):
            out[f"dispatch_offers_per_s_{kind}"] = round(
                statistics.median(out[f"dispatch_offers_per_s_{kind}_runs"]), 1
            )
            print(f"dispatch throughput {kind}: {out[f'dispatch_offers_per_s_{kind}']} offers/s", flush=True)
        out["dispatch_offers_per_cycle"] = args.offers_per_cycle
        out["pg_round_trips_per_offer"] = round(
            bench_round_trips(min(args.queued, 1000), 200, args.offers_per_cycle), 2
        )
        print(f"PostgreSQL round trips per offer: {out['pg_round_trips_per_offer']}", flush=True)
        save()
    if args.dispatch_only:
        return 0
    bench_e2e(args, out)
    save()
    if args.extras:
        bench_extras(args, out)
    out["load_1m_end"] = load_1m()
    save()
    return 0


def bench_extras(args: argparse.Namespace, out: dict[str, Any]) -> None:
    for kind in ("sqlite", "postgres"):
        small = statistics.median(bench_dispatch_cost(kind, 1_000, 200) for _ in range(args.repeat))
        large = bench_dispatch_cost(kind, args.backlog, 200)
        out[f"dispatch_once_ms_1k_{kind}"] = round(small, 3)
        out[f"dispatch_once_ms_{args.backlog // 1000}k_{kind}"] = round(large, 3)
        out[f"dispatch_once_ratio_{kind}"] = round(large / small, 2)
        print(
            f"dispatch_once {kind}: 1k {small:.3f} ms, {args.backlog} {large:.3f} ms,"
            f" ratio {large / small:.2f}"
        )
    c50, c99 = bench_cancel_latency(args.latency_samples // 2 or 1)
    out["cancel_latency_ms_p50"], out["cancel_latency_ms_p99"] = round(c50, 2), round(c99, 2)
    print(f"cancel latency (request to process group gone): p50 {c50:.2f} ms, p99 {c99:.2f} ms", flush=True)
    writes, rows = bench_cancel_writes(args.repeat)
    out["cancel_sqlite_write_transactions"], out["cancel_sqlite_rows_changed"] = writes, rows
    print(f"per cancellation on SQLite: {writes} write transactions, {rows} rows changed", flush=True)
    idle, loaded, hwm = bench_rss(args.backlog)
    out.update(
        rss_idle_mb=round(idle / 1024, 1),
        rss_backlog_mb=round(loaded / 1024, 1),
        rss_hwm_mb=round(hwm / 1024, 1),
    )
    print(
        f"RSS: idle {idle / 1024:.1f} MB, with {args.backlog} queued {loaded / 1024:.1f} MB"
        f" (peak {hwm / 1024:.1f})"
    )


if __name__ == "__main__":
    raise SystemExit(main())
