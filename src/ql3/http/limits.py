"""Pure ASGI guards that sit outside the framework: the body size cap and the last-resort 500."""

from __future__ import annotations

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
