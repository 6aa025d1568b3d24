"""Starting runs (idempotently), reading them back page by page, and their event log."""

from __future__ import annotations

from typing import Any

import pytest

RUNS = "/api/v1/projects/default/runs"
START = "/api/v1/projects/default/tasks/job/runs"


def test_a_started_run_is_queued_at_the_tasks_revision(client: Any, owner: Any, make_task: Any) -> None:
    task = make_task("job")

    resp = client.post(START, json={"priority": 5}, headers=owner)

    assert resp.status_code == 201
    run = resp.json()
    assert (run["task_id"], run["task_revision"]) == (task["id"], 1)
    assert (run["status"], run["priority"]) == ("queued", 5)
    assert run["trigger_type"] == "manual"
    assert run["exit_code"] is None


def test_a_run_can_be_started_without_a_body(client: Any, owner: Any, make_task: Any) -> None:
    make_task("job")

    resp = client.post(START, headers=owner)

    assert resp.status_code == 201


def test_repeating_an_idempotency_key_returns_the_same_run(
    client: Any, owner: Any, make_task: Any, counts: Any
) -> None:
    # Given a run started with a key
    make_task("job")
    first = client.post(START, json={"idempotency_key": "nightly-1"}, headers=owner)
    after_first = counts()

    # When the same request is repeated
    second = client.post(START, json={"idempotency_key": "nightly-1"}, headers=owner)

    # Then the first was created (201), the repeat answers 200 with the same run, and nothing new exists
    assert (first.status_code, second.status_code) == (201, 200)
    assert second.json()["id"] == first.json()["id"]
    assert counts() == after_first
    assert after_first["runs"] == 1


def test_an_idempotency_key_reused_for_another_task_is_a_conflict(
    client: Any, owner: Any, make_task: Any, counts: Any
) -> None:
    make_task("job")
    make_task("other")
    client.post(START, json={"idempotency_key": "k1"}, headers=owner)
    before = counts()

    resp = client.post(
        "/api/v1/projects/default/tasks/other/runs", json={"idempotency_key": "k1"}, headers=owner
    )

    assert resp.status_code == 409
    assert resp.json()["error"]["code"] == "idempotency_conflict"
    assert counts() == before


def test_runs_are_listed_newest_first_in_keyset_pages(client: Any, owner: Any, make_task: Any) -> None:
    # Given seven runs
    make_task("job")
    started = [client.post(START, json={}, headers=owner).json()["id"] for _ in range(7)]

    # When they are read three at a time, following next_cursor
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 3} | ({"cursor": cursor} if cursor else {})
        page = client.get(RUNS, params=params, headers=owner).json()
        seen += [r["id"] for r in page["items"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break

    # Then every run appears once, newest first, in three pages
    assert seen == list(reversed(started))
    assert pages == 3


def test_run_list_can_be_filtered_by_task_name(client: Any, owner: Any, make_task: Any) -> None:
    make_task("job")
    make_task("other")
    mine = client.post(START, json={}, headers=owner).json()
    client.post("/api/v1/projects/default/tasks/other/runs", json={}, headers=owner)

    page = client.get(RUNS, params={"task": "job"}, headers=owner).json()

    assert [r["id"] for r in page["items"]] == [mine["id"]]


def test_run_show_returns_the_run(client: Any, owner: Any, make_task: Any) -> None:
    make_task("job")
    run = client.post(START, json={}, headers=owner).json()

    shown = client.get(f"{RUNS}/{run['id']}", headers=owner)

    assert shown.status_code == 200
    assert shown.json() == run


def test_a_new_run_has_created_and_queued_events(client: Any, owner: Any, make_task: Any) -> None:
    make_task("job")
    run = client.post(START, json={}, headers=owner).json()

    page = client.get(f"{RUNS}/{run['id']}/events", headers=owner).json()

    assert [(e["sequence"], e["type"]) for e in page["items"]] == [(1, "run.created"), (2, "run.queued")]
    assert page["items"][0]["payload"] == {"trigger_type": "manual", "task_revision": 1}
    assert page["next_after"] is None


def test_events_page_after_a_sequence(client: Any, owner: Any, make_task: Any) -> None:
    make_task("job")
    run = client.post(START, json={}, headers=owner).json()

    page = client.get(f"{RUNS}/{run['id']}/events", params={"after": 1, "limit": 1}, headers=owner).json()

    assert [e["type"] for e in page["items"]] == ["run.queued"]
    assert page["next_after"] == 2


def test_a_run_pins_the_revision_current_when_it_started(client: Any, owner: Any, make_task: Any) -> None:
    # Given a run at revision 1 and an edit that publishes revision 2
    make_task("job")
    first = client.post(START, json={}, headers=owner).json()
    client.patch(
        "/api/v1/projects/default/tasks/job", json={"max_attempts": 2, "retry_safe": True}, headers=owner
    )

    # When another run starts
    second = client.post(START, json={}, headers=owner).json()

    # Then each keeps its own revision
    assert (first["task_revision"], second["task_revision"]) == (1, 2)
    assert client.get(f"{RUNS}/{first['id']}", headers=owner).json()["task_revision"] == 1


def test_an_idempotency_key_reused_with_another_body_is_a_conflict(
    client: Any, owner: Any, make_task: Any, counts: Any
) -> None:
    # Given a run started with a key and priority 1
    make_task("job")
    first = client.post(START, json={"idempotency_key": "k", "priority": 1}, headers=owner)
    before = counts()

    # When the key comes back with priority 9, then with the first body
    other = client.post(START, json={"idempotency_key": "k", "priority": 9}, headers=owner)
    same = client.post(START, json={"idempotency_key": "k", "priority": 1}, headers=owner)

    # Then the other body is 409 and wrote nothing; the same body is the first run (200)
    assert first.status_code == 201
    assert other.status_code == 409 and other.json()["error"]["code"] == "idempotency_conflict"
    assert same.status_code == 200 and same.json()["id"] == first.json()["id"]
    assert counts() == before


@pytest.mark.parametrize("key", ["ql3:cron:v1:0196a000-0000-7000-8000-000000000000:1:60000", "QL3:anything"])
def test_keys_under_ql3_are_reserved_for_the_server(
    client: Any, owner: Any, make_task: Any, counts: Any, key: str
) -> None:
    # Taking the scheduler's next keys in advance would suppress its cron fires (the keys are 422)
    make_task("job")
    before = counts()

    resp = client.post(START, json={"idempotency_key": key}, headers=owner)

    assert resp.status_code == 422 and resp.json()["error"]["code"] == "reserved_idempotency_key"
    assert counts() == before
