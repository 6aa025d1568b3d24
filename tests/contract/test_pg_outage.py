"""The PostgreSQL adapter while its database refuses connections (docs/operations.md, "A PostgreSQL
outage"): once a connection attempt has failed, a unit is StorageUnavailable without waiting for the
checkout timeout, and the first checkout after the database accepts connections again brings the
pool back."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from ql3.domain.errors import StorageUnavailable
from ql3.ports.storage import Transaction
from ql3.storage.postgres.adapter import CONNECT_TIMEOUT_S, PostgresDatabase, _connect_kwargs
from tests.support.databases import Harness, pg_admin_dsn
from tests.support.waits import wait_for

# A checkout timeout no test could wait out: a unit that waited for it instead of failing at once
# would hang until the test's own timeout below (which only bounds how long a broken test hangs).
HOUR_S = 3600.0


def _admin() -> str:
    admin = pg_admin_dsn()
    assert admin is not None  # the pg_harness fixture skipped already otherwise
    return admin


def _allow_connections(dbname: str, allow: bool) -> None:
    with psycopg.connect(_admin(), autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{dbname}" WITH ALLOW_CONNECTIONS {str(allow).lower()}'.encode())
        if not allow:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (dbname,),
            )


@pytest.fixture
def outage_db(pg_harness: Harness) -> Iterator[tuple[PostgresDatabase, str]]:
    dsn = pg_harness.db.dsn
    dbname = str(conninfo_to_dict(dsn)["dbname"])
    db = PostgresDatabase(dsn, min_size=1, max_size=4, checkout_timeout_s=HOUR_S)
    try:
        yield db, dbname
    finally:
        _allow_connections(dbname, True)
        db.close()


def _now(tx: Transaction) -> int:
    return tx.now_ms()


def _answers(db: PostgresDatabase) -> bool:
    try:
        db.transaction(_now, write=False)
    except StorageUnavailable:
        return False
    return True


@pytest.mark.timeout(60)
def test_units_fail_at_once_while_the_database_refuses_connections_and_recover_after(
    outage_db: tuple[PostgresDatabase, str],
) -> None:
    db, dbname = outage_db
    # Given a pool that has served a unit
    assert db.transaction(_now, write=False) > 0
    assert not db.reachability.down

    # When the database refuses connections and its backends are terminated
    _allow_connections(dbname, False)

    # Then every unit is StorageUnavailable, each without waiting for the hour-long checkout timeout,
    # and the adapter knows the database is down
    for _ in range(5):
        with pytest.raises(StorageUnavailable):
            db.transaction(_now, write=False)
        assert db.reachability.down

    # When it accepts connections again, after the pool failed several connection attempts
    wait_for(
        lambda: db.pool.get_stats().get("connections_errors", 0) >= 3,
        60,
        what="the pool to fail several connection attempts",
    )
    _allow_connections(dbname, True)

    # Then units succeed again, and the adapter no longer counts the database down
    wait_for(lambda: _answers(db), 60, what="a unit to succeed after the outage")
    assert not db.reachability.down
    assert db.transaction(_now, write=False) > 0


def test_a_connection_attempt_gives_up_after_two_seconds_unless_the_url_says_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    assert _connect_kwargs("postgresql://u@h/db") == {"connect_timeout": CONNECT_TIMEOUT_S}
    assert _connect_kwargs("postgresql://u@h/db?connect_timeout=9") == {}
    assert _connect_kwargs("host=h dbname=db connect_timeout=9") == {}
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "7")
    assert _connect_kwargs("postgresql://u@h/db") == {}
