"""The run logs route: offset paging, bounds, UTF-8 handling, completeness, isolation, no paths."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from ql3.application import runs
from ql3.storage.sqlite.adapter import SqliteDatabase

RUNS = "/api/v1/projects/default/runs"


def logs_url(run: dict[str, Any], project: str = "default") -> str:
    return f"/api/v1/projects/{project}/runs/{run['id']}/logs"


def write_log(root: Path, run: dict[str, Any], data: bytes) -> None:
    (root / f"{run['attempt_id']}.log").write_bytes(data)


def finish(db: SqliteDatabase, run: dict[str, Any]) -> None:
    """Move the queued run to a terminal status (cancelled) through the real transition."""
    db.transaction(
        lambda tx: runs.transition(
            tx, run["id"], run["version"], "cancelled", actor_type="user", finished_at_ms=tx.now_ms()
        )
    )


def read_all(client: Any, run: dict[str, Any], headers: Any, max_bytes: int) -> list[dict[str, Any]]:
    pages: list[dict[str, Any]] = []
    offset = 0
    for _ in range(1000):
        resp = client.get(logs_url(run), params={"offset": offset, "max_bytes": max_bytes}, headers=headers)
        assert resp.status_code == 200, resp.text
        page = resp.json()
        pages.append(page)
        offset = page["next_offset"]
        if page["eof"]:
            return pages
    raise AssertionError("the log never reached eof")


def test_a_log_is_read_in_pages_that_chain_by_offset(
    logs_client: Any, owner: Any, started_run: Any, logs_root: Path
) -> None:
    # Given a run whose attempt has written 40 bytes
    run = started_run()
    content = b"".join(f"line {i:02d}\n".encode() for i in range(5))
    write_log(logs_root, run, content)

    # When it is read 16 bytes at a time, each page asking from the previous next_offset
    pages = read_all(logs_client, run, owner, max_bytes=16)

    # Then the pages chain exactly, add up to the file, and only the last one is eof
    assert [(p["offset"], p["next_offset"]) for p in pages] == [(0, 16), (16, 32), (32, 40)]
    assert "".join(p["data"] for p in pages) == content.decode()
    assert [p["eof"] for p in pages] == [False, False, True]
    assert {p["attempt"] for p in pages} == {1}
    # the run is still queued, so the log is not complete even at its end
    assert not any(p["complete"] for p in pages)


def test_reading_from_an_offset_returns_the_rest(
    logs_client: Any, owner: Any, started_run: Any, logs_root: Path
) -> None:
    run = started_run()
    write_log(logs_root, run, b"one\ntwo\n")

    page = logs_client.get(logs_url(run), params={"offset": 4}, headers=owner).json()
    past = logs_client.get(logs_url(run), params={"offset": 100}, headers=owner).json()

    assert (page["data"], page["offset"], page["next_offset"], page["eof"]) == ("two\n", 4, 8, True)
    assert (past["data"], past["next_offset"], past["eof"]) == ("", 100, True)


def test_a_run_without_a_log_yet_reads_as_empty(logs_client: Any, owner: Any, started_run: Any) -> None:
    run = started_run()

    page = logs_client.get(logs_url(run), headers=owner).json()

    assert page == {
        "attempt": 1,
        "offset": 0,
        "next_offset": 0,
        "data": "",
        "eof": True,
        "complete": False,
        "size": 0,
    }


def test_complete_only_once_the_run_is_terminal_and_the_log_is_drained(
    db: SqliteDatabase, logs_client: Any, owner: Any, started_run: Any, logs_root: Path
) -> None:
    # Given a finished run with a 10-byte log
    run = started_run()
    write_log(logs_root, run, b"0123456789")
    before = logs_client.get(logs_url(run), headers=owner).json()
    finish(db, run)

    # When it is read in two pages
    first = logs_client.get(logs_url(run), params={"max_bytes": 6}, headers=owner).json()
    last = logs_client.get(logs_url(run), params={"offset": 6, "max_bytes": 6}, headers=owner).json()

    # Then only the page that drains the terminal run's log is complete
    assert before["complete"] is False
    assert (first["eof"], first["complete"]) == (False, False)
    assert (last["data"], last["eof"], last["complete"]) == ("6789", True, True)


def test_a_terminal_run_that_never_wrote_a_log_is_complete(
    db: SqliteDatabase, logs_client: Any, owner: Any, started_run: Any
) -> None:
    run = started_run()
    finish(db, run)

    page = logs_client.get(logs_url(run), headers=owner).json()

    assert (page["data"], page["eof"], page["complete"]) == ("", True, True)


@pytest.mark.parametrize(
    "params",
    [
        {"max_bytes": 0},
        {"max_bytes": 262_145},
        {"max_bytes": -1},
        {"max_bytes": "lots"},
        {"offset": -1},
        {"offset": "start"},
        {"attempt": 0},
    ],
    ids=["zero", "over-max", "negative", "not-a-number", "negative-offset", "text-offset", "attempt-0"],
)
def test_out_of_bounds_pages_are_rejected(
    logs_client: Any, owner: Any, started_run: Any, logs_root: Path, params: dict[str, Any]
) -> None:
    run = started_run()
    write_log(logs_root, run, b"data\n")

    resp = logs_client.get(logs_url(run), params=params, headers=owner)

    assert resp.status_code == 422
    assert resp.json()["error"]["code"] == "validation_failed"


def test_the_largest_page_is_allowed_and_bounded(
    logs_client: Any, owner: Any, started_run: Any, logs_root: Path
) -> None:
    run = started_run()
    write_log(logs_root, run, b"x" * 300_000)

    page = logs_client.get(logs_url(run), params={"max_bytes": 262_144}, headers=owner).json()

    assert (len(page["data"]), page["next_offset"], page["eof"]) == (262_144, 262_144, False)


def test_a_multibyte_character_is_never_split_across_pages(
    logs_client: Any, owner: Any, started_run: Any, logs_root: Path
) -> None:
    # Given text whose characters take 1 to 4 bytes
    run = started_run()
    text = "héllo → wörld 🚀 done\n" * 3
    write_log(logs_root, run, text.encode())

    # When it is read in pages of 5 bytes, which land inside characters
    pages = read_all(logs_client, run, owner, max_bytes=5)

    # Then the text comes back whole, with no replacement character
    assert "".join(p["data"] for p in pages) == text
    assert "\ufffd" not in "".join(p["data"] for p in pages)


def test_invalid_utf8_is_replaced(logs_client: Any, owner: Any, started_run: Any, logs_root: Path) -> None:
    run = started_run()
    write_log(logs_root, run, b"ok \xff\xfe end\n")

    page = logs_client.get(logs_url(run), headers=owner).json()

    assert page["data"] == "ok \ufffd\ufffd end\n"
    assert page["next_offset"] == 10


def test_an_attempt_can_be_named_and_a_missing_one_is_not_found(
    logs_client: Any, owner: Any, started_run: Any, logs_root: Path
) -> None:
    run = started_run()
    write_log(logs_root, run, b"first\n")

    named = logs_client.get(logs_url(run), params={"attempt": 1}, headers=owner)
    missing = logs_client.get(logs_url(run), params={"attempt": 2}, headers=owner)

    assert (named.status_code, named.json()["data"]) == (200, "first\n")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"


def test_a_viewer_can_read_logs(logs_client: Any, make_token: Any, started_run: Any, logs_root: Path) -> None:
    run = started_run()
    write_log(logs_root, run, b"visible\n")

    resp = logs_client.get(logs_url(run), headers=make_token("viewer"))

    assert resp.status_code == 200
    assert resp.json()["data"] == "visible\n"


def test_logs_need_a_token(logs_client: Any, started_run: Any) -> None:
    run = started_run()

    resp = logs_client.get(logs_url(run))

    assert resp.status_code == 401
    assert resp.json()["error"]["code"] == "unauthenticated"


def test_another_projects_run_is_not_found(
    logs_client: Any, owner: Any, make_token: Any, started_run: Any, logs_root: Path
) -> None:
    # Given a run with a log in project "other"
    make_token("admin", project="other")  # creates the project
    theirs = started_run("job", project="other")
    write_log(logs_root, theirs, b"secret output\n")

    # When it is asked for through the default project, or by a member of default only
    via_default = logs_client.get(logs_url(theirs), headers=owner)
    outsider = logs_client.get(logs_url(theirs, project="other"), headers=make_token("viewer"))

    # Then both are 404 and nothing of the log shows
    for resp in (via_default, outsider):
        assert resp.status_code == 404
        assert resp.json()["error"]["code"] == "not_found"
        assert "secret output" not in resp.text


def test_an_unknown_or_malformed_run_id_is_not_found(logs_client: Any, owner: Any) -> None:
    unknown = logs_client.get(f"{RUNS}/01a22d6c-0942-71ad-b0a5-4738104dd590/logs", headers=owner)
    malformed = logs_client.get(f"{RUNS}/..%2F..%2Fetc/logs", headers=owner)

    assert unknown.status_code == 404
    assert malformed.status_code == 404


def test_a_symlinked_log_is_refused_without_following_it(
    logs_client: Any, owner: Any, started_run: Any, logs_root: Path, tmp_path: Path
) -> None:
    # Given a log file that is a symlink to a file outside the logs root
    run = started_run()
    outside = tmp_path / "outside.txt"
    outside.write_text("not a log\n")
    os.symlink(outside, logs_root / f"{run['attempt_id']}.log")

    resp = logs_client.get(logs_url(run), headers=owner)

    assert resp.status_code == 404
    assert resp.json()["error"]["code"] == "logs_unavailable"
    assert "not a log" not in resp.text


def test_without_a_logs_root_the_route_serves_only_shipped_logs(
    client: Any, owner: Any, make_task: Any
) -> None:
    # A server without log files (a ql3 control replica) serves what remote workers shipped to the
    # database (docs/cluster.md "Log shipping"): nothing yet is an empty page, never a file read.
    make_task("job")
    run = client.post("/api/v1/projects/default/tasks/job/runs", json={}, headers=owner).json()

    resp = client.get(logs_url(run), headers=owner)

    assert resp.status_code == 200
    assert (resp.json()["data"], resp.json()["eof"], resp.json()["complete"]) == ("", True, False)


def test_no_response_ever_shows_a_file_path(
    db: SqliteDatabase,
    logs_client: Any,
    owner: Any,
    make_token: Any,
    started_run: Any,
    logs_root: Path,
    tmp_path: Path,
) -> None:
    # Given runs whose logs are present, missing, a symlink, and one in another project
    present, missing, linked = started_run(), started_run(), started_run()
    write_log(logs_root, present, b"hello\n")
    os.symlink(tmp_path / "nowhere", logs_root / f"{linked['attempt_id']}.log")
    finish(db, missing)

    # When every kind of answer is produced (ok, empty, refused, bad bounds, not found, unauthenticated)
    answers = [
        logs_client.get(logs_url(present), headers=owner),
        logs_client.get(logs_url(missing), headers=owner),
        logs_client.get(logs_url(linked), headers=owner),
        logs_client.get(logs_url(present), params={"max_bytes": 0}, headers=owner),
        logs_client.get(logs_url(present), params={"attempt": 9}, headers=owner),
        logs_client.get(logs_url(present, project="nope"), headers=owner),
        logs_client.get(logs_url(present), headers=make_token("viewer", project="other")),
        logs_client.get(logs_url(present)),
    ]

    # Then none of them names the logs root, the file or the attempt's file name
    assert {a.status_code for a in answers} == {200, 401, 404, 422}
    for answer in answers:
        for leak in (str(tmp_path), str(logs_root), ".log", "worker/logs", present["attempt_id"]):
            assert leak not in answer.text


def test_a_character_still_being_written_is_held_back_until_it_is_whole(
    db: SqliteDatabase, logs_client: Any, owner: Any, started_run: Any, logs_root: Path
) -> None:
    # Given a running log whose writer has written only the first two bytes of "→" (3 bytes)
    run = started_run()
    path = logs_root / f"{run['attempt_id']}.log"
    path.write_bytes(b"a " + "→".encode()[:2])

    # When it is read, then the rest of the character arrives and it is read again from next_offset
    first = logs_client.get(logs_url(run), headers=owner).json()
    with path.open("ab") as fh:
        fh.write("→".encode()[2:] + b"\n")
    second = logs_client.get(logs_url(run), params={"offset": first["next_offset"]}, headers=owner).json()

    # Then the half character is not shown as garbage but comes whole with the next page
    assert (first["data"], first["next_offset"], first["eof"]) == ("a ", 2, True)
    assert (second["data"], second["next_offset"]) == ("→\n", 6)


def test_a_finished_run_shows_a_cut_character_as_replaced(
    db: SqliteDatabase, logs_client: Any, owner: Any, started_run: Any, logs_root: Path
) -> None:
    run = started_run()
    write_log(logs_root, run, b"end " + "→".encode()[:2])
    finish(db, run)

    page = logs_client.get(logs_url(run), headers=owner).json()

    assert (page["data"], page["next_offset"], page["complete"]) == ("end \ufffd", 6, True)
