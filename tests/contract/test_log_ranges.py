"""Ranged reads and the search of a shipped log (docs/console.md "The run log") through the API on SQLite and
PostgreSQL: the end of the log in one read, pages backwards that rebuild it exactly, the search over
every chunk with its cursor, and bad input refused."""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.exceptions import StarletteDeprecationWarning

from ql3.application import auth
from ql3.application.log_ranges import MAX_SEARCH_SCAN_BYTES
from ql3.http.app import create_app
from ql3.ports.storage import Transaction
from tests.contract.test_attempt_logs import leased, ship
from tests.support.databases import Harness

with warnings.catch_warnings():
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from fastapi.testclient import TestClient

CHUNK = 64 * 1024
P = "/api/v1/projects/default/runs"


def _log(lines: int) -> bytes:
    """Numbered lines of mixed widths, with multibyte characters; a marker on lines 7 and lines - 7."""
    out = bytearray()
    for i in range(lines):
        mark = " Needle" if i in (7, lines - 7) else ""
        out += f"{i:06d} héllo wörld 🚀{mark} {'x' * (i % 50)}\n".encode()
    return bytes(out)


@pytest.fixture
def shipped(harness: Harness) -> Iterator[tuple[TestClient, str, bytes]]:
    """A client (the owner's token, no log files: a control replica) and a run whose remote worker
    shipped a log of about 1.3 MB in 64 KiB chunks."""
    session, fence = leased(harness.db)
    data = _log(20_000)
    for offset in range(0, len(data), CHUNK):
        ship(harness.db, session, fence.attempt_id, offset, data[offset : offset + CHUNK], cap=1 << 30)

    def token(tx: Transaction) -> str:
        project = auth.resolve_project(tx, "default")
        return auth.issue_token(tx, name="reader", role="viewer", project=project).token

    bearer = {"Authorization": f"Bearer {harness.db.transaction(token)}"}
    with TestClient(create_app(harness.db), headers=bearer) as client:
        yield client, fence.run_id, data


def _get(client: TestClient, url: str, **params: Any) -> dict[str, Any]:
    resp = client.get(url, params=params)
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


def test_the_end_in_one_read_then_pages_backwards_rebuild_the_log_exactly(
    shipped: tuple[TestClient, str, bytes],
) -> None:
    client, run_id, data = shipped
    url = f"{P}/{run_id}/logs"

    # When the end is read, then pages before it until the start
    tail = _get(client, url, from_end=100_000)
    pages = [tail]
    for _ in range(100):
        if pages[0]["offset"] == 0:
            break
        pages.insert(0, _get(client, url, before=pages[0]["offset"], max_bytes=100_000))

    # Then the end came in one read, starting at a line, and the pages chain back to 0 exactly
    assert tail["next_offset"] == tail["size"] == len(data) and tail["eof"] is True
    assert data[tail["offset"] - 1 : tail["offset"]] == b"\n"
    assert len(data) - tail["offset"] <= 100_000
    assert all(a["next_offset"] == b["offset"] for a, b in itertools.pairwise(pages))
    assert "".join(p["data"] for p in pages) == data.decode()
    assert len(pages) <= len(data) // 90_000 + 2  # every page but the first holds nearly a full read
    assert [p["eof"] for p in pages[:-1]] == [False] * (len(pages) - 1)


def test_a_page_without_a_line_start_starts_at_a_character(harness: Harness) -> None:
    session, fence = leased(harness.db)
    data = "🚀é" * 2000  # one line of 12,000 bytes
    ship(harness.db, session, fence.attempt_id, 0, data.encode())

    def token(tx: Transaction) -> str:
        return auth.issue_token(
            tx, name="r", role="viewer", project=auth.resolve_project(tx, "default")
        ).token

    with TestClient(
        create_app(harness.db), headers={"Authorization": f"Bearer {harness.db.transaction(token)}"}
    ) as c:
        pages = [_get(c, f"{P}/{fence.run_id}/logs", from_end=1001)]
        for _ in range(100):
            if pages[0]["offset"] == 0:
                break
            pages.insert(0, _get(c, f"{P}/{fence.run_id}/logs", before=pages[0]["offset"], max_bytes=777))

    assert "".join(p["data"] for p in pages) == data
    assert not any("\ufffd" in p["data"] for p in pages)


def test_the_search_covers_every_chunk_forwards_and_backwards(shipped: tuple[TestClient, str, bytes]) -> None:
    client, run_id, data = shipped
    url = f"{P}/{run_id}/logs/search"
    expected = [i for i in range(len(data)) if data[i : i + 6].lower() == b"needle"]
    assert len(expected) == 2 and expected[1] > len(data) - 1000

    forwards = _get(client, url, q="NEEDLE")
    first = _get(client, url, q="needle", limit=1)
    after_first = _get(client, url, q="needle", after=first["matches"][0]["offset"] + 1, limit=1)
    backwards = _get(client, url, q="needle", before=len(data))
    unicode = _get(client, url, q="000123 héllo wörld 🚀")

    assert [m["offset"] for m in forwards["matches"]] == expected
    assert forwards["next_cursor"] is None and forwards["size"] == len(data)
    assert {m["length"] for m in forwards["matches"]} == {6}
    assert (first["matches"][0]["offset"], first["next_cursor"]) == (expected[0], expected[0] + 1)
    assert [m["offset"] for m in after_first["matches"]] == expected[1:]
    assert [m["offset"] for m in backwards["matches"]] == expected[::-1]
    assert [m["offset"] for m in unicode["matches"]] == [data.index("000123 héllo".encode())]
    assert forwards["scanned_bytes"] <= MAX_SEARCH_SCAN_BYTES


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("logs", {"from_end": 10, "before": 10}),
        ("logs", {"offset": 0, "from_end": 10}),
        ("logs", {"from_end": 0}),
        ("logs", {"from_end": 262_145}),
        ("logs", {"before": -1}),
        ("logs/search", {}),
        ("logs/search", {"q": ""}),
        ("logs/search", {"q": "x" * 201}),
        ("logs/search", {"q": "a", "after": 0, "before": 5}),
        ("logs/search", {"q": "a", "limit": 101}),
        ("logs/search", {"q": "a", "after": -1}),
    ],
)
def test_bad_ranges_and_searches_are_refused(
    shipped: tuple[TestClient, str, bytes], path: str, params: dict[str, Any]
) -> None:
    client, run_id, _ = shipped

    resp = client.get(f"{P}/{run_id}/{path}", params=params)

    assert resp.status_code == 422, resp.text
    assert resp.json()["error"]["code"] == "validation_failed"
