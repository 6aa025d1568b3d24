"""An approval-required task through the CLI against a real ``ql3 serve``: the start makes a request,
another user approves it, and only then the run exists and runs."""

from __future__ import annotations

import json

import pytest

from tests.support.server import Server
from tests.support.waits import wait_for

pytestmark = pytest.mark.slow


def test_an_approved_request_becomes_a_run_that_succeeds(serve: Server) -> None:
    # Given an approval-required task, an operator who asks and a second user with the approver role
    # (the owner issued both tokens; neither issued the other's: docs/security.md "Separation of duty")
    serve.cli_json("task", "add", "deploy", "--command", "echo deployed", "--approval", "required")
    issued = serve.cli_json("token", "create", "--role", "approver", "--name", "alice")
    approver = {"QL3_TOKEN": issued["token"]}
    requester = {
        "QL3_TOKEN": serve.cli_json("token", "create", "--role", "operator", "--name", "otto")["token"]
    }

    # When the operator starts it
    started = serve.cli("run", "start", "deploy", "--wait", env=requester)

    # Then it prints an approval id and exits 0; no run exists yet
    assert started.returncode == 0, started.stderr
    assert started.stdout.startswith("approval ")
    approval_id = started.stdout.split()[1]
    assert serve.cli_json("run", "list")["items"] == []
    shown = serve.cli_json("approval", "show", approval_id)
    assert shown["state"] == "pending"
    as_json = serve.cli_json("run", "start", "deploy", env=requester)
    assert as_json["approval"]["state"] == "pending" and as_json["approval"]["id"] != approval_id

    # When the requester tries to approve its own request, it fails (exit 1) and stays pending
    own = serve.cli("approval", "approve", approval_id, env=requester)
    assert own.returncode == 1
    assert "permission_denied" in own.stderr  # an operator holds no approval.decide
    assert serve.cli_json("approval", "show", approval_id)["state"] == "pending"

    # When the approver approves it
    approved = serve.cli_json("approval", "approve", approval_id, "--reason", "change_window", env=approver)
    assert approved["state"] == "approved"

    # Then the run appears and succeeds
    def succeeded() -> list[dict[str, object]] | None:
        items: list[dict[str, object]] = serve.cli_json("run", "list")["items"]
        return items if items and items[0]["status"] == "succeeded" else None

    items = wait_for(succeeded, 30, what="the approved run to succeed")
    assert [r["status"] for r in items] == ["succeeded"]
    assert items[0]["trigger_type"] == "approved_action"
    assert serve.cli_json("approval", "show", approval_id)["state"] == "consumed"
    actions = serve.cli_json("action", "list")["items"]
    assert [a["approval_request_id"] for a in actions] == [approval_id]

    # And the approver may not start runs; a rejection needs a reason (usage 64 without one)
    assert serve.cli("run", "start", "deploy", env=approver).returncode == 1
    pending_id = as_json["approval"]["id"]
    assert serve.cli("approval", "reject", pending_id, env=approver).returncode == 64
    rejected = serve.cli("approval", "reject", pending_id, "--reason", "not_now", "--json", env=approver)
    assert rejected.returncode == 0, rejected.stderr
    assert json.loads(rejected.stdout)["state"] == "rejected"
    assert [a["id"] for a in serve.cli_json("approval", "list", "--state", "rejected")["items"]] == [
        pending_id
    ]
