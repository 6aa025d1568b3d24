"""The migration chain: snapshot, parity across dialects, checksums, idempotent re-run."""

from __future__ import annotations

from importlib import resources

import pytest

from ql3.domain.errors import MigrationError
from ql3.storage.migrations import chain
from tests.support.databases import Harness

# Tables that exist in one dialect only, by design (the PostgreSQL clock shim).
DIALECT_ONLY = {"postgres": {"ql3_clock"}, "sqlite": set[str]()}


def test_replaying_the_chain_reproduces_the_committed_snapshot(harness: Harness) -> None:
    committed = resources.files(f"ql3.storage.{harness.dialect}").joinpath("schema.sql").read_text()

    assert harness.db.schema_snapshot() == committed, (
        "schema drifted from the committed snapshot; run scripts/update-schema-snapshots"
    )


def test_both_dialects_have_the_same_tables_and_columns(sqlite_harness: Harness, pg_harness: Harness) -> None:
    lite = {t: c for t, c in sqlite_harness.db.columns().items() if t not in DIALECT_ONLY["sqlite"]}
    pg = {t: c for t, c in pg_harness.db.columns().items() if t not in DIALECT_ONLY["postgres"]}

    assert lite == pg


def test_rerunning_migrate_applies_nothing(harness: Harness) -> None:
    assert harness.db.migrate() == []
    status = harness.db.migration_status()
    assert [s.version for s in status] == [m.version for m in chain(harness.dialect)]
    assert all(s.applied for s in status)


def test_an_edited_applied_migration_is_refused(harness: Harness) -> None:
    harness.db.raw("UPDATE ql3_schema_migrations SET checksum = 'tampered' WHERE version = 1")

    with pytest.raises(MigrationError, match="edited"):
        harness.db.migrate()
    with pytest.raises(MigrationError):
        harness.db.migration_status()


def test_an_unknown_applied_migration_is_refused(harness: Harness) -> None:
    harness.db.raw(
        "INSERT INTO ql3_schema_migrations (version, name, checksum, applied_at_ms)"
        " VALUES (9999, 'future', 'x', 0)"
    )

    with pytest.raises(MigrationError):
        harness.db.migrate()
