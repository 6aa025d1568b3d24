"""Shipped attempt logs (docs/cluster.md "Log shipping"): the store of the chunks a remote worker
ships, and the bounded reads any replica serves them with.

An attempt's log is a head row (stored length, the quota fixed by its first chunk, truncated and
closed flags) and contiguous chunks from offset 0. An append is idempotent by offset: a chunk at the
stored end is appended; the identical chunk again (a retry after a lost response) is a replay and
changes nothing; a chunk past the end is a gap (409 ``log_gap``), one that differs from what is stored
an overlap (409 ``log_overlap``), both carrying ``stored_bytes`` for the worker to resume from. Only
the worker session that holds the attempt's lease may ship (the registry's session and generation,
the lease's worker, session and generation). The quota keeps the first ``cap_bytes`` bytes; past it
the head is marked truncated, readers render the truncation marker after the stored bytes, and
further chunks are dropped without an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from ql3.application import workers
from ql3.domain.attempt_logs import LogHead as LogHead
from ql3.domain.attempt_logs import truncation_marker as truncation_marker
from ql3.domain.errors import Conflict, FenceConflict, ValidationFailed
from ql3.domain.ids import is_id
from ql3.ports.storage import Transaction
from ql3.repositories import attempt_logs as repo

MAX_CHUNK_BYTES: Final = 64 * 1024  # one shipped chunk (and one stored row) at most
MAX_OFFSET: Final = 1 << 62
MIN_CAP_BYTES: Final = 1024
MAX_CAP_BYTES: Final = 1 << 40  # the same bound as the local log cap (execution/logs.py)
DEFAULT_CAP_BYTES: Final = 16 * 1024 * 1024  # the worker's default local log cap
PAGE_ROWS: Final = 64  # chunks read per page at most (a page is at most 256 KiB anyway)
MAX_READ_BYTES: Final = 1024 * 1024
# A terminal attempt whose log the worker never closed (it died, or lost its session) counts as
# complete this long after the attempt finished: a follower never waits forever.
UNCLOSED_COMPLETE_AFTER_MS: Final = 30_000

AppendOutcome = Literal["appended", "replayed", "truncated", "dropped"]


class LogGap(Conflict):
    """The chunk starts past the stored end of the log: the worker resumes from ``stored_bytes``."""

    code = "log_gap"


class LogOverlap(Conflict):
    """The chunk overlaps the stored log but is not the chunk stored at its offset."""

    code = "log_overlap"


def check_cap(cap_bytes: object) -> int:
    if type(cap_bytes) is not int or not MIN_CAP_BYTES <= cap_bytes <= MAX_CAP_BYTES:
        raise ValidationFailed(
            f"the log cap must be {MIN_CAP_BYTES}-{MAX_CAP_BYTES} bytes", field="log_cap_bytes"
        )
    return cap_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendResult:
    outcome: AppendOutcome
    head: LogHead


def _fence(tx: Transaction, *, worker_id: str, session_id: str, generation: int, attempt_id: str) -> None:
    """The registry's current session of this worker holds (or held) the attempt's lease."""
    workers.current_session(tx, worker_id, session_id, generation)
    lease = repo.get_log_lease(tx, attempt_id)
    if (
        lease is None
        or lease.worker_id != worker_id
        or lease.worker_session_id != session_id
        or lease.worker_generation != generation
    ):
        raise FenceConflict("the attempt is not leased to this worker session", reason="log_not_leased")


def append(
    tx: Transaction,
    *,
    worker_id: str,
    session_id: str,
    generation: int,
    attempt_id: str,
    offset: int,
    data: bytes,
    final: bool,
    cap_bytes: int,
) -> AppendResult:
    """Store one chunk at ``offset`` (``final``: the worker shipped the whole log of a settled
    attempt, readers may stop following). Validated and fenced before anything is written."""
    check_cap(cap_bytes)
    if not is_id(attempt_id):
        raise ValidationFailed("not an attempt id", field="attemptId")
    if type(offset) is not int or not 0 <= offset <= MAX_OFFSET:
        raise ValidationFailed("offset out of range", field="offset")
    if not isinstance(data, bytes) or len(data) > MAX_CHUNK_BYTES:
        raise ValidationFailed(f"a chunk is at most {MAX_CHUNK_BYTES} bytes", field="data")
    _fence(tx, worker_id=worker_id, session_id=session_id, generation=generation, attempt_id=attempt_id)
    now = tx.now_ms()
    repo.insert_log_if_absent(tx, attempt_id=attempt_id, cap_bytes=cap_bytes, now=now)
    head = repo.lock_log(tx, attempt_id)
    assert head is not None  # created above, and never deleted while its run is not pruned
    stored = head.stored_bytes
    outcome: AppendOutcome
    if head.truncated:
        outcome = "dropped"
    elif offset > stored:
        raise LogGap("the chunk starts past the stored end of the log", stored_bytes=stored)
    elif offset < stored or not data:
        if data and not _is_stored(tx, attempt_id, offset, data):
            raise LogOverlap("the chunk differs from the stored log at its offset", stored_bytes=stored)
        outcome = "replayed"
    else:
        keep = data[: head.cap_bytes - stored]
        if keep:
            repo.insert_chunk(tx, attempt_id=attempt_id, start_offset=stored, data=keep, now=now)
        truncated = len(keep) < len(data)
        advanced = repo.update_log_length(
            tx,
            attempt_id=attempt_id,
            stored_bytes=stored + len(keep),
            truncated_at_ms=now if truncated else None,
            expected_bytes=stored,
            now=now,
        )
        if not advanced:  # the row lock makes this impossible; refuse rather than corrupt
            raise Conflict("the log moved underneath this append")
        outcome = "truncated" if truncated else "appended"
    if final:
        repo.close_log(tx, attempt_id, now)
    found = repo.get_log(tx, attempt_id)
    assert found is not None
    return AppendResult(outcome=outcome, head=found)


def _is_stored(tx: Transaction, attempt_id: str, offset: int, data: bytes) -> bool:
    """The identical chunk is stored at ``offset`` (a replay of one whose response was lost)."""
    return repo.get_chunk_at(tx, attempt_id, offset) == data


def head(tx: Transaction, attempt_id: str) -> LogHead | None:
    """The attempt's shipped log, or None when nothing was ever shipped for it."""
    return repo.get_log(tx, attempt_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredPage:
    data: bytes
    next_offset: int
    eof: bool  # nothing was stored after ``next_offset`` when the page was read
    closed: bool  # the worker shipped the whole log of the settled attempt (or the quota ended it)


def read(tx: Transaction, log: LogHead, offset: int, max_bytes: int) -> StoredPage:
    """Up to ``max_bytes`` of the shipped log from ``offset`` (one keyset page of chunks), with the
    truncation marker after the stored bytes of a truncated log."""
    if type(offset) is not int or not 0 <= offset <= MAX_OFFSET:
        raise ValueError("offset out of range")
    if type(max_bytes) is not int or not 1 <= max_bytes <= MAX_READ_BYTES:
        raise ValueError("max_bytes out of range")
    out = bytearray()
    position = offset
    if offset < log.stored_bytes:
        for stored in repo.list_chunks(tx, attempt_id=log.attempt_id, from_offset=offset, limit=PAGE_ROWS):
            start, chunk = stored.start_offset, stored.data
            if start > position or len(out) >= max_bytes:
                break  # never a hole: a page ends where the stored bytes stop being contiguous
            piece = chunk[position - start : position - start + max_bytes - len(out)]
            out += piece
            position += len(piece)
    if log.truncated and position >= log.stored_bytes and len(out) < max_bytes:
        marker = truncation_marker(log.cap_bytes)
        skip = position - log.stored_bytes
        piece = marker[skip : skip + max_bytes - len(out)]
        out += piece
        position += len(piece)
    return StoredPage(
        data=bytes(out),
        next_offset=position,
        eof=position >= log.length,
        closed=log.closed or log.truncated,
    )
