"""``ql3 serve`` disconnects a client that trickles its request headers (slowloris)."""

from __future__ import annotations

import socket
import time

import pytest

from tests.support.server import Server

pytestmark = pytest.mark.slow
GIVE_UP_S = 60.0  # the deadline is 10 s; the machine is shared


def test_serve_cuts_off_trickled_headers(serve: Server) -> None:
    port = int(serve.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.settimeout(1.0)
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        closed = False
        while not closed and time.monotonic() - started < GIVE_UP_S:
            try:
                closed = conn.recv(4096) == b""
            except TimeoutError:
                try:
                    conn.sendall(b"X-Slow: 1\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    closed = True
            except ConnectionResetError:
                closed = True

    assert closed, "ql3 serve kept a slowloris connection open"
    assert serve.process.poll() is None  # and it is still serving
