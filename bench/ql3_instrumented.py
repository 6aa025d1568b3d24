"""``ql3 serve`` with counters (and optionally a profiler), for the benchmarks only; never shipped.

    python bench/ql3_instrumented.py STATS.json [--profile OUT.pstats] [--stages] [--sql-stats] -- serve ...

Counts, from inside the server process, without strace:

- control-plane transactions: every committed ``SqliteDatabase.transaction`` (write and read
  units apart) or ``PostgresDatabase.transaction``;
- SQLite commits per database file (``ql3.db``, the worker journal), seen by a ``sqlite3.connect``
  factory that counts the ``COMMIT`` statements the adapters execute;
- SQLite commits made with ``synchronous = FULL`` (the journal's crash barrier): in WAL mode each is
  one fsync of the WAL; commits with ``synchronous = NORMAL`` do not fsync (only a checkpoint does,
  which this does not count);
- ``os.fsync`` calls made from Python (receipts, directories).

With ``--stages`` it also records, for the idle-latency breakdown, the wall-clock instant
(``time.time_ns()``) of each stage of a run's way to its spawn: the API's ``create_run``, every
``runs`` notification, the dispatcher's ``dispatch_once`` (entry, and exit with an offer), the
intake's ``receive``, the lease check, the journal's ``accepted``, the starting ACK, the
``launching`` barrier and the spawn (the bench pairs them with each sample's send time and the
command's own ``date +%s%N``). The last 4,096 events go to STATS.json under ``stages``.

With ``--sql-stats`` it also counts and times every statement: on SQLite each distinct SQL text
executed on a connection (the control plane's ``ql3.db`` and the worker journal apart, PRAGMAs,
BEGIN and COMMIT included), the wall time of its ``execute`` call (which runs the statement to its
first row); on PostgreSQL each named query of the catalogue, the ``BEGIN`` pipeline and the
``COMMIT`` pipeline, with the wall time of its round trip. They go to STATS.json under ``sql`` as
``{"<database>|<statement>": [count, total_ns]}``; ``bench/ql3_bench.py --sql-stats`` prints the
top of each window per run.

The counters are written to STATS.json on every SIGUSR1 (a snapshot: the benchmark takes one before
and one after its measured window) and at exit (SIGTERM shuts ``ql3 serve`` down cleanly). With
``--profile`` every thread runs under ``cProfile`` with a CPU-time timer (``time.thread_time``),
and the merged statistics are dumped at exit.
"""

from __future__ import annotations

import atexit
import collections
import cProfile
import json
import os
import signal
import sqlite3
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

COUNTS: Counter[str] = Counter()
_LOCK = threading.Lock()
STAGES: collections.deque[tuple[str, int]] = collections.deque(maxlen=4096)
SQL: dict[str, list[int]] = {}
SQL_STATS = False


def _sql(key: str, ns: int) -> None:
    with _LOCK:
        entry = SQL.get(key)
        if entry is None:
            SQL[key] = [1, ns]
        else:
            entry[0] += 1
            entry[1] += ns


def _stage(name: str) -> None:
    STAGES.append((name, time.time_ns()))


def _timed(cls: Any, method: str, before: str | None, after: str | None, when: Any = None) -> None:
    """Wrap ``cls.method`` to record ``before`` at its entry and ``after`` at its return (when
    ``when(args, kwargs, result)`` holds)."""
    real = getattr(cls, method)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if before is not None and (when is None or when(args, kwargs, None)):
            _stage(before)
        result = real(*args, **kwargs)
        if after is not None and (when is None or when(args, kwargs, result)):
            _stage(after)
        return result

    setattr(cls, method, wrapper)


def _install_stages() -> None:
    from ql3.application import auth, runs
    from ql3.application.dispatcher import RunDispatcher
    from ql3.application.gateway import InProcessControlPlane
    from ql3.execution.launcher import LocalLauncher
    from ql3.storage.notify import LocalNotifier
    from ql3.worker.intake import Intake
    from ql3.worker.journal.store import WorkerJournal

    _timed(auth, "authenticate_use", "api_authenticate", "api_authenticated")
    _timed(auth, "authorize", "api_authorize", None)
    _timed(runs, "create_run", "api_create_run", None)
    _timed(LocalNotifier, "notify", "notify_runs", None, lambda a, k, r: a[1] == "runs")
    real_dispatch = RunDispatcher.dispatch_once

    def dispatch_once(self: Any, max_offers: int | None = None) -> Any:
        _stage("dispatch_start")
        result = real_dispatch(self, max_offers)
        _stage("dispatch_offer" if result.offer is not None else "dispatch_empty")
        return result

    RunDispatcher.dispatch_once = dispatch_once  # type: ignore[method-assign]
    _timed(Intake, "receive", "intake_receive", None)
    _timed(InProcessControlPlane, "lease_status", None, "lease_checked")
    _timed(WorkerJournal, "accept", None, "journal_accepted")
    _timed(InProcessControlPlane, "ack_starting", None, "ack_starting_done")
    launching = lambda a, k, r: k.get("to_state") == "launching"  # noqa: E731
    _timed(WorkerJournal, "advance", None, "journal_launching", launching)
    _timed(LocalLauncher, "start", "spawn_start", "spawn_done")


def _bump(key: str, n: int = 1) -> None:
    with _LOCK:
        COUNTS[key] += n


class _CountingConnection(sqlite3.Connection):
    _label = "other"
    _full = False

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:  # type: ignore[override]
        word = sql.lstrip()[:40].upper()
        if word.startswith("PRAGMA SYNCHRONOUS"):
            self._full = "FULL" in word
        if SQL_STATS:
            t0 = time.perf_counter_ns()
            result = super().execute(sql, *args)
            _sql(f"{self._label}|{' '.join(sql.split())[:160]}", time.perf_counter_ns() - t0)
        else:
            result = super().execute(sql, *args)
        if word.startswith("COMMIT"):
            _bump(f"sqlite_commits_{self._label}")
            if self._full:
                _bump(f"sqlite_full_commits_{self._label}")
        return result


_real_connect = sqlite3.connect


def _connect(database: Any, *args: Any, **kwargs: Any) -> sqlite3.Connection:
    kwargs.setdefault("factory", _CountingConnection)
    conn = _real_connect(database, *args, **kwargs)
    if isinstance(conn, _CountingConnection):
        name = Path(str(database)).name
        conn._label = "journal" if "journal" in name else ("ql3" if name == "ql3.db" else "other")
    return conn


def _install_counters(postgres: bool) -> None:
    sqlite3.connect = _connect  # type: ignore[assignment]
    real_fsync = os.fsync

    def fsync(fd: Any) -> None:
        _bump("python_fsyncs")
        real_fsync(fd)

    os.fsync = fsync

    from ql3.storage.sqlite.adapter import SqliteDatabase

    classes: list[tuple[Any, str]] = [(SqliteDatabase, "sqlite")]
    if postgres:  # imported only then: psycopg and libpq would add about 10 MB to a SQLite server's RSS
        from ql3.storage.postgres.adapter import PostgresDatabase

        classes.append((PostgresDatabase, "postgres"))
    for cls, prefix in classes:
        real = cls.transaction

        def transaction(
            self: Any, fn: Any, *, write: bool = True, _real: Any = real, _p: str = prefix
        ) -> Any:
            result = _real(self, fn, write=write)
            kind = "write" if write else "read"
            _bump(f"{_p}_{kind}_units")
            # and by thread (the loops' threads are named ql3-<loop>), to see who reads while work flows
            _bump(f"{_p}_{kind}_by_thread:{threading.current_thread().name.split('_')[0]}")
            return result

        cls.transaction = transaction  # type: ignore[method-assign]
    if postgres and SQL_STATS:
        _install_pg_statement_stats()


def _install_pg_statement_stats() -> None:
    """Count and time (one round trip each) the named queries, the BEGIN pipeline (with its first
    statement, counted under its own name as well) and the COMMIT pipeline of PostgreSQL units."""
    from ql3.storage.postgres.adapter import PostgresTransaction

    real_exec, real_open, real_commit = (
        PostgresTransaction._exec,
        PostgresTransaction._open,
        PostgresTransaction.commit,
    )

    def _exec(self: Any, query: str, params: Any) -> Any:
        t0 = time.perf_counter_ns()
        try:
            return real_exec(self, query, params)
        finally:
            _sql(f"postgres|{query}", time.perf_counter_ns() - t0)

    def _open(self: Any, query: Any, params: Any) -> Any:
        t0 = time.perf_counter_ns()
        try:
            return real_open(self, query, params)
        finally:
            _sql(f"postgres|(BEGIN pipeline{' + ' + query if query else ''})", time.perf_counter_ns() - t0)

    def commit(self: Any) -> None:
        t0 = time.perf_counter_ns()
        sent = self.round_trips
        try:
            real_commit(self)
        finally:
            if self.round_trips != sent:
                _sql("postgres|(COMMIT pipeline)", time.perf_counter_ns() - t0)

    PostgresTransaction._exec = _exec  # type: ignore[method-assign]
    PostgresTransaction._open = _open  # type: ignore[method-assign]
    PostgresTransaction.commit = commit  # type: ignore[method-assign]


def _thread_cpu() -> dict[str, list[int]]:
    """User and system clock ticks of every live thread, by thread name (several threads of one
    name are summed), read from ``/proc/self/task``: where the server's one core goes, with no
    profiler in the way."""
    out: dict[str, list[int]] = {}
    for thread in threading.enumerate():
        try:
            fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = thread.name.rstrip("0123456789").rstrip("_-") or thread.name
        ticks = out.setdefault(name, [0, 0])
        ticks[0] += int(fields[11])
        ticks[1] += int(fields[12])
    return out


def main() -> int:
    argv = sys.argv[1:]
    stats_path = Path(argv.pop(0))
    profile_path: Path | None = None
    if argv and argv[0] == "--profile":
        argv.pop(0)
        profile_path = Path(argv.pop(0))
    stages = False
    global SQL_STATS
    while argv and argv[0] in ("--stages", "--sql-stats"):
        flag = argv.pop(0)
        stages = stages or flag == "--stages"
        SQL_STATS = SQL_STATS or flag == "--sql-stats"
    if argv and argv[0] == "--":
        argv.pop(0)
    _install_counters(any(a.startswith("postgres") for a in argv))
    if stages:
        _install_stages()
    profiles: list[cProfile.Profile] = []
    if profile_path is not None:

        def start_thread_profile(frame: Any, event: str, arg: Any) -> None:
            profile = cProfile.Profile(time.thread_time)
            with _LOCK:
                profiles.append(profile)
            profile.enable()  # replaces this hook for the new thread

        threading.setprofile(start_thread_profile)
        main_profile = cProfile.Profile(time.thread_time)
        profiles.append(main_profile)
        main_profile.enable()

    def snapshot(*_: Any) -> None:
        with _LOCK:
            extra: dict[str, Any] = {"stages": list(STAGES)} if stages else {}
            if SQL_STATS:
                extra["sql"] = {k: list(v) for k, v in SQL.items()}
            extra["threads"] = _thread_cpu()
            data = json.dumps({**COUNTS, **extra}, sort_keys=True)
        tmp = stats_path.with_suffix(".tmp")
        tmp.write_text(data)
        tmp.replace(stats_path)

    signal.signal(signal.SIGUSR1, snapshot)

    def dump() -> None:
        snapshot()
        if profile_path is not None:
            import pstats

            for profile in profiles:
                profile.disable()
            merged = pstats.Stats(profiles[0])
            for profile in profiles[1:]:
                with _LOCK:
                    try:
                        merged.add(profile)
                    except TypeError:  # a thread that never ran a profiled call
                        continue
            merged.dump_stats(str(profile_path))

    atexit.register(dump)
    from ql3.cli.main import entrypoint

    sys.argv = ["ql3", *argv]
    try:
        entrypoint()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
