"""``GET .../tasks`` keyset pages both ways and its search, and ``GET .../next-fires``, through the
HTTP API on both databases (docs/console.md "Paging and search")."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.exceptions import StarletteDeprecationWarning

from ql3.application import auth, tasks
from ql3.http.app import create_app
from ql3.ports.storage import Transaction
from tests.support.databases import Harness

with warnings.catch_warnings():
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from fastapi.testclient import TestClient

TASKS = "/api/v1/projects/default/tasks"
FIRES = "/api/v1/projects/default/next-fires"
NAMES = [f"job-{i:02d}" for i in range(23)]


@pytest.fixture
def token(harness: Harness) -> str:
    def unit(tx: Transaction) -> str:
        issued = auth.bootstrap_owner(tx)
        assert issued is not None
        for name in NAMES:
            tasks.create_task(tx, issued.project.id, name, {"command": "true"})
        return issued.token

    found: str = harness.db.transaction(unit)
    return found


@pytest.fixture
def client(harness: Harness, token: str) -> Iterator[TestClient]:
    with TestClient(create_app(harness.db), headers={"Authorization": f"Bearer {token}"}) as c:
        yield c


def _get(client: TestClient, path: str, **params: Any) -> dict[str, Any]:
    resp = client.get(path, params=params)
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


def _names(page: dict[str, Any]) -> list[str]:
    return [str(t["name"]) for t in page["items"]]


def test_pages_walk_every_task_forward_and_back_again(client: TestClient) -> None:
    # When every page is read forward, 7 at a time
    forward: list[list[str]] = []
    page = _get(client, TASKS, limit=7)
    assert page["prev_cursor"] is None  # the first page has none before it
    for _ in range(10):
        forward.append(_names(page))
        if page["next_cursor"] is None:
            break
        page = _get(client, TASKS, limit=7, cursor=page["next_cursor"])
    # Then each task shows once, in name order, and the last page is short
    assert [n for p in forward for n in p] == NAMES
    assert [len(p) for p in forward] == [7, 7, 7, 2]

    # When the pages are read backwards from the last one with prev_cursor
    backward = [_names(page)]
    for _ in range(10):
        if page["prev_cursor"] is None:
            break
        page = _get(client, TASKS, limit=7, before=page["prev_cursor"])
        backward.append(_names(page))
    # Then the same pages come back, and the first one has no previous page but a next one
    assert backward == list(reversed(forward))
    assert page["prev_cursor"] is None and page["next_cursor"] == "job-06"


def test_a_page_before_the_first_seven_is_short_and_first(client: TestClient) -> None:
    page = _get(client, TASKS, limit=7, before="job-03")

    assert _names(page) == ["job-00", "job-01", "job-02"]
    assert page["prev_cursor"] is None and page["next_cursor"] == "job-02"


def test_search_keeps_name_substrings_ignoring_ascii_case_and_id_prefixes(
    client: TestClient, harness: Harness
) -> None:
    # Given tasks whose names hold LIKE's wildcards literally
    for name in ("Deploy_Web", "deployXweb", "50%-off", "500-off"):
        assert client.post(TASKS, json={"name": name, "command": "true"}).status_code == 201

    # Then a search is a case-insensitive substring of the name, wildcards taken literally
    assert _names(_get(client, TASKS, q="job-1")) == [f"job-1{i}" for i in range(10)]
    assert _names(_get(client, TASKS, q="DEPLOY_")) == ["Deploy_Web"]
    assert _names(_get(client, TASKS, q="0%")) == ["50%-off"]
    assert _get(client, TASKS, q="no such task")["items"] == []
    # and a task's id prefix finds it
    target = _get(client, TASKS, limit=1)["items"][0]
    assert target["id"] in [t["id"] for t in _get(client, TASKS, q=target["id"][:13])["items"]]
    # and a search pages like the whole list
    first = _get(client, TASKS, q="job-1", limit=4)
    second = _get(client, TASKS, q="job-1", limit=4, cursor=first["next_cursor"])
    back = _get(client, TASKS, q="job-1", limit=4, before=second["prev_cursor"])
    assert _names(second) == ["job-14", "job-15", "job-16", "job-17"]
    assert _names(back) == _names(first)


@pytest.mark.parametrize(
    "params",
    [
        {"limit": 0},
        {"limit": tasks.MAX_TASK_PAGE + 1},
        {"q": "x" * (tasks.MAX_SEARCH + 1)},
        {"cursor": "job-03", "before": "job-09"},
        {"before": ""},
    ],
    ids=["limit-0", "limit-too-big", "q-too-long", "cursor-and-before", "empty-before"],
)
def test_bad_paging_input_is_refused_with_a_stable_code(client: TestClient, params: dict[str, Any]) -> None:
    resp = client.get(TASKS, params=params)

    assert resp.status_code == 422, resp.text
    assert resp.json()["error"]["code"] == "validation_failed"


def test_next_fires_are_the_soonest_enabled_schedules_and_bounded(client: TestClient) -> None:
    # Given eight scheduled tasks, one of them disabled and one deleted
    # (made in an order that is not the order they fire in)
    crons = [
        "1 1 1 * *",
        "43 * * * *",
        "7 * * * *",
        "0 0 * * *",
        "31 * * * *",
        "3 */2 * * *",
        "19 * * * *",
        "55 * * * *",
    ]
    for i, cron in enumerate(crons):
        body = {"name": f"cron-{i}", "command": "true", "cron": cron}
        assert client.post(TASKS, json=body).status_code == 201
    assert client.post(f"{TASKS}/cron-2/disable").status_code == 200
    assert client.delete(f"{TASKS}/cron-5").status_code == 204
    listed = _get(client, TASKS, q="cron-")["items"]
    expected = sorted(
        ((t["next_fire_at_ms"], t["id"], t["name"]) for t in listed if t["enabled"] and t["next_fire_at_ms"]),
    )

    # When the next four fires are asked for
    fires = _get(client, FIRES, limit=4)["items"]

    # Then they are the four soonest of the enabled live schedules, soonest first
    assert [(f["next_fire_at_ms"], f["task_id"], f["task_name"]) for f in fires] == expected[:4]
    assert len(_get(client, FIRES)["items"]) == 6  # the default of 10 holds all six
    assert client.get(FIRES, params={"limit": tasks.MAX_NEXT_FIRES + 1}).status_code == 422
