"""Per-attempt log files: creation before spawn, bounded offset reads, and the size cap.

The command writes straight into the file through an inherited ``O_APPEND`` descriptor, so no process
sits in the output path and a restart of the worker never cuts the log. The cap is enforced outside
the command, twice over: readers never see bytes past the cap (the truncation marker stands in for
them), and ``enforce_log_cap`` cuts the file itself (periodically while the attempt runs and once after
it exits), leaving exactly ``cap`` bytes followed by the marker.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ql3.domain.errors import Ql3Error
from ql3.execution.receipts import check_file_id

DEFAULT_READ_BYTES = 64 * 1024
MAX_READ_BYTES = 1024 * 1024
MAX_LOG_CAP_BYTES = 1 << 40


class LogUnavailable(Ql3Error):
    """The log is not available."""

    code = "log_unavailable"
    http_status = 404


def log_path_for(root: Path, attempt_id: str) -> Path:
    return root / f"{check_file_id(attempt_id)}.log"


def truncation_marker(cap_bytes: int) -> bytes:
    return f"\n[ql3: log truncated at {cap_bytes} bytes]\n".encode("ascii")


def create_log(path: str | os.PathLike[str]) -> int:
    """Create a new log file (mode 0600, never an existing one) and return an ``O_APPEND`` descriptor."""
    return os.open(
        path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
    )


def enforce_log_cap(path: Path, cap_bytes: int) -> bool:
    """Cut a log that grew past ``cap_bytes`` to ``cap_bytes`` + the marker; True when it cut.

    Best effort against a writer that is still running: its appends may land after the marker, and the
    next call cuts them again. Once the attempt's processes are gone the result is exact.
    """
    _check_cap(cap_bytes)
    # Most logs end under their cap: a look at the name (never following a link) answers without an
    # open. Anything else takes the descriptor path below, which decides on what it opened.
    try:
        seen = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISREG(seen.st_mode) and seen.st_size <= cap_bytes:
        return False
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        st = os.fstat(fd)
        marker = truncation_marker(cap_bytes)
        if not stat.S_ISREG(st.st_mode) or st.st_size <= cap_bytes:
            return False
        if st.st_size == cap_bytes + len(marker) and os.pread(fd, len(marker), cap_bytes) == marker:
            return False
        os.ftruncate(fd, cap_bytes)
        os.write(fd, marker)
        return True
    finally:
        os.close(fd)


class LogReader:
    """Bounded reads by offset; the HTTP layer polls with the returned ``next_offset``."""

    def read(
        self,
        path: Path,
        offset: int,
        max_bytes: int = DEFAULT_READ_BYTES,
        *,
        cap_bytes: int | None = None,
    ) -> tuple[bytes, int]:
        """Up to ``max_bytes`` from ``offset``, and the offset to ask for next.

        With ``cap_bytes`` the reader sees the capped view: the first ``cap_bytes`` bytes, then the
        truncation marker, whether or not the file has been cut yet. Raises ``LogUnavailable``.
        """
        if type(offset) is not int or offset < 0:
            raise ValueError("offset out of range")
        if type(max_bytes) is not int or not 1 <= max_bytes <= MAX_READ_BYTES:
            raise ValueError("max_bytes out of range")
        if cap_bytes is not None:
            _check_cap(cap_bytes)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise LogUnavailable() from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise LogUnavailable()
            if cap_bytes is None or st.st_size <= cap_bytes:
                data = os.pread(fd, max_bytes, offset) if offset < st.st_size else b""
            else:
                data = b""
                if offset < cap_bytes:
                    data = os.pread(fd, min(max_bytes, cap_bytes - offset), offset)
                marker = truncation_marker(cap_bytes)
                marker_from = max(0, offset + len(data) - cap_bytes)
                if offset + len(data) >= cap_bytes and len(data) < max_bytes:
                    data += marker[marker_from : marker_from + max_bytes - len(data)]
        finally:
            os.close(fd)
        return data, offset + len(data)


def _check_cap(cap_bytes: int) -> None:
    if type(cap_bytes) is not int or not 1 <= cap_bytes <= MAX_LOG_CAP_BYTES:
        raise ValueError("log cap out of range")
