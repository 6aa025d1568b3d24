"""The issue's repro over HTTP: an admin mints an approver token (``POST /tokens``) and approves its
own request with it: refused with 403 ``separation_of_duty``. The project's approval policy through
the API and ``ql3 approval policy``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi.testclient import TestClient

P = "/api/v1/projects/default"


def _minted(client: TestClient, by: dict[str, str], role: str, name: str) -> dict[str, str]:
    resp = client.post(f"{P}/tokens", json={"name": name, "role": role}, headers=by)
    assert resp.status_code == 201, resp.text
    return {"Authorization": f"Bearer {resp.json()['token']}"}


def test_an_approver_token_minted_by_the_requester_cannot_approve(
    client: TestClient,
    owner: dict[str, str],
    make_task: Callable[..., dict[str, Any]],
    make_token: Callable[..., dict[str, str]],
) -> None:
    # Given the owner's request and an approver token the owner minted through the API
    make_task("gated", approval="required")
    puppet = _minted(client, owner, "approver", "puppet")
    approval = client.post(f"{P}/tasks/gated/runs", json={}, headers=owner).json()["approval"]
    url = f"{P}/approvals/{approval['id']}"

    # When the minted token approves it
    refused = client.post(f"{url}/approve", json={}, headers=puppet)

    # Then it is refused and the request stays pending; an approver from elsewhere can approve it
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "separation_of_duty"
    assert client.get(url, headers=owner).json()["state"] == "pending"
    independent = make_token("approver", name="independent")
    assert client.post(f"{url}/approve", json={}, headers=independent).json()["state"] == "approved"


def test_the_approval_policy_through_the_api_and_the_cli(
    client: TestClient,
    owner: dict[str, str],
    make_token: Callable[..., dict[str, str]],
    cli_main: Callable[..., tuple[int, str, str]],
) -> None:
    path = f"{P}/approval-policy"
    assert client.get(path, headers=owner).json() == {
        "second_admin": False,
        "version": 0,
        "updated_at_ms": None,
    }
    # Only an admin sets it; a viewer reads it
    operator = make_token("operator", name="op")
    assert client.put(path, json={"second_admin": True}, headers=operator).status_code == 403
    assert client.put(path, json={"second_admin": "yes"}, headers=owner).status_code == 422

    code, out, err = cli_main("approval", "policy", "--second-admin")
    assert code == 0 and "second_admin: on" in out, err
    code, out, _ = cli_main("--json", "approval", "policy")
    assert code == 0 and json.loads(out)["second_admin"] is True and json.loads(out)["version"] == 1
    assert client.get(path, headers=make_token("viewer", name="v")).json()["second_admin"] is True
    assert cli_main("approval", "policy", "--no-second-admin")[0] == 0
    assert client.get(path, headers=owner).json()["version"] == 2
