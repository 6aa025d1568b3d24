"""SQLite adapter: WAL, one connection per thread, BEGIN IMMEDIATE writes, bounded busy retry."""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ql3.domain.errors import Conflict, ReadOnlyTransaction, StorageBusy, StorageUnavailable
from ql3.ports.storage import Params, Row, Transaction
from ql3.storage.migrations import MigrationState, chain, verify_applied
from ql3.storage.notify import LocalNotifier
from ql3.storage.queries import catalogue

T = TypeVar("T")
Clock = Callable[[], int]
MAX_BUSY_RETRIES = 8
WAL_AUTOCHECKPOINT_PAGES = 10_000


def system_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc)
    return "locked" in text or "busy" in text


def _as_dict(row: sqlite3.Row) -> Row:
    """A row as a dict. Not ``dict(row)``: that looks every column up by name, and ``sqlite3.Row``
    finds a name by comparing it with each column's in turn, so a row of n columns costs n*n/2
    comparisons (about 10x the time of this for the 66 columns of ``fence_lock``)."""
    return dict(zip(row.keys(), row, strict=True))


def _as_dicts(rows: list[sqlite3.Row]) -> list[Row]:
    if not rows:
        return []
    names = rows[0].keys()
    return [dict(zip(names, row, strict=True)) for row in rows]


class SqliteTransaction:
    dialect = "sqlite"

    def __init__(self, conn: sqlite3.Connection, clock: Clock, queries: dict[str, str]) -> None:
        self._conn = conn
        self._clock = clock
        self._queries = queries
        self._now: int | None = None
        self.channels: set[str] = set()

    def now_ms(self) -> int:
        if self._now is None:
            self._now = self._clock()
        return self._now

    def _exec(self, query: str, params: Params | None) -> sqlite3.Cursor:
        sql = self._queries[query]
        try:
            return self._conn.execute(sql, dict(params or {}))
        except sqlite3.IntegrityError as exc:
            raise Conflict("a uniqueness or integrity rule rejected the write", query=query) from exc
        except sqlite3.OperationalError as exc:
            if "readonly" in str(exc).lower():  # PRAGMA query_only: a write in a write=False unit
                raise ReadOnlyTransaction(query=query) from exc
            raise

    def one(self, query: str, params: Params | None = None) -> Row | None:
        row = self._exec(query, params).fetchone()
        return _as_dict(row) if row is not None else None

    def all(self, query: str, params: Params | None = None) -> list[Row]:
        return _as_dicts(self._exec(query, params).fetchall())

    def run(self, query: str, params: Params | None = None) -> int:
        return self._exec(query, params).rowcount

    def notify(self, channel: str) -> None:
        self.channels.add(channel)

    def savepoint(self, fn: Callable[[Transaction], T]) -> T:
        """``ports.storage.Savepoints``: ``fn`` inside ``SAVEPOINT``, undone alone when it raises."""
        self._conn.execute("SAVEPOINT ql3_step")
        try:
            result = fn(self)
        except BaseException:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK TO ql3_step")
                self._conn.execute("RELEASE ql3_step")
            raise
        self._conn.execute("RELEASE ql3_step")
        return result


class SqliteDatabase:
    """The embedded database of the edge and standalone profiles."""

    dialect = "sqlite"

    def online_backup(self, target: Path) -> int:
        """A consistent copy of this database at ``target`` while it is in use (``backup.online_backup``:
        SQLite's online backup API, checked); returns the copy's schema version."""
        from ql3.storage.sqlite import backup

        return backup.online_backup(Path(self.path), target)

    def __init__(self, path: str | Path, *, clock: Clock | None = None, busy_timeout_ms: int = 5000) -> None:
        self.path = str(path)
        self.clock: Clock = clock or system_clock_ms
        self._busy_timeout_ms = busy_timeout_ms
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        self._queries = catalogue("sqlite")
        self.notifier = LocalNotifier()
        # Writers of this process queue on a lock instead of on SQLITE_BUSY, whose busy handler
        # sleeps in coarse steps; busy_timeout then only arbitrates between processes.
        self._write_lock = threading.Lock()
        self._writer: sqlite3.Connection | None = None
        self._writer_thread: int | None = None  # the thread inside a write unit, under _write_lock

    def _open(self, *, read: bool) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=0.0)
        except sqlite3.Error as exc:
            raise StorageUnavailable() from exc
        try:
            self._configure(conn, read=read)
        except sqlite3.Error as exc:  # e.g. the WAL cannot be made on a full disk: transient, not a crash
            conn.close()
            raise StorageUnavailable() from exc
        with self._all_lock:
            self._all.append(conn)
        return conn

    def _configure(self, conn: sqlite3.Connection, *, read: bool) -> None:
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_ms)}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        # A checkpoint (run by the commit that finds the WAL past this many pages) copies the WAL into
        # the database and syncs both while the write lock is held: at 10,000 pages (the default is
        # 1,000) a page written by many units is copied once per checkpoint, not once per 1,000 pages,
        # and the syncs are a tenth as frequent. Durability is unchanged: a commit is in the WAL.
        conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES}")
        conn.execute("PRAGMA foreign_keys = ON")
        if read:  # a read-only unit really is one: SQLite refuses every write on this connection
            conn.execute("PRAGMA query_only = ON")

    def _conn(self, *, read: bool = False) -> sqlite3.Connection:
        """This thread's connection: the one its write unit holds, if it is inside one (so a statement
        outside the catalogue, ``raw``, belongs to that unit as it always did); else its own, or
        (``read``) its own read-only connection, opened with ``PRAGMA query_only`` once, so a read
        unit costs no PRAGMA statement to enter and leave."""
        if not read and self._writer_thread == threading.get_ident():
            assert self._writer is not None
            return self._writer
        attr = "read_conn" if read else "conn"
        conn: sqlite3.Connection | None = getattr(self._local, attr, None)
        if conn is None:
            conn = self._open(read=read)
            setattr(self._local, attr, conn)
        return conn

    def _write_conn(self) -> sqlite3.Connection:
        """The process's one write connection, shared by every thread's write units (the caller holds
        ``_write_lock``). Its page cache stays valid from one write unit to the next: SQLite empties
        a connection's cache whenever another connection wrote since its last transaction, and with a
        writer per thread every unit read its pages again (from the database file and the WAL)."""
        if self._writer is None:
            self._writer = self._open(read=False)
        return self._writer

    def transaction(self, fn: Callable[[Transaction], T], *, write: bool = True) -> T:
        if write:
            with self._write_lock:
                conn = self._write_conn()
                self._writer_thread = threading.get_ident()
                try:
                    return self._transaction(fn, conn, write=True)
                finally:
                    self._writer_thread = None
        return self._transaction(fn, self._conn(read=True), write=False)

    def _transaction(self, fn: Callable[[Transaction], T], conn: sqlite3.Connection, *, write: bool) -> T:
        for attempt in range(MAX_BUSY_RETRIES):
            tx = SqliteTransaction(conn, self.clock, self._queries)
            try:
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    result = fn(tx)
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            except sqlite3.OperationalError as exc:
                if _is_busy(exc) and attempt + 1 < MAX_BUSY_RETRIES:
                    time.sleep(min(0.2, 0.005 * 2**attempt) * (0.5 + random.random()))
                    continue
                if _is_busy(exc):
                    raise StorageBusy() from exc
                raise StorageUnavailable() from exc
            for channel in tx.channels:
                self.notifier.notify(channel)
            return result
        raise StorageBusy()

    def wait_for(self, channel: str, timeout_s: float) -> bool:
        return self.notifier.wait(channel, timeout_s)

    def close(self) -> None:
        with self._all_lock:
            for conn in self._all:
                try:
                    conn.close()
                except sqlite3.Error:
                    pass
            self._all.clear()
        self._local = threading.local()
        self._writer = None

    # -- schema ---------------------------------------------------------------------------------

    def _applied(self, conn: sqlite3.Connection) -> dict[int, tuple[str, str, int]]:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS ql3_schema_migrations (version INTEGER PRIMARY KEY,"
            " name TEXT NOT NULL,"
            " checksum TEXT NOT NULL, applied_at_ms INTEGER NOT NULL)"
        )
        rows = conn.execute(
            "SELECT version, name, checksum, applied_at_ms FROM ql3_schema_migrations"
        ).fetchall()
        return {int(r[0]): (str(r[1]), str(r[2]), int(r[3])) for r in rows}

    def migrate(self) -> list[int]:
        """Apply pending migrations, each atomically; refuse edited or unknown applied ones."""
        conn = self._conn()
        applied_now: list[int] = []
        applied = self._applied(conn)
        for migration in verify_applied("sqlite", {v: c for v, (_, c, _) in applied.items()}):
            record = (
                "INSERT INTO ql3_schema_migrations (version, name, checksum, applied_at_ms) VALUES "
                f"({migration.version}, '{migration.name}', '{migration.checksum}', {system_clock_ms()});"
            )
            try:
                conn.executescript("BEGIN IMMEDIATE;\n" + migration.sql + "\n" + record + "\nCOMMIT;")
            except sqlite3.Error:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            applied_now.append(migration.version)
        return applied_now

    def migration_status(self) -> list[MigrationState]:
        applied = self._applied(self._conn())
        verify_applied("sqlite", {v: c for v, (_, c, _) in applied.items()})
        return [
            MigrationState(
                version=m.version,
                name=m.name,
                applied=m.version in applied,
                applied_at_ms=applied[m.version][2] if m.version in applied else None,
            )
            for m in chain("sqlite")
        ]

    def schema_snapshot(self) -> str:
        """Normalised DDL of every ql3 object, for the committed snapshot test."""
        rows = (
            self._conn()
            .execute(
                "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL "
                "AND name NOT LIKE 'sqlite_%' AND name != 'ql3_schema_migrations' ORDER BY type, name"
            )
            .fetchall()
        )
        return "\n".join(f"{' '.join(str(r[2]).split())};" for r in rows) + "\n"

    def columns(self) -> dict[str, list[str]]:
        conn = self._conn()
        tables = [
            str(r[0])
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
            )
        ]
        return {t: sorted(str(c[1]) for c in conn.execute(f'PRAGMA table_info("{t}")')) for t in tables}

    def raw(self, sql: str, params: tuple[Any, ...] = ()) -> list[Row]:
        """Test and tooling escape hatch: one statement outside the catalogue."""
        return _as_dicts(self._conn().execute(sql, params).fetchall())
