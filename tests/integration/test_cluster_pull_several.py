"""A remote worker pulling over HTTP (docs/cluster.md "Pull", "Several runs a pull"): one pull takes
a run for each free slot, and a worker counts the offers it has not started yet as taken, so it never
asks for a slot the server still counts as held."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from ql3.application.gateway import InProcessControlPlane
from ql3.cluster.pull import PullRequest, PullResult, PullService
from ql3.cluster.remote import RemoteWorker
from ql3.cluster.runtime import WorkerApi
from ql3.cluster.stops import StopWatch
from ql3.domain.offers import Offer
from ql3.http.app import create_app
from ql3.storage.sqlite.adapter import SqliteDatabase
from ql3.worker.config import WorkerConfig
from tests.support.cluster_api import P, plane, wait_status, worker_token


class _SpyPulls(PullService):
    """Records every pass: how many pairs it was offered and how it ended."""

    def __init__(self, db: SqliteDatabase) -> None:
        super().__init__(db)
        self.passes: list[tuple[int, str, int]] = []

    def pull_once(self, req: PullRequest, cursor: object = None, *, replay_only: bool = False) -> PullResult:
        result = super().pull_once(req, cursor, replay_only=replay_only)  # type: ignore[arg-type]
        got = 0 if result.offer is None else 1 + len(result.more_offers)
        self.passes.append((1 + len(req.more), result.reason, got))
        return result


@pytest.fixture
def spy(db: SqliteDatabase) -> _SpyPulls:
    return _SpyPulls(db)


@pytest.fixture
def api_client(db: SqliteDatabase, owner_token: str, spy: _SpyPulls) -> Iterator[TestClient]:
    notifier = db.notifier
    api = WorkerApi(
        control_plane=InProcessControlPlane(db),
        pull_service=spy,
        stop_watch=StopWatch(
            db, counters=notifier.counters, wait_past=notifier.wait_past, notify=notifier.notify
        ),
        control_owner="cp-test",
        cancel_lease_ms=30_000,
    )
    with TestClient(create_app(db, extensions=[api])) as client:
        yield client


def test_one_pull_takes_a_run_a_free_slot_and_a_full_worker_does_not_ask(
    api_client: TestClient,
    owner: dict[str, str],
    spy: _SpyPulls,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given four queued runs of a task that runs for a while
    made = api_client.post(f"{P}/tasks", json={"name": "nap", "command": "sleep 1"}, headers=owner)
    assert made.status_code == 201, made.text
    runs = []
    for _ in range(4):
        resp = api_client.post(f"{P}/tasks/nap/runs", json={}, headers=owner)
        assert resp.status_code == 201, resp.text
        runs.append(resp.json()["id"])

    # When a worker with three slots starts
    token = worker_token(api_client, owner, "w1")
    remote = RemoteWorker(
        plane(api_client, token), WorkerConfig(worker_id="w1", home=tmp_path / "w1", slots=3)
    )
    # (each offer takes a while to enter the active set, as on a busy host: the window in which a
    # worker counting only its active attempts would ask for slots the server counts as held)
    intake = remote.agent._intake
    receive = intake.receive

    def slow_receive(offer: Offer, *, asked_at: float | None = None) -> str:
        time.sleep(0.3)
        return receive(offer, asked_at=asked_at)

    monkeypatch.setattr(intake, "receive", slow_receive)
    assert remote.start()
    try:
        for run_id in runs:
            assert wait_status(api_client, owner, run_id, {"succeeded", "failed"})["status"] == "succeeded"
    finally:
        remote.stop(offline=True)

    # Then its first pull proposed three pairs and took three runs in one pass
    assert spy.passes[0] == (3, "claimed", 3)
    # And while its slots were taken it never asked (no pass answered "no capacity"); the fourth
    # run was taken once a slot was free
    assert all(reason != "no_capacity" for _, reason, _ in spy.passes), spy.passes
