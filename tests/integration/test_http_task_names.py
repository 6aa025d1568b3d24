"""Task names in any script over HTTP (docs/tasks.md "Names"): created, found by name, run; a name
breaking the rule gets 422 with the rule, and nothing is written."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from ql3.domain.tasks import TASK_NAME_RULE

TASKS = "/api/v1/projects/default/tasks"


def test_a_chinese_name_is_created_found_and_run(client: Any, owner: Any) -> None:
    name = "京东 签到"

    created = client.post(TASKS, json={"name": name, "command": "true"}, headers=owner)
    shown = client.get(f"{TASKS}/{quote(name)}", headers=owner)
    run = client.post(f"{TASKS}/{quote(name)}/runs", json={}, headers=owner)
    listed = client.get(TASKS, headers=owner).json()["items"]

    assert created.status_code == 201, created.text
    assert shown.status_code == 200 and shown.json()["name"] == name
    assert run.status_code == 201, run.text
    assert [t["name"] for t in listed] == [name]


def test_a_name_breaking_the_rule_gets_422_with_the_rule(client: Any, owner: Any, counts: Any) -> None:
    before = counts()

    answers = [
        client.post(TASKS, json={"name": bad, "command": "true"}, headers=owner)
        for bad in ("a/b", "-x", "bell\u0007", " lead", "x" * 129)
    ]

    for resp in answers:
        assert resp.status_code == 422, resp.text
        error = resp.json()["error"]
        assert (error["code"], error["details"]["field"]) == ("validation_failed", "name")
        assert error["message"] == f"invalid name: {TASK_NAME_RULE}"
    assert counts() == before
