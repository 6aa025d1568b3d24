"""Bounded reads of per-attempt log files for the logs route.

The HTTP layer does not import the execution adapters, so the few lines that read a log by offset live
here: the file is named by the attempt's log artifact id (a UUIDv7, checked, so a stored value can never
walk out of the root), opened without following links, and read with one ``pread`` of at most
``max_bytes``. No path ever leaves this module: failures are a fixed ``logs_unavailable``.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ql3.domain.errors import Ql3Error
from ql3.domain.ids import is_id

MAX_LOG_PAGE: Final = 256 * 1024
DEFAULT_LOG_PAGE: Final = 64 * 1024


class LogsUnavailable(Ql3Error):
    """The run's log is not available on this server."""

    code = "logs_unavailable"
    http_status = 404


@dataclass(frozen=True, slots=True, kw_only=True)
class LogChunk:
    data: bytes
    next_offset: int
    eof: bool  # nothing followed ``next_offset`` when the file was read
    size: int  # the log's length when it was read


def read_chunk(root: Path, artifact_id: str, offset: int, max_bytes: int) -> LogChunk:
    """Up to ``max_bytes`` of the log from ``offset``; a log that does not exist yet reads as empty."""
    if not is_id(artifact_id):
        raise LogsUnavailable()
    if offset < 0 or not 1 <= max_bytes <= MAX_LOG_PAGE:
        raise ValueError("log page out of range")
    try:
        fd = os.open(root / f"{artifact_id}.log", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return LogChunk(data=b"", next_offset=offset, eof=True, size=0)
    except OSError as exc:
        raise LogsUnavailable() from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise LogsUnavailable()
        data = os.pread(fd, max_bytes, offset) if offset < st.st_size else b""
        size = max(st.st_size, offset + len(data))
    except OSError as exc:
        raise LogsUnavailable() from exc
    finally:
        os.close(fd)
    end = offset + len(data)
    return LogChunk(data=data, next_offset=end, eof=end >= size, size=size)


def read_tail(root: Path, artifact_id: str, max_bytes: int) -> tuple[bytes, bool]:
    """The last ``max_bytes`` of the log and whether that is all of it (empty when it does not exist)."""
    if not is_id(artifact_id) or not 1 <= max_bytes <= MAX_LOG_PAGE:
        raise LogsUnavailable()
    try:
        fd = os.open(root / f"{artifact_id}.log", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return b"", True
    except OSError as exc:
        raise LogsUnavailable() from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise LogsUnavailable()
        start = max(0, st.st_size - max_bytes)
        return os.pread(fd, st.st_size - start, start), start == 0
    except OSError as exc:
        raise LogsUnavailable() from exc
    finally:
        os.close(fd)


MAX_SPAN_READ: Final = 2 * 1024 * 1024  # one read of a search scan (application/log_ranges.py)


def read_span(root: Path, artifact_id: str, offset: int, count: int) -> tuple[bytes, int]:
    """Up to ``count`` bytes from ``offset`` and the file's size when read (a missing log: empty, 0)."""
    if not is_id(artifact_id):
        raise LogsUnavailable()
    if offset < 0 or not 0 <= count <= MAX_SPAN_READ:
        raise ValueError("log span out of range")
    try:
        fd = os.open(root / f"{artifact_id}.log", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return b"", 0
    except OSError as exc:
        raise LogsUnavailable() from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise LogsUnavailable()
        data = os.pread(fd, count, offset) if count and offset < st.st_size else b""
        return data, max(st.st_size, offset + len(data))
    except OSError as exc:
        raise LogsUnavailable() from exc
    finally:
        os.close(fd)


def _incomplete_tail(data: bytes) -> int:
    """How many bytes at the end of ``data`` start a UTF-8 sequence that is not finished yet."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # not a continuation byte: the start of the last sequence
            need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
            return back if back < need else 0
    return 0


def split_text(chunk: LogChunk, *, final: bool) -> tuple[str, int]:
    """Decode a chunk as UTF-8 (invalid bytes replaced) and the offset to ask for next.

    A multi-byte character cut by the page end or by a writer mid-write is left for the next page, so
    pages never split a character; unless nothing else would be returned and the page is full (a tiny
    ``max_bytes``) or nothing more can come (``final``), where it is replaced instead.
    """
    data = chunk.data
    cut = _incomplete_tail(data)
    if cut and not final and (cut < len(data) or chunk.eof):
        data = data[: len(data) - cut]
        return data.decode("utf-8", errors="replace"), chunk.next_offset - cut
    return data.decode("utf-8", errors="replace"), chunk.next_offset
