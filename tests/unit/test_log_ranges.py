"""Ranged reads and the bounded search of application/log_ranges.py over an in-memory log."""

from __future__ import annotations

import pytest

from ql3.application import log_ranges
from ql3.application.log_ranges import SEARCH_BLOCK_BYTES, align_start, before_span, search, tail_span
from ql3.domain.errors import ValidationFailed


class Log:
    """A log in memory whose reads are counted."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.read_bytes = 0

    def read(self, start: int, count: int) -> bytes:
        piece = self.data[start : start + count]
        self.read_bytes += len(piece)
        return piece


def every(log: Log, query: str, *, backwards: bool = False, scan_bytes: int = 1 << 23) -> list[int]:
    """All matches by following the cursor, as a client does; each request's scan is bounded."""
    found: list[int] = []
    cursor: int | None = len(log.data) if backwards else None
    for _ in range(1000):
        after, before = (None, cursor) if backwards else (cursor, None)
        result = search(
            log.read, len(log.data), query, after=after, before=before, limit=3, scan_bytes=scan_bytes
        )
        found += result.matches
        assert result.scanned_bytes <= scan_bytes
        if result.next_cursor is None:
            return found
        cursor = result.next_cursor
    raise AssertionError("the cursor never reached the end")


def test_spans_from_the_end_and_before_an_offset_are_clamped_to_the_log() -> None:
    assert tail_span(100, 30) == log_ranges.Span(start=70, end=100)
    assert tail_span(10, 30) == log_ranges.Span(start=0, end=10)
    assert before_span(100, 50, 20) == log_ranges.Span(start=30, end=50)
    assert before_span(100, 500, 20) == log_ranges.Span(start=80, end=100)
    assert before_span(100, 5, 20) == log_ranges.Span(start=0, end=5)


def test_a_page_starts_at_a_line_else_at_a_character_and_is_never_emptied() -> None:
    assert align_start(b"tail of a line\nnext\n", 10) == len(b"tail of a line\n")
    assert align_start(b"tail of a line\nnext\n", 0) == 0  # the start of the log is kept
    assert align_start("\u00e9t\u00e9".encode()[1:], 9) == 1  # a cut character is dropped
    assert align_start("\U0001f680x".encode()[1:], 9) == 3
    assert align_start(b"one long line\n", 9) == 0  # the newline ends the page: kept whole
    assert align_start(b"\x80\x80", 9) == 1  # never emptied


def test_forwards_and_backwards_find_every_match_case_insensitively_across_blocks() -> None:
    # Given matches on both sides of every block boundary and in mixed case
    filler = b"x" * (SEARCH_BLOCK_BYTES - 3)
    data = b"Needle" + filler + b"neEDLE" + filler + b"NEEDLE" + b"y" * 10 + b"needle"
    log = Log(data)
    expected = [i for i in range(len(data)) if data[i : i + 6].lower() == b"needle"]
    assert len(expected) == 4

    # Then paging forwards and backwards through the cursor finds each exactly once
    assert every(log, "nEeDlE") == expected
    assert every(log, "needle", backwards=True) == expected[::-1]


def test_a_request_scans_at_most_its_bound_and_says_where_to_go_on() -> None:
    log = Log(b"a" * (3 * SEARCH_BLOCK_BYTES) + b"target")

    first = search(
        log.read, len(log.data), "target", after=0, before=None, limit=5, scan_bytes=SEARCH_BLOCK_BYTES
    )

    assert first.matches == [] and first.next_cursor == SEARCH_BLOCK_BYTES
    assert log.read_bytes <= SEARCH_BLOCK_BYTES + 2 * len("target")
    assert every(log, "target", scan_bytes=SEARCH_BLOCK_BYTES) == [3 * SEARCH_BLOCK_BYTES]


def test_the_limit_ends_a_page_at_its_last_match() -> None:
    log = Log(b"ab ab ab ab")

    forwards = search(log.read, 11, "ab", after=None, before=None, limit=2)
    backwards = search(log.read, 11, "ab", after=None, before=11, limit=2)

    assert (forwards.matches, forwards.next_cursor) == ([0, 3], 4)
    assert (backwards.matches, backwards.next_cursor) == ([9, 6], 6)


def test_multibyte_text_matches_at_character_boundaries_only() -> None:
    text = "héllo wörld 日本語 ÉTÉ été\n"
    log = Log(text.encode())

    assert every(log, "wörld") == [text.encode().index("wörld".encode())]
    assert every(log, "本") == [text.encode().index("本".encode())]
    # only ASCII letters fold: "été" is not "ÉTÉ"
    assert every(log, "été") == [text.encode().index("été".encode())]


def test_a_match_inside_a_secret_value_is_never_reported() -> None:
    log = Log(b"token=hunter22 and hunter again")

    result = search(log.read, len(log.data), "hunter", after=0, before=None, limit=10, secrets=["hunter22"])

    assert result.matches == [19]


@pytest.mark.parametrize("query", ["", "x" * 201, "lone \ud800 surrogate"])
def test_bad_queries_are_refused(query: str) -> None:
    with pytest.raises(ValidationFailed):
        search(Log(b"data").read, 4, query, after=None, before=None, limit=1)


def test_after_and_before_together_are_refused() -> None:
    with pytest.raises(ValidationFailed):
        search(Log(b"data").read, 4, "a", after=0, before=4, limit=1)
