"""Shared fixtures: one contract suite over SQLite and PostgreSQL, resolved lazily by fixture name.

PostgreSQL is read from ``QL3_TEST_PG_DSN`` (a DSN whose user may CREATE DATABASE). Without it the
PostgreSQL half skips on a laptop; under ``CI=true`` a missing database is a failure, never a skip.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
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

    def now_ms(self) -> int:
        return int(self.db.transaction(lambda tx: tx.now_ms(), write=False))

    def second_connection(self) -> Any:
        """Another database handle on the same data, for real two-connection races."""
        if self.dialect == "sqlite":
            return SqliteDatabase(self.db.path, clock=self._clock)
        return PostgresDatabase(self.db.dsn, min_size=1, max_size=4)


def _pg_admin_dsn() -> str | None:
    dsn = os.environ.get(PG_ENV)
    if not dsn:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{PG_ENV} is not set but CI=true: the PostgreSQL half of the suite must run")
        return None
    return dsn


def _with_dbname(dsn: str, name: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    info["dbname"] = name
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in info.items() if v is not None})


@pytest.fixture(scope="session")
def pg_template(xdist_name: str) -> Iterator[tuple[str, str]]:
    """A migrated template database for this xdist worker; tests clone it."""
    admin = _pg_admin_dsn()
    if admin is None:
        pytest.skip(f"PostgreSQL not configured ({PG_ENV})")
    name = f"ql3_tmpl_{xdist_name}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"'.encode())
    db = PostgresDatabase(_with_dbname(admin, name), min_size=1, max_size=2)
    db.migrate()
    db.close()
    yield admin, name
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


@pytest.fixture
def pg_harness(pg_template: tuple[str, str]) -> Iterator[Harness]:
    admin, template = pg_template
    name = f"ql3_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'.encode())
    db = PostgresDatabase(_with_dbname(admin, name), min_size=1, max_size=8)
    try:
        yield Harness(db=db, dialect="postgres")
    finally:
        db.close()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


@pytest.fixture
def sqlite_harness(tmp_path: Path) -> Iterator[Harness]:
    clock = FakeClock()
    db = SqliteDatabase(tmp_path / "ql3.db", clock=clock)
    db.migrate()
    try:
        yield Harness(db=db, dialect="sqlite", _clock=clock)
    finally:
        db.close()


@pytest.fixture(params=["sqlite_harness", "pg_harness"], ids=["sqlite", "postgres"])
def harness(request: pytest.FixtureRequest) -> Harness:
    """The contract-suite fixture: each test runs once per dialect."""
    h: Harness = request.getfixturevalue(request.param)
    return h


@pytest.fixture(scope="session")
def xdist_name() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main")
