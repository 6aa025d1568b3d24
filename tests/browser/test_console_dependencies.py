"""The Dependencies page in Chromium at 1280 and 390 px: list, add (with the install run's link), a bad
spec refused with the rule, remove. The server installs from nowhere (``PIP_NO_INDEX``, npm offline):
the install runs fail fast and reach no registry; the page is what is tested here."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import server as serving
from tests.support.console import START_TIMEOUT_S, Console, sign_in
from tests.support.server import start_server, stop


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    root = tmp_path_factory.mktemp("browser-deps")
    (root / "user").mkdir()
    offline = {"HOME": str(root / "user"), "PIP_NO_INDEX": "1", "npm_config_offline": "true"}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(serving, "START_TIMEOUT_S", max(START_TIMEOUT_S, serving.START_TIMEOUT_S))
        server = start_server(root / "home", env=offline)
    try:
        made = Console(server=server, owner=server.credentials()["token"], approver="", viewer="")
        viewer = made.api("POST", "/tokens", json={"role": "viewer", "name": "vic"})
        assert viewer.status_code == 201, viewer.text
        made.viewer = viewer.json()["token"]
        yield made
    finally:
        stop(server.process)


@pytest.mark.parametrize("width", [1280, 390])
def test_the_dependencies_page_adds_refuses_and_removes(console: Console, open_page: Any, width: int) -> None:
    from playwright.sync_api import expect

    name = f"pkg-{width}"
    page = open_page(width=width, height=900)
    open_page.allow(422, "/api/v1/projects/default/dependencies")
    sign_in(page, console, console.owner, "#/deps")
    expect(page.locator("main h1")).to_have_text("Dependencies")

    # Add: the row appears and the install run is linked
    page.select_option("form select[name=kind]", "python")
    page.fill("form input[name=spec]", f"{name}==1.*")
    page.click("form button[type=submit]")
    row = page.locator(f"table.cards tbody tr[data-id='python:{name}']")
    expect(row).to_contain_text(f"{name}==1.*")
    expect(page.locator("#deps-result a")).to_have_attribute("href", re.compile(r"^#/runs/[0-9a-f-]{36}$"))
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
    boxes = page.eval_on_selector_all(".scroll", "els => els.map(e => e.scrollWidth - e.clientWidth)")
    assert all(extra <= 1 for extra in boxes), f"the list scrolls sideways by {max(boxes)} px"

    # A bad spec: the rule is shown, nothing is added
    page.fill("form input[name=spec]", "evil @ https://example.invalid/e.whl")
    page.click("form button[type=submit]")
    expect(page.locator("#status")).to_contain_text("direct URL")
    assert len(console.api("GET", "/dependencies").json()["items"]) == 1

    # Remove
    row.locator("button:has-text('Remove')").click()
    page.click("#confirm-yes")
    expect(row).to_have_count(0)
    assert console.api("GET", "/dependencies").json()["items"] == []


def test_a_viewer_sees_the_list_without_the_form(console: Console, open_page: Any) -> None:
    from playwright.sync_api import expect

    page = open_page()
    sign_in(page, console, console.viewer, "#/deps")
    expect(page.locator("main h1")).to_have_text("Dependencies")
    expect(page.locator("form input[name=spec]")).to_have_count(0)
