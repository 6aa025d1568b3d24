"""The one exception -> HTTP response table.

Bodies are always ``{"error": {"code", "message", ["details"]}}``. Nothing a client sent is echoed
back (pydantic's ``input`` and the raw body are dropped) so that commands, env values and tokens can
never leak through an error.
"""

from __future__ import annotations

import logging
import re
import traceback
from typing import Any, Final

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ql3.domain.errors import PayloadTooLarge, Ql3Error, ValidationFailed
from ql3.http.dto import ErrorOut

log = logging.getLogger("ql3.http")

# Framework-level statuses that do not come from a Ql3Error, with their stable codes.
FRAMEWORK_CODES: Final[dict[int, tuple[str, str]]] = {
    400: ("bad_request", "The request is malformed."),
    401: ("unauthenticated", "A valid bearer token is required."),
    403: ("permission_denied", "The caller's role does not allow this."),
    404: ("not_found", "The resource does not exist."),
    405: ("method_not_allowed", "The method is not allowed on this resource."),
    413: (PayloadTooLarge.code, "The request body is too large."),
    415: ("unsupported_media_type", "The request body must be JSON."),
    422: (ValidationFailed.code, "The input is invalid."),
}
INTERNAL: Final = ("internal_error", "ql3 failed.")
# A request body that is not JSON at all (bad syntax, not UTF-8): 400 with this code, never a 422.
MALFORMED_JSON: Final = ("malformed_json", "The request body is not valid JSON.")
# A JSON body that names one key twice in an object (http/limits.py ``StrictJson``).
DUPLICATE_KEY: Final = ("duplicate_key", "The request body repeats a key in one JSON object.")
# FastAPI's detail when the body could not even be decoded (e.g. not UTF-8).
_BODY_PARSE_DETAIL: Final = "There was an error parsing the body"

# Documented on every API route (OpenAPI), in the one shape every error has.
API_ERROR_RESPONSES: Final[dict[int | str, dict[str, Any]]] = {
    401: {"model": ErrorOut, "description": "unauthenticated"},
    403: {"model": ErrorOut, "description": "permission_denied"},
    404: {"model": ErrorOut, "description": "not_found"},
    409: {"model": ErrorOut, "description": "conflict (name_taken, idempotency_conflict, ...)"},
    413: {"model": ErrorOut, "description": "payload_too_large"},
    422: {
        "model": ErrorOut,
        "description": "validation_failed: a parameter or the body breaks a rule this document states"
        " (types, enums, lengths, ranges, patterns; unknown body fields are refused), or one it cannot"
        " state: a cron expression's syntax, a cursor this server did not issue, text that is not"
        " valid Unicode (lone surrogates), parameters that exclude each other (a log read's offset,"
        " before and from_end; a log search's after and before). `details.field` names the field when"
        " it is known. `duplicate_key`: the JSON body names one key twice in an object.",
    },
}


def error_body(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "message": message}
    if details:
        body["details"] = details
    return {"error": body}


def status_for(exc: Ql3Error) -> int:
    """Every ql3 error maps by its class's ``http_status``; the code is the class's ``code``."""
    return exc.http_status


def ql3_error_response(exc: Ql3Error) -> JSONResponse:
    headers = {"Retry-After": "1"} if exc.retryable else None
    if status_for(exc) == 401:
        headers = {"WWW-Authenticate": "Bearer"}
    return JSONResponse({"error": exc.to_dict()}, status_code=status_for(exc), headers=headers)


def _validation_details(exc: RequestValidationError) -> dict[str, Any]:
    # Only known field locations, two levels deep: deeper parts are map keys the client chose, and
    # the name of an unknown field is the client's text too, so it is counted, not echoed.
    fields: list[str] = []
    unknown = 0
    for err in exc.errors()[:32]:
        loc = [str(part) for part in err.get("loc", ())]
        if err.get("type") == "extra_forbidden" and len(loc) <= 2:
            unknown += 1
            continue
        name = ".".join(loc[:2]) if loc else "request"
        if name not in fields:
            fields.append(name)
    details: dict[str, Any] = {}
    if fields:
        details["fields"] = fields
    if unknown:
        details["unknown_fields"] = unknown
    return details


def ql3_error_answer(exc: Ql3Error) -> JSONResponse:
    """What a route's Ql3Error answers (the handler below, and the fast path of ql3/http/run_intake.py)."""
    if status_for(exc) >= 500:
        log.warning("request failed", extra={"action": "http.error", "code": exc.code})
    return ql3_error_response(exc)


def _on_ql3_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Ql3Error)
    return ql3_error_answer(exc)


# Documented on every operation that takes a request body.
MALFORMED_JSON_DESCRIPTION: Final = "malformed_json: the body is not valid JSON (bad syntax, or not UTF-8)"


def _on_validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    if any(err.get("type") == "json_invalid" for err in exc.errors()):
        return JSONResponse(error_body(*MALFORMED_JSON), status_code=400)
    code, message = FRAMEWORK_CODES[422]
    return JSONResponse(error_body(code, message, _validation_details(exc)), status_code=422)


def _path_methods(app: Any) -> list[tuple[re.Pattern[str], frozenset[str]]]:
    """(path pattern, methods) of every documented path, built once from the OpenAPI document."""
    cached: list[tuple[re.Pattern[str], frozenset[str]]] | None = getattr(app.state, "path_methods", None)
    if cached is None:
        cached = []
        for template, operations in app.openapi().get("paths", {}).items():
            parts = re.split(r"(\{[^}]+\})", template)
            pattern = "".join("[^/]+" if p.startswith("{") else re.escape(p) for p in parts)
            cached.append((re.compile(pattern), frozenset(m.upper() for m in operations)))
        app.state.path_methods = cached
    return cached


def allowed_methods(request: Request) -> list[str]:
    """Every method the API serves on this path. A path is served by one route per method, and the
    router's own 405 names only the route it tried first; the document lists them all."""
    path = request.scope.get("path", "")
    methods: set[str] = set()
    for pattern, served in _path_methods(request.app):
        if pattern.fullmatch(path):
            methods |= served
    return sorted(methods)


def _on_http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400 and exc.detail == _BODY_PARSE_DETAIL:
        return JSONResponse(error_body(*MALFORMED_JSON), status_code=400)
    code, message = FRAMEWORK_CODES.get(exc.status_code, INTERNAL)
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        allowed = allowed_methods(request)
        if allowed:
            headers["Allow"] = ", ".join(allowed)
    return JSONResponse(error_body(code, message), status_code=exc.status_code, headers=headers or None)


def log_unhandled(exc: BaseException) -> None:
    # The message of an arbitrary exception may carry data; log its type and frames only.
    frames = "".join(traceback.format_tb(exc.__traceback__))
    log.error(
        "unhandled error %s\n%s",
        type(exc).__name__,
        frames,
        extra={"action": "http.unhandled", "error_type": type(exc).__name__},
    )


def install(app: FastAPI) -> None:
    app.add_exception_handler(Ql3Error, _on_ql3_error)
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(StarletteHTTPException, _on_http)
