"""HTTP approvals: an approval-required start makes a request (202, no run); deciding it; approved
actions and their manual resolution. Uses an injected clock so expiry and leases can pass."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ql3.application import approvals
from ql3.domain.ids import new_id
from ql3.storage.sqlite.adapter import SqliteDatabase
from tests.support.approval_builders import started
from tests.support.databases import FakeClock

P = "/api/v1/projects/default"
HOUR_MS = 3_600_000
CANARY = "CANARY-4ppr0v"
FORBIDDEN_KEYS = {
    "lease_owner",
    "lease_token_digest",
    "action_plan",
    "action_plan_json",
    "request_fence",
    "decision_fence",
    "command",
    "env",
}


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def db(tmp_path: Path, fake_clock: FakeClock) -> Iterator[SqliteDatabase]:
    """This module's database runs on a clock the tests move."""
    database = SqliteDatabase(tmp_path / "ql3.db", clock=fake_clock)
    database.migrate()
    yield database
    database.close()


def _n(db: Any, table: str) -> int:
    return int(db.raw(f"SELECT count(*) AS n FROM {table}")[0]["n"])


def _request(client: Any, headers: dict[str, str], task: str = "gated", **body: Any) -> dict[str, Any]:
    resp = client.post(f"{P}/tasks/{task}/runs", json=body, headers=headers)
    assert resp.status_code == 202, resp.text
    assert set(resp.json()) == {"approval"}
    approval: dict[str, Any] = resp.json()["approval"]
    return approval


@pytest.fixture
def gated(make_task: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    return make_task("gated", approval="required", command=f"echo {CANARY}", env={"K": f"{CANARY}-env"})


def test_starting_an_approval_required_task_makes_a_request_and_no_run(
    db: Any,
    client: Any,
    owner: dict[str, str],
    gated: dict[str, Any],
    make_token: Callable[..., dict[str, str]],
    counts: Callable[[], dict[str, int]],
) -> None:
    operator = make_token("operator", name="op")
    before = counts()

    # When an operator starts the task
    approval = _request(client, operator)

    # Then a pending approval request exists and no run, attempt or event was written
    assert approval["state"] == "pending" and approval["effective_state"] == "pending"
    assert approval["action_type"] == "run.create"
    assert approval["expires_at_ms"] - approval["requested_at_ms"] == HOUR_MS
    assert counts() == before
    assert _n(db, "approval_requests") == 1
    assert client.get(f"{P}/runs", headers=owner).json()["items"] == []
    assert client.get(f"{P}/approvals/{approval['id']}", headers=operator).json() == approval

    # And the same idempotency key names the same request; none makes a new one
    keyed = _request(client, operator, idempotency_key="k-1")
    assert _request(client, operator, idempotency_key="k-1")["id"] == keyed["id"]
    assert _request(client, operator)["id"] not in (approval["id"], keyed["id"])
    assert _n(db, "approval_requests") == 3
    assert _n(db, "runs") == 0

    # And a viewer may not start it at all
    viewer = make_token("viewer", name="v")
    assert client.post(f"{P}/tasks/gated/runs", json={}, headers=viewer).status_code == 403
    assert _n(db, "approval_requests") == 3


def test_a_task_without_approval_still_starts_a_run(
    client: Any, owner: dict[str, str], make_task: Callable[..., dict[str, Any]]
) -> None:
    make_task("free")
    resp = client.post(f"{P}/tasks/free/runs", json={}, headers=owner)
    assert resp.status_code == 201
    assert resp.json()["status"] == "queued"


def test_the_requester_cannot_approve_and_an_approver_can(
    db: Any,
    client: Any,
    owner: dict[str, str],
    gated: dict[str, Any],
    make_token: Callable[..., dict[str, str]],
) -> None:
    # Given a request by the owner (an admin: it holds approval.decide too)
    approval = _request(client, owner)
    url = f"{P}/approvals/{approval['id']}"

    # When the requester approves their own request
    own = client.post(f"{url}/approve", json={}, headers=owner)

    # Then it is refused and the request stays pending
    assert own.status_code == 403
    assert own.json()["error"]["code"] == "separation_of_duty"
    assert client.get(url, headers=owner).json()["state"] == "pending"

    # When viewers and operators try (no approval.decide), they are refused too
    for role in ("viewer", "operator"):
        resp = client.post(f"{url}/approve", json={}, headers=make_token(role, name=role))
        assert resp.status_code == 403, role
    assert client.get(url, headers=owner).json()["state"] == "pending"

    # When an approver approves it
    approver = make_token("approver", name="ap")
    done = client.post(f"{url}/approve", json={"reason_code": "change_window"}, headers=approver)

    # Then it is approved, by someone other than the requester
    assert done.status_code == 200, done.text
    body = done.json()
    assert body["state"] == "approved" and body["decision"] == "approve"
    assert body["reason_code"] == "change_window"
    assert body["decided_by"] not in (None, body["requested_by"])
    assert client.get(url, headers=owner).json()["state"] == "approved"
    listed = client.get(f"{P}/approvals", params={"state": "approved"}, headers=approver).json()
    assert [a["id"] for a in listed["items"]] == [approval["id"]]
    assert client.get(f"{P}/approvals", params={"state": "pending"}, headers=approver).json()["items"] == []
    # ...and still no run until ql3 serve consumes it
    assert _n(db, "runs") == 0


def test_reject_needs_a_reason_and_a_decision_is_final(
    client: Any, owner: dict[str, str], gated: dict[str, Any], make_token: Callable[..., dict[str, str]]
) -> None:
    approval = _request(client, owner)
    url = f"{P}/approvals/{approval['id']}"
    approver = make_token("approver", name="ap")

    assert client.post(f"{url}/reject", json={}, headers=approver).status_code == 422
    assert client.post(f"{url}/reject", json={"reason_code": "Bad Code"}, headers=approver).status_code == 422
    assert client.get(url, headers=owner).json()["state"] == "pending"

    body = {"reason_code": "not_now", "decision_id": "d-1"}
    rejected = client.post(f"{url}/reject", json=body, headers=approver)
    assert rejected.status_code == 200
    assert rejected.json()["state"] == "rejected"
    # the same decision id replays; any other decision conflicts
    assert client.post(f"{url}/reject", json=body, headers=approver).json() == rejected.json()
    late = client.post(f"{url}/approve", json={}, headers=approver)
    assert late.status_code == 409
    assert client.get(url, headers=owner).json()["state"] == "rejected"


def test_an_expired_request_cannot_be_approved(
    client: Any,
    owner: dict[str, str],
    gated: dict[str, Any],
    make_token: Callable[..., dict[str, str]],
    fake_clock: FakeClock,
) -> None:
    approval = _request(client, owner)
    fake_clock.advance(HOUR_MS)

    resp = client.post(f"{P}/approvals/{approval['id']}/approve", json={}, headers=make_token("approver"))

    assert resp.status_code == 409
    assert resp.json()["error"]["code"] == "approval_expired"
    shown = client.get(f"{P}/approvals/{approval['id']}", headers=owner).json()
    assert shown["state"] == "pending" and shown["effective_state"] == "expired"


def test_unknown_or_foreign_approvals_are_not_found(
    client: Any, owner: dict[str, str], gated: dict[str, Any], make_token: Callable[..., dict[str, str]]
) -> None:
    approval = _request(client, owner)
    outsider = make_token("admin", project="other", name="x")

    assert (
        client.get(f"/api/v1/projects/other/approvals/{approval['id']}", headers=outsider).status_code == 404
    )
    other = client.post(
        f"/api/v1/projects/other/approvals/{approval['id']}/approve", json={}, headers=outsider
    )
    assert other.status_code == 404
    assert client.get(f"{P}/approvals/{new_id()}", headers=owner).status_code == 404
    assert client.get(f"{P}/approvals/bad%20id", headers=owner).status_code == 404
    assert client.get(f"{P}/approvals", params={"state": "nope"}, headers=owner).status_code == 422


def _dispatched(db: Any, client: Any, owner: dict[str, str], approver: dict[str, str]) -> dict[str, Any]:
    """An approved and consumed request (what ql3 serve does): one approved action, pending."""
    approval = _request(client, owner)
    url = f"{P}/approvals/{approval['id']}/approve"
    assert client.post(url, json={}, headers=approver).status_code == 200
    dispatch = db.transaction(
        lambda tx: approvals.consume(tx, approval_id=approval["id"], consumption_id=new_id())
    )
    return {"approval": approval, "dispatch": dispatch}


def test_actions_are_listed_and_only_an_approver_resolves_a_recovery_required_one(
    db: Any,
    client: Any,
    owner: dict[str, str],
    gated: dict[str, Any],
    make_token: Callable[..., dict[str, str]],
    fake_clock: FakeClock,
) -> None:
    approver = make_token("approver", name="ap")
    made = _dispatched(db, client, owner, approver)
    dispatch = made["dispatch"]
    url = f"{P}/actions/{dispatch.id}"

    # The action is visible to a viewer, pending
    viewer = make_token("viewer", name="v")
    listed = client.get(f"{P}/actions", headers=viewer).json()
    assert [a["dispatch_id"] for a in listed["items"]] == [dispatch.id]
    assert listed["items"][0]["approval_request_id"] == made["approval"]["id"]
    assert client.get(url, headers=viewer).json()["status"] == "pending"

    # A pending action is not recovery_required: nothing to resolve
    pending = client.post(
        f"{url}/resolve", json={"outcome": "failed", "expected_version": 0}, headers=approver
    )
    assert pending.status_code == 409

    # Given the handler started behind the barrier and its lease ran out (outcome unproven)
    started(db, dispatch, lease_ms=5_000)
    fake_clock.advance(6_000)
    view = client.get(url, headers=viewer).json()
    assert view["effective_status"] == "recovery_required"
    body = {"outcome": "abandoned", "expected_version": view["version"]}

    # Viewers and operators cannot resolve it; a stale version conflicts; a bad outcome is invalid
    for role in ("viewer", "operator"):
        resp = client.post(f"{url}/resolve", json=body, headers=make_token(role, name=f"{role}2"))
        assert resp.status_code == 403, role
    stale = client.post(
        f"{url}/resolve", json={**body, "expected_version": view["version"] + 1}, headers=approver
    )
    assert stale.status_code == 409
    bad = client.post(f"{url}/resolve", json={**body, "outcome": "retry"}, headers=approver)
    assert bad.status_code == 422
    assert client.get(url, headers=viewer).json()["effective_status"] == "recovery_required"

    # An approver abandons it: recorded as blocked, and never retried
    done = client.post(f"{url}/resolve", json={**body, "mutation_id": "res-1"}, headers=approver)
    assert done.status_code == 200, done.text
    assert done.json()["status"] == "blocked"
    assert done.json()["result_code"] == "abandon_unknown"
    again = client.post(f"{url}/resolve", json={**body, "mutation_id": "res-1"}, headers=approver)
    assert again.status_code == 200 and again.json()["status"] == "blocked"
    assert _n(db, "runs") == 0


def _keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


def test_no_approval_or_action_response_carries_the_command_env_or_a_lease_owner(
    db: Any,
    client: Any,
    owner: dict[str, str],
    gated: dict[str, Any],
    make_token: Callable[..., dict[str, str]],
    fake_clock: FakeClock,
) -> None:
    # Given an approval-required task whose command and env carry a canary, and a started action
    approver = make_token("approver", name="ap")
    dispatch = _dispatched(db, client, owner, approver)["dispatch"]
    fence = started(db, dispatch, lease_ms=5_000, owner="replica-secret-owner")
    fake_clock.advance(6_000)
    digests = [
        r["lease_token_digest"] for r in db.raw("SELECT lease_token_digest FROM approved_action_executions")
    ]
    pending = _request(client, owner, idempotency_key="again")

    # When every approval and action route answers
    responses = [
        client.post(f"{P}/tasks/gated/runs", json={"idempotency_key": "again"}, headers=owner),
        client.get(f"{P}/approvals", headers=owner),
        client.get(f"{P}/approvals/{pending['id']}", headers=owner),
        client.post(f"{P}/approvals/{pending['id']}/reject", json={"reason_code": "no"}, headers=approver),
        client.get(f"{P}/actions", headers=owner),
        client.get(f"{P}/actions/{dispatch.id}", headers=owner),
        client.post(
            f"{P}/actions/{dispatch.id}/resolve",
            json={"outcome": "succeeded", "expected_version": fence.version},
            headers=approver,
        ),
    ]

    # Then none carries the canary, the lease owner, the lease token or its digest, or a plan
    assert [r.status_code for r in responses] == [202] + [200] * 6, [r.text for r in responses]
    secrets = [CANARY, "replica-secret-owner", fence.token, *[d for d in digests if d]]
    for resp in responses:
        for secret in secrets:
            assert secret not in resp.text, (resp.request.url, secret)
        assert not _keys(resp.json()) & FORBIDDEN_KEYS, resp.request.url


def test_an_approval_names_its_bound_revision_and_keeps_a_decision_note(
    db: Any,
    client: Any,
    owner: dict[str, str],
    gated: dict[str, Any],
    make_token: Callable[..., dict[str, str]],
) -> None:
    # Given a request bound to revision 1, and the task edited to revision 2 afterwards
    approval = _request(client, owner)
    url = f"{P}/approvals/{approval['id']}"
    assert approval["task_revision"] == 1
    edited = client.patch(f"{P}/tasks/gated", json={"command": "echo changed"}, headers=owner)
    assert edited.status_code == 200, edited.text
    assert edited.json()["revision"] == 2

    # Then the approval still says which revision will run
    assert client.get(url, headers=owner).json()["task_revision"] == 1
    listed = client.get(f"{P}/approvals", headers=owner).json()["items"]
    assert [a["task_revision"] for a in listed] == [1]

    # When an approver rejects with an invalid note, it is a 422 and nothing is written
    approver = make_token("approver", name="ap")
    for bad in ("x" * 501, "two\nlines", "nul\x00", "esc\x1b[31m", 12):
        resp = client.post(f"{url}/reject", json={"reason_code": "bad_timing", "note": bad}, headers=approver)
        assert resp.status_code == 422, (bad, resp.text)
        assert resp.json()["error"]["code"] == "validation_failed"
    lone = client.post(
        f"{url}/reject",
        content=b'{"reason_code": "bad_timing", "note": "\\ud800"}',
        headers={**approver, "content-type": "application/json"},
    )
    assert lone.status_code == 422
    assert db.raw("SELECT state, decision_note FROM approval_requests") == [
        {"state": "pending", "decision_note": None}
    ]

    # When it rejects with a note, the note is stored with the decision and shown
    note = "Wait for the freeze to end — see the change calendar."
    done = client.post(f"{url}/reject", json={"reason_code": "bad_timing", "note": note}, headers=approver)
    assert done.status_code == 200, done.text
    assert (done.json()["reason_code"], done.json()["note"]) == ("bad_timing", note)
    assert client.get(url, headers=owner).json()["note"] == note
    assert db.raw("SELECT decision_note FROM approval_requests")[0]["decision_note"] == note


def test_an_approve_may_carry_a_note(
    client: Any, owner: dict[str, str], gated: dict[str, Any], make_token: Callable[..., dict[str, str]]
) -> None:
    approval = _request(client, owner)
    approver = make_token("approver", name="ap")
    url = f"{P}/approvals/{approval['id']}"

    done = client.post(f"{url}/approve", json={"note": "checked with the on-call"}, headers=approver)

    assert done.status_code == 200, done.text
    assert (done.json()["reason_code"], done.json()["note"]) == ("approved", "checked with the on-call")
    assert client.get(url, headers=owner).json()["note"] == "checked with the on-call"
