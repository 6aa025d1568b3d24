"""The only place that wires adapters to services."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

from ql3.domain.errors import ConfigurationError
from ql3.ports.storage import Database
from ql3.storage.migrations import MigrationState


class ManagedDatabase(Database, Protocol):
    def migrate(self) -> list[int]: ...
    def migration_status(self) -> list[MigrationState]: ...


def ql3_home() -> Path:
    return Path(os.environ.get("QL3_HOME") or Path.home() / ".ql3")


def default_database_url(home: Path) -> str:
    return f"sqlite:///{home / 'ql3.db'}"


def open_database(url: str) -> ManagedDatabase:
    """``sqlite:///abs/path`` (edge, standalone) or ``postgresql://...`` (cluster)."""
    if url.startswith("sqlite:///"):
        from ql3.storage.sqlite.adapter import SqliteDatabase

        path = Path(url.removeprefix("sqlite://"))
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        return SqliteDatabase(path)
    if url.startswith(("postgresql://", "postgres://")):
        from ql3.storage.postgres.adapter import PostgresDatabase

        return PostgresDatabase(url)
    raise ConfigurationError("unsupported database URL scheme (use sqlite:/// or postgresql://)")
