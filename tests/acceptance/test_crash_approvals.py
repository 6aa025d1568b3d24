"""Approved actions with real processes: a crash after the start barrier is never replayed; the
run.create action is resolved from its receipt, anything without evidence waits for a person."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.server import Server, start_with_env, stop
from tests.support.waits import wait_for

pytestmark = pytest.mark.slow
LEASE = {"QL3_ACTION_LEASE_MS": "3000"}


def _approved_action(server: Server, marker: Path) -> tuple[str, dict[str, str]]:
    """An approval-protected task requested by an operator and approved by a second user (neither
    issued the other's token: docs/security.md "Separation of duty")."""
    assert (
        server.cli(
            "task", "add", "guarded", "--command", f"echo ran >> {marker}", "--approval", "required"
        ).returncode
        == 0
    )
    operator = server.cli_json("token", "create", "--role", "operator", "--name", "otto")["token"]
    requested = server.cli_json("run", "start", "guarded", env={"QL3_TOKEN": operator, "QL3_URL": server.url})
    approval_id = requested["approval"]["id"]
    token = server.cli_json("token", "create", "--role", "approver", "--name", "alice")["token"]
    approver = {"QL3_TOKEN": token, "QL3_URL": server.url}
    # The injected crash may beat the answer to this very request: the decision is committed first.
    server.cli("approval", "approve", approval_id, "--reason", "change_window", env=approver)
    return approval_id, approver


def _actions(server: Server) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = server.cli_json("action", "list")["items"]
    return items


def _runs(server: Server) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = server.cli_json("run", "list")["items"]
    return items


def test_a_crash_after_execute_is_resolved_from_the_receipt_with_exactly_one_run(tmp_path: Path) -> None:
    # Given a server that dies after the approved run.create executed, before its completion write
    home = tmp_path / "home"
    marker = tmp_path / "ran.txt"
    server = start_with_env(home, {**LEASE, "QL3_FAULT": "after_execute"})
    approval_id, _ = _approved_action(server, marker)
    assert server.process.wait(timeout=30) == 137

    # When it restarts: the executing action's lease expires and it is recovery_required
    restarted = start_with_env(home, LEASE)
    try:
        assert restarted.cli_json("approval", "list")["items"][0]["state"] == "consumed"
        # Then the resolver finds the receipt and closes it as succeeded, never executing again
        action = wait_for(lambda: (a := _actions(restarted)) and a[0]["status"] == "succeeded" and a[0], 60)
        assert action["effective_status"] == "succeeded"
        runs = _runs(restarted)
        assert len(runs) == 1 and runs[0]["trigger_type"] == "approved_action"
        created = restarted.cli_json("run", "events", runs[0]["id"])["items"][0]
        assert created["type"] == "run.created" and created["payload"]["approval_request_id"] == approval_id
        wait_for(lambda: _runs(restarted)[0]["status"] == "succeeded", 30)
        assert marker.read_text().splitlines() == ["ran"]
    finally:
        stop(restarted.process)


def test_a_crash_right_after_the_start_barrier_waits_for_a_person(tmp_path: Path) -> None:
    # Given a server that dies between the durable start barrier and execute
    home = tmp_path / "home"
    marker = tmp_path / "ran.txt"
    server = start_with_env(home, {**LEASE, "QL3_FAULT": "after_start_barrier"})
    _approval_id, approver = _approved_action(server, marker)
    assert server.process.wait(timeout=30) == 137

    restarted = start_with_env(home, LEASE)
    try:
        # When the lease has expired: the action is recovery_required and nothing ran or will run
        action = wait_for(
            lambda: (a := _actions(restarted)) and a[0]["effective_status"] == "recovery_required" and a[0],
            60,
        )
        assert _runs(restarted) == [] and not marker.exists()

        # Then a person resolves it; there is no retry
        done = restarted.cli(
            "action",
            "resolve",
            action["dispatch_id"],
            "--outcome",
            "failed",
            "--version",
            str(action["version"]),
            "--json",
            env={**approver, "QL3_URL": restarted.url},
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["status"] == "failed"
        assert _actions(restarted)[0]["status"] == "failed"
        assert _runs(restarted) == [] and not marker.exists()
    finally:
        stop(restarted.process)
