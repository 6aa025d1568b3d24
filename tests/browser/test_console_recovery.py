"""What a person recovers from the console, in headless Chromium against real ``ql3 serve`` processes:
a cancellation blocked by an unprovable process identity is rearmed (exact compare-and-set on the
dispatch version and result), and an approved action whose outcome a crash left unproven
(``recovery_required``) is resolved. Each test makes its own server, since each breaks it on purpose.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from ql3.execution.identity import ProcessHandle
from ql3.storage.sqlite.adapter import SqliteDatabase
from tests.support import server as serving
from tests.support.console import START_TIMEOUT_S, Console, sign_in
from tests.support.server import Server, start_with_env, stop
from tests.support.waits import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("browser")]

LEASE = {"QL3_ACTION_LEASE_MS": "3000"}


@pytest.fixture
def start(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    """``start(env)``: a ``ql3 serve`` on ``tmp_path/home`` (the same home each call), stopped at the end."""
    monkeypatch.setattr(serving, "START_TIMEOUT_S", max(START_TIMEOUT_S, serving.START_TIMEOUT_S))
    servers: list[Server] = []

    def make(env: dict[str, str]) -> Server:
        server = start_with_env(tmp_path / "home", env)
        servers.append(server)
        return server

    yield make
    for server in servers:
        if server.process.poll() is None:
            stop(server.process)


def _console(server: Server, **tokens: str) -> Console:
    made = Console(server=server, owner=server.credentials()["token"], approver="", viewer="")
    for role, name in tokens.items():
        resp = made.api("POST", "/tokens", json={"role": role, "name": name})
        assert resp.status_code == 201, resp.text
        setattr(made, role, resp.json()["token"])
    return made


def _attempt_handle(home: Path, run_id: str) -> tuple[str, str]:
    db = SqliteDatabase(home / "ql3.db")
    try:
        row = db.raw(
            "SELECT id, executor_handle FROM run_attempts WHERE run_id = ? ORDER BY attempt DESC", (run_id,)
        )[0]
        return str(row["id"]), str(row["executor_handle"])
    finally:
        db.close()


def _set_handle(home: Path, attempt_id: str, handle: str) -> None:
    db = SqliteDatabase(home / "ql3.db")
    try:
        db.raw("UPDATE run_attempts SET executor_handle = ? WHERE id = ?", (handle, attempt_id))
    finally:
        db.close()


def _cancellation(console: Console, run_id: str) -> dict[str, Any]:
    resp = console.api("GET", f"/runs/{run_id}/cancellation")
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


def _blocked(console: Console, run_id: str, past_version: int = 0) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        view = _cancellation(console, run_id)
        d = view["dispatch"]
        ok = view["operatorAction"] == "rearm" and d["version"] > past_version
        return view if ok else None

    found: dict[str, Any] = wait_for(check, 60)
    return found


def test_rearm_a_blocked_cancellation_in_the_ui(start: Any, open_page: Any) -> None:
    # Given a running command whose stored process identity no longer matches the live process
    server = start({})
    console = _console(server, viewer="vic")
    assert console.api("POST", "/tasks", json={"name": "victim", "command": "sleep 120"}).status_code == 201
    run = console.api("POST", "/tasks/victim/runs", json={}).json()
    wait_for(lambda: console.api("GET", f"/runs/{run['id']}").json()["status"] == "running", 60)
    attempt_id, real = _attempt_handle(server.home, run["id"])
    handle = ProcessHandle.decode(real)
    forged = ProcessHandle(
        attempt_id=handle.attempt_id,
        boot_id=handle.boot_id,
        pid=handle.pid,
        pgid=handle.pgid,
        start_ticks=str(int(handle.start_ticks) + 100_000),
    )
    _set_handle(server.home, attempt_id, forged.encode())
    try:
        # When it is cancelled: no signal can be proven to reach it, the cancellation is blocked
        assert console.api("POST", f"/runs/{run['id']}/cancel").status_code == 200
        blocked = _blocked(console, run["id"])
        assert blocked["dispatch"]["lastResult"] == "identity_mismatch"

        # Then a viewer, on a phone, sees why, but is not offered Rearm
        viewer = open_page(width=390, height=844, is_mobile=True, has_touch=True)
        sign_in(viewer, console, console.viewer, f"#/runs/{run['id']}")
        card = viewer.locator("#run-cancellation")
        expect(card.locator("[data-result=identity_mismatch]")).to_be_visible()
        assert card.locator("[data-action=rearm]").count() == 0
        assert viewer.evaluate("document.documentElement.scrollWidth") <= 390
        viewer.goto(f"{console.url}/#/cancellations")
        expect(viewer.locator(f"tr[data-id='{run['id']}'] [data-result=identity_mismatch]")).to_be_visible()
        assert viewer.locator("[data-action=rearm]").count() == 0
        assert viewer.evaluate("document.documentElement.scrollWidth") <= 390

        # The owner finds it from the overview's health card, on the blocked list
        page = open_page()
        sign_in(page, console, console.owner)
        page.click("#ov-health ~ p a[href='#/cancellations']")
        row = page.locator(f"tr[data-id='{run['id']}']")
        expect(row.locator("[data-result=identity_mismatch]")).to_be_visible()
        expect(row.locator("[data-fact=version]")).to_have_text(str(blocked["dispatch"]["version"]))
        expect(row.locator("[data-fact=attempts]")).to_have_text(str(blocked["dispatch"]["dispatchCount"]))

        # A Rearm confirmed after the dispatch moved on is refused (409): exact version and result
        row.locator("[data-action=rearm]").click()
        expect(page.locator("#confirm-text")).to_contain_text(f"version {blocked['dispatch']['version']}")
        moved = console.api(
            "POST",
            f"/runs/{run['id']}/cancellation/rearm",
            json={
                "mutation_id": "test.moved-on",
                "expected_dispatch_version": blocked["dispatch"]["version"],
                "expected_last_result": "identity_mismatch",
                "retry_delay_ms": 1000,
            },
        )
        assert moved.status_code == 200, moved.text
        again = _blocked(console, run["id"], past_version=moved.json()["dispatchVersion"])
        open_page.allow(409, f"/api/v1/projects/default/runs/{run['id']}/cancellation/rearm")
        with page.expect_response(f"**/runs/{run['id']}/cancellation/rearm") as refused:
            page.click("#confirm-yes")
        assert refused.value.status == 409
        expect(page.locator("#status.error")).to_contain_text("version_mismatch")
        assert _cancellation(console, run["id"])["dispatch"]["version"] == again["dispatch"]["version"]

        # The cause is found and fixed: the stored identity is the process's again
        _set_handle(server.home, attempt_id, real)

        # On the run's page: the card shows the reason, attempts and the version; declining changes nothing
        page.goto(f"{console.url}/#/runs/{run['id']}")
        card = page.locator("#run-cancellation")
        expect(card.locator("[data-fact=attempts]")).to_have_text(str(again["dispatch"]["dispatchCount"]))
        expect(card.locator("[data-fact=version]")).to_have_text(str(again["dispatch"]["version"]))
        assert again["dispatch"]["dispatchCount"] == blocked["dispatch"]["dispatchCount"] + 1
        expect(card.locator("[data-result=identity_mismatch]")).to_be_visible()
        page.fill("#rearm-delay", "1")
        page.click("#rearm")
        page.click("#confirm-no")
        assert _cancellation(console, run["id"])["dispatch"]["version"] == again["dispatch"]["version"]

        # When it is rearmed, the next try proves the identity and the run ends cancelled
        page.click("#rearm")
        expect(page.locator("#confirm-text")).to_contain_text(f"version {again['dispatch']['version']}")
        page.click("#confirm-yes")
        expect(page.locator("#status")).to_contain_text("rearmed")
        page.wait_for_selector("main h1 .badge-cancelled", timeout=60_000)
        final = _cancellation(console, run["id"])
        assert final["dispatch"]["status"] == "dispatched"
        assert final["dispatch"]["lastResult"] in {"termination_requested", "already_exited"}
        expect(page.locator("#run-events li[data-type='run.cancel_dispatch_rearmed']")).to_have_count(2)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(handle.pgid, signal.SIGKILL)


def test_resolve_a_recovery_required_action_in_the_ui_at_390_px(
    start: Any, open_page: Any, tmp_path: Path
) -> None:
    # Given a server that dies between an approved action's durable start barrier and its execution
    marker = tmp_path / "ran.txt"
    server = start({**LEASE, "QL3_FAULT": "after_start_barrier"})
    console = _console(server, approver="ada", operator="oscar")
    spec = {"name": "guarded", "command": f"echo ran >> {marker}", "approval": "required"}
    assert console.api("POST", "/tasks", json=spec).status_code == 201
    requested = console.api("POST", "/tasks/guarded/runs", token=console.operator, json={})
    assert requested.status_code == 202, requested.text
    with contextlib.suppress(httpx.HTTPError):  # the crash may beat the answer; the decision is committed
        console.api(
            "POST",
            f"/approvals/{requested.json()['approval']['id']}/approve",
            token=console.approver,
            json={"reason_code": "approved"},
        )
    assert server.process.wait(timeout=30) == 137

    # When it restarts and the lease has expired, the action waits for a person; nothing ran
    restarted = start(LEASE)
    console = Console(server=restarted, owner=console.owner, approver=console.approver, viewer="")
    operator = console.api("POST", "/tokens", json={"role": "operator", "name": "otto"}).json()["token"]

    def stuck() -> dict[str, Any] | None:
        items = console.api("GET", "/actions").json()["items"]
        return items[0] if items and items[0]["effective_status"] == "recovery_required" else None

    action: dict[str, Any] = wait_for(stuck, 60)
    assert console.api("GET", "/runs").json()["items"] == [] and not marker.exists()

    # An operator (no approval.recover) sees it but is not offered Resolve
    other = open_page(width=390, height=844, is_mobile=True, has_touch=True)
    sign_in(other, console, operator, f"#/actions/{action['dispatch_id']}")
    other.wait_for_selector("main h1 .badge-recovery_required")
    assert other.locator("#resolve-form").count() == 0
    assert "Only approvers and admins" in other.inner_text("main")

    # The approver, on a phone: the overview says a person is needed and leads to the action
    page = open_page(width=390, height=844, is_mobile=True, has_touch=True)
    sign_in(page, console, console.approver)
    page.wait_for_selector("#ov-actions")
    page.click("#ov-actions a")
    row = page.locator(f"tr[data-id='{action['dispatch_id']}']")
    expect(row.locator(".badge-recovery_required")).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= 390, "the action list overflows"
    row.locator(f"a[href='#/actions/{action['dispatch_id']}']").click()
    page.wait_for_selector("#resolve-form")
    page.wait_for_load_state("networkidle")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390, "the action page overflows"
    button = page.locator("#resolve").bounding_box()
    assert button is not None and button["x"] + button["width"] <= 390

    # Declining the confirmation changes nothing
    page.check("#resolve-form input[value=failed]")
    page.click("#resolve")
    expect(page.locator("#confirm-text")).to_contain_text("failed")
    page.click("#confirm-no")
    assert console.api("GET", f"/actions/{action['dispatch_id']}").json()["effective_status"] == (
        "recovery_required"
    )

    # When the approver states that it failed, the action is closed at exactly the version shown
    page.fill("#resolve-form input[name=reason_code]", "handler_never_ran")
    page.click("#resolve")
    with page.expect_response(f"**/actions/{action['dispatch_id']}/resolve") as answer:
        page.click("#confirm-yes")
    assert answer.value.status == 200
    sent = answer.value.request.post_data_json
    assert (sent["outcome"], sent["expected_version"], sent["reason_code"]) == (
        "failed",
        action["version"],
        "handler_never_ran",
    )
    page.wait_for_selector("main h1 .badge-failed")
    assert page.locator("#resolve-form").count() == 0
    stored = console.api("GET", f"/actions/{action['dispatch_id']}").json()
    assert stored["status"] == "failed" and stored["version"] > action["version"]
    # and there is no retry: nothing ran, no run exists
    assert console.api("GET", "/runs").json()["items"] == [] and not marker.exists()
