"""One bad item never stops a loop, with a real ``ql3 serve``: an approval approved before its requester
was revoked (the state earlier versions allowed) is parked with a reason, while a healthy approval of
another project runs to completion, ``/readyz`` stays 200, and the parked item shows in the API, the
CLI and ``/metrics``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from ql3.application import approvals, auth
from ql3.domain.ids import new_id
from ql3.storage.sqlite.adapter import SqliteDatabase
from tests.support.server import Server, start_server, stop
from tests.support.waits import wait_for

pytestmark = pytest.mark.slow


def _members(serve: Server, project: str) -> tuple[dict[str, str], dict[str, str]]:
    """A task that requires approval in ``project``, its requester's and its approver's environment."""
    serve.cli_json(
        "task", "add", "deploy", "-p", project, "--command", "echo deployed", "--approval", "required"
    )
    requester = serve.cli_json(
        "token", "create", "-p", project, "--role", "operator", "--name", f"req-{project}"
    )
    approver = serve.cli_json(
        "token", "create", "-p", project, "--role", "approver", "--name", f"ok-{project}"
    )
    return {"QL3_TOKEN": requester["token"]}, {"QL3_TOKEN": approver["token"]}


def _approve_then_revoke(home: Path, approval_id: str, project: str, approver: str, requester: str) -> None:
    """With the server stopped: approve the request, then revoke its requester (in that order, the state a
    server before the refusal on decide could reach)."""
    db = SqliteDatabase(str(home / "ql3.db"))
    owner_token = (home / "credentials").read_text()
    try:

        def unit(tx: Any) -> None:
            import json

            owner = auth.authenticate(tx, json.loads(owner_token)["token"])
            decider = auth.authenticate(tx, approver)
            gone = auth.authenticate(tx, requester)
            found = auth.resolve_project(tx, project)
            approvals.decide(
                tx,
                approval_id=approval_id,
                project_id=found.id,
                decider=decider,
                decider_role="approver",
                decision="approve",
                decision_id=new_id(),
                reason_code="looks_good",
            )
            auth.revoke_token(tx, owner, found, gone.id)

        db.transaction(unit)
    finally:
        db.close()


def test_a_revoked_requesters_approval_is_parked_and_another_projects_approval_runs(tmp_path: Path) -> None:
    home = tmp_path / "home"
    serve = start_server(home)
    try:
        # Given two projects, each with an approval-required task
        serve.cli_json("project", "create", "alpha")
        serve.cli_json("project", "create", "beta")
        req_a, ok_a = _members(serve, "alpha")
        req_b, ok_b = _members(serve, "beta")
        poisoned = serve.cli_json("run", "start", "deploy", "-p", "alpha", env=req_a)["approval"]["id"]

        # And, while the server is down, alpha's request approved and then its requester revoked
        stop(serve.process)
        _approve_then_revoke(home, poisoned, "alpha", ok_a["QL3_TOKEN"], req_a["QL3_TOKEN"])
        serve = start_server(home)

        # When beta's request is approved
        healthy = serve.cli_json("run", "start", "deploy", "-p", "beta", env=req_b)["approval"]["id"]
        serve.cli_json("approval", "approve", healthy, "-p", "beta", "--reason", "change_window", env=ok_b)

        # Then beta's run succeeds although alpha's approval is older and cannot be consumed
        def succeeded() -> list[dict[str, Any]] | None:
            items: list[dict[str, Any]] = serve.cli_json("run", "list", "-p", "beta")["items"]
            return items if items and items[0]["status"] == "succeeded" else None

        wait_for(succeeded, 60, what="beta's approved run to succeed")
        assert serve.cli_json("approval", "show", poisoned, "-p", "alpha")["state"] == "approved"

        # And alpha's approval is parked with its reason, in the API, the CLI and /metrics
        parked = serve.cli_json("loops", "parked", "-p", "alpha")["items"]
        assert [(i["loop"], i["item_kind"], i["item_key"], i["reason"]) for i in parked] == [
            ("approved-actions", "approval", poisoned, "requester_not_allowed")
        ]
        assert serve.cli_json("loops", "parked", "-p", "beta")["items"] == []
        everything = serve.cli_json("loops", "parked", "--all")["items"]
        assert [i["item_key"] for i in everything] == [poisoned]
        table = serve.cli("loops", "parked", "-p", "alpha")
        assert table.returncode == 0 and "requester_not_allowed" in table.stdout
        metrics = httpx.get(f"{serve.url}/metrics", timeout=10).text
        assert 'ql3_parked_items{loop="approved-actions",reason="requester_not_allowed"} 1.0' in metrics
        assert poisoned not in metrics

        # And the server is ready: every loop, the approved-actions one included, keeps its health
        ready = httpx.get(f"{serve.url}/readyz", timeout=10)
        assert ready.status_code == 200, ready.text

        # And approving a request of a revoked requester through the API is refused with a stable code
        second = serve.cli_json("run", "start", "deploy", "-p", "beta", env=req_b)["approval"]["id"]
        admin = serve.cli_json("token", "list", "-p", "beta")["items"]
        requester_id = next(t["id"] for t in admin if t["name"] == "req-beta")
        serve.cli_json("token", "revoke", requester_id, "-p", "beta")
        refused = serve.cli("approval", "approve", second, "-p", "beta", "--reason", "x", "--json", env=ok_b)
        assert refused.returncode == 1 and "requester_not_allowed" in refused.stderr
        assert serve.cli_json("approval", "show", second, "-p", "beta")["state"] == "pending"
    finally:
        stop(serve.process)
