"""Notification channels over HTTP, and delivery to a real local receiver: the webhook's HMAC
signature, apprise (json://), the test message, and secrets that never come back."""

from __future__ import annotations

import hashlib
import hmac
import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ql3.application import runs
from ql3.application.notifications import NotificationDeliverer
from ql3.domain.egress import parse_allow
from ql3.http.app import create_app
from ql3.notify.senders import ChannelSender
from ql3.storage.sqlite.adapter import SqliteDatabase

SECRET = "whsec-planted-canary-0123456789abcdef"
BASE = "/api/v1/projects/default/notifications"
# The receiver of these tests listens on loopback, which the default egress policy refuses
# (test_notification_egress.py): these tests open it, as an operator would with --notify-allow.
LOOPBACK = parse_allow(["127.0.0.0/8"])


@pytest.fixture
def client(db: SqliteDatabase, owner_token: str) -> Iterator[TestClient]:
    with TestClient(create_app(db, egress=LOOPBACK)) as test_client:
        yield test_client


class Receiver:
    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.status = 200
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                outer.requests.append((self.path, dict(self.headers.items()), body))
                self.send_response(outer.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    r.thread.start()
    yield r
    r.server.shutdown()
    r.server.server_close()


def _fail_run(db: SqliteDatabase, run_id: str) -> None:
    def unit(tx: Any) -> None:
        run = runs.lock_run(tx, run_id)
        run = runs.transition(tx, run.id, run.version, "dispatching", actor_type="system")
        run = runs.transition(tx, run.id, run.version, "running", actor_type="system")
        runs.transition(
            tx, run.id, run.version, "failed", actor_type="system", finished_at_ms=tx.now_ms(), exit_code=2
        )

    db.transaction(unit)


def test_a_failed_run_reaches_the_webhook_signed(
    client: Any, owner: Any, make_task: Any, db: SqliteDatabase, receiver: Receiver
) -> None:
    # Given a webhook channel and a rule for failures of one task
    created = client.post(
        f"{BASE}/channels",
        json={"name": "ops", "kind": "webhook", "url": f"{receiver.url}/hook", "secret": SECRET},
        headers=owner,
    )
    assert created.status_code == 201, created.text
    assert SECRET not in created.text and receiver.url not in created.text
    make_task("nightly")
    rule = client.post(
        f"{BASE}/rules", json={"channel": "ops", "task": "nightly", "events": ["failed"]}, headers=owner
    )
    assert rule.status_code == 201 and rule.json()["task"] == "nightly"
    run = client.post("/api/v1/projects/default/tasks/nightly/runs", json={}, headers=owner).json()

    # When the run fails and the loop delivers
    _fail_run(db, run["id"])
    report = NotificationDeliverer(db, ChannelSender(timeout_s=5, egress=LOOPBACK), "test").deliver_batch()

    # Then the receiver got one POST whose signature is the HMAC-SHA256 of the raw body
    assert report.delivered == 1
    assert len(receiver.requests) == 1
    path, headers, body = receiver.requests[0]
    expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    assert path == "/hook" and headers["X-Ql3-Signature"] == expected
    payload = json.loads(body)
    assert payload["run_id"] == run["id"] and payload["event"] == "failed" and payload["task"] == "nightly"
    assert payload["exit_code"] == 2 and headers["X-Ql3-Delivery"] == payload["delivery_id"]
    assert SECRET not in body.decode()


def test_channels_never_show_their_url_or_secret(client: Any, owner: Any) -> None:
    url = "tgram://123456:planted-bot-token/987"
    assert (
        client.post(
            f"{BASE}/channels", json={"name": "tg", "kind": "apprise", "url": url}, headers=owner
        ).status_code
        == 201
    )
    generated = client.post(
        f"{BASE}/channels",
        json={"name": "hook", "kind": "webhook", "url": "https://example.invalid/x"},
        headers=owner,
    ).json()
    assert len(generated["secret"]) >= 32  # generated, shown this once

    listing = client.get(f"{BASE}/channels", headers=owner)

    assert listing.status_code == 200
    assert "planted-bot-token" not in listing.text and generated["secret"] not in listing.text
    assert [(c["name"], c["scheme"]) for c in listing.json()["items"]] == [("hook", "https"), ("tg", "tgram")]


def test_the_test_message_goes_through_apprise(
    client: Any, owner: Any, db: SqliteDatabase, receiver: Receiver
) -> None:
    apprise_url = receiver.url.replace("http://", "json://") + "/apprise"
    client.post(
        f"{BASE}/channels", json={"name": "app", "kind": "apprise", "url": apprise_url}, headers=owner
    )

    queued = client.post(f"{BASE}/channels/app/test", headers=owner)
    assert queued.status_code == 202 and queued.json()["status"] == "pending"
    NotificationDeliverer(db, ChannelSender(timeout_s=5, egress=LOOPBACK), "test").deliver_batch()

    shown = client.get(f"{BASE}/deliveries/{queued.json()['id']}", headers=owner).json()
    assert shown["status"] == "delivered" and shown["attempts"] == 1
    assert len(receiver.requests) == 1
    sent = json.loads(receiver.requests[0][2])
    assert "test notification" in sent["title"]


def test_a_receiver_error_is_retried_with_a_reason_code(
    client: Any, owner: Any, db: SqliteDatabase, receiver: Receiver
) -> None:
    receiver.status = 500
    client.post(
        f"{BASE}/channels",
        json={"name": "ops", "kind": "webhook", "url": f"{receiver.url}/hook", "secret": SECRET},
        headers=owner,
    )
    queued = client.post(f"{BASE}/channels/ops/test", headers=owner).json()

    NotificationDeliverer(db, ChannelSender(timeout_s=5, egress=LOOPBACK), "test").deliver_batch()

    shown = client.get(f"{BASE}/deliveries/{queued['id']}", headers=owner).json()
    assert (shown["status"], shown["attempts"], shown["last_error"]) == ("pending", 1, "http_500")


@pytest.mark.parametrize(
    "body",
    [
        {"name": "x", "kind": "sms", "url": "https://example.invalid"},
        {"name": "x", "kind": "webhook", "url": "ftp://example.invalid", "secret": SECRET},
        {"name": "x", "kind": "webhook", "url": "https://example.invalid", "secret": "short"},
        {"name": "x", "kind": "apprise", "url": "not a url"},
        {"name": "x", "kind": "apprise", "url": "tgram://a/b", "secret": SECRET},
        {"name": "bad name!", "kind": "apprise", "url": "tgram://a/b"},
    ],
)
def test_bad_channels_are_422_and_write_nothing(
    client: Any, owner: Any, db: SqliteDatabase, body: Any
) -> None:
    resp = client.post(f"{BASE}/channels", json=body, headers=owner)

    assert resp.status_code == 422
    assert db.raw("SELECT count(*) AS n FROM notification_channels")[0]["n"] == 0


def test_only_admins_manage_channels(client: Any, make_token: Any) -> None:
    operator = make_token("operator")
    resp = client.post(
        f"{BASE}/channels", json={"name": "x", "kind": "apprise", "url": "tgram://a/b"}, headers=operator
    )
    assert resp.status_code == 403
    assert client.get(f"{BASE}/channels", headers=operator).status_code == 403


def test_rules_refuse_unknown_events_and_channels(client: Any, owner: Any) -> None:
    client.post(
        f"{BASE}/channels", json={"name": "tg", "kind": "apprise", "url": "tgram://a/b"}, headers=owner
    )
    assert (
        client.post(
            f"{BASE}/rules", json={"channel": "tg", "events": ["exploded"]}, headers=owner
        ).status_code
        == 422
    )
    assert client.post(f"{BASE}/rules", json={"channel": "nope"}, headers=owner).status_code == 404
    made = client.post(f"{BASE}/rules", json={"channel": "tg"}, headers=owner).json()
    assert "succeeded" not in made["events"] and "failed" in made["events"]
    assert client.delete(f"{BASE}/rules/{made['id']}", headers=owner).status_code == 204
    assert client.get(f"{BASE}/rules", headers=owner).json()["items"] == []


def test_retention_policy_round_trip(client: Any, owner: Any, make_token: Any) -> None:
    path = "/api/v1/projects/default/retention"
    assert client.get(path, headers=owner).json()["keep_days"] is None
    put = client.put(path, json={"keep_days": 30, "runs_per_task": 1000}, headers=owner)
    assert put.status_code == 200 and put.json()["version"] == 1
    assert client.get(path, headers=owner).json()["runs_per_task"] == 1000
    assert client.put(path, json={"keep_days": 0}, headers=owner).status_code == 422
    assert client.put(path, json={"keep_days": "30"}, headers=owner).status_code == 422
    assert client.put(path, json={"keep_days": 1}, headers=make_token("operator")).status_code == 403
