"""Refuse to start on a full disk: exit ``EXIT_DISK_FULL`` (74) with one line naming the directory,
instead of failing somewhere inside the start (docs/operations.md "A full disk")."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from ql3.application.disk_space import MIN_FREE_BYTES, full_disks
from ql3.cli.errors import EXIT_DISK_FULL, CliError


def state_dirs(home: Path, database_url: str | None = None) -> list[Path]:
    """The directories a server or worker writes to at start: its home and a SQLite database's."""
    paths = [home]
    if database_url is not None and database_url.startswith("sqlite:///"):
        paths.append(Path(database_url.removeprefix("sqlite://")).parent)
    return paths


def disk_full_error(paths: Sequence[Path]) -> CliError | None:
    """The error to exit with when a directory among ``paths`` is on a full disk, else None."""
    full = full_disks(paths)
    if not full:
        return None
    where, free = full[0]["path"], full[0]["free_bytes"]
    shown = where.encode("unicode_escape").decode("ascii")  # one line, whatever the name holds
    return CliError(
        "disk_full",
        f"no space left on the disk of {shown} ({free} bytes free; ql3 needs {MIN_FREE_BYTES // 1024} KiB"
        " there to start): free some space and start again",
        EXIT_DISK_FULL,
        details={"disks": full},
    )


def require_free_space(paths: Sequence[Path]) -> None:
    """Raise the disk-full ``CliError`` (exit 74) when a directory among ``paths`` is full."""
    error = disk_full_error(paths)
    if error is not None:
        raise error


def starting(paths: Sequence[Path], start: Callable[[], int]) -> int:
    """Run a command's start (and life) after the free-space check. A start that still fails (an
    error, or a non-zero exit such as a server's failed start-up) while a directory among ``paths`` is
    full, the disk having filled after the check, is reported as that full disk."""
    require_free_space(paths)
    try:
        code = start()
    except Exception as exc:
        error = disk_full_error(paths)
        if error is not None:
            raise error from exc
        raise
    if code != 0:
        require_free_space(paths)
    return code
