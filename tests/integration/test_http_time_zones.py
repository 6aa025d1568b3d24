"""Time zones over HTTP: a task's ``tz``, its next fires in that zone, the project's default zone, and
bad zones refused with 422 and nothing written."""

from __future__ import annotations

from typing import Any

TASKS = "/api/v1/projects/default/tasks"
SETTINGS = "/api/v1/projects/default/settings"


def test_a_task_in_a_zone_shows_its_zone_and_wall_clock_fires(client: Any, owner: Any) -> None:
    created = client.post(
        TASKS,
        json={"name": "早报", "command": "true", "cron": "0 8 * * *", "tz": "Asia/Shanghai"},
        headers=owner,
    )

    shown = client.get(f"{TASKS}/早报", headers=owner).json()

    assert created.status_code == 201, created.text
    assert (shown["cron"], shown["tz"]) == ("CRON_TZ=Asia/Shanghai 0 8 * * *", "Asia/Shanghai")
    assert len(shown["next_fires_local"]) == len(shown["next_fires_at_ms"]) == 5
    assert all(t.endswith("T08:00:00+08:00") for t in shown["next_fires_local"])


def test_the_project_default_zone_round_trips_and_applies_to_new_tasks(client: Any, owner: Any) -> None:
    before = client.get(SETTINGS, headers=owner).json()
    put = client.put(SETTINGS, json={"default_tz": "Asia/Shanghai"}, headers=owner)
    task = client.post(
        TASKS, json={"name": "job", "command": "true", "cron": "0 8 * * *"}, headers=owner
    ).json()
    cleared = client.put(SETTINGS, json={"default_tz": None}, headers=owner).json()

    assert before == {"default_tz": None}
    assert put.json() == {"default_tz": "Asia/Shanghai"}
    assert task["tz"] == "Asia/Shanghai"
    assert cleared == {"default_tz": None}


def test_bad_zones_get_422_and_write_nothing(client: Any, owner: Any, counts: Any) -> None:
    before = counts()

    bad_task = client.post(
        TASKS, json={"name": "job", "command": "true", "cron": "0 8 * * *", "tz": "Mars/X"}, headers=owner
    )
    bad_prefix = client.post(
        TASKS, json={"name": "job", "command": "true", "cron": "CRON_TZ=Mars/X 0 8 * * *"}, headers=owner
    )
    bad_setting = client.put(SETTINGS, json={"default_tz": "../../etc/passwd"}, headers=owner)

    for resp, field in ((bad_task, "tz"), (bad_prefix, "cron"), (bad_setting, "default_tz")):
        assert resp.status_code == 422, resp.text
        assert resp.json()["error"]["code"] == "validation_failed"
        assert resp.json()["error"]["details"]["field"] == field
    assert counts() == before
    assert client.get(SETTINGS, headers=owner).json() == {"default_tz": None}


def test_only_an_admin_sets_the_project_zone(client: Any, make_token: Any) -> None:
    operator = make_token("operator")

    refused = client.put(SETTINGS, json={"default_tz": "Asia/Shanghai"}, headers=operator)
    read = client.get(SETTINGS, headers=operator)

    assert refused.status_code == 403
    assert read.status_code == 200
