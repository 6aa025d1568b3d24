"""Bearer authentication, role enforcement and project isolation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

TASKS = "/api/v1/projects/default/tasks"


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer ql3_not-a-real-token"},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"Authorization": "Bearer " + "x" * 300},
    ],
    ids=["missing", "empty", "unknown", "wrong-scheme", "oversized"],
)
def test_missing_or_invalid_token_is_unauthenticated(
    client: Any, before_counts: dict[str, int], counts: Any, headers: dict[str, str]
) -> None:
    resp = client.post(TASKS, json={"name": "job", "command": "true"}, headers=headers)

    assert resp.status_code == 401
    assert resp.json()["error"]["code"] == "unauthenticated"
    assert resp.headers["www-authenticate"] == "Bearer"
    assert counts() == before_counts


@pytest.mark.parametrize(
    "path", ["/api/v1/projects", f"{TASKS}", "/api/v1/projects/default/runs", "/api/v1/projects/default"]
)
def test_every_api_read_needs_a_token(client: Any, path: str) -> None:
    assert client.get(path).status_code == 401


@pytest.fixture
def before_counts(counts: Callable[[], dict[str, int]], make_task: Any) -> dict[str, int]:
    """A project with task ``job``; the counts before the request under test."""
    make_task("job")
    return counts()


@pytest.fixture
def viewer(make_token: Any, make_task: Any) -> dict[str, str]:
    """A viewer of ``default``, where task ``job`` exists."""
    make_task("job")
    headers: dict[str, str] = make_token("viewer")
    return headers


def test_viewer_cannot_create_a_task(client: Any, viewer: Any, counts: Any) -> None:
    before = counts()

    resp = client.post(TASKS, json={"name": "other", "command": "true"}, headers=viewer)

    assert resp.status_code == 403
    assert resp.json()["error"] == {
        "code": "permission_denied",
        "message": "The caller's role does not allow this.",
        "details": {"permission": "task.write"},
    }
    assert counts() == before


def test_viewer_cannot_start_a_run(client: Any, viewer: Any, counts: Any) -> None:
    before = counts()

    resp = client.post(f"{TASKS}/job/runs", json={}, headers=viewer)

    assert resp.status_code == 403
    assert resp.json()["error"]["details"] == {"permission": "run.create"}
    assert counts() == before


@pytest.mark.parametrize(
    ("method", "suffix"),
    [("patch", "/job"), ("delete", "/job"), ("post", "/job/enable"), ("post", "/job/disable")],
)
def test_viewer_cannot_change_a_task(client: Any, viewer: Any, counts: Any, method: str, suffix: str) -> None:
    before = counts()
    kwargs: dict[str, Any] = {"json": {"max_attempts": 2}} if method == "patch" else {}

    resp = client.request(method.upper(), f"{TASKS}{suffix}", headers=viewer, **kwargs)

    assert resp.status_code == 403
    assert counts() == before
    assert client.get(f"{TASKS}/job", headers=viewer).json()["revision"] == 1


def test_viewer_can_read_tasks_and_runs(client: Any, viewer: Any, owner: Any) -> None:
    # Given a run started by the owner
    run = client.post(f"{TASKS}/job/runs", json={}, headers=owner).json()

    # When the viewer reads
    tasks = client.get(TASKS, headers=viewer)
    shown = client.get(f"/api/v1/projects/default/runs/{run['id']}", headers=viewer)

    # Then both reads succeed
    assert [t["name"] for t in tasks.json()["items"]] == ["job"]
    assert shown.json()["id"] == run["id"]


def test_operator_can_create_tasks_and_runs(client: Any, make_token: Any, before_counts: Any) -> None:
    operator = make_token("operator")

    task = client.post(TASKS, json={"name": "op-task", "command": "true"}, headers=operator)
    run = client.post(f"{TASKS}/op-task/runs", json={}, headers=operator)

    assert (task.status_code, run.status_code) == (201, 201)


@pytest.mark.parametrize("role", ["viewer", "operator", "approver"])
def test_only_admins_create_tokens(
    client: Any, make_token: Any, before_counts: Any, counts: Any, role: str
) -> None:
    member = make_token(role)
    after_setup = counts()

    resp = client.post("/api/v1/projects/default/tokens", json={"role": "admin"}, headers=member)

    assert resp.status_code == 403
    assert counts() == after_setup


def test_admin_token_create_returns_a_working_token_once(client: Any, owner: Any, before_counts: Any) -> None:
    # Given an admin creating a viewer token
    resp = client.post(
        "/api/v1/projects/default/tokens", json={"role": "viewer", "name": "dash"}, headers=owner
    )
    assert resp.status_code == 201
    token = resp.json()["token"]

    # When the token is used
    headers = {"Authorization": f"Bearer {token}"}

    # Then it reads but may not write
    assert client.get(TASKS, headers=headers).status_code == 200
    assert client.post(TASKS, json={"name": "no", "command": "true"}, headers=headers).status_code == 403


def test_only_the_owner_creates_projects(
    client: Any, make_token: Any, before_counts: Any, counts: Any
) -> None:
    admin = make_token("admin")
    after_setup = counts()

    resp = client.post("/api/v1/projects", json={"name": "newproj"}, headers=admin)

    assert resp.status_code == 403
    assert counts() == after_setup


def test_owner_creates_a_project(client: Any, owner: Any) -> None:
    resp = client.post("/api/v1/projects", json={"name": "team-b"}, headers=owner)

    assert resp.status_code == 201
    assert resp.json()["name"] == "team-b"
    listed = client.get("/api/v1/projects", headers=owner).json()["items"]
    assert sorted(p["name"] for p in listed) == ["default", "team-b"]


def test_project_list_shows_only_projects_with_a_role(client: Any, make_token: Any, owner: Any) -> None:
    # Given an admin of project A and a project B it has no role in
    admin_a = make_token("admin", project="proj-a")
    client.post("/api/v1/projects", json={"name": "proj-b"}, headers=owner)

    listed = client.get("/api/v1/projects", headers=admin_a).json()["items"]

    assert [(p["name"], p["role"]) for p in listed] == [("proj-a", "admin")]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/api/v1/projects/proj-b", None),
        ("GET", "/api/v1/projects/proj-b/tasks", None),
        ("POST", "/api/v1/projects/proj-b/tasks", {"name": "intruder", "command": "true"}),
        ("GET", "/api/v1/projects/proj-b/tasks/b-job", None),
        ("POST", "/api/v1/projects/proj-b/tasks/b-job/runs", {}),
        ("GET", "/api/v1/projects/proj-b/runs", None),
        ("POST", "/api/v1/projects/proj-b/tokens", {"role": "admin"}),
    ],
)
def test_admin_of_one_project_gets_not_found_in_another(
    client: Any, make_token: Any, owner: Any, counts: Any, method: str, path: str, body: Any
) -> None:
    # Given project B with a task, and a token that is admin in project A only
    client.post("/api/v1/projects", json={"name": "proj-b"}, headers=owner)
    client.post("/api/v1/projects/proj-b/tasks", json={"name": "b-job", "command": "true"}, headers=owner)
    admin_a = make_token("admin", project="proj-a")
    before = counts()

    resp = client.request(method, path, json=body, headers=admin_a)

    assert resp.status_code == 404
    assert resp.json()["error"]["code"] == "not_found"
    assert counts() == before


def test_unknown_project_is_not_found(client: Any, owner: Any) -> None:
    resp = client.get("/api/v1/projects/nowhere/tasks", headers=owner)

    assert resp.status_code == 404
