"""Pure ASGI guards that sit outside the framework: the body size cap, strict JSON (no duplicate keys)
and the last-resort 500."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from typing import Any, Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ql3.http.errors import DUPLICATE_KEY, FRAMEWORK_CODES, INTERNAL, error_body, log_unhandled

MAX_BODY_BYTES: Final = 256 * 1024


class _BodyTooLarge(Exception):
    pass


async def _send_json(send: Send, status: int, body: dict[str, object]) -> None:
    raw = json.dumps(body, separators=(",", ":")).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": raw})


class BodySizeLimit:
    """Refuse bodies over ``max_bytes`` with 413 before anything parses them.

    The declared Content-Length is checked first; the streamed size is counted too, because a chunked
    body declares nothing. Once the cap is crossed whatever the app tries to answer is dropped and the
    413 is sent instead.
    """

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        code, message = FRAMEWORK_CODES[413]
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > self.max_bytes:
                    await _send_json(send, 413, error_body(code, message))
                    return
        received = 0
        too_large = False
        started = False

        async def limited_receive() -> Message:
            nonlocal received, too_large
            msg = await receive()
            if msg["type"] == "http.request":
                received += len(msg.get("body", b""))
                if received > self.max_bytes:
                    too_large = True
                    raise _BodyTooLarge()
            return msg

        async def guarded_send(msg: Message) -> None:
            nonlocal started
            if too_large:
                return
            if msg["type"] == "http.response.start":
                started = True
            await send(msg)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not too_large:
                raise
        if too_large and not started:
            await _send_json(send, 413, error_body(code, message))


class _DuplicateKey(Exception):
    pass


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _DuplicateKey()
    return out


def has_duplicate_key(body: bytes) -> bool:
    """Whether ``body``, as JSON, has an object that names one key twice. A body that is not JSON at
    all answers False: the framework refuses it with its own 400 ``malformed_json``."""
    try:
        json.loads(body, object_pairs_hook=_unique_pairs)
    except _DuplicateKey:
        return True
    except (ValueError, RecursionError):
        return False
    return False


def _json_content(scope: Scope) -> bool:
    """Whether the framework would read this request's body as JSON: no Content-Type, or
    ``application/json`` / ``application/*+json`` (FastAPI's own rule)."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            media: bytes = value.split(b";", 1)[0].strip().lower()
            return media == b"application/json" or (
                media.startswith(b"application/") and media.endswith(b"+json")
            )
    return True


class StrictJson:
    """Refuse a JSON body that repeats a key in one object with 422 ``duplicate_key``, on every route.

    JSON parsers keep the last of two equal keys (``{"command":"id","command":"rm -rf /"}``), so what
    a reviewer, a proxy or a log sees need not be what the server acts on. The body is read here in
    full (within the size cap around this guard), checked, and replayed to the app unchanged.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] in ("GET", "HEAD", "OPTIONS")
            or not _json_content(scope)
        ):
            await self.app(scope, receive, send)
            return
        _, body, replayed = await buffer_body(receive)
        if body and has_duplicate_key(body):
            code, text = DUPLICATE_KEY
            await _send_json(send, 422, error_body(code, text))
            return
        await self.app(scope, replayed, send)


async def buffer_body(receive: Receive) -> tuple[deque[Message], bytes, Receive]:
    """A request's messages read up to the end of its body (bounded by the body size cap the caller
    sits behind), the body, and a ``receive`` that hands the read messages on first."""
    messages: deque[Message] = deque()
    body = bytearray()
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        body += message.get("body", b"")
        if not message.get("more_body", False):
            break

    async def replayed() -> Message:
        return messages.popleft() if messages else await receive()

    return messages, bytes(body), replayed


class CatchAll:
    """The last-resort handler: a JSON 500 with a fixed message, and a log line without the message
    of the exception (which could carry data)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(msg: Message) -> None:
            nonlocal started
            if msg["type"] == "http.response.start":
                started = True
            await send(msg)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            log_unhandled(exc)
            if started:
                return  # the server closes the half-sent response
            await _send_json(send, 500, error_body(*INTERNAL))


# -- security headers on every response (docs/security.md "HTTP") -------------------------------------

_API_CSP: Final = b"default-src 'none'; frame-ancestors 'none'"
# HTML without its own policy is the Swagger page at /docs: FastAPI's inline bootstrap script and the
# swagger-ui bundle from its CDN, nothing else, never framed.
_HTML_CSP: Final = (
    b"default-src 'self'; script-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net;"
    b" style-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net; img-src 'self' data: https://fastapi.tiangolo.com;"
    b" connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
BASE_SECURITY_HEADERS: Final = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
)


class SecurityHeaders:
    """The headers the console sends, on every response: nosniff, no framing, no referrer, a CSP.

    ``/api`` responses are also ``Cache-Control: no-store`` (one of them carries a new token). A header
    the route set itself (the console's CSP and cache policy) is kept.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        is_api = str(scope.get("path", "")).startswith("/api/")

        async def with_headers(msg: Message) -> None:
            if msg["type"] == "http.response.start":
                headers = list(msg.get("headers", []))
                present = {name.lower() for name, _ in headers}
                content_type = next((v for n, v in headers if n.lower() == b"content-type"), b"")
                extra = [(n, v) for n, v in BASE_SECURITY_HEADERS if n not in present]
                if b"content-security-policy" not in present:
                    html = content_type.lower().startswith(b"text/html")
                    extra.append((b"content-security-policy", _HTML_CSP if html else _API_CSP))
                if is_api and b"cache-control" not in present:
                    extra.append((b"cache-control", b"no-store"))
                msg = {**msg, "headers": headers + extra}
            await send(msg)

        await self.app(scope, receive, with_headers)


# -- slow clients (docs/security.md "HTTP") -------------------------------------------------------------

HEADER_READ_TIMEOUT_S: Final = 10.0
BODY_READ_TIMEOUT_S: Final = 30.0


# The request line and headers of one request; h11, which ql3 served with before, refused more.
MAX_HEADER_BYTES: Final = 16 * 1024


def read_deadline_protocol(
    header_timeout_s: float = HEADER_READ_TIMEOUT_S,
    body_timeout_s: float = BODY_READ_TIMEOUT_S,
    max_header_bytes: int = MAX_HEADER_BYTES,
) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with read deadlines, which uvicorn itself does not have, and a cap
    on the request line and headers, which httptools itself does not have.

    A connection must deliver a request's complete headers within ``header_timeout_s`` of opening (or
    of the previous response), and then its complete body within ``body_timeout_s``; otherwise it is
    closed. Unlike uvicorn's keep-alive timer, trickling a byte at a time does not extend either
    deadline (slowloris). A request that has been read completely has no deadline: a slow handler or a
    long poll is not a slow client.

    A request whose line and headers exceed ``max_header_bytes`` gets a 400 and the connection is
    closed: in the socket read that began the request, counted for each header the parser completes;
    in every later read while the headers are still incomplete, by the read's whole length. What is
    buffered of one request's headers thus stays below the cap plus one socket read.

    httptools (C, llhttp) rather than h11 (pure Python): parsing a request and writing its response
    cost about a sixth of the API's CPU per request under h11 (bench/README.md, 2026-12-02).
    """
    import httptools
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class ReadDeadlineHttpToolsProtocol(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None
        # The phase of the request being read: "idle" (none begun), "headers", "body".
        _phase = "idle"
        _header_bytes = 0  # the current request's line and headers, as far as counted
        _began_in_read = False  # the current request began in the read being parsed
        _unanswered = 0  # requests read in full whose response is not complete yet

        def _arm(self, timeout_s: float) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                self.transport.close()

        def _count_header_bytes(self, n: int) -> None:
            if not self._began_in_read:
                return  # counted by data_received, a whole read at a time
            self._header_bytes += n
            if self._header_bytes > max_header_bytes:
                raise httptools.HttpParserError("request headers too large")

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm(header_timeout_s)

        def data_received(self, data: bytes) -> None:
            self._began_in_read = False
            super().data_received(data)
            if self.transport.is_closing():
                self._disarm()
                return
            if self._phase == "headers" and not self._began_in_read:
                # Still inside the headers: all of this read was header bytes.
                self._header_bytes += len(data)
                if self._header_bytes > max_header_bytes:
                    self.send_400_response("Invalid HTTP request received.")
                    self._disarm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._phase = "headers"
            self._header_bytes = 0
            self._began_in_read = True
            if self._deadline is None:  # a pipelined request: its own header deadline from now
                self._arm(header_timeout_s)

        def on_url(self, url: bytes) -> None:
            self._count_header_bytes(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count_header_bytes(len(name) + len(value) + 4)
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._phase = "body"
            self._arm(body_timeout_s)
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._phase = "idle"
            self._unanswered += 1
            self._disarm()  # read in full: no deadline while it is handled
            super().on_message_complete()

        def on_response_complete(self) -> None:
            self._unanswered = max(0, self._unanswered - 1)
            super().on_response_complete()
            if self.transport.is_closing():
                self._disarm()
                return
            if self._phase == "idle" and self._unanswered == 0:
                self._arm(header_timeout_s)  # the next request's headers, from now

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return ReadDeadlineHttpToolsProtocol
