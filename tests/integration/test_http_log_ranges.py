"""Ranged reads and the search of a local log file (``ql3 serve``, docs/console.md "The run log"): the end in
one read, pages backwards that chain exactly, a bounded search with its cursor over a log larger than
one request's scan, secret values never found, completeness, and access as for the log itself."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ql3.application.log_ranges import MAX_SEARCH_SCAN_BYTES
from ql3.http.app import create_app
from ql3.storage.secret_box import AesGcmBox
from ql3.storage.sqlite.adapter import SqliteDatabase
from tests.integration.test_http_logs import finish, logs_url, write_log


def search_url(run: dict[str, Any], project: str = "default") -> str:
    return logs_url(run, project) + "/search"


def get(client: Any, url: str, headers: Any, **params: Any) -> dict[str, Any]:
    resp = client.get(url, params=params, headers=headers)
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


def test_the_end_of_a_log_is_one_read_starting_at_a_line(
    logs_client: Any, owner: Any, started_run: Any, logs_root: Path
) -> None:
    run = started_run()
    content = b"".join(f"line {i:05d}\n".encode() for i in range(10_000))  # 110,000 bytes
    write_log(logs_root, run, content)

    tail = get(logs_client, logs_url(run), owner, from_end=1000)
    whole = get(logs_client, logs_url(run), owner, from_end=262_144)

    # the last 1000 bytes, from the first line that starts inside them
    assert (tail["offset"], tail["next_offset"], tail["size"], tail["eof"]) == (
        109_010,
        110_000,
        110_000,
        True,
    )
    assert tail["data"] == content[109_010:].decode() and tail["data"].startswith("line 09910\n")
    # a read longer than the log is the whole log
    assert (whole["offset"], whole["data"]) == (0, content.decode())
    assert tail["complete"] is False  # the run goes on


def test_pages_backwards_chain_exactly_and_never_split_a_character(
    logs_client: Any, owner: Any, started_run: Any, logs_root: Path
) -> None:
    run = started_run()
    content = "".join(f"{i} héllo → wörld 🚀\n" if i % 7 else "🚀" * 300 + "\n" for i in range(3000)).encode()
    write_log(logs_root, run, content)

    pages = [get(logs_client, logs_url(run), owner, from_end=4096)]
    for _ in range(1000):
        if pages[0]["offset"] == 0:
            break
        pages.insert(0, get(logs_client, logs_url(run), owner, before=pages[0]["offset"], max_bytes=999))

    assert pages[0]["offset"] == 0
    assert all(a["next_offset"] == b["offset"] for a, b in itertools.pairwise(pages))
    assert "".join(p["data"] for p in pages).encode() == content
    assert not any("\ufffd" in p["data"] for p in pages)
    # a before= past the end reads the end; the forward offset read is unchanged beside them
    past = get(logs_client, logs_url(run), owner, before=10**9, max_bytes=100)
    assert past["next_offset"] == len(content) and past["eof"] is True
    forward = get(logs_client, logs_url(run), owner, offset=0, max_bytes=100)
    assert (forward["offset"], forward["data"]) == (0, content[:100].decode())


def test_a_terminal_runs_end_read_is_complete(
    db: SqliteDatabase, logs_client: Any, owner: Any, started_run: Any, logs_root: Path
) -> None:
    run = started_run()
    write_log(logs_root, run, b"a\nb\nc\n")
    finish(db, run)

    tail = get(logs_client, logs_url(run), owner, from_end=3)
    earlier = get(logs_client, logs_url(run), owner, before=2, max_bytes=10)

    assert (tail["data"], tail["complete"]) == ("c\n", True)
    assert (earlier["data"], earlier["eof"], earlier["complete"]) == ("a\n", False, False)


def test_the_search_goes_through_a_log_larger_than_one_requests_scan(
    logs_client: Any, owner: Any, started_run: Any, logs_root: Path
) -> None:
    # Given a 9 MiB log with a match near its start and one near its end
    run = started_run()
    line = b"x" * 1023 + b"\n"
    content = line * 5 + b"the Target here\n" + line * (9 * 1024 - 10) + b"a TARGET again\n" + line
    write_log(logs_root, run, content)
    expected = [content.lower().index(b"target"), content.lower().rindex(b"target")]
    assert expected[1] > MAX_SEARCH_SCAN_BYTES

    # When it is searched from after the first match, following the cursor
    first = get(logs_client, search_url(run), owner, q="target", after=expected[0] + 1)
    second = get(logs_client, search_url(run), owner, q="target", after=first["next_cursor"])
    backwards = get(logs_client, search_url(run), owner, q="TaRgEt", before=len(content), limit=5)
    rest = get(logs_client, search_url(run), owner, q="TaRgEt", before=backwards["next_cursor"], limit=5)

    # Then one request scans at most its bound and says where to go on; the next one finds the match
    assert first["matches"] == [] and first["next_cursor"] == expected[0] + 1 + MAX_SEARCH_SCAN_BYTES
    assert first["scanned_bytes"] == MAX_SEARCH_SCAN_BYTES
    assert [m["offset"] for m in second["matches"]] == [expected[1]] and second["next_cursor"] is None
    assert [m["offset"] for m in backwards["matches"] + rest["matches"]] == expected[::-1]
    assert rest["next_cursor"] is None
    # and the region around a match is what a ranged read of it returns
    around = get(logs_client, logs_url(run), owner, before=expected[1] + 100, max_bytes=2000)
    assert "a TARGET again" in around["data"]


@pytest.fixture
def secret_client(db: SqliteDatabase, owner_token: str, logs_root: Path) -> Iterator[TestClient]:
    with TestClient(create_app(db, logs_root=logs_root, secret_box=AesGcmBox(os.urandom(32)))) as client:
        yield client


def test_a_secret_value_is_never_found_and_reads_mask_it(
    secret_client: Any, owner: Any, started_run: Any, logs_root: Path
) -> None:
    put = secret_client.put(
        "/api/v1/projects/default/variables/API_KEY",
        json={"value": "hunter2-key", "secret": True},
        headers=owner,
    )
    assert put.status_code == 200, put.text
    run = started_run()
    write_log(logs_root, run, b"using hunter2-key now\nthe hunter is here\n")

    found = get(secret_client, search_url(run), owner, q="hunter")
    whole = get(secret_client, search_url(run), owner, q="hunter2-key")
    tail = get(secret_client, logs_url(run), owner, from_end=100)

    assert [m["offset"] for m in found["matches"]] == [len(b"using hunter2-key now\nthe ")]
    assert whole["matches"] == []
    assert "hunter2-key" not in tail["data"] and "***" in tail["data"]


def test_the_search_is_read_as_the_log_is(
    logs_client: Any, owner: Any, make_token: Any, started_run: Any, logs_root: Path
) -> None:
    run = started_run()
    write_log(logs_root, run, b"findable\n")

    viewer = logs_client.get(search_url(run), params={"q": "find"}, headers=make_token("viewer"))
    outsider = logs_client.get(
        search_url(run), params={"q": "find"}, headers=make_token("viewer", project="other")
    )
    anonymous = logs_client.get(search_url(run), params={"q": "find"})
    refused = logs_client.get(search_url(run), params={"q": "find", "after": 0, "before": 3}, headers=owner)

    assert viewer.status_code == 200 and [m["offset"] for m in viewer.json()["matches"]] == [0]
    assert outsider.status_code == 404 and "findable" not in outsider.text
    assert anonymous.status_code == 401
    assert refused.status_code == 422 and refused.json()["error"]["code"] == "validation_failed"


def test_a_run_without_a_log_searches_as_empty(logs_client: Any, owner: Any, started_run: Any) -> None:
    run = started_run()

    found = get(logs_client, search_url(run), owner, q="anything")
    tail = get(logs_client, logs_url(run), owner, from_end=10)

    assert (found["matches"], found["next_cursor"], found["size"]) == ([], None, 0)
    assert (tail["data"], tail["offset"], tail["eof"]) == ("", 0, True)
