"""Retention's and the notifications' view of the per-attempt log files: remove, cap and read the
tail by attempt id (``ports.logs``)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ql3.execution.logs import enforce_log_cap, log_path_for
from ql3.execution.receipts import InvalidAttemptId


class LogDirectory:
    """The ``LogFiles`` adapter over one logs directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, attempt_id: str) -> Path | None:
        try:
            return log_path_for(self.root, attempt_id)
        except InvalidAttemptId:
            return None

    def remove(self, attempt_id: str) -> int:
        path = self._path(attempt_id)
        if path is None:
            return 0
        try:
            size = os.lstat(path).st_size
            os.unlink(path)
        except FileNotFoundError:
            return 0
        return size

    def cap(self, attempt_id: str, max_bytes: int) -> int:
        path = self._path(attempt_id)
        if path is None:
            return 0
        try:
            before = os.lstat(path).st_size
        except FileNotFoundError:
            return 0
        if not enforce_log_cap(path, max_bytes):
            return 0
        return max(0, before - os.lstat(path).st_size)

    def tail(self, attempt_id: str, max_bytes: int) -> tuple[bytes, bool]:
        path = self._path(attempt_id)
        if path is None or max_bytes < 1:
            return b"", True
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return b"", True
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return b"", True
            start = max(0, st.st_size - max_bytes)
            return os.pread(fd, st.st_size - start, start), start == 0
        finally:
            os.close(fd)
