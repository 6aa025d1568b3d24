"""Checks the schemathesis run adds to its built-in ones (tests/integration/test_openapi_schemathesis.py,
loaded through ``SCHEMATHESIS_HOOKS``), on every operation the live document describes:

- ``duplicate_keys_refused``: every write whose generated body is a JSON object is sent again with
  its first key named twice, and must be refused with 422 ``duplicate_key`` (docs/security.md "HTTP
  edge");
- ``idempotency_keys_are_honest``: a run start that created a run is sent again under a reserved
  ``ql3:`` key (422 ``reserved_idempotency_key``), and under a fresh key with the same body and then
  another priority (the same run, then 409 ``idempotency_conflict``).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import httpx
import schemathesis

WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
RUN_START = re.compile(r"^/api/v1/projects/[^/]+/tasks/[^/]+/runs$")


def _send(response: Any, body: bytes) -> httpx.Response:
    """The request that got ``response`` again (same method, URL and credential) with ``body``."""
    sent = response.request
    headers = {"Content-Type": "application/json"}
    if sent.headers.get("Authorization"):
        headers["Authorization"] = sent.headers["Authorization"]
    return httpx.request(str(sent.method), str(sent.url), content=body, headers=headers, timeout=20)


def _code(reply: httpx.Response) -> str:
    try:
        return str(reply.json().get("error", {}).get("code", ""))
    except ValueError:
        return ""


@schemathesis.check
def duplicate_keys_refused(ctx: Any, response: Any, case: Any) -> bool | None:
    if case.method.upper() not in WRITES or not isinstance(case.body, dict) or not case.body:
        return None
    key = next(iter(case.body))
    whole = json.dumps(case.body)
    twice = "{" + json.dumps(key) + ":" + json.dumps(case.body[key]) + "," + whole[1:]
    reply = _send(response, twice.encode())
    if reply.status_code != 422 or _code(reply) != "duplicate_key":
        raise AssertionError(
            f"a body naming {key!r} twice answered {reply.status_code} {_code(reply)!r},"
            " not 422 duplicate_key"
        )
    return None


@schemathesis.check
def idempotency_keys_are_honest(ctx: Any, response: Any, case: Any) -> bool | None:
    path = httpx.URL(str(response.request.url)).path
    if case.method.upper() != "POST" or response.status_code != 201 or not RUN_START.match(path):
        return None
    body = dict(case.body) if isinstance(case.body, dict) else {}
    reserved = _send(response, json.dumps({**body, "idempotency_key": "ql3:cron:v2:x:1"}).encode())
    if reserved.status_code != 422 or _code(reserved) != "reserved_idempotency_key":
        raise AssertionError(f"a ql3: key answered {reserved.status_code} {_code(reserved)!r}")
    keyed = {**body, "idempotency_key": f"schemathesis-{uuid.uuid4().hex}"}
    first = _send(response, json.dumps(keyed).encode())
    again = _send(response, json.dumps(keyed).encode())
    if first.status_code != 201 or again.status_code != 200 or again.json()["id"] != first.json()["id"]:
        raise AssertionError(f"a repeated key answered {first.status_code}, then {again.status_code}")
    priority = int(body.get("priority") or 0)
    other = {**keyed, "priority": priority - 1 if priority > 0 else priority + 1}
    changed = _send(response, json.dumps(other).encode())
    if changed.status_code != 409 or _code(changed) != "idempotency_conflict":
        raise AssertionError(
            f"the same key with another priority answered {changed.status_code} {_code(changed)!r}"
        )
    return None
