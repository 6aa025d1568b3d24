"""HTTP cancellation: request, inspect, rearm, summary and the blocked drill-down (domain.md §6)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ql3.application import cancellation, cancellation_supervisor
from ql3.domain.cancellation import BlockedCursor, encode_blocked_cursor
from ql3.domain.ids import new_id
from ql3.domain.offers import LeaseFence
from tests.support.cancellation_builders import FakeSignal, handle_of, running_runs

P = "/api/v1/projects/default"
SUMMARY_KEYS = {
    "observedAtMs",
    "dispatches",
    "signals",
    "blockingResults",
    "assessment",
    "operatorAction",
}
LEASE_OWNER = "sup-canary-owner"


def _start(client: Any, headers: dict[str, str], task: str = "job") -> dict[str, Any]:
    resp = client.post(f"{P}/tasks/{task}/runs", json={}, headers=headers)
    assert resp.status_code == 201, resp.text
    run: dict[str, Any] = resp.json()
    return run


def _blocked(db: Any, n: int = 1, result: str = "identity_mismatch", **spec: Any) -> list[LeaseFence]:
    """``n`` running runs whose cancellation a supervisor could not prove: dispatch ``blocked``."""
    project, fences = running_runs(db, n, name="blocked-job", **spec)
    for fence in fences:
        outcome = db.transaction(
            lambda tx, f=fence: cancellation.request_cancel(
                tx, project.id, f.run_id, reason="user", actor_type="user", actor_id="someone"
            )
        )
        assert outcome == "requested"
    supervisor = cancellation_supervisor.CancellationSupervisor(
        db, signal=FakeSignal(default=result), owner=LEASE_OWNER, page=64
    )
    supervisor.run_cycle()
    return fences


def _dispatch_rows(db: Any) -> list[dict[str, Any]]:
    return [dict(r) for r in db.raw("SELECT * FROM cancellation_dispatches ORDER BY run_id")]


def test_viewer_cannot_cancel_and_an_operator_cancels_a_queued_run(
    client: Any,
    owner: dict[str, str],
    make_token: Callable[..., dict[str, str]],
    make_task: Callable[..., dict[str, Any]],
    counts: Callable[[], dict[str, int]],
) -> None:
    # Given a queued run (no worker) and a viewer and an operator of the project
    make_task("job")
    run = _start(client, owner)
    viewer, operator = make_token("viewer", name="v"), make_token("operator", name="o")
    before = counts()

    # When the viewer asks to cancel it, then it is refused and nothing is written
    denied = client.post(f"{P}/runs/{run['id']}/cancel", headers=viewer)
    assert denied.status_code == 403
    assert denied.json()["error"]["code"] == "permission_denied"
    assert counts() == before
    # ...though the viewer may read the cancellation state
    assert client.get(f"{P}/runs/{run['id']}/cancellation", headers=viewer).status_code == 200

    # When the operator cancels it
    first = client.post(f"{P}/runs/{run['id']}/cancel", headers=operator)

    # Then a run that never started ends cancelled at once
    assert first.status_code == 200, first.text
    assert first.json()["result"] == "requested"
    assert first.json()["run"]["status"] == "cancelled"
    assert first.json()["run"]["cancel_reason"] == "user"
    after_first = counts()
    assert after_first["run_events"] > before["run_events"]

    # And a second request is already_terminal and writes nothing
    second = client.post(f"{P}/runs/{run['id']}/cancel", headers=operator)
    assert second.status_code == 200
    assert second.json()["result"] == "already_terminal"
    assert second.json()["run"]["status"] == "cancelled"
    assert counts() == after_first
    shown = client.get(f"{P}/runs/{run['id']}", headers=viewer).json()
    assert shown["status"] == "cancelled"


def test_cancel_of_an_unknown_or_foreign_run_is_not_found(
    client: Any,
    owner: dict[str, str],
    make_token: Callable[..., dict[str, str]],
    make_task: Callable[..., dict[str, Any]],
) -> None:
    # Given a run in project default and an operator of another project only
    make_task("job")
    run = _start(client, owner)
    outsider = make_token("operator", project="other", name="x")

    # When they try to cancel or inspect it through their own project, or a made-up run id
    foreign = client.post(f"/api/v1/projects/other/runs/{run['id']}/cancel", headers=outsider)
    made_up = client.post(f"{P}/runs/{new_id()}/cancel", headers=owner)
    garbage = client.get(f"{P}/runs/not-an-id/cancellation", headers=owner)

    # Then each is 404 and the run is untouched
    assert [foreign.status_code, made_up.status_code, garbage.status_code] == [404, 404, 404]
    assert client.get(f"{P}/runs/{run['id']}", headers=owner).json()["status"] == "queued"


def test_an_operator_cancels_a_running_run_and_inspect_says_wait(db: Any, client: Any, owner: Any) -> None:
    # Given a running run (started by a worker)
    _, fences = running_runs(db, 1, name="busy")
    run_id = fences[0].run_id

    # When the owner cancels it
    resp = client.post(f"{P}/runs/{run_id}/cancel", headers=owner)

    # Then the intent is committed, the run keeps running until its process is stopped
    assert resp.status_code == 200
    assert resp.json()["result"] == "requested"
    assert resp.json()["run"]["status"] == "running"
    assert resp.json()["run"]["cancel_requested_at_ms"] is not None
    view = client.get(f"{P}/runs/{run_id}/cancellation", headers=owner).json()
    assert view["operatorAction"] == "wait"
    assert view["cancelReason"] == "user"
    assert view["dispatch"] is None
    again = client.post(f"{P}/runs/{run_id}/cancel", headers=owner).json()
    assert again["result"] == "already_requested"


def test_summary_shape_and_invariants(
    db: Any, client: Any, owner: Any, make_token: Callable[..., dict[str, str]]
) -> None:
    viewer = make_token("viewer", name="v")
    # Given nothing to cancel, the summary is clear
    clear = client.get(f"{P}/cancellation/summary", headers=viewer)
    assert clear.status_code == 200
    body = clear.json()
    assert set(body) == SUMMARY_KEYS
    assert body["assessment"] == "clear" and body["operatorAction"] == "none"
    assert body["dispatches"] == {
        "total": 0,
        "pending": 0,
        "leased": 0,
        "retryWait": 0,
        "dispatched": 0,
        "blocked": 0,
    }

    # Given two blocked cancellations
    _blocked(db, 2, result="pid_mismatch")

    # When the summary is read
    body = client.get(f"{P}/cancellation/summary", headers=viewer).json()

    # Then it needs attention and its counts are consistent
    assert set(body) == SUMMARY_KEYS | {"oldestBlockedAtMs"}
    d, b = body["dispatches"], body["blockingResults"]
    assert body["assessment"] == "attention_required" and body["operatorAction"] == "inspect"
    assert d["blocked"] == 2 and b["pidMismatch"] == 2
    assert d["total"] == d["pending"] + d["leased"] + d["retryWait"] + d["dispatched"] + d["blocked"]
    assert d["blocked"] == sum(b.values())
    assert body["signals"]["due"] <= d["pending"] + d["retryWait"]
    assert body["signals"]["expiredLease"] <= d["leased"]
    assert body["oldestBlockedAtMs"] <= body["observedAtMs"]


def test_blocked_pages_and_a_bad_cursor_is_422_and_writes_nothing(
    db: Any, client: Any, owner: Any, counts: Callable[[], dict[str, int]]
) -> None:
    # Given one blocked cancellation
    fences = _blocked(db, 1)
    page = client.get(f"{P}/cancellation/blocked", headers=owner)
    assert page.status_code == 200
    body = page.json()
    assert [i["runId"] for i in body["items"]] == [fences[0].run_id]
    assert body["truncated"] is False and body["nextCursor"] is None
    before, dispatches = counts(), _dispatch_rows(db)

    # When cursors that were never printed are sent
    future = encode_blocked_cursor(
        BlockedCursor(snapshot_at_ms=2**52, blocked_at_ms=1, run_id=fences[0].run_id)
    )
    bad = ["nope", "v1.", "v1.eyJ4IjoxfQ", "v1." + "A" * 300, future]
    answers = [client.get(f"{P}/cancellation/blocked", params={"cursor": c}, headers=owner) for c in bad]

    # Then each is 422 validation_failed, and nothing was written
    assert [a.status_code for a in answers] == [422] * len(bad)
    assert all(a.json()["error"]["code"] == "validation_failed" for a in answers)
    assert counts() == before
    assert _dispatch_rows(db) == dispatches


def test_rearm_needs_run_stop_and_the_exact_version(
    db: Any, client: Any, owner: Any, make_token: Callable[..., dict[str, str]]
) -> None:
    # Given a blocked cancellation
    run_id = _blocked(db, 1)[0].run_id
    view = client.get(f"{P}/runs/{run_id}/cancellation", headers=owner).json()
    assert view["operatorAction"] == "rearm"
    version, result = view["dispatch"]["version"], view["dispatch"]["lastResult"]
    assert result == "identity_mismatch"
    body = {
        "mutation_id": "m-1",
        "expected_dispatch_version": version,
        "expected_last_result": result,
        "retry_delay_ms": 60_000,
    }
    url = f"{P}/runs/{run_id}/cancellation/rearm"
    before = _dispatch_rows(db)

    # When a viewer rearms it, or the owner with a stale version
    viewer = client.post(url, json=body, headers=make_token("viewer", name="v"))
    stale = client.post(url, json={**body, "expected_dispatch_version": version + 5}, headers=owner)

    # Then both are refused (403, 409) and the dispatch is unchanged
    assert viewer.status_code == 403
    assert stale.status_code == 409
    assert stale.json()["error"]["code"] == "fence_conflict"
    assert _dispatch_rows(db) == before

    # When an operator rearms it with the exact version
    operator = make_token("operator", name="o")
    done = client.post(url, json=body, headers=operator)

    # Then it is rearmed (retry_wait, version + 1), and the same mutation replays the same receipt
    assert done.status_code == 200, done.text
    receipt = done.json()
    assert receipt["status"] == "rearmed"
    assert receipt["previousDispatchVersion"] == version
    assert receipt["dispatchVersion"] == version + 1
    assert receipt["retryDelayMs"] == 60_000
    assert client.post(url, json=body, headers=operator).json() == receipt
    after = client.get(f"{P}/runs/{run_id}/cancellation", headers=owner).json()
    assert after["dispatch"]["status"] == "retry_wait"
    assert after["operatorAction"] == "wait"


@pytest.mark.parametrize(
    "body",
    [
        {"mutation_id": "m", "expected_dispatch_version": 2, "expected_last_result": "identity_mismatch"},
        {
            "mutation_id": "m",
            "expected_dispatch_version": 2,
            "expected_last_result": "identity_mismatch",
            "retry_delay_ms": 10,
        },
        {
            "mutation_id": "m",
            "expected_dispatch_version": 2,
            "expected_last_result": "dispatch_error",
            "retry_delay_ms": 60_000,
        },
        {
            "mutation_id": "m",
            "expected_dispatch_version": "2",
            "expected_last_result": "identity_mismatch",
            "retry_delay_ms": 60_000,
        },
    ],
)
def test_rearm_rejects_invalid_bodies_with_422(
    db: Any, client: Any, owner: Any, body: dict[str, Any]
) -> None:
    run_id = _blocked(db, 1)[0].run_id
    before = _dispatch_rows(db)

    resp = client.post(f"{P}/runs/{run_id}/cancellation/rearm", json=body, headers=owner)

    assert resp.status_code == 422
    assert _dispatch_rows(db) == before


def test_no_cancellation_response_carries_an_owner_token_handle_pid_or_command(
    db: Any, client: Any, owner: Any
) -> None:
    # Given blocked cancellations of runs whose command and env carry a canary
    canary = "CANARY-c4nc3l"
    fences = _blocked(db, 2, command=f"echo {canary}-command", env={"API_KEY": f"{canary}-env"})
    run_id = fences[0].run_id
    rows = db.raw("SELECT lease_token_digest, attempt_id FROM cancellation_dispatches")
    secrets = [canary, LEASE_OWNER, handle_of(0), handle_of(1)]
    secrets += [r["lease_token_digest"] for r in rows if r["lease_token_digest"]]

    # When every cancellation read and write is exercised
    view = client.get(f"{P}/runs/{run_id}/cancellation", headers=owner)
    responses = [
        view,
        client.get(f"{P}/cancellation/summary", headers=owner),
        client.get(f"{P}/cancellation/blocked", headers=owner),
        client.post(
            f"{P}/runs/{run_id}/cancellation/rearm",
            json={
                "mutation_id": "m-2",
                "expected_dispatch_version": view.json()["dispatch"]["version"],
                "expected_last_result": "identity_mismatch",
                "retry_delay_ms": 1_000,
            },
            headers=owner,
        ),
        client.post(f"{P}/runs/{fences[1].run_id}/cancel", headers=owner),
    ]

    # Then none carries the canary, the lease owner, a handle, a pid or a token digest
    assert [r.status_code for r in responses] == [200] * len(responses)
    for resp in responses:
        for secret in secrets:
            assert secret not in resp.text, (resp.request.url, secret)
        assert not _keys(resp.json()) & FORBIDDEN_KEYS, resp.request.url


FORBIDDEN_KEYS = {
    "pid",
    "executor_handle",
    "handle",
    "lease_owner",
    "owner",
    "lease_token_digest",
    "command",
    "env",
}


def _keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()
