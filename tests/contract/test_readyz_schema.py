"""/readyz reports the schema version the database is at against the one this binary expects, and is
not ready (503 ``schema_mismatch``) while they differ: a database behind (migrations this binary
needs were not applied) or ahead (a newer binary migrated it). SQLite and PostgreSQL."""

from __future__ import annotations

from fastapi.testclient import TestClient

from ql3.bootstrap import expected_schema_version
from ql3.http.app import create_app
from ql3.storage.migrations import chain
from tests.support.databases import Harness


def test_readyz_reports_the_schema_version_and_refuses_a_database_behind_or_ahead(harness: Harness) -> None:
    expected = expected_schema_version(harness.dialect)
    assert expected == chain(harness.dialect)[-1].version
    with TestClient(create_app(harness.db, schema_version=expected)) as client:
        # Given a database at the version this binary expects: ready, and it says so
        ready = client.get("/readyz")
        assert ready.status_code == 200
        assert ready.json()["schema_version"] == {"applied": expected, "expected": expected}

        # When a newer binary has migrated it further: not ready, with a stable code
        harness.db.raw(
            "INSERT INTO ql3_schema_migrations (version, name, checksum, applied_at_ms)"
            f" VALUES ({expected + 1}, 'future', 'x', 0)"
        )
        ahead = client.get("/readyz")
        assert ahead.status_code == 503
        assert ahead.json()["error"]["code"] == "schema_mismatch"
        assert ahead.json()["error"]["details"] == {"applied": expected + 1, "expected": expected}

        # When the database is behind (its last migration not applied): not ready either
        harness.db.raw(f"DELETE FROM ql3_schema_migrations WHERE version >= {expected}")
        behind = client.get("/readyz")
        assert behind.status_code == 503
        assert behind.json()["error"]["code"] == "schema_mismatch"
        assert behind.json()["error"]["details"] == {"applied": expected - 1, "expected": expected}
