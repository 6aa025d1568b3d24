"""The webhook egress policy (issue: webhooks could reach loopback, cloud metadata and private ranges,
and the delivery status told what answered): refused at creation when the target is a literal address,
refused on every delivery after resolution, the checked address is the one connected to, and a refusal
says only ``refused``. docs/notifications.md "Egress policy"."""

from __future__ import annotations

import http.server
import ipaddress
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ql3.application.notifications import NotificationDeliverer
from ql3.domain.egress import EgressPolicy, parse_allow
from ql3.http.app import create_app
from ql3.notify.egress import own_addresses
from ql3.notify.senders import ChannelSender
from ql3.storage.sqlite.adapter import SqliteDatabase

BASE = "/api/v1/projects/default/notifications"
SECRET = "egress-secret-0123456789abcdef"


class Receiver:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []  # (path, Host header)
        self.status = 200
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                outer.requests.append((self.path, self.headers.get("Host", "")))
                self.send_response(outer.status)
                if outer.status == 302:
                    self.send_header("Location", "/elsewhere")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    r.thread.start()
    yield r
    r.server.shutdown()
    r.server.server_close()


@pytest.fixture
def open_client(db: SqliteDatabase, owner_token: str) -> Iterator[TestClient]:
    """An API whose policy opens every address at creation: the delivery is what is under test."""
    with TestClient(create_app(db, egress=parse_allow(["0.0.0.0/0", "::/0"]))) as test_client:
        yield test_client


class FakeDns:
    def __init__(self) -> None:
        self.answers: dict[str, list[str]] = {}
        self.asked: list[str] = []


@pytest.fixture
def fake_dns(monkeypatch: pytest.MonkeyPatch) -> FakeDns:
    """The names in ``answers`` resolve to what the test says (each lookup is recorded in ``asked``);
    everything else resolves as usual."""
    fake = FakeDns()
    answers = fake.answers
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host in answers:
            fake.asked.append(host)
            return [
                (
                    socket.AF_INET6 if ":" in a else socket.AF_INET,
                    socket.SOCK_STREAM,
                    6,
                    "",
                    (a, port or 0) if ":" not in a else (a, port or 0, 0, 0),
                )
                for a in answers[host]
            ]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return fake


def _add(client: TestClient, owner: dict[str, str], url: str, kind: str = "webhook") -> Any:
    body = {"name": "hook", "kind": kind, "url": url}
    if kind == "webhook":
        body["secret"] = SECRET
    return client.post(f"{BASE}/channels", json=body, headers=owner)


def _deliver(client: TestClient, owner: dict[str, str], db: SqliteDatabase, egress: EgressPolicy) -> Any:
    queued = client.post(f"{BASE}/channels/hook/test", headers=owner)
    assert queued.status_code == 202, queued.text
    NotificationDeliverer(db, ChannelSender(timeout_s=5, egress=egress), "test").deliver_batch()
    return client.get(f"{BASE}/deliveries/{queued.json()['id']}", headers=owner).json()


@pytest.mark.parametrize(
    ("kind", "url"),
    [
        ("webhook", "http://169.254.169.254/latest/meta-data/"),
        ("webhook", "http://127.0.0.1:9/"),
        ("webhook", "http://localhost/"),
        ("webhook", "http://api.localhost:8080/"),
        ("webhook", "http://[::1]/"),
        ("webhook", "http://[::ffff:127.0.0.1]/"),
        ("webhook", "https://10.1.2.3/"),
        ("webhook", "https://192.168.0.1/"),
        ("webhook", "http://100.64.0.1/"),
        ("webhook", "http://0.0.0.0/"),
        ("apprise", "json://127.0.0.1:9/x"),
    ],
)
def test_a_literal_internal_target_is_refused_at_creation_and_nothing_is_written(
    client: TestClient, owner: dict[str, str], kind: str, url: str
) -> None:
    refused = _add(client, owner, url, kind)

    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["code"] == "egress_refused"
    assert url not in refused.text
    assert client.get(f"{BASE}/channels", headers=owner).json()["items"] == []


def test_an_opened_network_is_accepted_at_creation(db: SqliteDatabase, owner: dict[str, str]) -> None:
    with TestClient(create_app(db, egress=parse_allow(["10.0.0.0/8"]))) as opened:
        assert _add(opened, owner, "https://10.1.2.3/hook").status_code == 201
        assert _add(opened, owner, "https://192.168.0.1/hook").json()["error"]["code"] == "egress_refused"


def test_loopback_is_refused_on_delivery_and_the_status_says_only_refused(
    open_client: TestClient, owner: dict[str, str], db: SqliteDatabase, receiver: Receiver
) -> None:
    # Given a channel that points at a live local receiver (accepted by a permissive API)
    assert _add(open_client, owner, f"http://127.0.0.1:{receiver.port}/hook").status_code == 201

    # When the default policy delivers it
    shown = _deliver(open_client, owner, db, EgressPolicy())

    # Then nothing reached the receiver, and the delivery tells nothing about what listens there
    assert receiver.requests == []
    assert shown["last_error"] == "refused" and shown["status"] == "pending"


def test_a_name_resolving_to_an_internal_address_is_refused_after_resolution(
    open_client: TestClient,
    owner: dict[str, str],
    db: SqliteDatabase,
    receiver: Receiver,
    fake_dns: FakeDns,
) -> None:
    # A name that passes creation (it is not resolved then) and resolves to metadata and loopback later;
    # one public address among them does not open it (no connection is attempted at all).
    fake_dns.answers["hooks.example.test"] = ["93.184.216.34", "127.0.0.1"]
    assert _add(open_client, owner, f"http://hooks.example.test:{receiver.port}/h").status_code == 201

    shown = _deliver(open_client, owner, db, EgressPolicy())

    assert shown["last_error"] == "refused" and receiver.requests == []


def test_the_checked_address_is_the_one_connected_to(
    open_client: TestClient,
    owner: dict[str, str],
    db: SqliteDatabase,
    receiver: Receiver,
    fake_dns: FakeDns,
) -> None:
    # Given a host opened by name that resolves (only here, in the sender's check) to the receiver
    fake_dns.answers["receiver.test"] = ["127.0.0.1"]
    assert _add(open_client, owner, f"http://receiver.test:{receiver.port}/h").status_code == 201

    # When it is delivered
    shown = _deliver(open_client, owner, db, parse_allow(["receiver.test"]))

    # Then it was resolved once (the check), connected to that address, and sent with the name as Host
    assert shown["status"] == "delivered", shown
    assert fake_dns.asked == ["receiver.test"]
    assert receiver.requests == [("/h", f"receiver.test:{receiver.port}")]


def test_an_opened_network_delivers_and_redirects_are_not_followed(
    open_client: TestClient, owner: dict[str, str], db: SqliteDatabase, receiver: Receiver
) -> None:
    assert _add(open_client, owner, f"http://127.0.0.1:{receiver.port}/hook").status_code == 201
    receiver.status = 302

    shown = _deliver(open_client, owner, db, parse_allow(["127.0.0.0/8"]))

    assert shown["last_error"] == "http_302"
    assert [path for path, _ in receiver.requests] == ["/hook"]  # /elsewhere never asked


def test_the_servers_own_addresses_are_refused_unless_opened() -> None:
    own = ipaddress.ip_address("198.51.100.7")
    public = ipaddress.ip_address("8.8.8.8")
    policy = EgressPolicy().with_own([ipaddress.ip_address("8.8.8.8")])

    assert not policy.address_allowed(public)
    assert parse_allow(["8.8.8.0/24"]).with_own([public]).address_allowed(public)
    assert not EgressPolicy().address_allowed(own)  # documentation range: not global either


def test_the_listen_host_counts_among_the_servers_own_addresses() -> None:
    found = own_addresses(["198.51.100.7", "0.0.0.0"])

    assert ipaddress.ip_address("198.51.100.7") in found
    assert ipaddress.ip_address("0.0.0.0") not in found  # listening everywhere names no address
