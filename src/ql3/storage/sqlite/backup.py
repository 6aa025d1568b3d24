"""An online copy of a SQLite database (``ql3 db backup`` and ``GET /api/v1/backup``).

SQLite's online backup API copies the whole database from one read snapshot (``pages=-1``): with WAL
the server's writers go on meanwhile. The copy is checked (integrity, ql3's migration table) and
turned into one self-contained file (journal mode DELETE) before anyone sees it.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path
from typing import Final

MIGRATIONS_TABLE: Final = "ql3_schema_migrations"


class BackupInvalid(Exception):
    """The database is not a sound ql3 database; ``code`` is ``not_a_backup`` or ``corrupt_backup``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def check_ql3_database(conn: sqlite3.Connection, what: str) -> int:
    """Fail unless ``conn`` is a sound ql3 database; return its schema version."""
    try:
        verdict = conn.execute("PRAGMA quick_check").fetchone()
        has_table = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (MIGRATIONS_TABLE,)
        ).fetchone()
        row = conn.execute(f"SELECT max(version) FROM {MIGRATIONS_TABLE}").fetchone() if has_table else None
    except sqlite3.DatabaseError as exc:
        raise BackupInvalid("not_a_backup", f"{what} is not a ql3 SQLite database") from exc
    if not verdict or verdict[0] != "ok":
        raise BackupInvalid("corrupt_backup", f"{what} failed SQLite's integrity check")
    if not row or row[0] is None:
        raise BackupInvalid("not_a_backup", f"{what} has no ql3 schema")
    return int(row[0])


def connect(path: Path, *, read_only: bool) -> sqlite3.Connection:
    if read_only:
        return sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=30)
    return sqlite3.connect(path, timeout=30)


def online_backup(source_path: Path, target: Path) -> int:
    """Copy the database at ``source_path`` to ``target`` (written as ``target``'s sibling temp file,
    mode 0600, checked, then renamed over it); return the copy's schema version. On any failure
    nothing is left at the temp path and ``target`` is untouched."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    try:
        source = connect(source_path, read_only=True)
        try:
            copy = sqlite3.connect(tmp)
            try:
                # pages=-1: the whole database in one step, from one read snapshot (WAL: writers go on)
                source.backup(copy, pages=-1)
                version = check_ql3_database(copy, "the copy")
                copy.execute("PRAGMA journal_mode = DELETE")  # one self-contained file
            finally:
                copy.close()
        finally:
            source.close()
        os.chmod(tmp, 0o600)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    return version
