"""kill -9 between the outcome's commit and the webhook delivery: after a restart the notification is
delivered exactly once, signed, by the real ``ql3 serve``."""

from __future__ import annotations

import hashlib
import hmac
import http.server
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.server import start_server, stop
from tests.support.waits import wait_for

pytestmark = pytest.mark.slow
SECRET = "acceptance-webhook-secret-0123456789"
# The receiver listens on loopback: refused unless the server opens it (docs/notifications.md).
ALLOW = ("--notify-allow", "127.0.0.1")


class Receiver:
    def __init__(self) -> None:
        self.bodies: list[tuple[dict[str, str], bytes]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                outer.bodies.append((dict(self.headers.items()), body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        """Stop serving and close the listening socket."""
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    try:
        yield found
    finally:
        found.close()


def outbox(home: Path) -> list[dict[str, Any]]:
    conn = sqlite3.connect(home / "ql3.db")
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("SELECT status, attempts, event FROM notification_outbox")]
    finally:
        conn.close()


def test_kill_9_after_the_outcome_commit_delivers_once_after_restart(
    tmp_path: Path, receiver: Receiver
) -> None:
    home = tmp_path / "home"
    lease = {"QL3_NOTIFY_LEASE_MS": "2000"}
    # Given a server that dies right after the failing run's outbox row is claimed, before sending
    server = start_server(home, *ALLOW, env={**lease, "QL3_FAULT": "notify_before_send"})
    try:
        added = server.cli(
            "notify",
            "channel",
            "add",
            "hook",
            "--webhook",
            receiver.url,
            "--secret-env",
            "HOOK_SECRET",
            env={"HOOK_SECRET": SECRET},
        )
        assert added.returncode == 0, added.stderr
        assert server.cli("notify", "rule", "add", "--channel", "hook").returncode == 0
        assert server.cli("task", "add", "broken", "--command", "exit 3").returncode == 0
        server.cli("run", "start", "broken")

        # When the outcome commits, the delivery loop claims it and the process dies (kill -9 style)
        assert server.process.wait(timeout=60) == 137
    finally:
        stop(server.process)
    assert receiver.bodies == []
    assert [(r["status"], r["attempts"], r["event"]) for r in outbox(home)] == [("leased", 1, "failed")]

    # Then a restart without the fault delivers it once the dead process's lease has expired
    restarted = start_server(home, *ALLOW, env=lease)
    try:
        wait_for(lambda: [r["status"] for r in outbox(home)] == ["delivered"], 60)
        time.sleep(1.0)  # a second delivery would have to happen now: the row is settled
        assert len(receiver.bodies) == 1
        headers, body = receiver.bodies[0]
        assert (
            headers["X-Ql3-Signature"]
            == "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        )
        payload = json.loads(body)
        assert payload["event"] == "failed" and payload["task"] == "broken" and payload["exit_code"] == 3
        assert [(r["status"], r["attempts"]) for r in outbox(home)] == [("delivered", 2)]
    finally:
        stop(restarted.process)
