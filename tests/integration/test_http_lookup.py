"""The lookup routes over HTTP: an id by unique prefix (404 / 409 with candidates / 422), and the
name of a principal with a role in the project."""

from __future__ import annotations

from typing import Any

RESOLVE = "/api/v1/projects/default/resolve"
START = "/api/v1/projects/default/tasks/job/runs"


def _shared(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def test_a_prefix_resolves_or_is_ambiguous_with_candidates(client: Any, owner: Any, make_task: Any) -> None:
    make_task("job")
    first = client.post(START, headers=owner).json()["id"]
    second = client.post(START, headers=owner).json()["id"]
    shared = _shared(first, second)

    unique = client.get(f"{RESOLVE}/run/{second[: len(shared) + 1]}", headers=owner)
    ambiguous = client.get(f"{RESOLVE}/run/{shared}", headers=owner)
    missing = client.get(f"{RESOLVE}/run/ffffffff", headers=owner)
    short = client.get(f"{RESOLVE}/run/01a", headers=owner)
    kind = client.get(f"{RESOLVE}/script/{shared}", headers=owner)

    assert unique.status_code == 200 and unique.json() == {"kind": "run", "id": second}
    assert ambiguous.status_code == 409
    error = ambiguous.json()["error"]
    assert error["code"] == "ambiguous_id" and sorted(error["details"]["candidates"]) == sorted(
        [first, second]
    )
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert short.status_code == 422 and kind.status_code == 422


def test_the_resolve_route_needs_a_token_and_a_role(client: Any, make_token: Any, make_task: Any) -> None:
    make_task("job")
    outsider = make_token("viewer", project="elsewhere", name="outsider")

    assert client.get(f"{RESOLVE}/task/0000").status_code == 401
    refused = client.get(f"{RESOLVE}/task/0000", headers=outsider)
    assert refused.status_code == 404 and refused.json()["error"]["message"] == "project not found"


def test_a_principal_is_named_only_to_members_of_its_project(
    client: Any, db: Any, owner: Any, make_token: Any
) -> None:
    make_token("approver", name="alice")
    make_token("viewer", project="elsewhere", name="bob")
    ids = {str(r["name"]): str(r["id"]) for r in db.raw("SELECT id, name FROM principals")}

    named = client.get(f"/api/v1/projects/default/principals/{ids['alice']}", headers=owner)
    hidden = client.get(f"/api/v1/projects/default/principals/{ids['bob']}", headers=owner)
    unknown = client.get("/api/v1/projects/default/principals/nobody", headers=owner)

    assert named.status_code == 200 and named.json() == {"id": ids["alice"], "name": "alice", "kind": "user"}
    assert hidden.status_code == 404 and unknown.status_code == 404
