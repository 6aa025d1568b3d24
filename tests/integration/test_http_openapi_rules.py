"""What the OpenAPI document states is what the API does: 400 ``malformed_json``, ``Allow`` on a 405
naming every method of the path, the rules of the 422s, and integers as JSON Schema reads them.

Found by schemathesis (tests/integration/test_openapi_schemathesis.py); each is pinned here in-process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ql3.domain.tasks import TASK_NAME_RE

TASKS = "/api/v1/projects/default/tasks"
JSON = {"Content-Type": "application/json"}


@pytest.mark.parametrize("raw", [b'{"name": "x", "command": ', b"\xff\xfe{}", b"nul"])
def test_a_body_that_is_not_json_is_a_400_malformed_json(
    client: Any, owner: dict[str, str], counts: Callable[[], dict[str, int]], raw: bytes
) -> None:
    before = counts()
    resp = client.post(TASKS, content=raw, headers={**owner, **JSON})

    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "malformed_json"
    assert counts() == before


def test_the_document_states_400_on_every_operation_with_a_body(client: Any) -> None:
    spec = client.get("/openapi.json").json()
    with_body = [
        (path, method, op)
        for path, ops in spec["paths"].items()
        for method, op in ops.items()
        if "requestBody" in op
    ]

    assert len(with_body) > 10
    for path, method, op in with_body:
        assert op["responses"]["400"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/ErrorOut"
        }, (method, path)
    get_only = spec["paths"]["/api/v1/projects/{project}/runs"]["get"]
    assert "400" not in get_only["responses"]


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("OPTIONS", TASKS, "GET, POST"),
        ("PUT", f"{TASKS}/job", "DELETE, GET, PATCH"),
        ("DELETE", "/api/v1/projects", "GET, POST"),
        ("PATCH", "/api/v1/projects/default/retention", "GET, PUT"),
        ("POST", "/healthz", "GET"),
    ],
)
def test_a_405_names_every_method_of_the_path(
    client: Any, owner: dict[str, str], method: str, path: str, allowed: str
) -> None:
    resp = client.request(method, path, headers=owner)

    assert resp.status_code == 405
    assert resp.headers["allow"] == allowed
    assert resp.json()["error"]["code"] == "method_not_allowed"


def test_an_integral_number_is_an_integer_and_nothing_else_is(
    client: Any, owner: dict[str, str], make_task: Callable[..., dict[str, Any]]
) -> None:
    make_task("job")
    ok = client.put(
        "/api/v1/projects/default/retention", json={"keep_days": 30.0, "runs_per_task": 10}, headers=owner
    )
    assert ok.status_code == 200, ok.text
    assert ok.json()["keep_days"] == 30 and isinstance(ok.json()["keep_days"], int)

    for bad in (30.5, "30", True):
        refused = client.put("/api/v1/projects/default/retention", json={"keep_days": bad}, headers=owner)
        assert refused.status_code == 422, (bad, refused.text)
    nested = client.post(
        TASKS,
        json={"name": "pref", "command": "true", "prefer": [{"labels": {"a": "b"}, "weight": 2.0}]},
        headers=owner,
    )
    assert nested.status_code == 201, nested.text


def test_a_bad_rerun_of_is_refused_also_when_the_task_needs_approval(
    client: Any, owner: dict[str, str], make_task: Callable[..., dict[str, Any]]
) -> None:
    make_task("gated", approval="required")
    approvals_before = client.get("/api/v1/projects/default/approvals", headers=owner).json()["items"]

    for bad in ("", "not-a-run", "01a2318c-aa56-7356-8442-6945e57fd958"):
        resp = client.post(f"{TASKS}/gated/runs", json={"rerun_of": bad}, headers=owner)
        assert resp.status_code == 422, (bad, resp.text)
        assert resp.json()["error"]["details"]["field"] == "rerun_of"
    after = client.get("/api/v1/projects/default/approvals", headers=owner).json()["items"]
    assert after == approvals_before
    assert client.post(f"{TASKS}/gated/runs", json={}, headers=owner).status_code == 202


def test_the_document_states_the_rules_the_domain_enforces(client: Any) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]

    assert schemas["TaskCreate"]["properties"]["name"]["pattern"] == TASK_NAME_RE.pattern
    assert schemas["TaskCreate"]["properties"]["name"]["maxLength"] == 128
    assert schemas["ProjectCreate"]["properties"]["name"]["pattern"]
    expires = schemas["TokenCreate"]["properties"]["expires_in_s"]["anyOf"][0]
    assert (expires["minimum"], expires["maximum"]) == (60, 10 * 366 * 86400)
    keep = schemas["RetentionIn"]["properties"]["keep_days"]["anyOf"][0]
    assert (keep["type"], keep["minimum"]) == ("integer", 1)
