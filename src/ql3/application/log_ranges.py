"""Ranged reads and bounded search over an attempt's log (docs/console.md "The run log"), the same rules for a
local log file and a shipped log (application/attempt_logs.py): the caller supplies the log's length
and a reader of byte ranges; nothing here touches a file or the database.

A ranged read from the end (``from_end``) or backwards (``before``) starts where a line starts when
the page holds one, else at a character boundary, so a client paging backwards gets whole lines and
never a split character. A search is a case-insensitive (ASCII letters) substring scan of the raw
bytes that scans at most ``scan_bytes`` per request and returns a cursor to go on from; a match that
overlaps one of the project's secret values is never reported (the value itself is masked on reads).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from ql3.domain.errors import ValidationFailed
from ql3.domain.variables import MIN_MASKED_CHARS

SEARCH_BLOCK_BYTES: Final = 1024 * 1024  # one read of a scan (a shipped log reads it in one transaction)
MAX_SEARCH_SCAN_BYTES: Final = 8 * 1024 * 1024  # bytes one search request scans at most
MAX_QUERY_CHARS: Final = 200
MAX_SEARCH_MATCHES: Final = 100
_MAX_BLOCKS: Final = MAX_SEARCH_SCAN_BYTES // SEARCH_BLOCK_BYTES + 1

Reader = Callable[[int, int], bytes]  # (start, count) -> up to count bytes from start; short = the end


@dataclass(frozen=True, slots=True, kw_only=True)
class Span:
    """Where a ranged read starts and ends (before aligning its start)."""

    start: int
    end: int


def tail_span(size: int, from_end: int) -> Span:
    """The last ``from_end`` bytes of a log of ``size`` bytes."""
    return Span(start=max(0, size - from_end), end=size)


def before_span(size: int, before: int, max_bytes: int) -> Span:
    """The ``max_bytes`` bytes that end at ``before`` (clamped to the log's length)."""
    end = min(before, size)
    return Span(start=max(0, end - max_bytes), end=end)


def align_start(data: bytes, start: int) -> int:
    """How many leading bytes of a page read from ``start`` to drop so that it starts a line (when a
    line starts inside it) or else a character; a page that starts the log is kept whole, and so is
    one that would be left empty (a page always moves a reader on)."""
    if start == 0 or not data:
        return 0
    newline = data.find(b"\n")
    if 0 <= newline < len(data) - 1:
        return newline + 1
    skip = 0
    while skip < min(3, len(data) - 1) and data[skip] & 0xC0 == 0x80:  # continuation bytes
        skip += 1
    return skip


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchResult:
    matches: list[int]  # byte offsets where a match starts: ascending forwards, descending backwards
    length: int  # the byte length of every match (the query's UTF-8 form)
    next_cursor: int | None  # ask again with after= (or before=) this; None: the scan reached the end
    scanned_bytes: int


def needle_of(query: str) -> bytes:
    """The query's bytes as matched (ASCII letters folded); refused when empty or too long."""
    if not query or len(query) > MAX_QUERY_CHARS:
        raise ValidationFailed(f"the search text must be 1-{MAX_QUERY_CHARS} characters", field="q")
    try:
        return query.encode("utf-8", errors="strict").lower()
    except UnicodeEncodeError as exc:  # a lone surrogate
        raise ValidationFailed("the search text is not valid Unicode", field="q") from exc


def _secret_spans(data: bytes, secrets: Sequence[bytes]) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    for value in secrets:
        at = data.find(value)
        while at != -1:  # bounded: each step moves at least one byte through ``data``
            spans.append((at, at + len(value)))
            at = data.find(value, at + 1)
    spans.sort()
    return spans


def _hides_secret(starts: list[int], reach: list[int], at: int, length: int) -> bool:
    """The match [at, at + length) overlaps a secret's occurrence (``starts`` sorted, ``reach[i]`` the
    furthest end of the first i + 1 occurrences)."""
    index = bisect.bisect_left(starts, at + length)  # the occurrences that start before the match ends
    return index > 0 and reach[index - 1] > at


def _block_matches(
    read: Reader, size: int, needle: bytes, secrets: Sequence[bytes], lo: int, hi: int
) -> tuple[list[int], bool]:
    """The offsets in [lo, hi) where a match starts, and whether the log ended early (a short read)."""
    pad = max([len(needle), *(len(s) for s in secrets)])
    first = max(0, lo - pad)
    want = min(size, hi + pad) - first
    data = read(first, want)
    short = len(data) < want
    hay = data.lower()
    spans = _secret_spans(data, secrets) if secrets else []
    starts = [s for s, _ in spans]
    reach: list[int] = []
    for _, end in spans:
        reach.append(max(end, reach[-1]) if reach else end)
    found: list[int] = []
    at = hay.find(needle, lo - first)
    while at != -1 and first + at < hi:  # bounded by the block's length
        if not spans or not _hides_secret(starts, reach, at, len(needle)):
            found.append(first + at)
        at = hay.find(needle, at + 1)
    return found, short


def search(
    read: Reader,
    size: int,
    query: str,
    *,
    after: int | None,
    before: int | None,
    limit: int,
    secrets: Sequence[str] = (),
    scan_bytes: int = MAX_SEARCH_SCAN_BYTES,
) -> SearchResult:
    """Matches of ``query`` starting at or past ``after`` (ascending), or starting before ``before``
    (descending; neither given: forwards from the start), at most ``limit``, scanning at most
    ``scan_bytes`` of the log's ``size`` bytes."""
    needle = needle_of(query)
    if after is not None and before is not None:
        raise ValidationFailed("give after or before, not both", field="before")
    if not 1 <= limit <= MAX_SEARCH_MATCHES:
        raise ValidationFailed(f"limit must be 1-{MAX_SEARCH_MATCHES}", field="limit")
    if not 1 <= scan_bytes <= MAX_SEARCH_SCAN_BYTES:
        raise ValueError("scan_bytes out of range")
    hidden = [v.encode() for v in secrets if len(v) >= MIN_MASKED_CHARS]
    matches: list[int] = []
    if before is None:
        pos = after or 0
        stop = min(size, pos + scan_bytes)
        for _ in range(_MAX_BLOCKS):
            if pos >= stop:
                break
            block_end = min(stop, pos + SEARCH_BLOCK_BYTES)
            found, short = _block_matches(read, size, needle, hidden, pos, block_end)
            for at in found:
                matches.append(at)
                if len(matches) == limit:
                    return SearchResult(
                        matches=matches,
                        length=len(needle),
                        next_cursor=at + 1,
                        scanned_bytes=at + 1 - (after or 0),
                    )
            pos = block_end
            if short:
                pos = size
                break
        return SearchResult(
            matches=matches,
            length=len(needle),
            next_cursor=pos if pos < size else None,
            scanned_bytes=min(pos, stop) - (after or 0),
        )
    pos = min(before, size)
    stop = max(0, pos - scan_bytes)
    origin = pos
    for _ in range(_MAX_BLOCKS):
        if pos <= stop:
            break
        block_start = max(stop, pos - SEARCH_BLOCK_BYTES)
        found, _short = _block_matches(read, size, needle, hidden, block_start, pos)
        for at in reversed(found):
            matches.append(at)
            if len(matches) == limit:
                return SearchResult(
                    matches=matches, length=len(needle), next_cursor=at, scanned_bytes=origin - at
                )
        pos = block_start
    return SearchResult(
        matches=matches, length=len(needle), next_cursor=pos if pos > 0 else None, scanned_bytes=origin - pos
    )
