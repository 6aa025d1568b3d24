"""Pure ASGI guards that sit outside the framework: the body size cap and the last-resort 500."""

from __future__ import annotations

import asyncio
import json
from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ql3.http.errors import FRAMEWORK_CODES, INTERNAL, error_body, log_unhandled

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


def read_deadline_protocol(
    header_timeout_s: float = HEADER_READ_TIMEOUT_S, body_timeout_s: float = BODY_READ_TIMEOUT_S
) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with read deadlines, which uvicorn itself does not have.

    A connection must deliver a request's complete headers within ``header_timeout_s`` of opening (or
    of the previous response), and then its complete body within ``body_timeout_s``; otherwise it is
    closed. Unlike uvicorn's keep-alive timer, trickling a byte at a time does not extend either
    deadline (slowloris). A request that has been read completely has no deadline: a slow handler or a
    long poll is not a slow client.
    """
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class ReadDeadlineH11Protocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None
        _reading_body = False

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

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._reading_body = False
            self._arm(header_timeout_s)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.transport.is_closing():
                self._disarm()
                return
            state = self.conn.their_state
            if state is h11.SEND_BODY:
                if not self._reading_body:
                    self._reading_body = True
                    self._arm(body_timeout_s)
            elif state is not h11.IDLE:  # DONE, MUST_CLOSE, CLOSED, ERROR: the request is read
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.transport.is_closing():
                return
            self._reading_body = False
            if self.conn.their_state is h11.IDLE:
                self._arm(header_timeout_s)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return ReadDeadlineH11Protocol
