"""Strict JSON: a body that names one key twice in an object is 422 ``duplicate_key`` on every route,
before authentication and before anything is written (``{"command":"id","command":"rm -rf /"}`` would
otherwise run the last one while a reviewer reads the first). docs/security.md "HTTP edge"."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ql3.http.app import create_app
from ql3.http.limits import has_duplicate_key
from ql3.storage.sqlite.adapter import SqliteDatabase

DUPLICATED = b'{"name":"a","name":"b"}'
JSON = {"Content-Type": "application/json"}


def _write_routes() -> list[tuple[str, str]]:
    """Every POST, PUT, PATCH and DELETE operation the API documents, path parameters filled in."""
    paths = create_app(SqliteDatabase(":memory:")).openapi()["paths"]
    out: list[tuple[str, str]] = []
    for path, operations in paths.items():
        for method in operations:
            if method in ("post", "put", "patch", "delete"):
                out.append((method.upper(), re.sub(r"\{[^}]+\}", "x", path)))
    return sorted(out)


WRITE_ROUTES = _write_routes()


def test_every_write_route_is_covered() -> None:
    assert len(WRITE_ROUTES) >= 20
    assert ("POST", "/api/v1/projects/x/tasks/x/runs") in WRITE_ROUTES


@pytest.mark.parametrize(("method", "path"), WRITE_ROUTES)
def test_a_duplicate_key_is_refused_on_every_route(
    client: TestClient, owner: dict[str, str], method: str, path: str
) -> None:
    resp = client.request(method, path, content=DUPLICATED, headers={**owner, **JSON})

    assert resp.status_code == 422, resp.text
    assert resp.json()["error"]["code"] == "duplicate_key"


def test_a_task_whose_command_is_given_twice_is_not_created(
    client: TestClient, owner: dict[str, str]
) -> None:
    body = b'{"name":"job","command":"id","command":"echo planted-second-command"}'

    resp = client.post("/api/v1/projects/default/tasks", content=body, headers={**owner, **JSON})

    assert resp.status_code == 422 and resp.json()["error"]["code"] == "duplicate_key"
    assert client.get("/api/v1/projects/default/tasks", headers=owner).json()["items"] == []


def test_the_run_start_fast_path_refuses_it_too(
    client: TestClient, owner: dict[str, str], make_task: Any, counts: Any
) -> None:
    make_task("job")
    before = counts()
    body = b'{"priority":1,"priority":9}'

    for headers in ({**owner, **JSON}, owner):  # with and without a Content-Type (read as JSON)
        resp = client.post("/api/v1/projects/default/tasks/job/runs", content=body, headers=headers)
        assert resp.status_code == 422 and resp.json()["error"]["code"] == "duplicate_key"
    assert counts() == before


def test_malformed_and_unique_bodies_go_on_as_before(client: TestClient, owner: dict[str, str]) -> None:
    malformed = client.post("/api/v1/projects/default/tasks", content=b'{"name":', headers={**owner, **JSON})
    created = client.post(
        "/api/v1/projects/default/tasks",
        content=b'{"name":"job","command":"id","env":{"A":"1","B":"1"}}',
        headers={**owner, **JSON},
    )

    assert malformed.status_code == 400 and malformed.json()["error"]["code"] == "malformed_json"
    assert created.status_code == 201, created.text


@pytest.mark.parametrize(
    ("body", "duplicate"),
    [
        (b'{"a":1,"a":1}', True),
        (b'{"a":{"b":1,"b":2}}', True),
        (b'{"a":[{"x":1},{"y":2,"y":3}]}', True),
        (b'{"a":1,"\\u0061":2}', True),  # an escaped spelling is the same key
        (b'{"a":{"a":1},"b":[{"a":1},{"a":2}]}', False),
        (b"[1,2,3]", False),
        (b'{"a":', False),  # not JSON: the framework's 400
    ],
)
def test_duplicate_detection(body: bytes, duplicate: bool) -> None:
    assert has_duplicate_key(body) is duplicate
