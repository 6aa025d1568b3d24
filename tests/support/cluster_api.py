"""A remote worker against the worker API of an in-process ``ql3`` app: tokens, a control plane, pulls."""

from __future__ import annotations

import time
from typing import Any

from fastapi.testclient import TestClient

from ql3.cluster.http_control_plane import HttpControlPlane
from ql3.cluster.pull import pull_offer_id
from ql3.domain.digests import new_token
from ql3.domain.ids import new_id
from ql3.domain.offers import Offer

P = "/api/v1/projects/default"


SETTLE_S = 60.0


def worker_token(client: TestClient, owner: dict[str, str], worker_id: str) -> str:
    resp = client.post("/api/v1/worker-tokens", json={"workerId": worker_id}, headers=owner)
    assert resp.status_code == 201, resp.text
    token: str = resp.json()["token"]
    return token


def plane(client: TestClient, token: str) -> HttpControlPlane:
    # A client of its own (same app), so each plane carries its own credential.
    own = TestClient(client.app)
    return HttpControlPlane("http://testserver", token, client=own)


def task_and_run(
    client: TestClient, owner: dict[str, str], name: str, command: str, **fields: Any
) -> dict[str, Any]:
    made = client.post(f"{P}/tasks", json={"name": name, "command": command, **fields}, headers=owner)
    assert made.status_code == 201, made.text
    resp = client.post(f"{P}/tasks/{name}/runs", json={}, headers=owner)
    assert resp.status_code == 201, resp.text
    run: dict[str, Any] = resp.json()
    return run


def pull(p: HttpControlPlane, session: Any) -> Offer:
    token = new_token()
    offer = p.pull(session, offer_id=pull_offer_id(session.worker_id, token), lease_token=token, wait_ms=0)
    assert offer is not None
    return offer


def register(p: HttpControlPlane, worker_id: str) -> Any:
    return p.register(
        worker_id=worker_id,
        session_id=new_id(),
        capabilities={"executors": ["local_process"]},
        max_concurrent_runs=2,
        session_lease_ms=30_000,
    )


def wait_status(client: TestClient, owner: dict[str, str], run_id: str, statuses: set[str]) -> dict[str, Any]:
    deadline = time.monotonic() + SETTLE_S
    while True:
        run: dict[str, Any] = client.get(f"{P}/runs/{run_id}", headers=owner).json()
        if run["status"] in statuses or time.monotonic() > deadline:
            return run
        time.sleep(0.05)
