"""The migration chain: numbered ``NNNN_name.sql`` files per dialect, recorded with checksums."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

from ql3.domain.errors import MigrationError

_FILE_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True, slots=True, kw_only=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class MigrationState:
    version: int
    name: str
    applied: bool
    applied_at_ms: int | None


def chain(dialect: str) -> list[Migration]:
    """The dialect's migrations in order; gaps or duplicates are refused."""
    folder = resources.files(f"ql3.storage.{dialect}").joinpath("migrations")
    found: list[Migration] = []
    for entry in folder.iterdir():
        match = _FILE_RE.match(entry.name)
        if match:
            found.append(
                Migration(version=int(match[1]), name=match[2], sql=entry.read_text(encoding="utf-8"))
            )
    found.sort(key=lambda m: m.version)
    for expected, migration in enumerate(found, start=1):
        if migration.version != expected:
            raise MigrationError("migration chain has a gap or a duplicate", version=migration.version)
    return found


def verify_applied(dialect: str, applied: dict[int, str]) -> list[Migration]:
    """Check recorded checksums against the chain and return the migrations still to apply."""
    pending: list[Migration] = []
    known = {m.version: m for m in chain(dialect)}
    for version, checksum in applied.items():
        migration = known.get(version)
        if migration is None:
            raise MigrationError("the database has a migration this ql3 does not know", version=version)
        if migration.checksum != checksum:
            raise MigrationError("an applied migration was edited", version=version)
    for migration in known.values():
        if migration.version not in applied:
            pending.append(migration)
    return pending
