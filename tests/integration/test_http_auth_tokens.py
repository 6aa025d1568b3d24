"""whoami and the token lifecycle over HTTP: list, revoke (401 at once), rotate, expiry."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.http import bearer

TOKENS = "/api/v1/projects/default/tokens"
ITEM_KEYS = {"id", "name", "role", "created_at_ms", "expires_at_ms", "revoked_at_ms", "last_used_at_ms"}


def _mint(client: Any, owner: dict[str, str], role: str, **extra: Any) -> dict[str, Any]:
    resp = client.post(TOKENS, json={"role": role, "name": f"{role}-x", **extra}, headers=owner)
    assert resp.status_code == 201, resp.text
    issued: dict[str, Any] = resp.json()
    return issued


def test_whoami_names_the_principal_and_its_roles(client: Any, owner: dict[str, str]) -> None:
    assert client.post("/api/v1/projects", json={"name": "beta"}, headers=owner).status_code == 201
    viewer = _mint(client, owner, "viewer")

    me = client.get("/api/v1/whoami", headers=owner).json()
    them = client.get("/api/v1/whoami", headers=bearer(viewer["token"])).json()

    assert me["is_owner"] is True and me["kind"] == "user" and me["name"] == "owner"
    assert me["roles"] == {"beta": "admin", "default": "admin"}
    assert them == {
        "principal_id": viewer["principal_id"],
        "name": "viewer-x",
        "kind": "user",
        "is_owner": False,
        "roles": {"default": "viewer"},
    }
    assert client.get("/api/v1/whoami").status_code == 401


def test_a_revoked_token_gets_401_on_its_very_next_request(client: Any, owner: dict[str, str]) -> None:
    member = _mint(client, owner, "operator")
    headers = bearer(member["token"])
    assert client.get("/api/v1/projects/default/tasks", headers=headers).status_code == 200

    resp = client.post(f"{TOKENS}/{member['principal_id']}/revoke", headers=owner)

    assert resp.status_code == 200
    item = resp.json()
    assert set(item) == ITEM_KEYS and item["revoked_at_ms"] is not None and item["role"] == "operator"
    denied = client.get("/api/v1/projects/default/tasks", headers=headers)
    assert denied.status_code == 401 and denied.json()["error"]["code"] == "unauthenticated"
    listed = client.get(TOKENS, headers=owner).json()["items"]
    assert {i["id"]: i["revoked_at_ms"] for i in listed}[member["principal_id"]] == item["revoked_at_ms"]


def test_list_shows_lifecycle_and_never_a_token_or_digest(
    client: Any, owner: dict[str, str], db: Any
) -> None:
    member = _mint(client, owner, "viewer", expires_in_s=3600)
    assert member["expires_at_ms"] is not None
    client.get("/api/v1/whoami", headers=bearer(member["token"]))  # a first use is recorded

    resp = client.get(TOKENS, headers=owner)

    assert resp.status_code == 200
    items = {i["id"]: i for i in resp.json()["items"]}
    assert set(items[member["principal_id"]]) == ITEM_KEYS
    assert items[member["principal_id"]]["expires_at_ms"] == member["expires_at_ms"]
    assert items[member["principal_id"]]["last_used_at_ms"] is not None
    digests = [r["token_digest"] for r in db.raw("SELECT token_digest FROM principals")]
    assert member["token"] not in resp.text and not any(d in resp.text for d in digests)


def test_rotate_returns_a_new_token_once_and_kills_the_old(client: Any, owner: dict[str, str]) -> None:
    member = _mint(client, owner, "viewer")

    resp = client.post(f"{TOKENS}/{member['principal_id']}/rotate", headers=owner)

    assert resp.status_code == 201
    body = resp.json()
    assert set(body) == ITEM_KEYS | {"token"} and body["token"].startswith("ql3_")
    assert client.get("/api/v1/whoami", headers=bearer(member["token"])).status_code == 401
    me = client.get("/api/v1/whoami", headers=bearer(body["token"])).json()
    assert me["principal_id"] == member["principal_id"]
    assert body["token"] not in client.get(TOKENS, headers=owner).text


def test_rotate_with_a_lifetime(client: Any, owner: dict[str, str]) -> None:
    member = _mint(client, owner, "viewer")

    body = client.post(
        f"{TOKENS}/{member['principal_id']}/rotate", json={"expires_in_s": 120}, headers=owner
    ).json()

    assert body["expires_at_ms"] is not None and body["expires_at_ms"] > body["created_at_ms"]


@pytest.mark.parametrize("role", ["viewer", "operator", "approver"])
def test_only_admins_manage_tokens(client: Any, owner: dict[str, str], role: str) -> None:
    target = _mint(client, owner, "viewer")
    caller = bearer(_mint(client, owner, role)["token"])

    for method, path in (
        ("GET", TOKENS),
        ("POST", f"{TOKENS}/{target['principal_id']}/revoke"),
        ("POST", f"{TOKENS}/{target['principal_id']}/rotate"),
    ):
        resp = client.request(method, path, headers=caller)
        assert resp.status_code == 403, (method, path)
        assert resp.json()["error"]["code"] == "permission_denied"
    assert client.get("/api/v1/whoami", headers=bearer(target["token"])).status_code == 200


def test_an_admin_cannot_take_over_the_owner(client: Any, owner: dict[str, str]) -> None:
    admin = bearer(_mint(client, owner, "admin")["token"])
    owner_id = client.get("/api/v1/whoami", headers=owner).json()["principal_id"]

    rotate = client.post(f"{TOKENS}/{owner_id}/rotate", headers=admin)
    revoke = client.post(f"{TOKENS}/{owner_id}/revoke", headers=admin)

    assert rotate.status_code == 403 and revoke.status_code == 403
    assert client.get("/api/v1/whoami", headers=owner).status_code == 200


def test_the_owner_cannot_revoke_itself(client: Any, owner: dict[str, str]) -> None:
    owner_id = client.get("/api/v1/whoami", headers=owner).json()["principal_id"]

    resp = client.post(f"{TOKENS}/{owner_id}/revoke", headers=owner)

    assert resp.status_code == 409
    assert client.get("/api/v1/whoami", headers=owner).status_code == 200


def test_another_projects_token_is_not_found(client: Any, owner: dict[str, str], make_token: Any) -> None:
    beta_admin = make_token("admin", project="beta")
    target = _mint(client, owner, "viewer")

    resp = client.post(f"/api/v1/projects/beta/tokens/{target['principal_id']}/revoke", headers=beta_admin)

    assert resp.status_code == 404
    assert client.get("/api/v1/whoami", headers=bearer(target["token"])).status_code == 200


@pytest.mark.parametrize("bad", [0, 59, -1, "60", 1.5, True, 10**12])
def test_a_bad_lifetime_is_422_and_creates_nothing(
    client: Any, owner: dict[str, str], counts: Any, bad: object
) -> None:
    before = counts()

    resp = client.post(TOKENS, json={"role": "viewer", "expires_in_s": bad}, headers=owner)

    assert resp.status_code == 422 and resp.json()["error"]["code"] == "validation_failed"
    assert counts() == before
