"""The fast path of ``POST /api/v1/projects/{project}/tasks/{task}/runs``, in front of the framework.

A live producer submits runs one request at a time, and each request's CPU is spent by the one server
process that also executes them. Most of it was the framework's, not ql3's (bench/README.md, "The
API's cost per submitted run"): FastAPI's routing (an included router's routes matched twice), the
dependency resolution of the body, the bearer header and the path, the token check's own read
transaction and thread hand-off, the response model's validation. This pure ASGI middleware answers
the common case itself with exactly what the route answers, and hands every other request to the
framework untouched:

- it takes a request only when its body is empty or a JSON object (``Content-Type: application/json``)
  that ``RunCreate`` accepts, and it carries a bearer token. Anything else (malformed JSON, another
  media type, a body the model refuses, no token) goes to the route, whose answer (400, 401, 422, in
  the framework's order) is the reference; the body read so far is replayed to it;
- the token is checked against the database in the create unit itself, first, as ``current_principal``
  checks it (a revoked, expired or unknown token is refused, a worker credential too, and its use is
  recorded when due): one transaction and one thread hand-off per request instead of two;
- a token this process has not yet seen authenticate (a bounded set of digests) is checked in a read
  transaction first, in the same hand-off, so a wrong token is refused without taking the write lock
  (``BEGIN IMMEDIATE`` on SQLite). The set never grants anything: the write unit checks every token
  again, so a revocation takes effect on the next request, and a refused token leaves the set;
- the unit is the route's own (``start_run_in``), its errors answer through the same table
  (``errors.ql3_error_answer``), and the run is serialised as the framework serialises the route's
  ``response_model`` (``RunOut`` through pydantic's ``dump_json``, by alias).

The OpenAPI document is the route's: this path adds nothing to it. It sits inside the body size cap,
the last-resort 500 and the security headers (ql3/http/app.py), like every route.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from typing import Final

from pydantic import TypeAdapter, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from ql3.domain.digests import API_TOKEN_DOMAIN, token_digest
from ql3.domain.errors import Ql3Error
from ql3.http import errors
from ql3.http.auth import bearer, principal_in, refuse_unless_management_caller
from ql3.http.dto import RunCreate, RunOut
from ql3.http.limits import buffer_body
from ql3.http.routes.approvals import ApprovalRequested
from ql3.http.routes.tasks import start_run_in
from ql3.ports.storage import Database, Transaction

# The route this path answers for (tests/unit/http/test_run_intake.py checks it is served there).
ROUTE_PATH: Final = "/api/v1/projects/{project}/tasks/{task}/runs"
# Starlette's ``{name}`` (str convertor) is ``[^/]+`` over the percent-decoded path.
_PATH: Final = re.compile(r"/api/v1/projects/(?P<project>[^/]+)/tasks/(?P<task>[^/]+)/runs")
_RUN_OUT: Final = TypeAdapter(RunOut)
# How many token digests that authenticated here are remembered (least recently used first out).
KNOWN_TOKENS_MAX: Final = 256


def run_create_of(headers: Headers, body: bytes) -> RunCreate | None:
    """The body as the route would take it, or None when the route must answer (whatever it is)."""
    if not body:
        return RunCreate()  # no body: the route's optional body is absent
    content_type = headers.get("content-type")
    if content_type is None or content_type.split(";", 1)[0].strip().lower() != "application/json":
        return None
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the parser
        return None
    if not isinstance(data, dict):
        return None
    try:
        return RunCreate.model_validate(data)
    except ValidationError:
        return None


class StartRunFastPath:
    """Answers ``POST .../tasks/{task}/runs`` without the framework when it can (module docstring)."""

    def __init__(self, app: ASGIApp, db: Database) -> None:
        self.app = app
        self.db = db
        # Digests of tokens that authenticated on this path; touched from the event loop only.
        self._known: OrderedDict[str, None] = OrderedDict()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        target = None
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            target = _PATH.fullmatch(scope["path"])
        if target is None:
            await self.app(scope, receive, send)
            return
        # bounded by the body size cap around this middleware
        messages, body, replayed = await buffer_body(receive)
        complete = messages[-1]["type"] == "http.request"
        request = run_create_of(Headers(scope=scope), body) if complete else None
        credentials = await bearer(Request(scope)) if request is not None else None
        if request is None or credentials is None:
            await self.app(scope, replayed, send)
            return
        messages.clear()
        token, project, task = credentials.credentials, target["project"], target["task"]

        key = token_digest(API_TOKEN_DOMAIN, token)
        precheck = key not in self._known

        def unit(tx: Transaction) -> tuple[RunOut, bool] | ApprovalRequested:
            return start_run_in(tx, principal_in(tx, token), project, task, request)

        def checked_then_created() -> tuple[RunOut, bool] | ApprovalRequested:
            if precheck:
                self.db.transaction(lambda tx: refuse_unless_management_caller(tx, token), write=False)
            return self.db.transaction(unit)

        response: Response
        try:
            result = await run_in_threadpool(checked_then_created)
        except Ql3Error as exc:
            self._known.pop(key, None)
            response = errors.ql3_error_answer(exc)
        else:
            self._remember(key)
            if isinstance(result, ApprovalRequested):
                response = JSONResponse(result.model_dump(mode="json"), status_code=202)
            else:
                out, created = result
                response = Response(
                    _RUN_OUT.dump_json(out, by_alias=True),
                    status_code=201 if created else 200,
                    media_type="application/json",
                )
        await response(scope, replayed, send)

    def _remember(self, key: str) -> None:
        self._known[key] = None
        self._known.move_to_end(key)
        if len(self._known) > KNOWN_TOKENS_MAX:
            self._known.popitem(last=False)
