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
