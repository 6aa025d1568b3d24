"""PostgreSQL adapter: psycopg 3 with a pool; the database clock is the time authority."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import secrets
import select
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Final, Self, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from ql3.domain.errors import Conflict, ReadOnlyTransaction, StorageBusy, StorageUnavailable
from ql3.ports.storage import Params, Row, Transaction
from ql3.storage.migrations import MigrationState, chain, verify_applied
from ql3.storage.notify import LocalNotifier
from ql3.storage.queries import catalogue

T = TypeVar("T")
log = logging.getLogger("ql3.storage")
MAX_TX_RETRIES = 5
# A database outage (docs/operations.md, "A PostgreSQL outage"). A checkout waits for a pooled
# connection up to CHECKOUT_TIMEOUT_S, in slices of OUTAGE_CHECKOUT_S: once a connection attempt has
# failed (the adapter then knows the database is down), it gives up at the end of the slice, so that
# /readyz and the API answer 503 at once instead of after the whole timeout. The first connection
# made or unit completed clears that state.
CHECKOUT_TIMEOUT_S: Final = 10.0
OUTAGE_CHECKOUT_S: Final = 0.5
# The pool's own reconnection backoff (1 s, then doubling) gives up after this long; the next
# checkout starts a new attempt at once. So no attempt waits more than about 1 s behind a database
# that accepts connections again, whatever the outage's length (psycopg_pool's default, 5 min,
# doubled the wait up to there: the pool came back 56 s after a 200 s outage).
RECONNECT_TIMEOUT_S: Final = 1.0
# A connection attempt to an unreachable host gives up after this long (libpq's minimum), unless the
# database URL or PGCONNECT_TIMEOUT sets connect_timeout; psycopg's own default is 130 s.
CONNECT_TIMEOUT_S: Final = 2
# Statement 5 s, lock 1 s, idle-in-transaction 10 s (docs/contracts.md §7).
_OPTIONS = "-c statement_timeout=5000 -c lock_timeout=1000 -c idle_in_transaction_session_timeout=10000"
_MIGRATION_LOCK = 7_301_114_003
_NOW = b"SELECT ql3_now_ms() AS now"
# The payload names the sending database object (``PostgresDatabase.origin``): its own listener skips
# what it sent, which the commit already posted to the local notifier.
_NOTIFY = b"SELECT pg_notify(%s, %s)"


def _host_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def _hung_up(conn: psycopg.Connection[Row]) -> bool:
    """Whether the server has hung up on an idle pooled connection, seen without a round trip.

    An idle connection that LISTENs to nothing has nothing to read: anything readable is a goodbye
    (the FATAL of a terminated backend, an idle-session timeout) or the end of the stream. The FATAL
    is on the socket before the backend has gone, its end of stream only once the process has
    exited: a unit that only watched for the end of the stream could queue its COMMIT before it
    arrived, and then could not tell whether it committed (docs/dispatch.md, "dispatch on
    PostgreSQL")."""
    if conn.closed or conn.broken:
        return True
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    return bool(poller.poll(0))


class Reachability:
    """Whether the adapter knows the database is down: set by a connection attempt that failed,
    cleared by the first connection made or unit completed. Each change is logged once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._down_since: float | None = None

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def lost(self) -> None:
        with self._lock:
            if self._down_since is not None:
                return
            self._down_since = time.monotonic()
        log.warning("database unreachable", extra={"action": "storage.unreachable"})

    def reached(self) -> None:
        if self._down_since is None:  # the common case, without the lock
            return
        with self._lock:
            since, self._down_since = self._down_since, None
        if since is not None:
            log.warning(
                "database reachable again",
                extra={"action": "storage.reachable", "down_s": round(time.monotonic() - since, 3)},
            )


def _watched_connection(reachability: Reachability) -> type[psycopg.Connection[Row]]:
    """The pool's connection class: every connection attempt the pool makes (at start, to replace a
    broken connection, to grow) tells ``reachability`` whether the database accepted it."""

    class WatchedConnection(psycopg.Connection[Row]):
        __qualname__ = "WatchedConnection"  # as the pool's log lines name it

        @classmethod
        def connect(cls, conninfo: str = "", **kwargs: Any) -> Self:
            try:
                conn = super().connect(conninfo, **kwargs)
            except psycopg.OperationalError:
                reachability.lost()
                raise
            reachability.reached()
            return conn

    return WatchedConnection


def _connect_kwargs(dsn: str) -> dict[str, Any]:
    """``connect_timeout`` when neither the URL nor the environment sets one."""
    if "connect_timeout" in conninfo_to_dict(dsn) or os.environ.get("PGCONNECT_TIMEOUT"):
        return {}
    return {"connect_timeout": CONNECT_TIMEOUT_S}


class PostgresTransaction:
    """One unit of work on a pooled autocommit connection, with the fewest round trips.

    The transaction is opened lazily: ``BEGIN`` (``READ ONLY`` for a read unit), the database clock
    (``ql3_now_ms()``, which reads ``transaction_timestamp()`` and so is the same whenever it is taken
    within the transaction) and the first statement travel in one pipeline, i.e. one round trip.
    The notifications and ``COMMIT`` travel in one more. Statements in between are one round trip
    each and run with psycopg's automatic server-side preparation (``prepare_threshold``).
    """

    dialect = "postgres"

    def __init__(
        self, conn: psycopg.Connection[Row], queries: dict[str, str], *, write: bool, origin: str = ""
    ) -> None:
        self._conn = conn
        self._queries = queries
        self._origin = origin
        self._begin = b"BEGIN" if write else b"BEGIN READ ONLY"
        self._now: int | None = None
        self.begun = False
        self.round_trips = 0
        self.commit_sent = False
        self.channels: set[str] = set()
        # Channels already sent and committed by an early commit (``_then_commit``), posted locally
        # after the unit; those the committing statement sent itself are not sent again by ``notify``.
        self.posted: set[str] = set()
        self._sent_by_last: set[str] = set()

    def _open(self, query: str | None, params: Params | None) -> psycopg.Cursor[Row] | None:
        """BEGIN, the clock and (optionally) the first statement, in one round trip."""
        self._sent_by_last = set()
        self.round_trips += 1
        with self._conn.pipeline():
            self._conn.execute(self._begin)
            self.begun = True
            clock = self._conn.execute(_NOW)
            cur = None if query is None else self._conn.execute(self._queries[query], dict(params or {}))
        row = clock.fetchone()
        assert row is not None
        self._now = int(row["now"])
        return cur

    def now_ms(self) -> int:
        if self._now is None:
            self._open(None, None)
        assert self._now is not None
        return self._now

    def _exec(self, query: str, params: Params | None) -> psycopg.Cursor[Row]:
        try:
            if not self.begun:
                cur = self._open(query, params)
                assert cur is not None
                return cur
            self.round_trips += 1
            return self._conn.execute(self._queries[query], dict(params or {}))
        except pg_errors.IntegrityError as exc:
            raise Conflict("a uniqueness or integrity rule rejected the write", query=query) from exc
        except pg_errors.ReadOnlySqlTransaction as exc:
            raise ReadOnlyTransaction(query=query) from exc

    def one(self, query: str, params: Params | None = None) -> Row | None:
        cur = self._exec(query, params)
        return cur.fetchone() if cur.description else None

    def all(self, query: str, params: Params | None = None) -> list[Row]:
        return self._exec(query, params).fetchall()

    def run(self, query: str, params: Params | None = None) -> int:
        return self._exec(query, params).rowcount

    def notify(self, channel: str) -> None:
        if channel in self._sent_by_last:
            return  # the statement that committed the unit sent it (``one_then_commit``)
        self.channels.add(channel)

    def savepoint(self, fn: Callable[[Transaction], T]) -> T:
        """``ports.storage.Savepoints``: ``fn`` inside ``SAVEPOINT``, undone alone when it raises (a
        failed statement inside leaves the unit usable again). ``fn`` must not end the unit early
        (``one_then_commit``): it is given a transaction that cannot."""
        self.now_ms()  # the unit is open
        self.round_trips += 1
        self._conn.execute(b"SAVEPOINT ql3_step")
        try:
            result = fn(_NoEarlyCommit(self))
        except BaseException:
            if self.begun:
                self.round_trips += 1
                try:
                    self._conn.execute(b"ROLLBACK TO SAVEPOINT ql3_step")
                except psycopg.Error:
                    pass  # the connection broke: the unit fails as a whole with the first error
            raise
        self.round_trips += 1
        self._conn.execute(b"RELEASE SAVEPOINT ql3_step")
        return result

    def one_then_commit(self, query: str, params: Params) -> Row | None:
        """The first row of ``_then_commit``."""
        cur = self._then_commit(query, params)
        row = cur.fetchone() if cur.description else None
        if row is not None and row.get("notified"):
            self._sent_by_last.update(row["notified"])
            self.posted.update(row["notified"])
        return row

    def all_then_commit(self, query: str, params: Params) -> list[Row]:
        """All the rows of ``_then_commit``."""
        return self._then_commit(query, params).fetchall()

    def _then_commit(self, query: str, params: Params) -> psycopg.Cursor[Row]:
        """The unit's last statement and COMMIT in one round trip, with BEGIN and the clock when it
        is also the first, and the NOTIFYs of ``notify`` (see ``ports.storage.CommitsWithStatement``).
        The caller writes nothing after it that must commit together with it: a further statement
        opens a new transaction. A pooled connection the server hung up on is discarded at
        checkout (``_hung_up``); one found broken while the pipeline is queued, before COMMIT is
        marked sent, makes ``PostgresDatabase.transaction`` re-run the unit on a fresh connection;
        once COMMIT was queued, a lost connection is StorageUnavailable and never re-run (the unit
        may have committed)."""
        args = {**params, "origin": self._origin}
        first = not self.begun
        self.round_trips += 1
        try:
            with self._conn.pipeline():
                if first:
                    self._conn.execute(self._begin)
                    self.begun = True
                    clock = self._conn.execute(_NOW)
                cur = self._conn.execute(self._queries[query], args)
                for channel in sorted(self.channels):
                    self._conn.execute(_NOTIFY, (f"ql3_{channel}", self._origin))
                self.commit_sent = True
                self._conn.execute(b"COMMIT")
        except pg_errors.IntegrityError as exc:
            raise Conflict("a uniqueness or integrity rule rejected the write", query=query) from exc
        except pg_errors.ReadOnlySqlTransaction as exc:
            raise ReadOnlyTransaction(query=query) from exc
        if first:
            clock_row = clock.fetchone()
            assert clock_row is not None
            self._now = int(clock_row["now"])  # the committed transaction's clock, until a new one
        # Committed: a further statement of the unit opens a new transaction (with its clock).
        self.begun, self.commit_sent = False, False
        self.posted.update(self.channels)
        self.channels = set()
        self._sent_by_last = set()
        return cur

    def commit(self) -> None:
        """The notifications (delivered by PostgreSQL only at commit) and COMMIT, in one round trip.
        A unit that ran no statement and notifies nothing has nothing to commit."""
        if not self.begun:
            if not self.channels:
                return
            self.now_ms()
        self.round_trips += 1
        with self._conn.pipeline():
            for channel in sorted(self.channels):
                self._conn.execute(_NOTIFY, (f"ql3_{channel}", self._origin))
            self.commit_sent = True
            self._conn.execute(b"COMMIT")

    @property
    def broken(self) -> bool:
        return self._conn.broken

    def rollback(self) -> None:
        """Best effort: a broken connection is discarded by the pool, which also rolls back any
        connection returned inside a transaction."""
        if self.begun and not self._conn.broken:
            with contextlib.suppress(psycopg.Error):
                self._conn.execute(b"ROLLBACK")


class PostgresDatabase:
    """The cluster engine: replicas coordinate only through row locks, CAS and LISTEN/NOTIFY."""

    dialect = "postgres"

    def __init__(
        self,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 8,
        checkout_timeout_s: float = CHECKOUT_TIMEOUT_S,
    ) -> None:
        self.dsn = dsn
        self._queries = catalogue("postgres")
        self.notifier = LocalNotifier()
        # The host clock, for the worker's own timers only: every time this database stores is read from
        # the database's clock inside the transaction (``Transaction.now_ms``).
        self.clock: Callable[[], int] = _host_clock_ms
        # Sent as every NOTIFY's payload. A commit posts its channels to ``notifier`` itself, so the
        # relay skips its own NOTIFYs coming back over LISTEN: without that every local commit woke
        # this process's loops twice (the second time a moment later, for nothing).
        self.origin = secrets.token_hex(8)
        self._listener: threading.Thread | None = None
        self._stop = threading.Event()
        self._max_size = max_size
        self._checkout_timeout_s = checkout_timeout_s
        self._connect_kwargs = _connect_kwargs(dsn)
        self.reachability = Reachability()
        try:
            self.pool: ConnectionPool[psycopg.Connection[Row]] = ConnectionPool(
                dsn,
                connection_class=_watched_connection(self.reachability),
                min_size=min_size,
                max_size=max_size,
                kwargs={
                    "row_factory": dict_row,
                    "autocommit": True,
                    "options": _OPTIONS,
                    **self._connect_kwargs,
                },
                open=True,
                timeout=checkout_timeout_s,
                reconnect_timeout=RECONNECT_TIMEOUT_S,
            )
        except psycopg.Error as exc:
            raise StorageUnavailable() from exc

    def _checkout(self) -> psycopg.Connection[Row]:
        """A pooled connection, waited for in slices of ``OUTAGE_CHECKOUT_S`` up to the checkout
        timeout; StorageUnavailable at the end of the first slice that ends while the database is
        known to be down. Each slice is a new request to the pool, which starts a connection attempt
        at once when it has none and is not already making one: the first checkout after the
        database is back also brings the pool back."""
        deadline = time.monotonic() + self._checkout_timeout_s
        while True:
            wait = min(OUTAGE_CHECKOUT_S, deadline - time.monotonic())
            try:
                return self.pool.getconn(timeout=max(0.001, wait))
            except PoolTimeout as exc:
                if self.reachability.down or time.monotonic() >= deadline:
                    raise StorageUnavailable() from exc

    @contextlib.contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Row]]:
        """``pool.connection()`` with ``_checkout``'s wait."""
        conn = self._checkout()
        try:
            with conn:
                yield conn
        finally:
            self.pool.putconn(conn)

    def transaction(self, fn: Callable[[Transaction], T], *, write: bool = True) -> T:
        # No round trip to check a pooled connection on checkout, only a look at its socket: one
        # the server hung up on is discarded before the unit starts (``_hung_up``). One whose
        # backend dies later fails on the unit's first exchange, before anything of the unit
        # reached the server, and the unit then runs again from scratch on another connection
        # (the pool discards the broken one). Once a statement was answered, or COMMIT was queued,
        # a lost connection is StorageUnavailable: the unit may or may not have committed, so it
        # is never re-run.
        busy_retries = 0
        stale_retries = 0
        while True:
            tx: PostgresTransaction | None = None
            try:
                with self._connection() as conn:
                    if stale_retries < self._max_size and _hung_up(conn):
                        stale_retries += 1
                        conn.close()  # the pool discards a closed connection and opens another
                        continue
                    tx = PostgresTransaction(conn, self._queries, write=write, origin=self.origin)
                    try:
                        result = fn(tx)
                        tx.commit()
                    except BaseException:
                        tx.rollback()
                        raise
                self.reachability.reached()
                for channel in tx.channels | tx.posted:
                    self.notifier.notify(channel)
                return result
            except (pg_errors.SerializationFailure, pg_errors.DeadlockDetected) as exc:
                busy_retries += 1
                if busy_retries >= MAX_TX_RETRIES:
                    raise StorageBusy() from exc
                time.sleep(min(0.2, 0.005 * 2 ** (busy_retries - 1)) * (0.5 + random.random()))
            except (pg_errors.LockNotAvailable, pg_errors.QueryCanceled) as exc:
                raise StorageBusy() from exc
            except psycopg.OperationalError as exc:
                stale = tx is not None and tx.broken and tx.round_trips <= 1 and not tx.commit_sent
                if stale and stale_retries < self._max_size:
                    stale_retries += 1
                    continue
                raise StorageUnavailable() from exc

    def start_listening(self, channels: list[str]) -> None:
        """Relay NOTIFYs from other replicas into the local notifier (one thread, blocking); our own
        come back too and are skipped (their commit notified locally already)."""
        if self._listener is not None:
            return

        def listen() -> None:
            while not self._stop.is_set():
                try:
                    with psycopg.connect(self.dsn, autocommit=True, **self._connect_kwargs) as conn:
                        for channel in channels:
                            conn.execute(f"LISTEN ql3_{channel}")  # channel names are internal constants
                        while not self._stop.is_set():
                            for note in conn.notifies(timeout=1.0):
                                if note.payload != self.origin:
                                    self.notifier.notify(note.channel.removeprefix("ql3_"))
                except psycopg.Error:
                    self._stop.wait(1.0)

        self._listener = threading.Thread(target=listen, name="ql3-pg-listen", daemon=True)
        self._listener.start()

    def wait_for(self, channel: str, timeout_s: float) -> bool:
        return self.notifier.wait(channel, timeout_s)

    def close(self) -> None:
        self._stop.set()
        self.pool.close()
        if self._listener is not None:
            self._listener.join(timeout=3)

    # -- schema ---------------------------------------------------------------------------------

    def _applied(self, conn: psycopg.Connection[Row]) -> dict[int, tuple[str, str, int]]:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS ql3_schema_migrations (version INTEGER PRIMARY KEY,"
            " name TEXT NOT NULL,"
            " checksum TEXT NOT NULL, applied_at_ms BIGINT NOT NULL)"
        )
        rows = conn.execute(
            "SELECT version, name, checksum, applied_at_ms FROM ql3_schema_migrations"
        ).fetchall()
        return {
            int(r["version"]): (str(r["name"]), str(r["checksum"]), int(r["applied_at_ms"])) for r in rows
        }

    def migrate(self) -> list[int]:
        """Apply pending migrations under an advisory lock so concurrent replicas serialise."""
        applied_now: list[int] = []
        with self.pool.connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            applied = self._applied(conn)
            for migration in verify_applied("postgres", {v: c for v, (_, c, _) in applied.items()}):
                conn.execute(migration.sql.encode())
                conn.execute(
                    "INSERT INTO ql3_schema_migrations (version, name, checksum, applied_at_ms)"
                    " VALUES (%s, %s, %s, %s)",
                    (migration.version, migration.name, migration.checksum, time.time_ns() // 1_000_000),
                )
                applied_now.append(migration.version)
        return applied_now

    def migration_status(self) -> list[MigrationState]:
        with self.pool.connection() as conn:
            applied = self._applied(conn)
        verify_applied("postgres", {v: c for v, (_, c, _) in applied.items()})
        return [
            MigrationState(
                version=m.version,
                name=m.name,
                applied=m.version in applied,
                applied_at_ms=applied[m.version][2] if m.version in applied else None,
            )
            for m in chain("postgres")
        ]

    def schema_snapshot(self) -> str:
        """Normalised description of tables, columns, indexes and functions."""
        lines: list[str] = []
        with self.pool.connection() as conn:
            for r in conn.execute(
                "SELECT table_name, column_name, data_type, is_nullable, column_default"
                " FROM information_schema.columns WHERE table_schema = current_schema()"
                " AND table_name != 'ql3_schema_migrations' ORDER BY table_name, ordinal_position"
            ):
                lines.append(
                    f"COLUMN {r['table_name']}.{r['column_name']} {r['data_type']}"
                    f" null={r['is_nullable']} default={r['column_default']}"
                )
            for r in conn.execute(
                "SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema()"
                " AND tablename != 'ql3_schema_migrations' ORDER BY indexname"
            ):
                lines.append(f"INDEX {r['indexdef']}")
            for r in conn.execute(
                "SELECT conrelid::regclass::text AS t, conname, pg_get_constraintdef(oid) AS def"
                " FROM pg_constraint WHERE connamespace = current_schema()::regnamespace"
                " AND conrelid::regclass::text != 'ql3_schema_migrations' ORDER BY 1, 2"
            ):
                lines.append(f"CONSTRAINT {r['t']}.{r['conname']} {r['def']}")
            for r in conn.execute(
                "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
                " WHERE n.nspname = current_schema() ORDER BY 1"
            ):
                lines.append(f"FUNCTION {r['proname']}")
        return "\n".join(lines) + "\n"

    def columns(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        with self.pool.connection() as conn:
            for r in conn.execute(
                "SELECT table_name, column_name FROM information_schema.columns"
                " WHERE table_schema = current_schema() ORDER BY table_name, column_name"
            ):
                out.setdefault(str(r["table_name"]), []).append(str(r["column_name"]))
        return out

    def raw(self, sql: str, params: tuple[Any, ...] = ()) -> list[Row]:
        """Test and tooling escape hatch: one statement outside the catalogue."""
        with self.pool.connection() as conn:
            cur = conn.execute(sql.replace("?", "%s").encode(), params)
            return cur.fetchall() if cur.description else []


class _NoEarlyCommit:
    """A unit's statements without ``one_then_commit``: what runs inside a savepoint cannot commit
    the unit under it (steps that would send their last statement with COMMIT take the
    statement-by-statement way, as on SQLite)."""

    dialect = "postgres"

    def __init__(self, tx: PostgresTransaction) -> None:
        self._tx = tx

    def now_ms(self) -> int:
        return self._tx.now_ms()

    def one(self, query: str, params: Params | None = None) -> Row | None:
        return self._tx.one(query, params)

    def all(self, query: str, params: Params | None = None) -> list[Row]:
        return self._tx.all(query, params)

    def run(self, query: str, params: Params | None = None) -> int:
        return self._tx.run(query, params)

    def notify(self, channel: str) -> None:
        self._tx.notify(channel)
