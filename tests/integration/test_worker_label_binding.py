"""A worker credential cannot widen its worker's labels over HTTP (docs/security.md "A remote
worker"): with w1's token, a new session with another project's labels is 403 ``labels_not_approved``
and that project's waiting run stays unclaimed, until an admin approves the labels (or mints a
credential for them); only the owner or an admin of default reads and approves them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ql3.application.gateway import InProcessControlPlane
from ql3.cluster import remote as remote_module
from ql3.cluster.http_control_plane import HttpControlPlane
from ql3.cluster.pull import PullService, pull_offer_id
from ql3.cluster.remote import RemoteWorker
from ql3.cluster.runtime import WorkerApi
from ql3.cluster.stops import StopWatch
from ql3.domain.digests import new_token
from ql3.domain.errors import PermissionDenied
from ql3.domain.ids import new_id
from ql3.ports.control_plane import SessionInfo
from ql3.storage.sqlite.adapter import SqliteDatabase
from ql3.worker.config import WorkerConfig
from tests.support.cluster_api import plane, worker_token


@pytest.fixture
def client(db: SqliteDatabase, owner_token: str) -> Iterator[TestClient]:
    """The app with the worker API and its admin routes (the CLI in-process talks to it too)."""
    from ql3.http.app import create_app

    notifier = db.notifier
    api = WorkerApi(
        control_plane=InProcessControlPlane(db),
        pull_service=PullService(db),
        stop_watch=StopWatch(
            db, counters=notifier.counters, wait_past=notifier.wait_past, notify=notifier.notify
        ),
        control_owner="cp-test",
        cancel_lease_ms=30_000,
    )
    with TestClient(create_app(db, extensions=[api])) as client:
        yield client


def _register(p: HttpControlPlane, worker_id: str, labels: dict[str, str]) -> SessionInfo:
    return p.register(
        worker_id=worker_id,
        session_id=new_id(),
        capabilities={"executors": ["local_process"], "labels": labels},
        max_concurrent_runs=2,
        session_lease_ms=30_000,
    )


def _pull(p: HttpControlPlane, session: SessionInfo) -> Any:
    token = new_token()
    return p.pull(session, offer_id=pull_offer_id(session.worker_id, token), lease_token=token, wait_ms=0)


def _beta_run(client: TestClient, owner: dict[str, str]) -> str:
    """A run of project beta that only a worker labelled zone=b may take."""
    assert client.post("/api/v1/projects", json={"name": "beta"}, headers=owner).status_code == 201
    beta = "/api/v1/projects/beta"
    made = client.post(
        f"{beta}/tasks",
        json={"name": "beta-job", "command": "echo beta-secret", "require": {"zone": "b"}},
        headers=owner,
    )
    assert made.status_code == 201, made.text
    run = client.post(f"{beta}/tasks/beta-job/runs", json={}, headers=owner)
    assert run.status_code == 201, run.text
    return str(run.json()["id"])


def test_a_stolen_worker_token_cannot_register_another_projects_labels_until_an_admin_approves(
    client: TestClient, owner: dict[str, str], make_token: Any
) -> None:
    # Given w1 registered with zone=a, and beta's run waiting for a zone=b worker
    token = worker_token(client, owner, "w1")
    w1 = plane(client, token)
    session = _register(w1, "w1", {"zone": "a"})
    run_id = _beta_run(client, owner)
    assert _pull(w1, session) is None

    # When whoever holds w1's token registers a new session labelled zone=b
    thief = plane(client, token)
    with pytest.raises(PermissionDenied) as caught:
        _register(thief, "w1", {"zone": "b"})

    # Then it is refused, w1's session is untouched and beta's run is still waiting
    assert caught.value.details["code"] == "labels_not_approved"
    assert _pull(w1, session) is None  # still w1's current session, still nothing it may take
    waiting = client.get(f"/api/v1/projects/beta/runs/{run_id}", headers=owner).json()
    assert waiting["status"] == "queued", waiting
    # And the refused labels wait for an admin, who alone may read and approve them
    shown = client.get("/api/v1/worker-labels/w1", headers=owner)
    assert shown.status_code == 200, shown.text
    assert shown.json()["labels"] == {"zone": "a"} and shown.json()["approved_by"] is None
    assert shown.json()["requested_labels"] == {"zone": "b"}
    operator = make_token("operator", name="op")
    for headers in (operator, {"Authorization": f"Bearer {token}"}):
        assert client.get("/api/v1/worker-labels/w1", headers=headers).status_code == 403
        refused = client.post(
            "/api/v1/worker-labels/w1/approve", json={"labels": {"zone": "b"}}, headers=headers
        )
        assert refused.status_code == 403
    assert client.get("/api/v1/worker-labels/w1", headers=owner).json()["labels"] == {"zone": "a"}

    # When the owner approves zone=b, a zone=b session registers and takes beta's run
    approved = client.post("/api/v1/worker-labels/w1/approve", json={"labels": {"zone": "b"}}, headers=owner)
    assert approved.status_code == 200, approved.text
    assert approved.json()["requested_labels"] is None and approved.json()["approved_by"] is not None
    relabelled = _register(w1, "w1", {"zone": "b"})
    offer = _pull(w1, relabelled)
    assert offer is not None and offer.fence.run_id == run_id


def test_a_credential_minted_with_labels_registers_only_those(
    client: TestClient, owner: dict[str, str]
) -> None:
    minted = client.post(
        "/api/v1/worker-tokens", json={"workerId": "w2", "labels": {"zone": "c"}}, headers=owner
    )
    assert minted.status_code == 201, minted.text
    w2 = plane(client, minted.json()["token"])

    # Even its first registration may not take other labels than the minted ones
    with pytest.raises(PermissionDenied) as caught:
        _register(w2, "w2", {"zone": "b"})
    assert caught.value.details["code"] == "labels_not_approved"
    assert _register(w2, "w2", {"zone": "c"}).generation == 1
    # And bad labels are 422 with nothing minted
    bad = client.post(
        "/api/v1/worker-tokens", json={"workerId": "w3", "labels": {"k": "\u0000"}}, headers=owner
    )
    assert bad.status_code == 422
    listed = client.get("/api/v1/worker-tokens", headers=owner).json()["items"]
    assert [t["worker_id"] for t in listed] == ["w2"]
    assert client.get("/api/v1/worker-labels/w3", headers=owner).status_code == 404


def test_ql3_worker_approve_approves_the_pending_request_or_the_given_labels(
    client: TestClient, owner: dict[str, str], cli_main: Any
) -> None:
    # Given w1 bound to zone=a and a refused registration with zone=b
    token = worker_token(client, owner, "w1")
    _register(plane(client, token), "w1", {"zone": "a"})
    with pytest.raises(PermissionDenied):
        _register(plane(client, token), "w1", {"zone": "b"})

    # When an admin runs `ql3 worker approve w1`, the pending labels are approved and said
    code, out, err = cli_main("worker", "approve", "w1")
    assert code == 0, err
    assert out == "worker w1 may register with labels zone=b\n"
    assert _register(plane(client, token), "w1", {"zone": "b"}).generation == 2

    # And with nothing pending it says so (exit 64) and changes nothing; --label approves exactly those
    code, _, err = cli_main("worker", "approve", "w1")
    assert code == 64 and "no_pending_labels" in err and "zone=b" in err
    code, _, err = cli_main("worker", "approve", "w1", "--label", "zone=c", "--no-labels")
    assert code == 64, err
    code, out, err = cli_main("worker", "approve", "w1", "--no-labels")
    assert code == 0 and out == "worker w1 may register with labels (none)\n", err
    assert client.get("/api/v1/worker-labels/w1", headers=owner).json()["labels"] == {}
    # And `ql3 worker token create --label` mints a credential for exactly those labels
    code, out, err = cli_main("worker", "token", "create", "w4", "--label", "zone=d", "--label", "gpu=1")
    assert code == 0, err
    assert client.get("/api/v1/worker-labels/w4", headers=owner).json()["labels"] == {"zone": "d", "gpu": "1"}


def test_a_running_worker_whose_labels_are_no_longer_approved_waits_for_approval_after_a_fence(
    client: TestClient, owner: dict[str, str], tmp_path: Path, monkeypatch: Any
) -> None:
    # Given a remote worker running with zone=a, whose approval an admin then moved to zone=b
    monkeypatch.setattr(remote_module, "BACKOFF_MAX_S", 0.05)
    monkeypatch.setattr(remote_module, "PULL_WAIT_MS", 100)  # the pull loop notices the fence soon
    token = worker_token(client, owner, "w1")
    config = WorkerConfig(worker_id="w1", home=tmp_path / "w1", labels={"zone": "a"})
    remote = RemoteWorker(plane(client, token), config)
    assert remote.start()
    try:
        first = remote.agent.session
        assert first is not None
        moved = client.post("/api/v1/worker-labels/w1/approve", json={"labels": {"zone": "b"}}, headers=owner)
        assert moved.status_code == 200

        # When a zone=b session of w1 replaces its session (which fences it: it must register again)
        replacing = _register(plane(client, token), "w1", {"zone": "b"})
        assert replacing.generation == first.generation + 1

        # Then it keeps asking (refused: zone=a is no longer approved), registers nothing, keeps pulling
        pending = _poll(lambda: _requested(client, owner) == {"zone": "a"})
        assert pending and remote.agent.session is None
        assert all(t.is_alive() for t in remote._threads)
        # And an admin's approval brings it back by itself, with a new session
        client.post("/api/v1/worker-labels/w1/approve", json={"labels": {"zone": "a"}}, headers=owner)
        assert _poll(lambda: remote.agent.session is not None)
        assert remote.agent.session is not None and remote.agent.session.session_id != first.session_id
    finally:
        remote.stop(offline=True)


def _requested(client: TestClient, owner: dict[str, str]) -> Any:
    return client.get("/api/v1/worker-labels/w1", headers=owner).json()["requested_labels"]


def _poll(check: Any, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False
