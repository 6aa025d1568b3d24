"""Input edges: lone UTF-16 surrogates are refused with 422 and write nothing; every response carries
the security headers the console sends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

TASKS = "/api/v1/projects/default/tasks"
JSON = {"content-type": "application/json"}


@pytest.fixture
def before(make_task: Callable[..., dict[str, Any]], counts: Callable[[], dict[str, int]]) -> dict[str, int]:
    make_task("victim")
    return counts()


# Raw bodies: a JSON encoder would refuse to produce these, a hostile client does not.
@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", TASKS, r'{"name":"s1","command":"\ud800"}'),
        ("POST", TASKS, r'{"name":"s1","command":"true","env":{"A":"\udfff"}}'),
        ("POST", TASKS, r'{"name":"s1","command":"true","env":{"\ud800":"x"}}'),
        ("POST", TASKS, r'{"name":"s1","command":"true","cwd":"/tmp/\ud800"}'),
        ("POST", TASKS, r'{"name":"s1","command":"true","require":{"zone":"\ud800"}}'),
        ("POST", TASKS, r'{"name":"s1","command":"true","prefer":[{"labels":{"zone":"\ud800"}}]}'),
        ("PATCH", f"{TASKS}/victim", r'{"command":"\ud800"}'),
        ("PATCH", f"{TASKS}/victim", r'{"env":{"A":"\ud800"}}'),
        ("POST", f"{TASKS}/victim/runs", r'{"idempotency_key":"\udfff"}'),
        ("POST", "/api/v1/projects/default/tokens", r'{"role":"viewer","name":"\ud800"}'),
        ("POST", "/api/v1/projects", r'{"name":"\ud800"}'),
    ],
    ids=[
        "command",
        "env-value",
        "env-key",
        "cwd",
        "require",
        "prefer",
        "patch-command",
        "patch-env",
        "idempotency-key",
        "token-name",
        "project-name",
    ],
)
def test_a_lone_surrogate_is_422_and_writes_nothing(
    client: Any, owner: dict[str, str], before: dict[str, int], counts: Any, method: str, path: str, body: str
) -> None:
    resp = client.request(method, path, content=body.encode("ascii"), headers={**owner, **JSON})

    assert resp.status_code == 422, resp.text
    assert resp.json()["error"]["code"] == "validation_failed"
    assert counts() == before
    assert client.get(f"{TASKS}/victim", headers=owner).json()["revision"] == 1


def test_a_valid_surrogate_pair_is_ordinary_text(client: Any, owner: dict[str, str]) -> None:
    body = r'{"name":"emoji","command":"echo \ud83d\ude00"}'

    resp = client.post(TASKS, content=body.encode("ascii"), headers={**owner, **JSON})

    assert resp.status_code == 201, resp.text


EXPECTED = {
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
}


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/api/v1/projects", 200),
        ("GET", "/api/v1/whoami", 200),
        ("GET", "/api/v1/projects/nope", 404),
        ("POST", TASKS, 422),
        ("GET", "/healthz", 200),
        ("GET", "/openapi.json", 200),
    ],
)
def test_api_responses_carry_the_security_headers(
    client: Any, owner: dict[str, str], method: str, path: str, status: int
) -> None:
    resp = client.request(method, path, headers=owner, json={} if method == "POST" else None)

    assert resp.status_code == status
    for name, value in EXPECTED.items():
        assert resp.headers[name] == value, name
    assert resp.headers["content-security-policy"] == "default-src 'none'; frame-ancestors 'none'"
    if path.startswith("/api/"):
        assert resp.headers["cache-control"] == "no-store"


def test_errors_outside_the_routes_carry_them_too(client: Any, owner: dict[str, str]) -> None:
    unauthenticated = client.get("/api/v1/projects")
    too_large = client.post(TASKS, content=b"x" * (300 * 1024), headers={**owner, **JSON})

    for resp, status in ((unauthenticated, 401), (too_large, 413)):
        assert resp.status_code == status
        assert resp.headers["x-content-type-options"] == "nosniff"
        assert resp.headers["x-frame-options"] == "DENY"


def test_the_new_token_response_is_not_cacheable(client: Any, owner: dict[str, str]) -> None:
    resp = client.post("/api/v1/projects/default/tokens", json={"role": "viewer"}, headers=owner)

    assert resp.status_code == 201
    assert resp.headers["cache-control"] == "no-store"


def test_the_console_keeps_its_own_policy_and_docs_get_one(client: Any) -> None:
    console = client.get("/")
    docs = client.get("/docs")

    assert console.headers["content-security-policy"] == "default-src 'self'; frame-ancestors 'none'"
    assert console.headers["cache-control"] == "no-cache"
    assert console.headers["x-frame-options"] == "DENY"
    assert docs.status_code == 200
    assert "frame-ancestors 'none'" in docs.headers["content-security-policy"]
    assert docs.headers["x-content-type-options"] == "nosniff"
