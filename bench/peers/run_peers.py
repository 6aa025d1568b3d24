"""Side-by-side benchmark of peer task queues: procrastinate, pgqueuer (PostgreSQL) and huey (SQLite).

Run by hand from the repository root, with the peers' own virtual environment::

    bench/setup-peers
    bench/.venv-peers/bin/python bench/peers/run_peers.py --jobs 2000 --repeat 3 \\
        --latency-samples 50 --json bench/results/peers.json

Every peer executes the same job (``subprocess.run(["true"])``, see peer_common.py) with the
same concurrency (2) in a separate worker process started through the library's own CLI.

* throughput: fresh database/queue, enqueue N jobs, start the worker, wall time from just
  before spawning the worker until the last job's end timestamp; jobs/s = N / wall time.
  Median over --repeat repetitions, each on fresh storage with a fresh worker.
* live producer (--live, the default): fresh storage, the worker running and warmed up, then the
  producer enqueues N jobs one call at a time while the worker runs; wall time from the first
  enqueue call to the last job's end.
* cost per job: CPU of the worker process (utime + stime from /proc, and with its reaped children,
  the `true` processes), and on PostgreSQL the peer database's committed transactions
  (pg_stat_database.xact_commit, the producer's included) and the cluster's WAL syncs
  (pg_stat_wal.wal_sync, cluster-wide: other sessions add to it); backlog: the worker's whole life,
  live: the producer's window.
* idle latency: fresh storage, worker running and warmed up, queue empty; one job at a time
  (random 50-150 ms pause between them); latency = job start timestamp (taken inside the job)
  minus the producer's time.time_ns() taken just before the enqueue call. p50/p99 by nearest rank.
* peak RSS: VmHWM from /proc of the worker process plus any long-lived descendant processes
  (the short-lived `true` children are not counted), max over the peer's workers.

Everything talks to 127.0.0.1 or local files only. Every wait is bounded by --phase-timeout;
a peer whose phase fails or times out is reported as failed and the run moves on.
Timing is reported, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, ClassVar, Protocol
from urllib.parse import urlsplit, urlunsplit

from peer_common import (
    CONCURRENCY_ENV,
    DSN_ENV,
    HUEY_DB_ENV,
    RECORD_ENV,
    Record,
    count_records,
    read_records,
)

PEERS_DIR = Path(__file__).resolve().parent
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}
PEER_NAMES = ("procrastinate", "pgqueuer", "huey")
WARMUP_JOBS = 3
STOP_GRACE_S = 15.0
RSS_SAMPLE_EVERY_S = 0.25


class PhaseTimeout(Exception):
    pass


# --------------------------------------------------------------------------------------------
# /proc helpers (no psutil)


def _status_kib(pid: int, key: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return None


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out.extend(int(x) for x in fh.read().split())
        except OSError:
            continue
    return out


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    stack = _children(pid)
    while stack and len(out) < 10_000:
        child = stack.pop()
        out.append(child)
        stack.extend(_children(child))
    return out


class RssTracker:
    """Peak of sum(VmHWM) over the worker and its long-lived descendants.

    A descendant counts only once it has been seen in two consecutive samples, which drops the
    short-lived `true` processes (and the brief fork-before-exec state, whose counters would
    otherwise duplicate the parent's).
    """

    def __init__(self, root_pid: int) -> None:
        self.root_pid = root_pid
        self.peak_kib = 0
        self._seen: set[int] = set()
        self._hwm: dict[int, int] = {}

    def sample(self) -> None:
        root = _status_kib(self.root_pid, "VmHWM")
        if root is None:
            return
        self._hwm[self.root_pid] = max(self._hwm.get(self.root_pid, 0), root)
        current = {p for p in _descendants(self.root_pid) if _comm(p) != "true"}
        for pid in current & self._seen:
            hwm = _status_kib(pid, "VmHWM")
            if hwm is not None:
                self._hwm[pid] = max(self._hwm.get(pid, 0), hwm)
        self._seen = current
        self.peak_kib = max(self.peak_kib, sum(self._hwm.values()))


# --------------------------------------------------------------------------------------------
# worker process


class Worker:
    started: ClassVar[list[Worker]] = []  # every worker this run spawned, for the final clean-up

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.argv = argv
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.spawn_ns = 0
        self.rss: RssTracker | None = None
        self._last_rss = 0.0

    def start(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
        try:
            self.spawn_ns = time.time_ns()
            self.proc = subprocess.Popen(
                self.argv,
                cwd=PEERS_DIR,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()
        Worker.started.append(self)
        self.rss = RssTracker(self.proc.pid)

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"worker exited early with code {self.proc.returncode}: {self.log_tail()}")

    def maybe_sample_rss(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.rss is not None and (force or now - self._last_rss >= RSS_SAMPLE_EVERY_S):
            self._last_rss = now
            self.rss.sample()

    async def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        self.maybe_sample_rss(force=True)
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + STOP_GRACE_S
        while proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self.kill()

    def kill(self) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        else:
            # The worker is gone; still reap anything left in its session (our own process group).
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

    def log_tail(self, n: int = 3) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return " | ".join(lines[-n:])


# --------------------------------------------------------------------------------------------
# peers


class Session(Protocol):
    """One fresh queue (database or SQLite file) with an open producer connection."""

    async def enqueue_many(self, tags: Sequence[int]) -> None: ...

    async def enqueue_one(self, tag: int) -> None: ...

    def worker_argv(self) -> list[str]: ...

    def worker_env(self) -> dict[str, str]: ...


@dataclass
class Settings:
    pg_url: str
    concurrency: int
    huey_delay: float
    huey_max_delay: float
    pgqueuer_driver: str
    pgqueuer_limit: str
    workdir: Path


def _with_db(pg_url: str, dbname: str) -> str:
    parts = urlsplit(pg_url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + dbname, parts.query, ""))


def _base_env(settings: Settings, record_file: Path) -> dict[str, str]:
    env = dict(os.environ)
    env[RECORD_ENV] = str(record_file)
    env[CONCURRENCY_ENV] = str(settings.concurrency)
    env["PYTHONPATH"] = str(PEERS_DIR)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@contextlib.asynccontextmanager
async def fresh_pg_database(settings: Settings, label: str) -> AsyncIterator[str]:
    import psycopg

    dbname = f"ql3_bench_{label}_{os.getpid()}"
    admin_dsn = _with_db(settings.pg_url, "postgres")
    with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=10) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{dbname}"')
    try:
        yield _with_db(settings.pg_url, dbname)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=10) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


class ProcrastinateSession:
    def __init__(self, settings: Settings, dsn: str, record_file: Path, app: Any) -> None:
        self.settings = settings
        self.dsn = dsn
        self.record_file = record_file
        self.app = app
        self.task = app.tasks["run_true"]

    async def enqueue_many(self, tags: Sequence[int]) -> None:
        chunk = 500
        for i in range(0, len(tags), chunk):
            await self.task.batch_defer_async(*({"tag": t} for t in tags[i : i + chunk]))

    async def enqueue_one(self, tag: int) -> None:
        await self.task.defer_async(tag=tag)

    def worker_argv(self) -> list[str]:
        return [
            sys.executable, "-m", "procrastinate", "--app", "app_procrastinate.app", "--log-level", "warning",
            "worker", "--concurrency", str(self.settings.concurrency),
        ]  # fmt: skip

    def worker_env(self) -> dict[str, str]:
        env = _base_env(self.settings, self.record_file)
        env[DSN_ENV] = self.dsn
        return env


@contextlib.asynccontextmanager
async def procrastinate_session(settings: Settings, record_file: Path) -> AsyncIterator[Session]:
    import app_procrastinate

    async with fresh_pg_database(settings, "procrastinate") as dsn:
        app = app_procrastinate.make_app(dsn)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            yield ProcrastinateSession(settings, dsn, record_file, app)


class PgqueuerSession:
    def __init__(self, settings: Settings, dsn: str, record_file: Path, queries: Any) -> None:
        self.settings = settings
        self.dsn = dsn
        self.record_file = record_file
        self.queries = queries

    async def enqueue_many(self, tags: Sequence[int]) -> None:
        chunk = 500
        for i in range(0, len(tags), chunk):
            part = tags[i : i + chunk]
            await self.queries.enqueue(
                ["run_true"] * len(part), [str(t).encode() for t in part], [0] * len(part)
            )

    async def enqueue_one(self, tag: int) -> None:
        await self.queries.enqueue("run_true", str(tag).encode())

    def worker_argv(self) -> list[str]:
        # == `pgq run app_pgqueuer:create_pgqueuer` (whose CLI is broken in 1.6.0, see app_pgqueuer.main)
        return [sys.executable, "-m", "app_pgqueuer"]

    def worker_env(self) -> dict[str, str]:
        env = _base_env(self.settings, self.record_file)
        env[DSN_ENV] = self.dsn
        env["BENCH_PGQ_DRIVER"] = self.settings.pgqueuer_driver
        env["BENCH_PGQ_LIMIT"] = self.settings.pgqueuer_limit
        return env


@contextlib.asynccontextmanager
async def pgqueuer_session(settings: Settings, record_file: Path) -> AsyncIterator[Session]:
    import app_pgqueuer
    from pgqueuer import Queries

    async with (
        fresh_pg_database(settings, "pgqueuer") as dsn,
        app_pgqueuer.open_driver(dsn, settings.pgqueuer_driver) as driver,
    ):
        queries = Queries(driver)
        await queries.install()
        yield PgqueuerSession(settings, dsn, record_file, queries)


class HueySession:
    def __init__(self, settings: Settings, db_path: Path, record_file: Path, task: Any) -> None:
        self.settings = settings
        self.db_path = db_path
        self.record_file = record_file
        self.task = task

    async def enqueue_many(self, tags: Sequence[int]) -> None:
        for i, t in enumerate(tags):
            self.task(t)  # calling a huey task enqueues it
            if i % 100 == 99:
                await asyncio.sleep(0)  # let a phase timeout cancel us

    async def enqueue_one(self, tag: int) -> None:
        self.task(tag)

    def worker_argv(self) -> list[str]:
        return [
            sys.executable, "-m", "huey.bin.huey_consumer", "app_huey.huey",
            "--worker-type", "thread", "--workers", str(self.settings.concurrency),
            "--delay", str(self.settings.huey_delay), "--max-delay", str(self.settings.huey_max_delay),
            "--quiet",
        ]  # fmt: skip

    def worker_env(self) -> dict[str, str]:
        env = _base_env(self.settings, self.record_file)
        env[HUEY_DB_ENV] = str(self.db_path)
        return env


@contextlib.asynccontextmanager
async def huey_session(settings: Settings, record_file: Path) -> AsyncIterator[Session]:
    import app_huey

    db_dir = Path(tempfile.mkdtemp(prefix="huey_", dir=settings.workdir))
    db_path = db_dir / "huey.db"
    try:
        huey, task = app_huey.make_huey(str(db_path))
        try:
            yield HueySession(settings, db_path, record_file, task)
        finally:
            huey.storage.close()
    finally:
        shutil.rmtree(db_dir, ignore_errors=True)


SessionFactory = Callable[[Settings, Path], contextlib.AbstractAsyncContextManager[Session]]
SESSIONS: dict[str, SessionFactory] = {
    "procrastinate": procrastinate_session,
    "pgqueuer": pgqueuer_session,
    "huey": huey_session,
}
STORAGE = {"procrastinate": "PostgreSQL", "pgqueuer": "PostgreSQL", "huey": "SQLite (WAL)"}


# --------------------------------------------------------------------------------------------
# measurements


@dataclass
class ThroughputRun:
    jobs: int
    wall_s: float
    jobs_per_s: float
    startup_s: float
    steady_jobs_per_s: float
    enqueue_s: float
    duplicates: int
    peak_rss_kib: int
    load_1m_after: float
    # PostgreSQL peers: the database's committed transactions from before the enqueue until the
    # worker stopped (pg_stat_database.xact_commit, everything included), per job
    db_transactions_per_job: float | None = None
    mode: str = "backlog"  # or "live": a producer enqueues one job at a time while the worker runs
    cpu_ms_per_job: float | None = None  # the worker process itself (utime + stime)
    cpu_ms_per_job_with_children: float | None = None  # plus its reaped children (the `true`s)
    xact_per_job: float | None = None  # PostgreSQL: pg_stat_database.xact_commit of the peer's database
    wal_sync_per_job: float | None = None  # PostgreSQL: pg_stat_wal.wal_sync (cluster-wide)
    wal_write_per_job: float | None = None


@dataclass
class LatencyResult:
    samples_ms: list[float]
    enqueue_call_ms: list[float]
    p50_ms: float
    p99_ms: float
    max_ms: float
    enqueue_call_p50_ms: float
    peak_rss_kib: int


@dataclass
class PeerResult:
    name: str
    storage: str
    worker_argv: list[str] = field(default_factory=list)
    throughput: list[ThroughputRun] = field(default_factory=list)
    live: list[ThroughputRun] = field(default_factory=list)
    median_jobs_per_s: float | None = None
    median_live_jobs_per_s: float | None = None
    median_steady_jobs_per_s: float | None = None
    median_startup_s: float | None = None
    latency: LatencyResult | None = None
    peak_rss_kib: int | None = None
    errors: list[str] = field(default_factory=list)


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return ordered[rank - 1]


async def wait_for_records(
    worker: Worker, record_file: Path, target: int, deadline: float, poll_s: float
) -> None:
    while count_records(str(record_file)) < target:
        if time.monotonic() > deadline:
            got = count_records(str(record_file))
            raise PhaseTimeout(f"only {got}/{target} jobs recorded before the deadline")
        worker.check_alive()
        worker.maybe_sample_rss()
        await asyncio.sleep(poll_s)


def xact_commits(dsn: str) -> int:
    """The committed transactions of ``dsn``'s database so far (statistics of exited backends and
    of this connection's snapshot included; a live backend flushes its own within a second)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


TICK_MS = 1000.0 / os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid: int) -> tuple[int, int]:
    """(utime + stime, cutime + cstime) of a live process, in clock ticks."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])


def pg_counters(dsn: str | None) -> dict[str, int]:
    """The database's committed transactions and the cluster's WAL syncs / writes (cluster-wide:
    other sessions on the same server add to those). Empty for a SQLite peer."""
    if not dsn:
        return {}
    import psycopg

    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute(
            "SELECT d.xact_commit, w.wal_sync, w.wal_write FROM pg_stat_database d, pg_stat_wal w"
            " WHERE d.datname = current_database()"
        ).fetchone()
    assert row is not None
    # (this connection's own SELECT is a transaction too, counted once per reading: 1 per pair)
    return {"xact": int(row[0]), "wal_sync": int(row[1]), "wal_write": int(row[2])}


def _costs(run: ThroughputRun, cpu0: tuple[int, int], cpu1: tuple[int, int], pg0: dict[str, int],
           pg1: dict[str, int]) -> None:  # fmt: skip
    run.cpu_ms_per_job = round((cpu1[0] - cpu0[0]) * TICK_MS / run.jobs, 3)
    run.cpu_ms_per_job_with_children = round((sum(cpu1) - sum(cpu0)) * TICK_MS / run.jobs, 3)
    if pg0 and pg1:
        run.xact_per_job = round((pg1["xact"] - pg0["xact"] - 1) / run.jobs, 2)
        run.wal_sync_per_job = round((pg1["wal_sync"] - pg0["wal_sync"]) / run.jobs, 2)
        run.wal_write_per_job = round((pg1["wal_write"] - pg0["wal_write"]) / run.jobs, 2)


async def live_rep(
    name: str, settings: Settings, jobs: int, rep: int, timeout_s: float, result: PeerResult
) -> ThroughputRun:
    """The worker runs (warmed up by a few jobs) while a producer enqueues ``jobs`` jobs one call at a
    time; wall time from the first enqueue call to the last job's end. CPU of the worker and the
    database's transactions over that window (the producer's enqueues included), read after the
    worker stopped (PostgreSQL backends flush their statistics when they exit)."""
    record_file = settings.workdir / f"{name}_live{rep}.rec"
    deadline = time.monotonic() + timeout_s
    async with SESSIONS[name](settings, record_file) as session:
        log_path = settings.workdir / f"{name}_live{rep}.log"
        worker = Worker(session.worker_argv(), session.worker_env(), log_path)
        dsn = getattr(session, "dsn", None)
        try:
            worker.start()
            for w in range(WARMUP_JOBS):
                await one_job(session, worker, record_file, -1 - w, deadline)
            await asyncio.sleep(1.2)  # PostgreSQL flushes a backend's statistics at most once a second
            assert worker.proc is not None
            pg0, cpu0 = pg_counters(dsn), cpu_ticks(worker.proc.pid)
            t0_ns = time.time_ns()
            for tag in range(jobs):
                await session.enqueue_one(tag)
                if tag % 50 == 49:
                    worker.check_alive()
                    worker.maybe_sample_rss()
                    await asyncio.sleep(0)
            enqueue_s = (time.time_ns() - t0_ns) / 1e9
            await wait_for_records(worker, record_file, jobs + WARMUP_JOBS, deadline, poll_s=0.02)
            cpu1 = cpu_ticks(worker.proc.pid)
            worker.maybe_sample_rss(force=True)
        finally:
            await worker.stop()
        await asyncio.sleep(0.5)
        pg1 = pg_counters(dsn)
        records = [r for r in read_records(str(record_file)) if r.tag >= 0]
    tags = {r.tag for r in records}
    missing = set(range(jobs)) - tags
    if missing:
        raise RuntimeError(f"{len(missing)} jobs never recorded (e.g. {sorted(missing)[:5]})")
    last_end = max(r.end_ns for r in records)
    first_start = min(r.start_ns for r in records)
    wall_s = (last_end - t0_ns) / 1e9
    steady_s = (last_end - first_start) / 1e9
    run = ThroughputRun(
        jobs=jobs,
        wall_s=wall_s,
        jobs_per_s=jobs / wall_s,
        startup_s=(first_start - t0_ns) / 1e9,
        steady_jobs_per_s=(jobs - 1) / steady_s if steady_s > 0 else float("nan"),
        enqueue_s=enqueue_s,
        duplicates=len(records) - len(tags),
        peak_rss_kib=worker.rss.peak_kib if worker.rss else 0,
        load_1m_after=_load(),
        mode="live",
    )
    _costs(run, cpu0, cpu1, pg0, pg1)
    return run


async def throughput_rep(
    name: str, settings: Settings, jobs: int, rep: int, timeout_s: float, result: PeerResult
) -> ThroughputRun:
    record_file = settings.workdir / f"{name}_tp{rep}.rec"
    deadline = time.monotonic() + timeout_s
    per_job: float | None = None
    async with SESSIONS[name](settings, record_file) as session:
        dsn: str | None = getattr(session, "dsn", None)
        commits_before = xact_commits(dsn) if dsn else 0
        t0 = time.perf_counter()
        await session.enqueue_many(list(range(jobs)))
        enqueue_s = time.perf_counter() - t0
        worker = Worker(session.worker_argv(), session.worker_env(), settings.workdir / f"{name}_tp{rep}.log")
        result.worker_argv = worker.argv
        dsn = getattr(session, "dsn", None)
        await asyncio.sleep(1.2)  # the enqueue's statistics reach pg_stat_database
        pg0 = pg_counters(dsn)
        try:
            worker.start()
            assert worker.proc is not None
            await wait_for_records(worker, record_file, jobs, deadline, poll_s=0.02)
            cpu1 = cpu_ticks(worker.proc.pid)
            worker.maybe_sample_rss(force=True)
        finally:
            await worker.stop()
        await asyncio.sleep(0.5)
        pg1 = pg_counters(dsn)
        records = read_records(str(record_file))
        if dsn:
            await asyncio.sleep(1.0)  # the producer's still-open backend flushes its statistics
            per_job = (xact_commits(dsn) - commits_before) / jobs
    tags = {r.tag for r in records}
    missing = set(range(jobs)) - tags
    if missing:
        raise RuntimeError(f"{len(missing)} jobs never recorded (e.g. {sorted(missing)[:5]})")
    last_end = max(r.end_ns for r in records)
    first_start = min(r.start_ns for r in records)
    wall_s = (last_end - worker.spawn_ns) / 1e9
    steady_s = (last_end - first_start) / 1e9
    run = ThroughputRun(
        jobs=jobs,
        wall_s=wall_s,
        jobs_per_s=jobs / wall_s,
        startup_s=(first_start - worker.spawn_ns) / 1e9,
        steady_jobs_per_s=(jobs - 1) / steady_s if steady_s > 0 else float("nan"),
        enqueue_s=enqueue_s,
        duplicates=len(records) - len(tags),
        peak_rss_kib=worker.rss.peak_kib if worker.rss else 0,
        load_1m_after=_load(),
        db_transactions_per_job=None if per_job is None else round(per_job, 2),
    )
    _costs(run, (0, 0), cpu1, pg0, pg1)  # the worker's whole life: start-up included, like the wall time
    return run


async def one_job(
    session: Session, worker: Worker, record_file: Path, tag: int, deadline: float
) -> tuple[Record, int, int]:
    """Enqueue one job and wait for its record; returns (record, t before enqueue, t after)."""
    before = count_records(str(record_file))
    t_enqueue = time.time_ns()
    await session.enqueue_one(tag)
    t_returned = time.time_ns()
    await wait_for_records(worker, record_file, before + 1, min(deadline, time.monotonic() + 30), 0.002)
    rec = read_records(str(record_file))[before]
    if rec.tag != tag:
        raise RuntimeError(f"expected job {tag}, got {rec.tag}")
    return rec, t_enqueue, t_returned


async def latency_phase(name: str, settings: Settings, samples: int, timeout_s: float) -> LatencyResult:
    record_file = settings.workdir / f"{name}_lat.rec"
    deadline = time.monotonic() + timeout_s
    rng = random.Random(20261130)
    lat_ms: list[float] = []
    call_ms: list[float] = []
    async with SESSIONS[name](settings, record_file) as session:
        worker = Worker(session.worker_argv(), session.worker_env(), settings.workdir / f"{name}_lat.log")
        try:
            worker.start()
            for w in range(WARMUP_JOBS):  # the first one also waits for the worker to come up
                await one_job(session, worker, record_file, -1 - w, deadline)
            for i in range(samples):
                await asyncio.sleep(rng.uniform(0.05, 0.15))  # let the queue go idle again
                rec, t_enqueue, t_returned = await one_job(session, worker, record_file, i, deadline)
                lat_ms.append((rec.start_ns - t_enqueue) / 1e6)
                call_ms.append((t_returned - t_enqueue) / 1e6)
                worker.maybe_sample_rss()
        finally:
            await worker.stop()
    return LatencyResult(
        samples_ms=lat_ms,
        enqueue_call_ms=call_ms,
        p50_ms=percentile(lat_ms, 50),
        p99_ms=percentile(lat_ms, 99),
        max_ms=max(lat_ms),
        enqueue_call_p50_ms=percentile(call_ms, 50),
        peak_rss_kib=worker.rss.peak_kib if worker.rss else 0,
    )


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError | PhaseTimeout):
        return f"timeout: {exc}" if str(exc) else "timeout"
    return f"{type(exc).__name__}: {exc}"


async def run_throughput(
    result: PeerResult, settings: Settings, args: argparse.Namespace, rep: int, mode: str = "backlog"
) -> None:
    name = result.name
    log(f"[{name}] {mode} rep {rep + 1}/{args.repeat}: {args.jobs} jobs (load {_load():.2f})")
    phase = throughput_rep if mode == "backlog" else live_rep
    try:
        run = await asyncio.wait_for(
            phase(name, settings, args.jobs, rep, args.phase_timeout, result),
            timeout=args.phase_timeout + 30,
        )
    except Exception as exc:
        result.errors.append(f"{mode} rep {rep + 1}: {_describe(exc)}")
        log(f"[{name}]   FAILED: {_describe(exc)}")
        if args.verbose:
            traceback.print_exc()
        return
    (result.throughput if mode == "backlog" else result.live).append(run)
    log(
        f"[{name}]   {run.jobs_per_s:8.1f} jobs/s end-to-end (wall {run.wall_s:.2f} s, "
        f"startup {run.startup_s:.2f} s, steady {run.steady_jobs_per_s:.1f} jobs/s, "
        f"enqueue {run.enqueue_s:.2f} s, peak RSS {run.peak_rss_kib / 1024:.1f} MiB, "
        f"CPU {run.cpu_ms_per_job} ms/job, with children {run.cpu_ms_per_job_with_children}, "
        f"xact {run.xact_per_job}/job, wal_sync {run.wal_sync_per_job}/job"
        + (
            ""
            if run.db_transactions_per_job is None
            else f", {run.db_transactions_per_job} db tx/job with the enqueue"
        )
        + ")"
    )


async def run_latency(result: PeerResult, settings: Settings, args: argparse.Namespace) -> None:
    name = result.name
    log(f"[{name}] idle latency: {args.latency_samples} samples (load {_load():.2f})")
    try:
        result.latency = await asyncio.wait_for(
            latency_phase(name, settings, args.latency_samples, args.phase_timeout),
            timeout=args.phase_timeout + 30,
        )
    except Exception as exc:
        result.errors.append(f"latency: {_describe(exc)}")
        log(f"[{name}]   FAILED: {_describe(exc)}")
        if args.verbose:
            traceback.print_exc()
        return
    lat = result.latency
    log(f"[{name}]   p50 {lat.p50_ms:.2f} ms, p99 {lat.p99_ms:.2f} ms, max {lat.max_ms:.2f} ms")


def summarize(result: PeerResult) -> None:
    runs = result.throughput
    if runs:
        result.median_jobs_per_s = statistics.median(r.jobs_per_s for r in runs)
        result.median_steady_jobs_per_s = statistics.median(r.steady_jobs_per_s for r in runs)
        result.median_startup_s = statistics.median(r.startup_s for r in runs)
    if result.live:
        result.median_live_jobs_per_s = statistics.median(r.jobs_per_s for r in result.live)
    peaks = [r.peak_rss_kib for r in [*runs, *result.live]]
    if result.latency is not None:
        peaks.append(result.latency.peak_rss_kib)
    result.peak_rss_kib = max(peaks) if peaks else None


async def run_all(settings: Settings, args: argparse.Namespace) -> list[PeerResult]:
    """Repetitions are interleaved (rep 1 of every peer, then rep 2, ...) so that background load
    on the machine spreads over all peers instead of hitting one of them."""
    results = [PeerResult(name=name, storage=STORAGE[name]) for name in args.peer_list]
    for rep in range(args.repeat):
        for result in results:
            await run_throughput(result, settings, args, rep)
            if args.live:
                await run_throughput(result, settings, args, rep, mode="live")
    if args.latency_samples > 0:
        for result in results:
            await run_latency(result, settings, args)
    for result in results:
        summarize(result)
    return results


def _load() -> float:
    return os.getloadavg()[0]


# --------------------------------------------------------------------------------------------
# reporting


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def machine_info(pg_url: str) -> dict[str, Any]:
    cpu = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_kib = _meminfo_kib("MemTotal")
    pg_version = ""
    with contextlib.suppress(Exception):
        import psycopg

        with psycopg.connect(_with_db(pg_url, "postgres")) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            pg_version = str(row[0]) if row else ""
    packages: dict[str, str] = {}
    for pkg in ("procrastinate", "pgqueuer", "huey", "psycopg", "asyncpg"):
        try:
            packages[pkg] = version(pkg)
        except PackageNotFoundError:
            packages[pkg] = "not installed"
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu,
        "mem_total_gib": round(mem_kib / 1024 / 1024, 1) if mem_kib else None,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "postgresql": pg_version,
        "sqlite": __import__("sqlite3").sqlite_version,
        "packages": packages,
    }


def _meminfo_kib(key: str) -> int | None:
    with contextlib.suppress(OSError), open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return None


def _fmt(value: float | None, spec: str) -> str:
    return "FAILED" if value is None else format(value, spec)


def _median_cost(runs: list[ThroughputRun], *keys: str) -> str:
    cells = []
    for key in keys:
        values = [getattr(r, key) for r in runs if getattr(r, key) is not None]
        cells.append(f"{statistics.median(values):.2f}" if values else "-")
    return " / ".join(cells)


def render_table(results: list[PeerResult], args: argparse.Namespace) -> str:
    header = (
        "peer",
        "storage",
        f"jobs/s (median of {args.repeat})",
        "per rep",
        "steady jobs/s",
        "startup s",
        "idle p50 ms",
        "idle p99 ms",
        "enqueue call p50 ms",
        "peak RSS MiB",
        "live jobs/s",
        "CPU ms/job (live, +children)",
        "xact/job (live)",
        "wal_sync/job (live)",
    )
    rows: list[tuple[str, ...]] = [header]
    for r in results:
        if r.latency is not None:
            lat_p50, lat_p99 = f"{r.latency.p50_ms:.2f}", f"{r.latency.p99_ms:.2f}"
            call_p50 = f"{r.latency.enqueue_call_p50_ms:.2f}"
        else:
            lat_p50 = lat_p99 = call_p50 = "-" if args.latency_samples == 0 else "FAILED"
        rows.append(
            (
                r.name,
                r.storage,
                _fmt(r.median_jobs_per_s, ".1f"),
                ", ".join(f"{t.jobs_per_s:.1f}" for t in r.throughput) or "-",
                _fmt(r.median_steady_jobs_per_s, ".1f"),
                _fmt(r.median_startup_s, ".2f"),
                lat_p50,
                lat_p99,
                call_p50,
                _fmt(r.peak_rss_kib / 1024 if r.peak_rss_kib else None, ".1f"),
                _fmt(r.median_live_jobs_per_s, ".1f") if args.live else "-",
                _median_cost(r.live, "cpu_ms_per_job", "cpu_ms_per_job_with_children"),
                _median_cost(r.live, "xact_per_job"),
                _median_cost(r.live, "wal_sync_per_job"),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for r in results:
        for err in r.errors:
            lines.append(f"! {r.name}: {err}")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=2000, help="jobs per throughput repetition")
    p.add_argument("--repeat", type=int, default=3, help="throughput repetitions per peer")
    p.add_argument("--latency-samples", type=int, default=50, help="idle enqueue->start samples (0: skip)")
    p.add_argument(
        "--peers", default=",".join(PEER_NAMES), help="comma-separated subset of " + ", ".join(PEER_NAMES)
    )
    p.add_argument("--concurrency", type=int, default=2, help="worker concurrency for every peer")
    p.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432", help="server URL, no database")
    p.add_argument("--phase-timeout", type=float, default=300.0, help="hard limit per phase, seconds")
    p.add_argument(
        "--huey-delay", type=float, default=0.01, help="huey consumer --delay (initial poll interval)"
    )
    p.add_argument("--huey-max-delay", type=float, default=0.1, help="huey consumer --max-delay")
    p.add_argument(
        "--pgqueuer-driver", choices=("asyncpg", "psycopg"), default="asyncpg", help="pgqueuer's driver"
    )
    p.add_argument(
        "--pgqueuer-limit",
        choices=("entrypoint", "worker", "semaphore"),
        default="worker",
        help="how pgqueuer's concurrency is capped (see app_pgqueuer.py)",
    )
    p.add_argument(
        "--live",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also a live-producer repetition after each backlog one (jobs enqueued one by one while the"
        " worker runs)",
    )
    p.add_argument("--json", type=Path, help="write full results (raw samples included) here")
    p.add_argument("--keep-workdir", action="store_true", help="keep worker logs and record files")
    p.add_argument("-v", "--verbose", action="store_true", help="print tracebacks of failures")
    args = p.parse_args(argv)
    peers = [x.strip() for x in args.peers.split(",") if x.strip()]
    unknown = [x for x in peers if x not in PEER_NAMES]
    if unknown:
        p.error(f"unknown peers: {', '.join(unknown)}")
    args.peer_list = peers
    host = urlsplit(args.pg_url).hostname or ""
    if host not in LOOPBACK_HOSTS:
        p.error(f"--pg-url must point at a loopback address, got {host!r}")
    if args.jobs < 1 or args.repeat < 1 or args.concurrency < 1 or args.latency_samples < 0:
        p.error("--jobs, --repeat and --concurrency must be >= 1, --latency-samples >= 0")
    return args


async def amain(args: argparse.Namespace) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="ql3_bench_peers_"))
    settings = Settings(
        pg_url=args.pg_url,
        concurrency=args.concurrency,
        huey_delay=args.huey_delay,
        huey_max_delay=args.huey_max_delay,
        pgqueuer_driver=args.pgqueuer_driver,
        pgqueuer_limit=args.pgqueuer_limit,
        workdir=workdir,
    )
    started = time.time()
    load_before = os.getloadavg()
    try:
        results = await run_all(settings, args)
    finally:
        for worker in Worker.started:  # normally all stopped already; this only catches leftovers
            worker.kill()
        if args.keep_workdir:
            log(f"worker logs and record files kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    table = render_table(results, args)
    print(table)
    if args.json:
        payload = {
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
            "duration_s": round(time.time() - started, 1),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "params": {
                "jobs": args.jobs,
                "repeat": args.repeat,
                "latency_samples": args.latency_samples,
                "concurrency": args.concurrency,
                "huey_delay": args.huey_delay,
                "huey_max_delay": args.huey_max_delay,
                "pgqueuer_driver": args.pgqueuer_driver,
                "pgqueuer_limit": args.pgqueuer_limit,
                "phase_timeout": args.phase_timeout,
                "live": args.live,
            },
            "machine": machine_info(args.pg_url),
            "peers": [asdict(r) for r in results],
            "table": table,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
        log(f"wrote {args.json}")
    return 0 if all(not r.errors for r in results) else 1


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(amain(parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
