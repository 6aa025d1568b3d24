"""/metrics for alerting: per-task last success and last failure (task name as the only label), queue
depth, and the run-duration histogram."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ql3.application import runs
from ql3.application.outcome_metrics import DurationHistogram
from ql3.http.metrics import _alerting_collector
from ql3.storage.sqlite.adapter import SqliteDatabase


def samples(body: str) -> dict[tuple[str, str], float]:
    """``{(sample name, task label): value}`` of the exposition text."""
    return {
        (sample.name, sample.labels.get("task", "")): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }


def _finish(db: SqliteDatabase, run_id: str, to: str, duration_ms: int) -> int:
    def unit(tx: Any) -> int:
        now = tx.now_ms()
        run = runs.lock_run(tx, run_id)
        run = runs.transition(tx, run.id, run.version, "dispatching", actor_type="system")
        run = runs.transition(
            tx, run.id, run.version, "running", actor_type="system", started_at_ms=now - duration_ms
        )
        runs.transition(tx, run.id, run.version, to, actor_type="system", finished_at_ms=now)
        return int(now)

    return int(db.transaction(unit))


def _start(client: Any, owner: Any, task: str, project: str = "default") -> str:
    resp = client.post(f"/api/v1/projects/{project}/tasks/{task}/runs", json={}, headers=owner)
    assert resp.status_code == 201, resp.text
    return str(resp.json()["id"])


def test_last_success_and_failure_per_task_and_queue_depth(
    client: Any, owner: Any, make_task: Any, db: SqliteDatabase
) -> None:
    make_task("backup")
    client.post("/api/v1/projects", json={"name": "edge"}, headers=owner)
    make_task("sync", project="edge")
    ok_id = _start(client, owner, "backup")
    ok_at = _finish(db, ok_id, "succeeded", 1000)
    bad_id = _start(client, owner, "backup")
    bad_at = _finish(db, bad_id, "timed_out", 1000)
    sync_at = _finish(db, _start(client, owner, "sync", "edge"), "failed", 1000)
    queued = [_start(client, owner, "backup") for _ in range(2)]

    body = client.get("/metrics", headers=owner).text  # the owner's token: every project's tasks

    found = samples(body)
    assert found[("ql3_task_last_success_timestamp_seconds", "backup")] == ok_at / 1000
    assert found[("ql3_task_last_failure_timestamp_seconds", "backup")] == bad_at / 1000
    assert found[("ql3_task_last_failure_timestamp_seconds", "edge/sync")] == sync_at / 1000
    assert ("ql3_task_last_success_timestamp_seconds", "edge/sync") not in found
    assert "ql3_queue_depth 2.0" in body
    assert not any(run_id in body for run_id in [ok_id, bad_id, *queued])


def test_run_durations_are_a_histogram_of_runs_finished_since_the_first_scrape(
    client: Any, owner: Any, make_task: Any, db: SqliteDatabase
) -> None:
    make_task("timed")
    before = _start(client, owner, "timed")
    _finish(db, before, "succeeded", 50)  # finished before the first scrape: not counted
    time.sleep(0.005)  # a later millisecond: a run finished in the scrape's own millisecond is counted
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_alerting_collector(db, DurationHistogram(settle_ms=0)))
    generate_latest(registry)

    for duration_ms in (200, 3000, 3000, 120_000):
        _finish(db, _start(client, owner, "timed"), "succeeded", duration_ms)
    text = generate_latest(registry).decode()
    again = generate_latest(registry).decode()

    assert 'ql3_run_duration_seconds_bucket{le="0.5"} 1.0' in text
    assert 'ql3_run_duration_seconds_bucket{le="5.0"} 3.0' in text
    assert 'ql3_run_duration_seconds_bucket{le="60.0"} 3.0' in text
    assert 'ql3_run_duration_seconds_bucket{le="+Inf"} 4.0' in text
    assert "ql3_run_duration_seconds_count 4.0" in text
    assert "ql3_run_duration_seconds_sum 126.2" in text
    assert "ql3_run_duration_seconds_count 4.0" in again  # folded in once


def test_the_served_metrics_include_the_histogram_and_the_outbox(client: Any, owner: Any) -> None:
    base = "/api/v1/projects/default/notifications"
    client.post(f"{base}/channels", json={"name": "a", "kind": "apprise", "url": "json://h/x"}, headers=owner)
    client.post(f"{base}/channels/a/test", headers=owner)

    body = client.get("/metrics").text

    assert 'ql3_run_duration_seconds_bucket{le="+Inf"} 0.0' in body
    assert 'ql3_notifications{status="pending"} 1.0' in body


def test_task_names_appear_only_for_a_scrape_token_of_their_project(
    client: Any, owner: Any, make_task: Any, db: SqliteDatabase, make_token: Any
) -> None:
    # Given a finished task in two projects
    make_task("backup-secret-name")
    client.post("/api/v1/projects", json={"name": "edge"}, headers=owner)
    make_task("sync", project="edge")
    _finish(db, _start(client, owner, "backup-secret-name"), "failed", 1000)
    _finish(db, _start(client, owner, "sync", "edge"), "succeeded", 1000)

    # When /metrics is scraped without a token, with edge's scrape token, and with a wrong token
    anonymous = client.get("/metrics")
    scrape = make_token("metrics", project="edge", name="prometheus")
    scoped = client.get("/metrics", headers=scrape)
    wrong = client.get("/metrics", headers={"Authorization": "Bearer not-a-token"})
    not_bearer = client.get("/metrics", headers={"Authorization": "Basic dXNlcjpwYXNz"})

    # Then without a token no project-specific label value appears (the families stay, empty)
    assert anonymous.status_code == 200
    assert "backup-secret-name" not in anonymous.text and "edge" not in anonymous.text
    assert "# TYPE ql3_task_last_failure_timestamp_seconds gauge" in anonymous.text
    assert 'ql3_runs{status="failed"} 1.0' in anonymous.text  # counts by status stay public
    # And the scrape token sees its own project's tasks only
    assert ("ql3_task_last_success_timestamp_seconds", "edge/sync") in samples(scoped.text)
    assert "backup-secret-name" not in scoped.text
    # And a token that does not authenticate is refused, as on every route
    assert wrong.status_code == 401 and not_bearer.status_code == 401


def test_a_metrics_token_reads_nothing_else(client: Any, make_token: Any, make_task: Any) -> None:
    make_task("job")
    scrape = make_token("metrics", name="prometheus")

    for path in ("/api/v1/projects/default/tasks", "/api/v1/projects/default/runs"):
        assert client.get(path, headers=scrape).status_code == 403
