"""The fixtures every folder of the suite shares, registered once by ``tests/conftest.py``.

``harness`` is the contract-suite fixture: each test that takes it runs once on SQLite and once on
PostgreSQL (a clone of a migrated template database per test). ``pg_database`` is an empty PostgreSQL
database for a real ``ql3 serve --database-url``. Folder conftests keep only what is local to them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from ql3.storage.postgres.adapter import PostgresDatabase
from ql3.storage.sqlite.adapter import SqliteDatabase
from tests.support.databases import PG_ENV, FakeClock, Harness, PgDatabase, pg_admin_dsn, with_dbname

PG_TEMPLATE_ENV = "QL3_TEST_PG_TEMPLATE"


@pytest.fixture(scope="session")
def pg_template(xdist_name: str) -> Iterator[tuple[str, str]]:
    """A migrated template database for this xdist worker; tests clone it.

    ``QL3_TEST_PG_TEMPLATE`` names an existing, migrated database to clone instead, which this
    fixture neither creates nor drops: ``scripts/mutate-sql`` installs a mutated server-side function
    there, so every test database starts with the mutant."""
    admin = pg_admin_dsn()
    if admin is None:
        pytest.skip(f"PostgreSQL not configured ({PG_ENV})")
    given = os.environ.get(PG_TEMPLATE_ENV)
    if given:
        yield admin, given
        return
    name = f"ql3_tmpl_{xdist_name}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"'.encode())
    db = PostgresDatabase(with_dbname(admin, name), min_size=1, max_size=2)
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
    db = PostgresDatabase(with_dbname(admin, name), min_size=1, max_size=8)
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


@pytest.fixture
def pg_database() -> Iterator[PgDatabase]:
    """A fresh, empty PostgreSQL database, dropped afterwards (skipped without QL3_TEST_PG_DSN)."""
    admin = pg_admin_dsn()  # skips on a laptop without PostgreSQL; fails under CI=true
    if admin is None:
        pytest.skip("PostgreSQL not configured (QL3_TEST_PG_DSN)")
    name = f"ql3_serve_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"'.encode())
    info = psycopg.conninfo.conninfo_to_dict(admin)
    user, host = info.get("user") or "postgres", info.get("host") or "127.0.0.1"
    url = f"postgresql://{quote(str(user))}@{quote(str(host), safe='')}:{info.get('port') or '5432'}/{name}"
    try:
        yield PgDatabase(admin_dsn=admin, name=name, url=url)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())
