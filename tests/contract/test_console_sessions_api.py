"""The sign-in API on both databases: the session cookie's attributes, CSRF on state-changing requests
from a cookie session (bearer requests unaffected), lock-out answers, sign-out, the sessions and users
routes and TOTP (docs/security.md "Console sign-in")."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ql3.application import auth, sessions
from ql3.http.app import create_app
from ql3.storage.secret_box import AesGcmBox
from tests.support.databases import Harness

POLICY = sessions.SessionPolicy(
    idle_ms=60_000, max_ms=3_600_000, max_failures=3, lockout_ms=120_000, address_max_failures=5
)
PASSWORD = "correct horse battery"


@pytest.fixture
def api(harness: Harness) -> Iterator[tuple[TestClient, str]]:
    issued = harness.db.transaction(auth.bootstrap_owner)
    assert issued is not None
    app = create_app(harness.db, secret_box=AesGcmBox(os.urandom(32)), session_policy=POLICY)
    with TestClient(app) as client:
        yield client, issued.token


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _add_user(client: TestClient, owner: str, name: str = "alice", role: str = "operator") -> dict[str, Any]:
    made = client.post(
        "/api/v1/projects/default/users",
        json={"name": name, "password": PASSWORD, "role": role},
        headers=_bearer(owner),
    )
    assert made.status_code == 201, made.text
    body: dict[str, Any] = made.json()
    return body


def _sign_in(client: TestClient, name: str = "alice", password: str = PASSWORD, **extra: Any) -> Any:
    return client.post("/api/v1/session", json={"name": name, "password": password, **extra})


def test_sign_in_sets_a_strict_http_only_cookie_and_csrf_guards_changes(api: tuple[TestClient, str]) -> None:
    client, owner = api
    _add_user(client, owner)
    signed = _sign_in(client)
    assert signed.status_code == 200, signed.text
    cookie = signed.headers["set-cookie"]
    assert cookie.startswith("ql3_session=ql3s_")
    lowered = cookie.lower()
    assert "httponly" in lowered and "samesite=strict" in lowered and "path=/" in lowered
    assert f"max-age={POLICY.max_ms // 1000}" in lowered
    assert "secure" not in lowered  # plain http here; https sets it (below)
    csrf = signed.json()["csrf_token"]
    assert signed.json()["name"] == "alice" and "password" not in signed.text

    # reads need no CSRF token; a new tab learns it from GET /session
    assert client.get("/api/v1/whoami").json()["name"] == "alice"
    assert client.get("/api/v1/session").json()["csrf_token"] == csrf
    # a change without the token is refused with a stable code, and nothing is written
    refused = client.post("/api/v1/projects/default/tasks", json={"name": "t1", "command": "true"})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "csrf_token_invalid"
    wrong = client.post(
        "/api/v1/projects/default/tasks",
        json={"name": "t1", "command": "true"},
        headers={"X-CSRF-Token": "x" * 64},
    )
    assert wrong.status_code == 403 and wrong.json()["error"]["code"] == "csrf_token_invalid"
    assert client.get("/api/v1/projects/default/tasks").json()["items"] == []
    made = client.post(
        "/api/v1/projects/default/tasks",
        json={"name": "t1", "command": "true"},
        headers={"X-CSRF-Token": csrf},
    )
    assert made.status_code == 201, made.text
    # a bearer request is unaffected by the cookie, and never borrows it
    bearer = client.post(
        "/api/v1/projects/default/tasks", json={"name": "t2", "command": "true"}, headers=_bearer(owner)
    )
    assert bearer.status_code == 201
    assert client.get("/api/v1/whoami", headers=_bearer(owner)).json()["name"] == "owner"
    bad = client.get("/api/v1/whoami", headers=_bearer("ql3_not_a_token"))
    assert bad.status_code == 401


def test_https_sets_a_secure_cookie(harness: Harness) -> None:
    issued = harness.db.transaction(auth.bootstrap_owner)
    assert issued is not None
    app = create_app(harness.db, session_policy=POLICY)
    with TestClient(app, base_url="https://testserver") as client:
        _add_user(client, issued.token)
        signed = _sign_in(client)
        assert signed.status_code == 200
        assert "secure" in signed.headers["set-cookie"].lower()


def test_sign_out_revokes_the_session_and_clears_the_cookie(api: tuple[TestClient, str]) -> None:
    client, owner = api
    _add_user(client, owner)
    signed = _sign_in(client)
    secret = client.cookies["ql3_session"]
    csrf = signed.json()["csrf_token"]
    assert client.delete("/api/v1/session").status_code == 403  # sign-out is a change: CSRF too
    out = client.delete("/api/v1/session", headers={"X-CSRF-Token": csrf})
    assert out.status_code == 204
    assert 'ql3_session=""' in out.headers["set-cookie"] or "max-age=0" in out.headers["set-cookie"].lower()
    # the old cookie, replayed, is refused: the session is revoked on the server
    client.cookies.set("ql3_session", secret)
    assert client.get("/api/v1/whoami").status_code == 401
    assert client.get("/api/v1/session").status_code == 401


def test_failures_lock_the_name_and_the_address(api: tuple[TestClient, str]) -> None:
    client, owner = api
    _add_user(client, owner)
    _add_user(client, owner, "bob")
    answers = [_sign_in(client, password="wrong password") for _ in range(POLICY.max_failures)]
    assert [a.status_code for a in answers] == [401, 401, 429]
    assert answers[0].json()["error"]["code"] == "signin_failed"
    assert answers[2].json()["error"]["code"] == "signin_locked"
    assert 0 < answers[2].json()["error"]["details"]["retry_after_s"] <= POLICY.lockout_ms // 1000
    locked = _sign_in(client)  # the right password while locked
    assert locked.status_code == 429 and locked.json()["error"]["code"] == "signin_locked"
    # an unknown name answers like a wrong password
    unknown = _sign_in(client, "nobody")
    assert unknown.status_code == 401 and unknown.json()["error"]["code"] == "signin_failed"
    # this address has failed 5 times (address_max_failures): bob is refused from here too
    from_here = _sign_in(client, "bob")
    assert from_here.status_code == 429 and from_here.json()["error"]["code"] == "signin_locked"
    # a new password from an admin clears the name's lock (the address lock is per process)
    client.app.state.signin_limiter.succeeded("testclient")  # type: ignore[attr-defined]
    reset = client.post(
        "/api/v1/projects/default/users/alice/password",
        json={"password": "a new password"},
        headers=_bearer(owner),
    )
    assert reset.status_code == 200
    assert _sign_in(client, password="a new password").status_code == 200


def test_sessions_are_listed_and_revoked_through_the_api(api: tuple[TestClient, str]) -> None:
    client, owner = api
    _add_user(client, owner)
    first = _sign_in(client).json()
    client.cookies.clear()
    second = _sign_in(client).json()
    csrf = second["csrf_token"]
    mine = client.get("/api/v1/sessions").json()["items"]
    assert [s["id"] for s in mine] == [second["session"]["id"], first["session"]["id"]]
    assert [s["current"] for s in mine] == [True, False]
    # an admin lists alice's sessions and revokes one
    listed = client.get("/api/v1/projects/default/users/alice/sessions", headers=_bearer(owner)).json()[
        "items"
    ]
    assert {s["id"] for s in listed} == {first["session"]["id"], second["session"]["id"]}
    revoked = client.post(
        f"/api/v1/projects/default/sessions/{first['session']['id']}/revoke", headers=_bearer(owner)
    )
    assert revoked.status_code == 200 and revoked.json()["revoked_at_ms"] is not None
    assert [s["id"] for s in client.get("/api/v1/sessions").json()["items"]] == [second["session"]["id"]]
    # alice revokes her own current session: the next request is signed out
    own = client.post(f"/api/v1/sessions/{second['session']['id']}/revoke", headers={"X-CSRF-Token": csrf})
    assert own.status_code == 200
    assert client.get("/api/v1/whoami").status_code == 401
    missing = client.post("/api/v1/projects/default/sessions/nope/revoke", headers=_bearer(owner))
    assert missing.status_code == 404


def test_users_are_managed_by_admins_only_and_validated(api: tuple[TestClient, str]) -> None:
    client, owner = api
    _add_user(client, owner, "vic", role="viewer")
    signed = _sign_in(client, "vic")
    csrf = signed.json()["csrf_token"]
    denied = client.post(
        "/api/v1/projects/default/users",
        json={"name": "eve", "password": PASSWORD, "role": "admin"},
        headers={"X-CSRF-Token": csrf},
    )
    assert denied.status_code == 403 and denied.json()["error"]["code"] == "permission_denied"
    short = client.post(
        "/api/v1/projects/default/users", json={"name": "x", "password": "short"}, headers=_bearer(owner)
    )
    assert short.status_code == 422
    taken = client.post(
        "/api/v1/projects/default/users", json={"name": "vic", "password": PASSWORD}, headers=_bearer(owner)
    )
    assert taken.status_code == 409
    users = client.get("/api/v1/projects/default/users", headers=_bearer(owner)).json()["items"]
    assert [(u["name"], u["totp"]) for u in users] == [("vic", False)]
    removed = client.delete("/api/v1/projects/default/users/vic", headers=_bearer(owner))
    assert removed.status_code == 200 and removed.json() == {"sessions_revoked": 1}
    assert client.get("/api/v1/whoami").status_code == 401


def test_totp_sign_in_through_the_api(api: tuple[TestClient, str], harness: Harness) -> None:
    client, owner = api
    _add_user(client, owner)
    enabled = client.post("/api/v1/projects/default/users/alice/totp", headers=_bearer(owner))
    assert enabled.status_code == 200
    secret = enabled.json()["secret"]
    needs = _sign_in(client)
    assert needs.status_code == 401 and needs.json()["error"]["code"] == "totp_required"
    assert "ql3_session" not in client.cookies
    step = harness.now_ms() // 1000 // sessions.TOTP_STEP_S
    ok = _sign_in(client, totp=sessions.totp_code(secret, step))
    assert ok.status_code == 200 and "ql3_session" in client.cookies
