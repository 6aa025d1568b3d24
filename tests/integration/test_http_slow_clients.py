"""Slow clients are disconnected: headers and body each have a read deadline that trickling bytes does
not extend; a request read in full is never cut, however long its handler takes."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from ql3.http.app import create_app
from ql3.http.limits import MAX_HEADER_BYTES, read_deadline_protocol

HEADER_S = 1.0
BODY_S = 1.5
GIVE_UP_S = 20.0  # generous: the machine is shared


async def _slow_app(scope: Any, receive: Any, send: Any) -> None:
    """A handler slower than both deadlines, after the request has been read."""
    if scope["type"] != "http":
        return
    await asyncio.sleep(HEADER_S + BODY_S + 0.5)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def _response(conn: socket.socket) -> bytes:
    """One whole HTTP response: a loaded machine may deliver the headers and the body separately."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    while len(body) < length:
        chunk = conn.recv(4096)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def _responses(conn: socket.socket, n: int) -> list[bytes]:
    """``n`` whole responses from one connection, however the bytes arrive: one ``recv`` may hold the
    end of one response and the start (or all) of the next ones. Fewer when the server closes."""
    data = b""
    replies: list[bytes] = []
    while len(replies) < n:
        head_end = data.find(b"\r\n\r\n")
        if head_end >= 0:
            head = data[:head_end]
            length = next(
                (
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                0,
            )
            end = head_end + 4 + length
            if len(data) >= end:
                replies.append(data[:end])
                data = data[end:]
                continue
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    return replies


def _serve(app: Any, header_s: float = HEADER_S, body_s: float = BODY_S) -> Iterator[int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    config = uvicorn.Config(
        app,
        http=read_deadline_protocol(header_s, body_s),
        lifespan="off",
        log_level="warning",
        timeout_keep_alive=5,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + GIVE_UP_S
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=GIVE_UP_S)
        sock.close()


@pytest.fixture
def api_port(db: Any, owner_token: str) -> Iterator[int]:
    yield from _serve(create_app(db))


@pytest.fixture
def patient_port(db: Any, owner_token: str) -> Iterator[int]:
    """Deadlines longer than the test waits: only the header cap can close a connection."""
    yield from _serve(create_app(db), header_s=10 * GIVE_UP_S, body_s=10 * GIVE_UP_S)


@pytest.fixture
def slow_port() -> Iterator[int]:
    yield from _serve(_slow_app)


def _closed_by_server(conn: socket.socket, trickle: bytes | None, every_s: float = 0.2) -> float:
    """Trickle ``trickle`` (or nothing) until the server closes; return how long that took."""
    conn.settimeout(every_s)
    started = time.monotonic()
    while time.monotonic() - started < GIVE_UP_S:
        try:
            if conn.recv(4096) == b"":
                return time.monotonic() - started
        except TimeoutError:
            pass
        except ConnectionResetError:
            return time.monotonic() - started
        if trickle:
            try:
                conn.sendall(trickle)
            except (BrokenPipeError, ConnectionResetError):
                return time.monotonic() - started
    pytest.fail("the server kept a slow connection open")


def test_trickled_headers_are_cut_off(api_port: int) -> None:
    with socket.create_connection(("127.0.0.1", api_port)) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")

        took = _closed_by_server(conn, b"X-Slow: 1\r\n")

    assert took >= HEADER_S * 0.5


def test_a_silent_connection_is_cut_off(api_port: int) -> None:
    with socket.create_connection(("127.0.0.1", api_port)) as conn:
        _closed_by_server(conn, None)


def test_a_trickled_body_is_cut_off(api_port: int) -> None:
    with socket.create_connection(("127.0.0.1", api_port)) as conn:
        conn.sendall(
            b"POST /api/v1/projects HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000\r\n\r\n{"
        )

        _closed_by_server(conn, b" ")


def test_an_endless_chunk_is_cut_off(api_port: int) -> None:
    with socket.create_connection(("127.0.0.1", api_port)) as conn:
        conn.sendall(
            b"POST /api/v1/projects HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"ffffffffffffffffffff\r\n"
        )

        _closed_by_server(conn, b"a")


def test_a_prompt_client_is_served_and_can_reuse_its_connection(api_port: int) -> None:
    with socket.create_connection(("127.0.0.1", api_port)) as conn:
        conn.settimeout(GIVE_UP_S)
        for _ in range(2):
            time.sleep(HEADER_S * 0.6)  # each request starts a fresh header deadline
            conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            reply = _response(conn)
            assert reply.startswith(b"HTTP/1.1 200"), reply


def test_a_slow_handler_is_not_a_slow_client(slow_port: int) -> None:
    with socket.create_connection(("127.0.0.1", slow_port)) as conn:
        conn.settimeout(GIVE_UP_S)
        conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")

        reply = _response(conn)

    assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"ok")


def test_headers_over_the_cap_are_refused(patient_port: int) -> None:
    big = b"X-Big: " + b"a" * (MAX_HEADER_BYTES + 1) + b"\r\n"
    with socket.create_connection(("127.0.0.1", patient_port)) as conn:
        conn.settimeout(GIVE_UP_S)
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + big + b"\r\n")
        assert _response(conn).startswith(b"HTTP/1.1 400")


def test_a_header_that_never_ends_is_cut_off_at_the_cap(patient_port: int) -> None:
    with socket.create_connection(("127.0.0.1", patient_port)) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")

        _closed_by_server(conn, b"a" * 1024, every_s=0.01)


def test_a_body_is_not_counted_as_headers(patient_port: int) -> None:
    body = b'{"name": "' + b"a" * (2 * MAX_HEADER_BYTES) + b'"}'
    with socket.create_connection(("127.0.0.1", patient_port)) as conn:
        conn.settimeout(GIVE_UP_S)
        head = b"POST /api/v1/projects HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        conn.sendall(head + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
        for start in range(0, len(body), 1000):  # apart, so that the server reads them one by one
            conn.sendall(body[start : start + 1000])
            time.sleep(0.005)
        assert _response(conn).startswith(b"HTTP/1.1 401")  # read in full, then refused: no token


def test_headers_below_the_cap_are_served_also_when_split_across_writes(api_port: int) -> None:
    with socket.create_connection(("127.0.0.1", api_port)) as conn:
        conn.settimeout(GIVE_UP_S)
        head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (MAX_HEADER_BYTES - 1024) + b"\r\n\r\n"
        for start in range(0, len(head), 1000):
            conn.sendall(head[start : start + 1000])
            time.sleep(0.002)
        assert _response(conn).startswith(b"HTTP/1.1 200")


def test_pipelined_requests_are_all_answered(api_port: int) -> None:
    with socket.create_connection(("127.0.0.1", api_port)) as conn:
        conn.settimeout(GIVE_UP_S)
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 3)
        replies = _responses(conn, 3)
    assert len(replies) == 3 and all(reply.startswith(b"HTTP/1.1 200") for reply in replies), replies
