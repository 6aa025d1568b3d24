"""/metrics: Prometheus counts by status and loop health, with no ids or names as labels."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from ql3.application.lifecycle import LifecycleRunner
from ql3.http.app import create_app
from ql3.storage.sqlite.adapter import SqliteDatabase


def test_metrics_count_runs_by_status_without_ids(client: Any, owner: Any, make_task: Any) -> None:
    task = make_task("measured")
    run_ids = [
        client.post("/api/v1/projects/default/tasks/measured/runs", json={}, headers=owner).json()["id"]
        for _ in range(3)
    ]

    body = client.get("/metrics").text

    assert 'ql3_runs{status="queued"} 3.0' in body
    assert "ql3_workers" in body and "ql3_cancellation_dispatches" in body
    assert task["id"] not in body and "measured" not in body
    assert not any(run_id in body for run_id in run_ids)


def test_metrics_report_each_control_loop(db: SqliteDatabase) -> None:
    loop = LifecycleRunner("dispatcher", lambda: False, wake=lambda t: False, backstop_s=1.0)
    loop.cycles = 7

    class Runtime:
        loops = [loop]

        def start(self) -> None: ...

        def stop(self) -> None: ...

    with TestClient(create_app(db, lifecycle=[Runtime()])) as client:
        body = client.get("/metrics").text

    assert 'ql3_loop_cycles_total{loop="dispatcher"} 7.0' in body
    assert 'ql3_loop_recent_failures{loop="dispatcher"} 0.0' in body


def test_metrics_count_queued_runs_by_waiting_reason_only(
    client: Any, owner: Any, make_task: Any, register_worker: Any
) -> None:
    # Given a plain worker, two runs that need gpu=yes and one run it can take
    register_worker("plain-worker")
    gpu = make_task("needs-gpu", require={"gpu": "yes"})
    make_task("plain")
    for name in ("needs-gpu", "needs-gpu", "plain"):
        client.post(f"/api/v1/projects/default/tasks/{name}/runs", json={}, headers=owner)

    body = client.get("/metrics").text
    listed = client.get("/api/v1/projects/default/runs", headers=owner).json()["items"]
    shown = client.get(f"/api/v1/projects/default/runs/{listed[0]['id']}", headers=owner).json()

    # Then the gauge counts them by reason, with the reason as its only label (no ids, no labels)
    assert 'ql3_runs_queued_by_reason{reason="no_matching_worker"} 2.0' in body
    assert 'ql3_runs_queued_by_reason{reason="queued"} 1.0' in body
    assert 'ql3_runs_queued_by_reason{reason="no_free_slot"} 0.0' in body
    assert gpu["id"] not in body and "gpu" not in body and "plain-worker" not in body
    # And each run's JSON says the same
    by_task = sorted((r["task_id"] == gpu["id"], r["waiting_reason"]) for r in listed)
    assert by_task == [(False, "queued"), (True, "no_matching_worker"), (True, "no_matching_worker")]
    assert shown["waiting_reason"] == listed[0]["waiting_reason"]
