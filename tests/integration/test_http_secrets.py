"""Env values never leave the server; commands and working directories only reach the roles that may
see them (docs/console.md), and only in a task's ``command``/``cwd`` fields: never in errors, run
bodies or logs (architecture.md section 7)."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

CANARY = "CANARY-7f3a9e"
TASKS = "/api/v1/projects/default/tasks"


def _planted(n: int) -> dict[str, Any]:
    return {
        "command": f"echo {CANARY}-command-{n}",
        "env": {"API_KEY": f"{CANARY}-env-{n}"},
        "cwd": f"/srv/{CANARY}-cwd-{n}",
    }


def _without_shown_fields(body: Any) -> Any:
    """The body minus a task's ``command`` and ``cwd``, the only places an editor may see them."""
    if isinstance(body, dict):
        return {k: _without_shown_fields(v) for k, v in body.items() if k not in {"command", "cwd"}}
    if isinstance(body, list):
        return [_without_shown_fields(v) for v in body]
    return body


def test_no_response_or_log_line_carries_the_command_env_or_cwd(
    client: Any, owner: Any, make_token: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    responses: list[Any] = []

    def call(method: str, path: str, headers: dict[str, str] | None = None, **kwargs: Any) -> Any:
        resp = client.request(method, path, headers={**owner, **(headers or {})}, **kwargs)
        responses.append(resp)
        return resp

    # Given a task whose command, env value and cwd carry the canary
    task = call("POST", TASKS, json={"name": "secretive", **_planted(1)}).json()
    # When every read, change and error path is exercised
    call("GET", TASKS)
    call("GET", f"{TASKS}/secretive")
    call("GET", f"{TASKS}/{task['id']}")
    call("PATCH", f"{TASKS}/secretive", json=_planted(2))
    call("POST", f"{TASKS}/secretive/disable")
    call("POST", f"{TASKS}/secretive/enable")
    run = call("POST", f"{TASKS}/secretive/runs", json={"idempotency_key": "k"}).json()
    call("POST", f"{TASKS}/secretive/runs", json={"idempotency_key": "k"})
    call("GET", "/api/v1/projects/default/runs")
    call("GET", f"/api/v1/projects/default/runs/{run['id']}")
    call("GET", f"/api/v1/projects/default/runs/{run['id']}/events")
    call("GET", "/api/v1/projects")
    # ...including refusals whose input carries the canary
    call("POST", TASKS, json={"name": "secretive", **_planted(3)})  # name taken
    call("POST", TASKS, json={"name": "bad cron", **_planted(4), "cron": "nope"})
    call("POST", TASKS, json={"name": "huge", **_planted(5), "command": CANARY * 20000})
    call("POST", TASKS, json={"name": "extra", **_planted(6), "shell": CANARY})
    call("POST", TASKS, json={"name": "typed", **_planted(7), "env": {"K": [CANARY]}})
    call("POST", TASKS, json={"name": "typed", **_planted(8), "timeout_ms": CANARY})
    call("POST", TASKS, json={"name": CANARY + "/bad", "command": "true"})
    call("PATCH", f"{TASKS}/secretive", json={"cwd": f"relative/{CANARY}"})
    call("PATCH", f"{TASKS}/secretive", json={CANARY: 1})
    call(
        "POST",
        TASKS,
        content=b'{"command": "' + CANARY.encode() + b'", ',
        headers={"Content-Type": "application/json"},
    )
    call("POST", TASKS, content=b'{"command": "' + CANARY.encode() * 20000 + b'"}')

    # ...and every read again as a viewer
    viewer = make_token("viewer", name="looker")
    for path in (TASKS, f"{TASKS}/secretive", f"{TASKS}/secretive/revisions"):
        call("GET", path, headers=viewer)

    # Then the canary appears in no response (status line, headers, body) and no log record, except an
    # editor's view of the task's own command and cwd fields
    assert [r.status_code for r in responses[:13]] == [201] + [200] * 6 + [201] + [200] * 5
    assert all(r.status_code >= 400 for r in responses[13:-3])
    assert [r.status_code for r in responses[-3:]] == [200] * 3
    for resp in responses:
        shown = resp.json() if resp.status_code < 400 and resp.content else None
        text = json.dumps(_without_shown_fields(shown)) if shown is not None else resp.text
        assert CANARY not in text, resp.request.url
        assert CANARY not in str(resp.headers)
    for resp in responses[-3:]:
        assert CANARY not in resp.text, resp.request.url  # a viewer sees no command at all
    assert CANARY not in caplog.text


def test_an_unknown_task_name_in_the_path_is_not_echoed(client: Any, owner: Any) -> None:
    resp = client.get(f"{TASKS}/{CANARY}", headers=owner)

    assert resp.status_code == 404
    assert CANARY not in resp.text
