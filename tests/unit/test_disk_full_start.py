"""A start on a full disk: exit 74 with one line naming the directory (cli/disk.py), and a SQLite
connection that cannot be set up (its WAL cannot be made on a full disk) is a transient storage error."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from ql3.cli.disk import disk_full_error, require_free_space, starting, state_dirs
from ql3.cli.errors import EXIT_DISK_FULL, CliError
from ql3.domain.errors import StorageUnavailable
from ql3.storage.sqlite.adapter import SqliteDatabase


class _Stat:
    def __init__(self, free: int) -> None:
        self.f_bavail = free
        self.f_frsize = 1


def _disk_with(monkeypatch: pytest.MonkeyPatch, full_under: Path, free: int = 4096) -> None:
    """Every path under ``full_under`` is on a disk with ``free`` bytes left; others have plenty."""
    real = os.statvfs

    def statvfs(path: Any) -> Any:
        if str(path).startswith(str(full_under)):
            real(path)  # a missing path still raises FileNotFoundError
            return _Stat(free)
        return real(path)

    monkeypatch.setattr(os, "statvfs", statvfs)


def test_the_state_dirs_are_the_home_and_a_sqlite_databases_directory(tmp_path: Path) -> None:
    assert state_dirs(tmp_path) == [tmp_path]
    assert state_dirs(tmp_path, "postgresql://db/x") == [tmp_path]
    assert state_dirs(tmp_path, "sqlite:///srv/db/ql3.db") == [tmp_path, Path("/srv/db")]


def test_a_full_disk_is_one_line_naming_the_directory_and_exit_74(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = tmp_path / "full"
    full.mkdir()
    _disk_with(monkeypatch, full)
    home = full / "new\nhome" / "deeper"  # not made yet: judged by its nearest existing ancestor

    with pytest.raises(CliError) as caught:
        require_free_space([tmp_path, home])

    error = caught.value
    assert error.exit_code == EXIT_DISK_FULL == 74
    assert error.code == "disk_full"
    assert "\n" not in error.message and str(full) in error.message and "4096 bytes free" in error.message
    assert error.details["disks"] == [{"path": str(home), "free_bytes": 4096}]
    assert disk_full_error([tmp_path]) is None


def test_a_start_that_fails_while_the_disk_fills_is_reported_as_the_full_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A start that fails for another reason, or exits non-zero, on a disk with space: as it is
    def broken() -> int:
        raise RuntimeError("not the disk")

    with pytest.raises(RuntimeError):
        starting([tmp_path], broken)
    assert starting([tmp_path], lambda: 3) == 3
    assert starting([tmp_path], lambda: 0) == 0

    # The disk fills after the check: the failed start (an error, or a server's exit 3) is the disk's
    def filling_then(outcome: int | None) -> int:
        _disk_with(monkeypatch, tmp_path)
        if outcome is None:
            raise RuntimeError("database or disk is full")
        return outcome

    with pytest.raises(CliError) as caught:
        starting([tmp_path], lambda: filling_then(3))
    assert caught.value.exit_code == EXIT_DISK_FULL and caught.value.__cause__ is None
    monkeypatch.undo()
    with pytest.raises(CliError) as again:
        starting([tmp_path], lambda: filling_then(None))
    assert again.value.exit_code == EXIT_DISK_FULL and isinstance(again.value.__cause__, RuntimeError)


def test_a_sqlite_connection_that_cannot_be_set_up_is_storage_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a database whose WAL cannot be made (what SQLite says when the disk is full)
    def full(self: SqliteDatabase, conn: sqlite3.Connection, *, read: bool) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    db = SqliteDatabase(tmp_path / "ql3.db")
    monkeypatch.setattr(SqliteDatabase, "_configure", full)

    # Then a unit fails with the transient storage error, not the driver's
    for write in (True, False):
        with pytest.raises(StorageUnavailable) as caught:
            db.transaction(lambda tx: None, write=write)
        assert caught.value.retryable
    db.close()
