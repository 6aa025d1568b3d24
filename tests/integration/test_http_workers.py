"""Workers over HTTP: the list any member may read, and drain, which only the owner or an admin of the
default project may do. Neither ever shows a session id, token or capability hash."""

from __future__ import annotations

from typing import Any

import pytest

from ql3.storage.sqlite.adapter import SqliteDatabase

WORKERS = "/api/v1/projects/default/workers"


def drain_url(worker_id: str) -> str:
    return f"/api/v1/workers/{worker_id}/drain"


def secrets_of(db: SqliteDatabase) -> list[str]:
    rows = db.raw("SELECT session_id, capabilities_hash FROM workers")
    return [str(v) for row in rows for v in row.values()]


def test_members_see_every_worker_without_session_facts(
    db: SqliteDatabase, client: Any, make_token: Any, register_worker: Any
) -> None:
    # Given two registered workers
    register_worker("w2", slots=3)
    register_worker("w1", labels={"zone": "a"})

    # When a viewer of the default project lists them
    resp = client.get(WORKERS, headers=make_token("viewer"))

    # Then both show by id with their public facts, and no session id or capability hash
    assert resp.status_code == 200
    page = resp.json()
    assert [w["id"] for w in page["items"]] == ["w1", "w2"]
    first = page["items"][0]
    assert {k: first[k] for k in ("status", "generation", "max_concurrent_runs", "active_runs")} == {
        "status": "online",
        "generation": 1,
        "max_concurrent_runs": 2,
        "active_runs": 0,
    }
    assert first["labels"] == {"zone": "a"}
    assert first["executors"] == ["local_process"]
    assert page["next_after"] is None
    assert not any("session" in key or "hash" in key for key in first)
    for secret in secrets_of(db):
        assert secret not in resp.text


def test_the_worker_list_pages_by_id(client: Any, owner: Any, register_worker: Any) -> None:
    for worker_id in ("w1", "w2", "w3"):
        register_worker(worker_id)

    first = client.get(WORKERS, params={"limit": 2}, headers=owner).json()
    rest = client.get(WORKERS, params={"limit": 2, "after": first["next_after"]}, headers=owner).json()

    assert [w["id"] for w in first["items"]] == ["w1", "w2"]
    assert first["next_after"] == "w2"
    assert ([w["id"] for w in rest["items"]], rest["next_after"]) == (["w3"], None)


@pytest.mark.parametrize("limit", [0, 65, -1])
def test_an_out_of_range_worker_page_is_rejected(client: Any, owner: Any, limit: int) -> None:
    resp = client.get(WORKERS, params={"limit": limit}, headers=owner)

    assert resp.status_code == 422
    assert resp.json()["error"]["code"] == "validation_failed"


def test_a_non_member_of_the_project_cannot_list_workers(
    client: Any, make_token: Any, register_worker: Any
) -> None:
    register_worker("w1")

    resp = client.get(WORKERS, headers=make_token("admin", project="other"))

    assert resp.status_code == 404
    assert "w1" not in resp.text


def test_the_owner_drains_a_worker(db: SqliteDatabase, client: Any, owner: Any, register_worker: Any) -> None:
    # Given an online worker
    register_worker("w1")

    # When the owner drains it
    resp = client.post(drain_url("w1"), headers=owner)

    # Then it is draining, in the answer and in the list, and its session stays hidden
    assert resp.status_code == 200
    assert (resp.json()["id"], resp.json()["status"]) == ("w1", "draining")
    listed = client.get(WORKERS, headers=owner).json()["items"]
    assert [(w["id"], w["status"]) for w in listed] == [("w1", "draining")]
    for secret in secrets_of(db):
        assert secret not in resp.text


def test_an_admin_of_the_default_project_may_drain(
    client: Any, make_token: Any, register_worker: Any
) -> None:
    register_worker("w1")

    resp = client.post(drain_url("w1"), headers=make_token("admin"))

    assert resp.status_code == 200
    assert resp.json()["status"] == "draining"


@pytest.mark.parametrize(
    ("role", "project"),
    [("viewer", "default"), ("operator", "default"), ("approver", "default"), ("admin", "other")],
    ids=["viewer", "operator", "approver", "admin-of-another-project"],
)
def test_others_may_not_drain(
    client: Any, owner: Any, make_token: Any, register_worker: Any, role: str, project: str
) -> None:
    # Given an online worker
    register_worker("w1")

    # When someone who is not the owner nor an admin of default tries to drain it
    resp = client.post(drain_url("w1"), headers=make_token(role, project=project))

    # Then it is refused and the worker stays online
    assert resp.status_code == 403
    assert resp.json()["error"]["code"] == "permission_denied"
    assert client.get(WORKERS, headers=owner).json()["items"][0]["status"] == "online"


def test_draining_an_unknown_worker_is_not_found(client: Any, owner: Any) -> None:
    unknown = client.post(drain_url("nobody"), headers=owner)
    malformed = client.post(drain_url("%2E%2E"), headers=owner)

    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "not_found"
    assert malformed.status_code == 404


def test_drain_needs_a_token(client: Any, register_worker: Any) -> None:
    register_worker("w1")

    resp = client.post(drain_url("w1"))

    assert resp.status_code == 401


def test_show_gives_one_worker_with_labels_slots_and_busy(
    db: SqliteDatabase, client: Any, make_token: Any, register_worker: Any
) -> None:
    register_worker("w1", slots=3, labels={"gpu": "yes"})
    viewer = make_token("viewer")

    shown = client.get(f"{WORKERS}/w1", headers=viewer)
    missing = client.get(f"{WORKERS}/nope", headers=viewer)
    bad = client.get(f"{WORKERS}/bad%20id", headers=viewer)

    assert shown.status_code == 200
    body = shown.json()
    assert (body["id"], body["labels"], body["slots"], body["busy"]) == ("w1", {"gpu": "yes"}, 3, 0)
    assert body == client.get(WORKERS, headers=viewer).json()["items"][0]
    assert not any(secret in shown.text for secret in secrets_of(db))
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "not_found")
    assert bad.status_code == 404
