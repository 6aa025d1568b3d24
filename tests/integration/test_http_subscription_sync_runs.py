"""A subscription's sync over HTTP is a run (docs/scripts.md "Subscriptions"): ``POST .../syncs``
queues a run of the task ``ql3-sync-NAME`` and answers with it; the sync call itself takes only a
running sync run's credential."""

from __future__ import annotations

from typing import Any

SUBS = "/api/v1/projects/default/subscriptions"


def test_sync_now_queues_a_run_of_the_sync_task(client: Any, owner: Any) -> None:
    added = client.post(SUBS, json={"name": "upstream", "repo": "file:///srv/repo.git"}, headers=owner)
    assert added.status_code == 201, added.text

    started = client.post(f"{SUBS}/upstream/syncs", headers=owner)

    assert started.status_code == 201, started.text
    body = started.json()
    assert body["task"] == "ql3-sync-upstream"
    run = client.get(f"/api/v1/projects/default/runs/{body['run_id']}", headers=owner).json()
    assert (run["task_name"], run["trigger_type"]) == ("ql3-sync-upstream", "manual")
    task = client.get("/api/v1/projects/default/tasks/ql3-sync-upstream", headers=owner).json()
    assert task["command"] == "ql3 subscription sync-run upstream"
    missing = client.post(f"{SUBS}/nope/syncs", headers=owner)
    assert missing.status_code == 404


def test_the_sync_call_refuses_anything_but_a_running_runs_credential(client: Any, owner: Any) -> None:
    for headers in ({}, owner, {"Authorization": "Bearer ql3r_nope"}):
        answer = client.post("/api/v1/subscription-sync", headers=headers)
        assert answer.status_code == 401, answer.text
        assert answer.json()["error"]["code"] == "notify_credential_invalid"
