"""Signing in to the console with a name and a password, at 1280 and 390 px: the session survives a new
browser context that reuses the storage state (a new tab, a restarted browser), ends when idle, is
listed and signed out; a state-changing request without the CSRF token is refused; failed attempts
lock the name; TOTP as a second factor (docs/security.md "Console sign-in")."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ql3.application.sessions import TOTP_STEP_S, totp_code
from tests.support.server import Server, start_server, stop

PASSWORD = "correct horse battery"
WIDTHS = [1280, 390]
IDLE_S = 5


def _start(tmp_path_factory: pytest.TempPathFactory, name: str, env: dict[str, str]) -> tuple[Server, str]:
    server = start_server(tmp_path_factory.mktemp(name) / "home", env=env)
    return server, str(server.credentials()["token"])


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    server, owner = _start(
        tmp_path_factory,
        "signin",
        {"QL3_SIGNIN_MAX_FAILURES": "3", "QL3_SIGNIN_ADDRESS_MAX_FAILURES": "1000"},
    )
    try:
        yield server, owner
    finally:
        stop(server.process)


@pytest.fixture(scope="module")
def short_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    server, owner = _start(tmp_path_factory, "signin-short", {"QL3_SESSION_IDLE_S": str(IDLE_S)})
    try:
        yield server, owner
    finally:
        stop(server.process)


def _api(site: tuple[Server, str], method: str, path: str, **kwargs: Any) -> httpx.Response:
    server, owner = site
    return httpx.request(
        method,
        f"{server.url}/api/v1{path}",
        headers={"Authorization": f"Bearer {owner}"},
        timeout=10,
        **kwargs,
    )


def _add_user(site: tuple[Server, str], name: str, role: str = "operator") -> None:
    made = _api(
        site, "POST", "/projects/default/users", json={"name": name, "password": PASSWORD, "role": role}
    )
    assert made.status_code == 201, made.text


def _fill(page: Any, name: str, password: str = PASSWORD) -> None:
    page.fill("#signin-name", name)
    page.fill("#signin-password", password)
    page.click("#signin-submit")


def _signed_in_as(page: Any, name: str) -> None:
    page.wait_for_selector("#signout:not([hidden])", state="attached")
    page.wait_for_selector("main h1")
    assert name in page.text_content("#whoami")


def _no_horizontal_overflow(page: Any) -> None:
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")


@pytest.mark.parametrize("width", WIDTHS)
def test_sign_in_survives_a_new_context_csrf_guards_changes_and_sign_out_ends_it(
    site: tuple[Server, str], open_page: Any, width: int
) -> None:
    server, _ = site
    name = f"alice{width}"
    _add_user(site, name)
    page = open_page(width=width)
    page.goto(f"{server.url}/")
    page.wait_for_selector("#signin-name")
    _no_horizontal_overflow(page)
    _fill(page, name)
    _signed_in_as(page, name)

    # A new context with the same storage state (a new tab, a restarted browser) is still signed in
    state = page.context.storage_state()
    cookie = next(c for c in state["cookies"] if c["name"] == "ql3_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["expires"] > time.time() + 86400
    again = open_page(width=width, storage_state=state)
    again.goto(f"{server.url}/#/tasks")
    _signed_in_as(again, name)

    # A state-changing request without the CSRF token is refused, by fetch and by page.request
    open_page.allow(403, "/api/v1/projects/default/tasks")
    answer = again.evaluate(
        """async () => {
          const r = await fetch('/api/v1/projects/default/tasks', {method: 'POST',
            headers: {'Content-Type': 'application/json'},
            body: JSON.stringify({name: 'x', command: 'true'})});
          return [r.status, (await r.json()).error.code];
        }"""
    )
    assert answer == [403, "csrf_token_invalid"]
    direct = again.request.post(
        f"{server.url}/api/v1/projects/default/tasks", data={"name": "y", "command": "true"}
    )
    assert direct.status == 403 and direct.json()["error"]["code"] == "csrf_token_invalid"
    assert _api(site, "GET", "/projects/default/tasks/x").status_code == 404
    # ...while the console's own requests carry it: a task is created through the form's API path
    made = again.evaluate(
        """async () => {
          const s = await (await fetch('/api/v1/session')).json();
          const r = await fetch('/api/v1/projects/default/tasks', {method: 'POST', headers: {
            'Content-Type': 'application/json', 'X-CSRF-Token': s.csrf_token},
            body: JSON.stringify({name: 'made-by-' + s.name, command: 'true'})});
          return r.status;
        }"""
    )
    assert made == 201

    # The sessions page lists both sign-ins' session (one session, two contexts) as this one
    again.goto(f"{server.url}/#/sessions")
    again.wait_for_selector("#sessions table, #sessions .cards, #sessions [data-label]")
    assert "this session" in again.text_content("#sessions")
    _no_horizontal_overflow(again)

    # Signing out revokes the session on the server: the same cookie elsewhere is signed out too
    page.close()  # (its 5 s refresh would otherwise meet the 401 at a random moment)
    open_page.allow(401, "/api/v1/session")
    if width < 600:
        again.click("#menu")
    again.click("#signout")
    again.wait_for_selector("#signin-name")
    elsewhere = open_page(width=width, storage_state=state)
    elsewhere.goto(f"{server.url}/")
    elsewhere.wait_for_selector("#signin-name")
    assert elsewhere.get_attribute("#signout", "hidden") is not None


@pytest.mark.parametrize("width", WIDTHS)
def test_failed_attempts_lock_the_name(site: tuple[Server, str], open_page: Any, width: int) -> None:
    server, _ = site
    name = f"lena{width}"
    _add_user(site, name, role="viewer")
    open_page.allow(401, "/api/v1/session")
    open_page.allow(429, "/api/v1/session")
    page = open_page(width=width)
    page.goto(f"{server.url}/")
    codes = []
    for _ in range(3):
        with page.expect_response("**/api/v1/session") as answer:
            _fill(page, name, "wrong password")
        codes.append(answer.value.status)
        page.wait_for_selector("#status.error")
    assert codes == [401, 401, 429]
    assert "signin_locked" in page.text_content("#status")
    # the right password is refused while the name is locked
    with page.expect_response("**/api/v1/session") as answer:
        _fill(page, name)
    assert answer.value.status == 429
    assert page.get_attribute("#signout", "hidden") is not None
    assert page.input_value("#signin-password") == ""


@pytest.mark.parametrize("width", WIDTHS)
def test_totp_sign_in(site: tuple[Server, str], open_page: Any, width: int) -> None:
    server, _ = site
    name = f"tess{width}"
    _add_user(site, name)
    enabled = _api(site, "POST", f"/projects/default/users/{name}/totp")
    assert enabled.status_code == 200, enabled.text
    secret = enabled.json()["secret"]
    open_page.allow(401, "/api/v1/session")  # totp_required: the password was right, the code is asked
    page = open_page(width=width)
    page.goto(f"{server.url}/")
    _fill(page, name)
    page.wait_for_selector("#signin-totp:visible")
    assert page.get_attribute("#signout", "hidden") is not None
    page.fill("#signin-totp", totp_code(secret, int(time.time()) // TOTP_STEP_S))
    page.click("#signin-submit")
    _signed_in_as(page, name)


@pytest.mark.parametrize("width", WIDTHS)
def test_an_idle_session_is_signed_out(short_site: tuple[Server, str], open_page: Any, width: int) -> None:
    server, _ = short_site
    name = f"ida{width}"
    _add_user(short_site, name)
    page = open_page(width=width)
    page.goto(f"{server.url}/")
    _fill(page, name)
    _signed_in_as(page, name)
    state = page.context.storage_state()
    page.close()
    time.sleep(IDLE_S + 1.5)  # nobody uses the session for longer than its idle time

    open_page.allow(401, "/api/v1/session")
    later = open_page(width=width, storage_state=state)
    later.goto(f"{server.url}/")
    later.wait_for_selector("#signin-name")
    assert later.get_attribute("#signout", "hidden") is not None
