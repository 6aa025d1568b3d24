"""A task's script notifies: ``ql3 notify TITLE BODY``, ``from notify import send`` and
``require('sendNotify')`` inside runs of a real ``ql3 serve`` reach a signed webhook the test listens
on, with the run's own credential; the same credential is refused once the run has ended."""

from __future__ import annotations

import hashlib
import hmac
import http.server
import json
import os
import shlex
import shutil
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.server import CLI, Server, start_server, stop
from tests.support.waits import wait_for

SECRET = "acceptance-webhook-secret-0123456789"
# The receiver listens on 127.0.0.1, which the egress policy refuses by default: the server opens it
# as an operator would (--notify-allow, docs/notifications.md "Egress policy").
WEBHOOK_ENV: dict[str, str] = {}


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

    def payloads(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _, body in self.bodies]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Receiver]]:
    receiver = Receiver()
    server = start_server(
        tmp_path_factory.mktemp("notify") / "home", "--notify-allow", "127.0.0.1", env=WEBHOOK_ENV
    )
    try:
        added = server.cli(
            "notify", "channel", "add", "hook", "--webhook", receiver.url, "--secret-env", "HOOK_SECRET",
            env={"HOOK_SECRET": SECRET},
        )  # fmt: skip
        assert added.returncode == 0, added.stderr
        assert server.cli("notify", "rule", "add", "--channel", "hook").returncode == 0
        yield server, receiver
    finally:
        stop(server.process)
        receiver.close()


def _run_task(server: Server, name: str, command: str, *extra: str) -> dict[str, Any]:
    made = server.cli("task", "add", name, "--command", command, *extra)
    assert made.returncode == 0, made.stderr
    ran = server.cli("--json", "run", "start", name, "--wait")
    assert ran.returncode == 0, ran.stdout + ran.stderr + server.cli("run", "logs", name).stdout
    result: dict[str, Any] = json.loads(ran.stdout)
    return result


def _delivered(receiver: Receiver, title: str) -> tuple[dict[str, str], dict[str, Any]]:
    wait_for(lambda: any(p.get("title") == title for p in receiver.payloads()), 30)
    for headers, body in receiver.bodies:
        payload = json.loads(body)
        if payload.get("title") == title:
            expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
            assert headers["X-Ql3-Signature"] == expected
            return headers, payload
    raise AssertionError(title)


def test_ql3_notify_in_a_task_reaches_the_webhook_and_the_credential_ends_with_the_run(
    served: tuple[Server, Receiver],
) -> None:
    server, receiver = served
    cli = " ".join(shlex.quote(part) for part in CLI)
    # The task also prints its credential, to try it again once the run has ended.
    command = (
        'echo "using key $API_KEY"; echo last-line; '
        f'{cli} notify --log 2 "backup done" "3 files, 12 MB" && '
        'echo "TOKEN=$QL3_NOTIFY_TOKEN URL=$QL3_NOTIFY_URL"'
    )

    run = _run_task(server, "cli-notify", command, "--env", "API_KEY=hunter2-secret")

    headers, payload = _delivered(receiver, "backup done")
    assert headers["X-Ql3-Event"] == "script"
    assert payload["message"] == "3 files, 12 MB" and payload["task"] == "cli-notify"
    assert payload["run_id"] == run["id"] and payload["link"].endswith(f"/#/runs/{run['id']}")
    # The run's last two lines of output, its env value masked
    assert payload["log"] == "using key ***\nlast-line"
    log = server.cli("run", "logs", run["id"]).stdout
    token = log.split("TOKEN=", 1)[1].split()[0]
    url = log.split("URL=", 1)[1].split()[0]
    assert token.startswith("ql3r_") and server.credentials()["token"] not in log
    late = httpx.post(
        f"{url}/api/v1/notify", json={"title": "late"}, headers={"Authorization": f"Bearer {token}"}
    )
    assert late.status_code == 401 and late.json()["error"]["code"] == "notify_credential_invalid"


def test_notify_py_and_send_notify_js_helpers(served: tuple[Server, Receiver]) -> None:
    server, receiver = served
    python = 'python3 -c \'from notify import send; send("py title", "from python")\''
    _run_task(server, "py-notify", python)
    assert _delivered(receiver, "py title")[1]["message"] == "from python"

    if shutil.which("node") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("node is needed under CI to exercise sendNotify.js")
        pytest.skip("node is not installed: sendNotify.js not exercised")
    script = (
        'require("sendNotify").sendNotify("js title", "from node")'
        ".catch(e => { console.error(e); process.exit(1) })"
    )
    node = f"node -e {shlex.quote(script)}"
    _run_task(server, "js-notify", node)
    assert _delivered(receiver, "js title")[1]["message"] == "from node"


def test_ql3_notify_outside_a_run_is_a_usage_error(served: tuple[Server, Receiver]) -> None:
    server, _ = served
    done = server.cli("notify", "hello", "world")
    assert done.returncode == 64 and "only inside a ql3 run" in done.stderr


def test_a_failing_runs_message_masks_the_projects_secrets_in_its_excerpt_and_text(
    served: tuple[Server, Receiver],
) -> None:
    server, receiver = served
    # Given a project secret (3 characters are enough to be masked) and a task env value
    for name, value in (("DB_PASS", "s3cr3t-db-pass-7781"), ("PIN", "K9z")):
        done = server.cli("env", "set", name, value, "--secret")
        assert done.returncode == 0, done.stderr
    cli = " ".join(shlex.quote(part) for part in CLI)
    command = (
        'echo "connecting with $DB_PASS and pin $PIN"; echo "region $REGION_KEY"; '
        f'{cli} notify --log 3 "job failed $PIN" "pass was $DB_PASS"; exit 3'
    )
    made = server.cli("task", "add", "leaky", "--command", command, "--env", "REGION_KEY=eu-north-key")
    assert made.returncode == 0, made.stderr

    # When the run prints them, sends a message with its last lines, and fails
    ran = server.cli("--json", "run", "start", "leaky", "--wait")
    run = json.loads(ran.stdout)

    # Then the webhook's message carries the excerpt and the text with every secret masked
    assert run["status"] == "failed", run
    _, payload = _delivered(receiver, "job failed ***")
    assert payload["message"] == "pass was ***"
    assert payload["log"] == "connecting with *** and pin ***\nregion ***"
    raw = json.dumps(payload)
    for value in ("s3cr3t-db-pass-7781", "K9z", "eu-north-key"):
        assert value not in raw

    # And the run's own failure notification carries its console link and its last lines, masked
    wait_for(
        lambda: any(p.get("event") == "failed" and p.get("run_id") == run["id"] for p in receiver.payloads()),
        30,
    )
    (failed,) = [
        p for p in receiver.payloads() if p.get("event") == "failed" and p.get("run_id") == run["id"]
    ]
    assert failed["link"] == f"{server.url.rstrip('/')}/#/runs/{run['id']}"
    assert failed["log"].startswith("connecting with *** and pin ***\nregion ***")
    raw = json.dumps(failed)
    for value in ("s3cr3t-db-pass-7781", "K9z", "eu-north-key"):
        assert value not in raw
