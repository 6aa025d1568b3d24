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


def bench_dispatch_throughput(kind: str, queued: int, claims: int) -> float:
    with database(kind) as db:
        seed(db, queued)
        d = RunDispatcher(
            db, lease_secret=b"b" * 32, budget=DispatchBudget(lease_ms=600_000), incarnation_started_ms=0
        )
        start = time.perf_counter()
        done = 0
        deadline = start + PHASE_TIMEOUT_S
        while done < claims and time.perf_counter() < deadline:
            if d.dispatch_once().offer is not None:
                done += 1
        return done / (time.perf_counter() - start)


def bench_round_trips(queued: int, claims: int) -> float:
    """Mean PostgreSQL round trips (pool checks included) per dispatch_once() that makes an offer."""
    with database("postgres") as db:
        seed(db, queued)
        d = RunDispatcher(
            db, lease_secret=b"b" * 32, budget=DispatchBudget(lease_ms=600_000), incarnation_started_ms=0
        )
        d.dispatch_once()  # warm the spec cache and the recovery walk
        with count_round_trips() as counter:
            offers = sum(1 for _ in range(claims) if d.dispatch_once().offer is not None)
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

    def transaction(self, fn: Any, *, write: bool = True) -> Any:
        conn = self._conn()
        before = conn.total_changes
        result = super().transaction(fn, write=write)
        if write:
            type(self).writes += 1
        type(self).rows += conn.total_changes - before
        return result


def bench_cancel_writes(repeat: int) -> tuple[float, float]:
    """(write transactions, rows changed) on SQLite from the cancel request to the run being cancelled."""
    from ql3.application import cancellation
    from ql3.bootstrap import build_standalone_runtime

    figures: list[tuple[int, int]] = []
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        db = _CountingSqlite(home / "ql3.db")
        db.migrate()
        project = db.transaction(auth.bootstrap_owner).project
        task = db.transaction(lambda tx: tasks.create_task(tx, project.id, "s", {"command": "sleep 60"})).task
        runtime = build_standalone_runtime(db, home)
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


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--e2e-runs", type=int, default=2000)
    parser.add_argument("--latency-samples", type=int, default=50)
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--dispatch-only",
        action="store_true",
        help="only the dispatch parts (throughput, round trips per offer on PostgreSQL, dispatch_once cost)",
    )
    parser.add_argument("--claims", type=int, default=2000, help="offers per throughput repetition")
    args = parser.parse_args()
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "nproc": os.cpu_count()}
    for _ in range(args.repeat):
        for kind in ("sqlite", "postgres"):  # interleaved, so both see the same load
            out.setdefault(f"dispatch_offers_per_s_{kind}_runs", []).append(
                round(bench_dispatch_throughput(kind, args.queued, args.claims), 1)
            )
    for kind in ("sqlite", "postgres"):
        out[f"dispatch_offers_per_s_{kind}"] = statistics.median(out[f"dispatch_offers_per_s_{kind}_runs"])
        print(f"dispatch throughput {kind}: {out[f'dispatch_offers_per_s_{kind}']} offers/s", flush=True)
    out["pg_round_trips_per_offer"] = round(bench_round_trips(min(args.queued, 1000), 200), 2)
    print(f"PostgreSQL round trips per offer: {out['pg_round_trips_per_offer']}", flush=True)
    if args.dispatch_only:
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(out, indent=2))
        return 0
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
    e2e = [bench_end_to_end(args.e2e_runs, 8) for _ in range(args.repeat)]
    out["end_to_end_runs_per_s"] = round(statistics.median(e2e), 1)
    print(f"end to end (true, ql3 serve, 8 slots): {out['end_to_end_runs_per_s']} runs/s", flush=True)
    p50, p99 = bench_idle_latency(args.latency_samples)
    out["idle_start_latency_ms_p50"], out["idle_start_latency_ms_p99"] = round(p50, 2), round(p99, 2)
    print(f"idle start latency: p50 {p50:.2f} ms, p99 {p99:.2f} ms", flush=True)
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
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
