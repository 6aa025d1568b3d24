"""The console's admin pages (issue 32): notification channels with a test send seen in the delivery
history, retention, a backup download, projects and members; and the smaller items: the theme switch,
the status line cleared on navigation and translated, the approval controls' order, a header long names
cannot wrap. Headless Chromium against a real ``ql3 serve`` at 1280 and 390 px."""

from __future__ import annotations

import http.server
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from tests.support import server as serving
from tests.support.console import START_TIMEOUT_S, Console, sign_in
from tests.support.server import start_server, stop

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("browser")]
WIDTHS = [1280, 390]


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    """The shared console world, on a server whose webhooks may reach loopback (the test's receiver)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(serving, "START_TIMEOUT_S", max(START_TIMEOUT_S, serving.START_TIMEOUT_S))
        server = start_server(tmp_path_factory.mktemp("admin") / "home", "--notify-allow", "127.0.0.0/8")
    try:
        made = Console(server=server, owner=server.credentials()["token"], approver="", viewer="")
        for role, name in (("approver", "ada"), ("viewer", "vic"), ("operator", "otto")):
            resp = made.api("POST", "/tokens", json={"role": role, "name": name})
            assert resp.status_code == 201, resp.text
            setattr(made, role, resp.json()["token"])
        yield made
    finally:
        stop(server.process)


class Receiver:
    """A webhook receiver on loopback that records what it is sent."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                outer.bodies.append(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    r.thread.start()
    yield r
    r.server.shutdown()
    r.server.server_close()


def _page(open_page: Any, width: int) -> Any:
    return open_page(width=width, height=844, is_mobile=width < 500, has_touch=width < 500)


def _no_overflow(page: Any, width: int) -> None:
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    boxes = page.eval_on_selector_all(".scroll", "els => els.map(e => e.scrollWidth - e.clientWidth)")
    assert all(extra <= 1 for extra in boxes), f"a list scrolls sideways by {max(boxes)} px"


@pytest.mark.parametrize("width", WIDTHS)
def test_a_channel_gets_a_test_message_seen_in_the_delivery_history(
    console: Console, open_page: Any, receiver: Receiver, width: int
) -> None:
    page = _page(open_page, width)
    sign_in(page, console, console.owner, "#/admin/notifications")
    name = f"hook-{width}"

    # When a webhook channel pointing at the receiver is added through the form
    page.fill("#channel-form input[name=channel_name]", name)
    page.select_option("#channel-form select[name=channel_kind]", "webhook")
    page.fill("#channel-form input[name=channel_url]", receiver.url)
    page.click("#channel-form button[type=submit]")

    # Then it is listed without its URL, and the generated signing secret is shown once
    row = page.locator(f"#channel-form ~ div tr[data-id='{name}']")
    expect(row).to_be_visible()
    expect(page.locator("#channel-secret code")).not_to_be_empty()
    assert receiver.url not in page.inner_text("main")
    listed = console.api("GET", "/notifications/channels").json()["items"]
    assert name in [c["name"] for c in listed]

    # When a rule is added for it and a test message is sent
    page.select_option("#rule-form select[name=rule_channel]", name)
    page.check("#rule-form input[value=succeeded]")
    page.click("#rule-form button[type=submit]")
    rules = console.api("GET", "/notifications/rules").json()["items"]
    expect(page.locator("#rule-form ~ div tbody tr", has_text=name)).to_have_count(1)
    mine = [r for r in rules if r["channel"] == name]
    assert len(mine) == 1 and "succeeded" in mine[0]["events"]
    row.locator("[data-action=test]").click()

    # Then the receiver gets it and the history shows it delivered (the page refreshes itself)
    delivered = page.locator("#delivery-history tbody tr", has_text=name).locator(
        ".badge[data-value=delivered]"
    )
    expect(delivered).to_have_count(1, timeout=30_000)
    assert any(b'"test"' in body for body in receiver.bodies)
    _no_overflow(page, width)

    # When the channel is removed after confirming, it is gone with its rule
    row.locator("[data-action=remove]").click()
    page.click("#confirm-yes")
    expect(row).to_have_count(0)
    assert name not in [r["channel"] for r in console.api("GET", "/notifications/rules").json()["items"]]


@pytest.mark.parametrize("width", WIDTHS)
def test_retention_is_shown_and_changed(console: Console, open_page: Any, width: int) -> None:
    page = _page(open_page, width)
    sign_in(page, console, console.owner, "#/admin/retention")
    days = 30 + width % 7
    page.fill("#retention-form input[name=keep_days]", str(days))
    page.fill("#retention-form input[name=runs_per_task]", "500")
    page.fill("#retention-form input[name=log_bytes_per_run]", "")
    page.click("#retention-form button[type=submit]")
    expect(page.locator("#status")).to_contain_text("Retention saved")
    expect(page.locator("dl.fields")).to_contain_text(str(days))
    policy = console.api("GET", "/retention").json()
    assert (policy["keep_days"], policy["runs_per_task"], policy["log_bytes_per_run"]) == (days, 500, None)
    _no_overflow(page, width)

    # A viewer sees the policy but no form
    viewer = _page(open_page, width)
    sign_in(viewer, console, console.viewer, "#/admin/retention")
    expect(viewer.locator("dl.fields")).to_contain_text(str(days))
    expect(viewer.locator("#retention-form")).to_have_count(0)


@pytest.mark.parametrize("width", WIDTHS)
def test_the_owner_downloads_a_valid_sqlite_backup(
    console: Console, open_page: Any, width: int, tmp_path: Path
) -> None:
    page = _page(open_page, width)
    sign_in(page, console, console.owner, "#/admin/backup")
    with page.expect_download() as info:
        page.click("#backup-download")
    download = info.value
    assert download.suggested_filename.startswith("ql3-backup-") and download.suggested_filename.endswith(
        ".db"
    )
    saved = tmp_path / "backup.db"
    download.save_as(str(saved))
    assert saved.read_bytes()[:16] == b"SQLite format 3\x00"
    conn = sqlite3.connect(saved)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert "ada" in {r[0] for r in conn.execute("SELECT name FROM principals")}
    finally:
        conn.close()
    expect(page.locator("#status")).to_contain_text("Backup downloaded")
    _no_overflow(page, width)

    # An admin who is not the owner is told so, and no download is offered
    admin = console.api("POST", "/tokens", json={"role": "admin", "name": f"second-admin-{width}"}).json()
    other = _page(open_page, width)
    sign_in(other, console, admin["token"], "#/admin/backup")
    expect(other.locator("#owner-only")).to_be_visible()
    expect(other.locator("#backup-download")).to_have_count(0)


@pytest.mark.parametrize("width", WIDTHS)
def test_create_a_project_and_add_and_remove_a_member(console: Console, open_page: Any, width: int) -> None:
    page = _page(open_page, width)
    sign_in(page, console, console.owner, "#/admin/projects")
    project = f"team-{width}"

    # When the owner creates a project, its members section opens with the creation still said
    page.fill("#project-form input[name=project_name]", project)
    page.click("#project-form button[type=submit]")
    expect(page.locator("#members h2")).to_contain_text(project)
    expect(page.locator("#status")).to_contain_text(f"Project {project} created.")

    # When a member is added with a role, the token is shown once and the API lists the member
    page.fill("#member-form input[name=member_name]", "mia")
    page.select_option("#member-form select[name=member_role]", "operator")
    page.click("#member-form button[type=submit]")
    token = page.locator("#member-token code").inner_text()
    members = httpx.get(
        f"{console.url}/api/v1/projects/{project}/tokens",
        headers={"Authorization": f"Bearer {console.owner}"},
        timeout=10,
    ).json()["items"]
    assert [(m["name"], m["role"]) for m in members if m["revoked_at_ms"] is None] == [("mia", "operator")]
    whoami = httpx.get(
        f"{console.url}/api/v1/whoami", headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    assert whoami.json()["roles"] == {project: "operator"}
    _no_overflow(page, width)

    # When the member is removed after confirming, the token is refused
    page.locator("#members tr[data-id=mia] [data-action=remove]").click()
    page.click("#confirm-yes")
    expect(page.locator("#members tr[data-id=mia] .badge[data-value=revoked]")).to_be_visible()
    refused = httpx.get(
        f"{console.url}/api/v1/whoami", headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    assert refused.status_code == 401


def _background(page: Any) -> str:
    return str(page.evaluate("getComputedStyle(document.body).backgroundColor"))


@pytest.mark.parametrize("width", WIDTHS)
def test_the_theme_switch_overrides_the_os_and_is_remembered(
    console: Console, open_page: Any, width: int
) -> None:
    page = open_page(width=width, height=844, color_scheme="light")
    sign_in(page, console, console.owner)
    if width < 500:
        page.click("#menu")
    light, dark = "rgb(246, 247, 249)", "rgb(18, 20, 24)"
    assert page.inner_text("#theme") == "Auto" and _background(page) == light

    # auto -> light -> dark: dark although the OS is light
    page.click("#theme")
    assert page.inner_text("#theme") == "Light" and _background(page) == light
    page.click("#theme")
    assert page.inner_text("#theme") == "Dark" and _background(page) == dark

    # remembered across a reload (localStorage), and a light choice beats a dark OS
    page.reload()
    page.wait_for_selector("main h1")
    assert _background(page) == dark
    if width < 500:
        page.click("#menu")
    page.click("#theme")  # back to auto: it follows the OS again
    assert page.inner_text("#theme") == "Auto" and _background(page) == light
    page.emulate_media(color_scheme="dark")
    assert _background(page) == dark
    page.click("#theme")
    assert page.inner_text("#theme") == "Light" and _background(page) == light


@pytest.mark.parametrize("width", WIDTHS)
def test_a_status_message_is_translated_and_cleared_on_navigation(
    console: Console, open_page: Any, width: int
) -> None:
    page = _page(open_page, width)
    page.add_init_script("window.localStorage.setItem('ql3.lang', 'zh')")
    open_page.allow(422, "/api/v1/projects/default/notifications/channels")
    sign_in(page, console, console.owner, "#/admin/notifications")

    # An error the server words in English is shown in Chinese with its code
    page.fill("#channel-form input[name=channel_name]", "bad name with spaces")
    page.fill("#channel-form input[name=channel_url]", "https://example.invalid/h")
    page.click("#channel-form button[type=submit]")
    expect(page.locator("#status")).to_have_text(
        "输入无效\uff08validation_failed\uff09"
    )  # full-width brackets

    # Navigating away clears it
    if width < 500:
        page.click("#menu")
    page.click("nav a[data-page=tasks]")
    page.wait_for_selector("main h1")
    expect(page.locator("#status")).to_have_text("")


def test_the_reject_reason_follows_both_buttons(console: Console, open_page: Any) -> None:
    resp = console.api(
        "POST", "/tasks", json={"name": "gated-order", "command": "true", "approval": "required"}
    )
    assert resp.status_code == 201, resp.text
    requested = console.api("POST", "/tasks/gated-order/runs", token=console.operator, json={})
    assert requested.status_code == 202, requested.text
    page = open_page()
    sign_in(page, console, console.approver, "#/approvals")
    controls = page.locator("table.cards tbody tr", has_text="gated-order").first.locator(".actions").first
    expect(controls.locator("[data-action=reject]")).to_be_visible()
    order = controls.evaluate("box => Array.from(box.children).map(c => c.dataset.action || c.tagName)")
    assert order == ["approve", "reject", "SELECT", "INPUT"]


def test_the_header_does_not_wrap_at_1280_with_long_names(console: Console, open_page: Any) -> None:
    project = "a-project-with-a-name-long-enough-to-push-the-header-about"
    made = httpx.post(
        f"{console.url}/api/v1/projects",
        json={"name": project},
        headers={"Authorization": f"Bearer {console.owner}"},
        timeout=10,
    )
    assert made.status_code == 201, made.text
    issued = httpx.post(
        f"{console.url}/api/v1/projects/{project}/tokens",
        json={"name": "principal-with-a-name-that-goes-on-and-on-and-on", "role": "admin"},
        headers={"Authorization": f"Bearer {console.owner}"},
        timeout=10,
    ).json()
    for lang in ("en", "zh"):
        page = open_page(width=1280, height=800)
        page.add_init_script(f"window.localStorage.setItem('ql3.lang', '{lang}')")
        sign_in(page, console, issued["token"], "#/admin")
        # the session controls share one line, the page links another, nothing overflows
        for selector in (".session > *:not([hidden])", "header nav a"):
            boxes = page.eval_on_selector_all(
                selector,
                "els => els.map(e => [e.getBoundingClientRect().top, e.getBoundingClientRect().bottom])",
            )
            assert max(top for top, _ in boxes) < min(bottom for _, bottom in boxes), (selector, boxes)
        nav = page.eval_on_selector("header nav", "n => n.scrollWidth - n.clientWidth")
        assert nav <= 1, "the page links scroll at 1280 px"
        assert page.evaluate("document.documentElement.scrollWidth") <= 1280
        # the cut name is whole in its title
        assert "principal-with-a-name-that-goes-on-and-on-and-on" in str(
            page.get_attribute("#whoami", "title")
        )
