"""The databases the suite runs on: the contract harness over SQLite and PostgreSQL, and its clock.

PostgreSQL is read from ``QL3_TEST_PG_DSN`` (a DSN whose user may CREATE DATABASE). Without it the
PostgreSQL half skips on a laptop; under ``CI=true`` a missing database is a failure, never a skip.
The fixtures that build these live in ``tests/support/plugin.py``.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from ql3.storage.postgres.adapter import PostgresDatabase
from ql3.storage.sqlite.adapter import SqliteDatabase

PG_ENV = "QL3_TEST_PG_DSN"
START_MS = 1_800_000_000_000


class FakeClock:
    """The injected SQLite clock; tests move it explicitly."""

    def __init__(self, start_ms: int = START_MS) -> None:
        self._now = start_ms
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            return self._now

    def advance(self, ms: int) -> None:
        with self._lock:
            self._now += ms


@dataclass
class Harness:
    """A migrated database plus the capabilities a contract test may use on any dialect."""

    db: Any
    dialect: str
    _clock: FakeClock | None = None

    def advance_clock(self, ms: int) -> None:
        if self._clock is not None:
            self._clock.advance(ms)
        else:
            self.db.raw("UPDATE ql3_clock SET offset_ms = offset_ms + ?", (ms,))

    def freeze_clock(self) -> None:
        """Stop the database clock where it is; only ``advance_clock`` moves it from then on, so a
        test can reach an exact instant (a lease's expiry to the millisecond). The SQLite clock
        already moves only when advanced; on PostgreSQL this test database's ``ql3_now_ms()`` is
        replaced by one that reads the stored instant (``ql3_clock.offset_ms`` becomes it)."""
        if self._clock is not None:
            return
        self.db.raw("UPDATE ql3_clock SET offset_ms = ql3_now_ms()")
        self.db.raw(
            "CREATE OR REPLACE FUNCTION ql3_now_ms() RETURNS BIGINT LANGUAGE sql STABLE AS"
            " $$ SELECT offset_ms FROM ql3_clock WHERE singleton $$"
        )

    def now_ms(self) -> int:
        return int(self.db.transaction(lambda tx: tx.now_ms(), write=False))

    def forge(self, sql: str) -> None:
        """One statement with the database's referential checks off: a state no public path makes
        (a row its foreign keys require gone), for tests of the checks behind those keys. SQLite: a
        plain connection, whose foreign keys are off unless asked for; PostgreSQL: a session whose
        ``session_replication_role`` skips the foreign-key triggers (the test user is a superuser)."""
        if self.dialect == "sqlite":
            conn = sqlite3.connect(self.db.path, isolation_level=None)
            try:
                conn.execute(sql)
            finally:
                conn.close()
            return
        with psycopg.connect(self.db.dsn, autocommit=True) as pg:
            pg.execute("SET session_replication_role = replica")
            pg.execute(sql.encode())

    def second_connection(self) -> Any:
        """Another database handle on the same data, for real two-connection races."""
        if self.dialect == "sqlite":
            return SqliteDatabase(self.db.path, clock=self._clock)
        return PostgresDatabase(self.db.dsn, min_size=1, max_size=4)


def pg_admin_dsn() -> str | None:
    dsn = os.environ.get(PG_ENV)
    if not dsn:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{PG_ENV} is not set but CI=true: the PostgreSQL half of the suite must run")
        return None
    return dsn


def with_dbname(dsn: str, name: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    info["dbname"] = name
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in info.items() if v is not None})


@dataclass(frozen=True)
class PgDatabase:
    """A throwaway PostgreSQL database for one ``ql3 serve --database-url``."""

    admin_dsn: str
    name: str
    url: str
