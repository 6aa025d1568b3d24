"""CLI failures and the exit codes they map to."""

from __future__ import annotations

from typing import Any, Final

EXIT_OK: Final = 0
EXIT_ERROR: Final = 1
EXIT_USAGE: Final = 64
# EX_IOERR: a start refused because a disk it writes to is full (cli/disk.py, docs/operations.md).
EXIT_DISK_FULL: Final = 74
# API statuses that mean "the caller's input is wrong": reported as usage errors.
USAGE_STATUSES: Final = frozenset({413, 422})


class CliError(Exception):
    """A failure reported as ``error: <code>: <message>`` on stderr with ``exit_code``."""

    def __init__(
        self, code: str, message: str, exit_code: int = EXIT_ERROR, *, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.exit_code = exit_code
        self.details: dict[str, Any] = details or {}


class UsageError(CliError):
    """Local validation of arguments failed (exit 64)."""

    def __init__(self, message: str, code: str = "usage") -> None:
        super().__init__(code, message, EXIT_USAGE)
