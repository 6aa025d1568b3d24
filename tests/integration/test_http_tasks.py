"""Task management over HTTP: create, show, list, edit, enable, disable, delete."""

from __future__ import annotations

from typing import Any

TASKS = "/api/v1/projects/default/tasks"


def test_create_returns_the_public_task(client: Any, owner: Any) -> None:
    body = {
        "name": "backup",
        "command": "tar czf /tmp/b.tgz /srv",
        "cron": "0  3 * * *",
        "env": {"B": "2", "A": "1"},
        "timeout_ms": 60000,
        "require": {"zone": "eu"},
        "prefer": [{"labels": {"disk": "ssd"}, "weight": 3}],
        "overlap": "skip",
        "max_attempts": 2,
        "retry_safe": True,
    }

    resp = client.post(TASKS, json=body, headers=owner)

    assert resp.status_code == 201
    task = resp.json()
    assert task["name"] == "backup"
    assert (task["revision"], task["enabled"], task["cron"]) == (1, True, "0 3 * * *")
    assert task["env_keys"] == ["A", "B"]
    assert task["prefer"] == [{"labels": {"disk": "ssd"}, "weight": 3}]
    assert (task["overlap"], task["max_attempts"], task["timeout_ms"]) == ("skip", 2, 60000)
    assert task["retry_safe"] is True
    assert len(task["content_digest"]) == 64
    assert "env" not in task


def test_show_finds_a_task_by_name_or_id(client: Any, owner: Any, make_task: Any) -> None:
    task = make_task("job")

    by_name = client.get(f"{TASKS}/job", headers=owner).json()
    by_id = client.get(f"{TASKS}/{task['id']}", headers=owner).json()

    # the creation answer also carries its placement warnings (none here); the task is the same
    assert task.pop("warnings") == []
    assert by_name == by_id == task


def test_list_pages_by_name(client: Any, owner: Any, make_task: Any) -> None:
    for name in ("c", "a", "b"):
        make_task(name)

    first = client.get(TASKS, params={"limit": 2}, headers=owner).json()
    second = client.get(TASKS, params={"limit": 2, "cursor": first["next_cursor"]}, headers=owner).json()

    assert [t["name"] for t in first["items"]] == ["a", "b"]
    assert [t["name"] for t in second["items"]] == ["c"]
    assert second["next_cursor"] is None


def test_edit_publishes_a_new_revision(client: Any, owner: Any, make_task: Any) -> None:
    task = make_task("job")

    resp = client.patch(
        f"{TASKS}/job", json={"command": "echo changed", "cron": "*/5 * * * *"}, headers=owner
    )

    edited = resp.json()
    assert resp.status_code == 200
    assert (edited["revision"], edited["cron"]) == (2, "*/5 * * * *")
    assert edited["content_digest"] != task["content_digest"]


def test_edit_with_null_clears_an_optional_field(client: Any, owner: Any, make_task: Any) -> None:
    make_task("job", cron="0 * * * *")

    edited = client.patch(f"{TASKS}/job", json={"cron": None}, headers=owner).json()

    assert (edited["revision"], edited["cron"]) == (2, None)


def test_edit_that_changes_nothing_keeps_the_revision(client: Any, owner: Any, make_task: Any) -> None:
    make_task("job")

    edited = client.patch(f"{TASKS}/job", json={"command": "echo hello"}, headers=owner).json()

    assert edited["revision"] == 1


def test_empty_edit_is_refused(client: Any, owner: Any, make_task: Any) -> None:
    make_task("job")

    resp = client.patch(f"{TASKS}/job", json={}, headers=owner)

    assert resp.status_code == 422


def test_disable_then_enable(client: Any, owner: Any, make_task: Any) -> None:
    make_task("job")

    disabled = client.post(f"{TASKS}/job/disable", headers=owner).json()
    enabled = client.post(f"{TASKS}/job/enable", headers=owner).json()

    assert (disabled["enabled"], enabled["enabled"]) == (False, True)


def test_a_task_can_be_created_disabled(client: Any, owner: Any) -> None:
    resp = client.post(TASKS, json={"name": "later", "command": "true", "enabled": False}, headers=owner)

    assert resp.json()["enabled"] is False


def test_delete_frees_the_name_and_keeps_runs(client: Any, owner: Any, make_task: Any) -> None:
    # Given a task with a run
    make_task("job")
    run = client.post(f"{TASKS}/job/runs", json={}, headers=owner).json()

    # When it is deleted
    deleted = client.delete(f"{TASKS}/job", headers=owner)

    # Then it is gone, its name is free again, and its run is still readable
    assert deleted.status_code == 204
    assert client.get(f"{TASKS}/job", headers=owner).status_code == 404
    assert client.post(TASKS, json={"name": "job", "command": "true"}, headers=owner).status_code == 201
    assert client.get(f"/api/v1/projects/default/runs/{run['id']}", headers=owner).status_code == 200


def test_a_cron_task_shows_its_next_fire_time_and_misfire_policy(client: Any, owner: Any) -> None:
    body = {"name": "hourly", "command": "true", "cron": "0 * * * *", "misfire": "fire_once"}

    task = client.post(TASKS, json=body, headers=owner).json()
    disabled = client.post(f"{TASKS}/hourly/disable", headers=owner).json()

    assert task["misfire"] == "fire_once"
    assert task["next_fire_at_ms"] is not None and task["next_fire_at_ms"] % 3_600_000 == 0
    assert disabled["next_fire_at_ms"] is None  # a disabled task has no schedule
