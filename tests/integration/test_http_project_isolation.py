"""Ids of another project's tasks and runs are not found, even for a caller who may read both."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def other(client: Any, owner: Any) -> dict[str, Any]:
    """Project ``other`` with a task and a run, seen from ``default``."""
    client.post("/api/v1/projects", json={"name": "other"}, headers=owner)
    task = client.post(
        "/api/v1/projects/other/tasks", json={"name": "theirs", "command": "true"}, headers=owner
    )
    run = client.post("/api/v1/projects/other/tasks/theirs/runs", json={}, headers=owner)
    return {"task": task.json(), "run": run.json()}


def test_another_projects_task_id_is_not_found(client: Any, owner: Any, other: dict[str, Any]) -> None:
    resp = client.get(f"/api/v1/projects/default/tasks/{other['task']['id']}", headers=owner)

    assert resp.status_code == 404


def test_another_projects_task_id_cannot_be_started(
    client: Any, owner: Any, other: dict[str, Any], counts: Any
) -> None:
    before = counts()

    resp = client.post(f"/api/v1/projects/default/tasks/{other['task']['id']}/runs", json={}, headers=owner)

    assert resp.status_code == 404
    assert counts() == before


def test_another_projects_task_id_cannot_be_edited_or_deleted(
    client: Any, owner: Any, other: dict[str, Any], counts: Any
) -> None:
    before = counts()
    task_id = other["task"]["id"]

    edited = client.patch(
        f"/api/v1/projects/default/tasks/{task_id}", json={"max_attempts": 3}, headers=owner
    )
    deleted = client.delete(f"/api/v1/projects/default/tasks/{task_id}", headers=owner)

    assert (edited.status_code, deleted.status_code) == (404, 404)
    assert counts() == before


def test_another_projects_run_id_is_not_found(client: Any, owner: Any, other: dict[str, Any]) -> None:
    run_id = other["run"]["id"]

    shown = client.get(f"/api/v1/projects/default/runs/{run_id}", headers=owner)
    events = client.get(f"/api/v1/projects/default/runs/{run_id}/events", headers=owner)

    assert (shown.status_code, events.status_code) == (404, 404)


def test_run_list_filtered_by_another_projects_task_is_not_found(
    client: Any, owner: Any, other: dict[str, Any]
) -> None:
    resp = client.get(f"/api/v1/projects/default/runs?task={other['task']['id']}", headers=owner)

    assert resp.status_code == 404


def test_run_list_shows_only_this_projects_runs(
    client: Any, owner: Any, other: dict[str, Any], make_task: Any
) -> None:
    make_task("mine")
    mine = client.post("/api/v1/projects/default/tasks/mine/runs", json={}, headers=owner).json()

    items = client.get("/api/v1/projects/default/runs", headers=owner).json()["items"]

    assert [r["id"] for r in items] == [mine["id"]]
