"""Every class of bad input is refused with a stable code and writes nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

TASKS = "/api/v1/projects/default/tasks"


@pytest.fixture
def before(make_task: Callable[..., dict[str, Any]], counts: Callable[[], dict[str, int]]) -> dict[str, int]:
    """A project with one task; the row counts every rejected request must leave untouched."""
    make_task("existing")
    return counts()


def _error_code(resp: Any) -> str:
    body = resp.json()
    assert set(body) == {"error"}
    return str(body["error"]["code"])


@pytest.mark.parametrize(
    "name", ["", "-starts-with-dash", " leading space", "a/b", "x" * 129, "bell\u0007", "..", "a\nb"]
)
def test_invalid_task_name_is_refused(client: Any, owner: Any, before: Any, counts: Any, name: str) -> None:
    resp = client.post(TASKS, json={"name": name, "command": "true"}, headers=owner)

    assert resp.status_code == 422
    assert _error_code(resp) == "validation_failed"
    assert counts() == before


@pytest.mark.parametrize("name", ["bad name", "-x", "x" * 129])
def test_invalid_project_name_is_refused(
    client: Any, owner: Any, before: Any, counts: Any, name: str
) -> None:
    resp = client.post("/api/v1/projects", json={"name": name}, headers=owner)

    assert resp.status_code == 422
    assert _error_code(resp) == "validation_failed"
    assert counts() == before


@pytest.mark.parametrize(
    "run_ref", ["not-an-id", "01a22d6c-0942-71ad-b0a5-4738104dd59", "00000000-0000-7000-8000-000000000000"]
)
def test_invalid_or_unknown_run_id_is_not_found(
    client: Any, owner: Any, before: Any, counts: Any, run_ref: str
) -> None:
    resp = client.get(f"/api/v1/projects/default/runs/{run_ref}", headers=owner)

    assert resp.status_code == 404
    assert _error_code(resp) == "not_found"
    assert counts() == before


@pytest.mark.parametrize("task_ref", ["no-such-task", "01a22d6c-0942-71ad-b0a5-4738104dd590", "x" * 300])
def test_starting_a_run_of_an_unknown_task_writes_nothing(
    client: Any, owner: Any, before: Any, counts: Any, task_ref: str
) -> None:
    resp = client.post(f"{TASKS}/{task_ref}/runs", json={}, headers=owner)

    assert resp.status_code == 404
    assert _error_code(resp) == "not_found"
    assert counts() == before


@pytest.mark.parametrize(
    ("cron", "why"),
    [
        ("not a cron", "has 5 fields"),
        ("* * * *", "this one has 4"),
        ("61 * * * *", "field 1 (minute) is wrong: Bad minute"),
        ("* 24 * * *", "field 2 (hour) is wrong"),
        ("* * * 13 *", "within 1-12"),
        ("* * 31 2 *", "never match a date"),
        ("@daily", "e.g. '0 0 * * *' for @daily"),
        ("* * * * * *", "fires 1 s apart"),
        ("0 0 0 1 1 * 2030", "years are not supported"),
        ("", "is empty"),
    ],
)
def test_invalid_cron_is_refused_saying_which_field_and_why(
    client: Any, owner: Any, before: Any, counts: Any, cron: str, why: str
) -> None:
    resp = client.post(TASKS, json={"name": "cronjob", "command": "true", "cron": cron}, headers=owner)

    assert resp.status_code == 422
    error = resp.json()["error"]
    assert (error["code"], error["details"]) == ("validation_failed", {"field": "cron"})
    assert error["message"].startswith("invalid cron expression: ") and why in error["message"]
    assert counts() == before


def test_invalid_cron_in_an_edit_publishes_no_revision(
    client: Any, owner: Any, before: Any, counts: Any
) -> None:
    resp = client.patch(f"{TASKS}/existing", json={"cron": "99 * * * *"}, headers=owner)

    assert resp.status_code == 422
    assert counts() == before
    assert client.get(f"{TASKS}/existing", headers=owner).json()["revision"] == 1


def test_command_over_128_kib_is_refused(client: Any, owner: Any, before: Any, counts: Any) -> None:
    # Given a body under the 256 KiB request cap whose command is over the 128 KiB command cap
    command = "x" * (128 * 1024 + 1)

    resp = client.post(TASKS, json={"name": "huge", "command": command}, headers=owner)

    assert resp.status_code == 422
    assert resp.json()["error"]["details"] == {"field": "command"}
    assert counts() == before


def test_body_over_256_kib_is_refused_from_content_length(
    client: Any, owner: Any, before: Any, counts: Any
) -> None:
    body = b'{"name": "big", "command": "' + b"x" * (256 * 1024) + b'"}'

    resp = client.post(TASKS, content=body, headers={**owner, "Content-Type": "application/json"})

    assert resp.status_code == 413
    assert _error_code(resp) == "payload_too_large"
    assert counts() == before


def test_streamed_body_over_256_kib_is_refused_without_content_length(
    client: Any, owner: Any, before: Any, counts: Any
) -> None:
    # Given a chunked body (no Content-Length) that only reveals its size while streaming
    def chunks() -> Any:
        yield b'{"name": "big", "command": "'
        for _ in range(40):
            yield b"x" * 8192
        yield b'"}'

    resp = client.post(TASKS, content=chunks(), headers={**owner, "Content-Type": "application/json"})

    assert resp.status_code == 413
    assert _error_code(resp) == "payload_too_large"
    assert counts() == before


def test_body_just_under_the_cap_is_parsed(client: Any, owner: Any, before: Any) -> None:
    # Given a body under 256 KiB that the size guard must let through to validation
    body = {"name": "under", "command": "true", "env": {"PAD": "y" * (60 * 1024)}}

    resp = client.post(TASKS, json=body, headers=owner)

    assert resp.status_code == 201


@pytest.mark.parametrize(
    ("url", "body"),
    [
        (TASKS, {"name": "x1", "command": "true", "shell": "/bin/zsh"}),
        (TASKS, {"name": "x1", "command": "true", "prefer": [{"labels": {"a": "b"}, "extra": 1}]}),
        (f"{TASKS}/existing", {"nickname": "y"}),
        (f"{TASKS}/existing/runs", {"idempotency_key": "k", "force": True}),
        ("/api/v1/projects", {"name": "p2", "owner": "me"}),
        ("/api/v1/projects/default/tokens", {"role": "viewer", "scopes": ["all"]}),
    ],
)
def test_unknown_json_fields_are_refused(
    client: Any, owner: Any, before: Any, counts: Any, url: str, body: dict[str, Any]
) -> None:
    method = client.patch if url.endswith("/existing") else client.post

    resp = method(url, json=body, headers=owner)

    assert resp.status_code == 422
    assert _error_code(resp) == "validation_failed"
    assert counts() == before


@pytest.mark.parametrize(
    "fields",
    [
        {"command": 42},
        {"command": ["echo", "hi"]},
        {"command": "true", "timeout_ms": "1000"},
        {"command": "true", "timeout_ms": 1.5},
        {"command": "true", "max_attempts": True},
        {"command": "true", "env": {"A": 1}},
        {"command": "true", "env": ["A=1"]},
        {"command": "true", "overlap": "sometimes"},
        {"command": "true", "enabled": "yes"},
        {"command": "true", "max_attempts": 0},
        {"command": "true", "timeout_ms": -5},
        {"command": "true", "cwd": "relative/dir"},
    ],
)
def test_wrong_types_and_values_are_refused(
    client: Any, owner: Any, before: Any, counts: Any, fields: dict[str, Any]
) -> None:
    resp = client.post(TASKS, json={"name": "typed", **fields}, headers=owner)

    assert resp.status_code == 422
    assert _error_code(resp) == "validation_failed"
    assert counts() == before


@pytest.mark.parametrize(
    "body", [{"priority": "high"}, {"priority": 2**40}, {"idempotency_key": ""}, {"idempotency_key": 7}]
)
def test_bad_run_request_writes_no_run(
    client: Any, owner: Any, before: Any, counts: Any, body: dict[str, Any]
) -> None:
    resp = client.post(f"{TASKS}/existing/runs", json=body, headers=owner)

    assert resp.status_code == 422
    assert counts() == before


def test_malformed_json_is_refused(client: Any, owner: Any, before: Any, counts: Any) -> None:
    resp = client.post(
        TASKS, content=b'{"name": "x", "command": ', headers={**owner, "Content-Type": "application/json"}
    )

    assert resp.status_code == 400
    assert _error_code(resp) == "malformed_json"
    assert counts() == before


@pytest.mark.parametrize("query", ["limit=0", "limit=101", "limit=ten", "cursor=%%%", "cursor=bm90LWpzb24"])
def test_bad_run_page_parameters_are_refused(client: Any, owner: Any, before: Any, query: str) -> None:
    resp = client.get(f"/api/v1/projects/default/runs?{query}", headers=owner)

    assert resp.status_code == 422
    assert _error_code(resp) == "validation_failed"


def test_an_invalid_role_for_a_token_is_refused(client: Any, owner: Any, before: Any, counts: Any) -> None:
    resp = client.post("/api/v1/projects/default/tokens", json={"role": "root"}, headers=owner)

    assert resp.status_code == 422
    assert counts() == before


def test_duplicate_task_name_is_a_conflict(client: Any, owner: Any, before: Any, counts: Any) -> None:
    resp = client.post(TASKS, json={"name": "existing", "command": "true"}, headers=owner)

    assert resp.status_code == 409
    assert _error_code(resp) == "name_taken"
    assert counts() == before
