"""Retry safety over HTTP and the CLI: retries need an explicit ``retry_safe``, else nothing is written."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

TASKS = "/api/v1/projects/default/tasks"
Cli = Callable[..., tuple[int, str, str]]


def test_a_task_with_retries_but_no_retry_safe_is_refused_with_a_stable_code(
    client: Any, owner: Any, counts: Any
) -> None:
    before = counts()

    resp = client.post(TASKS, json={"name": "job", "command": "true", "max_attempts": 3}, headers=owner)

    assert resp.status_code == 422
    assert resp.json()["error"]["code"] == "retry_safety_required"
    assert counts() == before


def test_an_edit_to_retries_without_retry_safe_is_refused_and_the_revision_stays(
    client: Any, owner: Any, make_task: Any, counts: Any
) -> None:
    make_task("job")
    before = counts()

    refused = client.patch(f"{TASKS}/job", json={"max_attempts": 2}, headers=owner)
    accepted = client.patch(f"{TASKS}/job", json={"max_attempts": 2, "retry_safe": True}, headers=owner)

    assert (refused.status_code, refused.json()["error"]["code"]) == (422, "retry_safety_required")
    assert accepted.status_code == 200
    assert (accepted.json()["revision"], accepted.json()["retry_safe"]) == (2, True)
    assert counts()["task_revisions"] == before["task_revisions"] + 1


def test_retry_safe_must_be_a_boolean(client: Any, owner: Any, counts: Any) -> None:
    before = counts()

    resp = client.post(TASKS, json={"name": "job", "command": "true", "retry_safe": "yes"}, headers=owner)

    assert resp.status_code == 422 and counts() == before


def test_the_cli_refuses_retries_without_retry_safe_before_any_request(cli_main: Cli) -> None:
    code, _, err = cli_main("task", "add", "job", "--command", "true", "--max-attempts", "3")

    assert code == 64 and "--retry-safe" in err
    assert cli_main.requests == []  # type: ignore[attr-defined]


def test_the_cli_declares_retry_safety_on_add_and_edit(cli_main: Cli) -> None:
    code, out, _ = cli_main(
        "task", "add", "job", "--command", "true", "--max-attempts", "3", "--retry-safe", "--json"
    )
    assert code == 0
    assert (json.loads(out)["max_attempts"], json.loads(out)["retry_safe"]) == (3, True)

    # The server refuses an edit that would leave retries undeclared (exit 64, no new revision)
    code, _, err = cli_main("task", "edit", "job", "--no-retry-safe")
    assert code == 64 and "retry_safety_required" in err
    code, out, _ = cli_main("task", "edit", "job", "--no-retry-safe", "--max-attempts", "1", "--json")
    assert code == 0
    assert (json.loads(out)["revision"], json.loads(out)["retry_safe"]) == (2, False)
