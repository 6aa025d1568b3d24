"""The console in a real browser: Playwright driving the system's Chromium against a real ``ql3 serve``.

One server and one browser per module keep the suite short. Every page a test opens is watched: a
JavaScript exception, a console error, a failed request or an unexpected 4xx/5xx answer fails the test,
and a screenshot of the page is written to ``test-artifacts/`` when a test fails.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support import server as serving
from tests.support.console import START_TIMEOUT_S, Console
from tests.support.server import start_server, stop

CHROMIUM = Path(os.environ.get("QL3_CHROMIUM", "/usr/bin/chromium"))
LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
# An older server answers 404 on GET /whoami and GET .../tokens; the console then falls back (role from
# the project list, a notice on the Tokens page). The fallback test serves those 404s; nothing else may fail.
TOLERATED = re.compile(r"/api/v1/(whoami|projects/[^/]+/tokens)$")
TIMEOUT_MS = 30_000


def _require_browser() -> Any:
    ci = os.environ.get("CI", "").lower() == "true"
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if ci:
            pytest.fail("playwright is not installed (pip install -e '.[dev]')")
        pytest.skip("playwright is not installed")
    if not CHROMIUM.exists():
        if ci:
            pytest.fail(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set QL3_CHROMIUM)")
        pytest.skip(f"no Chromium at {CHROMIUM}")
    return sync_playwright


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(serving, "START_TIMEOUT_S", max(START_TIMEOUT_S, serving.START_TIMEOUT_S))
        server = start_server(tmp_path_factory.mktemp("browser") / "home")
    try:
        owner = server.credentials()["token"]
        made = Console(server=server, owner=owner, approver="", viewer="")
        for role, name in (("approver", "ada"), ("viewer", "vic"), ("operator", "otto")):
            resp = made.api("POST", "/tokens", json={"role": role, "name": name})
            assert resp.status_code == 201, resp.text
            setattr(made, role, resp.json()["token"])
        yield made
    finally:
        stop(server.process)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_playwright = _require_browser()
    with sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=LAUNCH_ARGS)
        try:
            yield launched
        finally:
            launched.close()


@dataclass
class Watch:
    problems: list[str] = field(default_factory=list)
    pages: list[Any] = field(default_factory=list)
    allowed: list[tuple[int, str]] = field(default_factory=list)  # (status, path) a test provokes
    offline: bool = False  # a test that cuts the network expects failed requests

    def allow(self, status: int, path: str) -> None:
        self.allowed.append((status, path))

    def expect_offline(self) -> None:
        self.offline = True

    def attach(self, page: Any) -> Any:
        page.set_default_timeout(TIMEOUT_MS)
        page.on("pageerror", lambda exc: self.problems.append(f"pageerror: {exc}"))
        page.on("console", self._console)
        page.on("requestfailed", self._failed)
        page.on("response", self._response)
        self.pages.append(page)
        return page

    def _console(self, msg: Any) -> None:
        if msg.type != "error":
            return
        url = str((msg.location or {}).get("url", ""))
        # Chromium reports each 4xx answer as a console error too; those are judged in _response.
        if msg.text.startswith("Failed to load resource") and "/api/v1/" in url:
            return
        if self.offline and "ERR_INTERNET_DISCONNECTED" in msg.text:
            return
        self.problems.append(f"console error: {msg.text} ({url})")

    def _failed(self, request: Any) -> None:
        failure = request.failure or ""
        if "ERR_ABORTED" in failure and request.resource_type in {"fetch", "xhr"}:
            return  # a poll cut short by navigating to another page
        if self.offline and "ERR_INTERNET_DISCONNECTED" in failure:
            return
        self.problems.append(f"request failed: {request.method} {request.url} {failure}")

    def _response(self, response: Any) -> None:
        if response.status < 400:
            return
        path = response.url.split("?")[0].removeprefix(response.url.split("/api/")[0])
        if TOLERATED.search(path) and response.status in {404, 405}:
            return
        if (response.status, path) in self.allowed:
            return
        self.problems.append(f"HTTP {response.status}: {response.request.method} {response.url}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when == "call":
        item.stash[FAILED] = report.failed


FAILED = pytest.StashKey[bool]()


@pytest.fixture
def open_page(browser: Any, request: pytest.FixtureRequest) -> Iterator[Callable[..., Any]]:
    """``open_page(width=1280, height=800, **context_options)``: a new page in a fresh context."""
    watch = Watch()
    contexts: list[Any] = []

    def make(width: int = 1280, height: int = 800, **options: Any) -> Any:
        context = browser.new_context(viewport={"width": width, "height": height}, **options)
        contexts.append(context)
        return watch.attach(context.new_page())

    make.allow = watch.allow  # type: ignore[attr-defined]
    make.expect_offline = watch.expect_offline  # type: ignore[attr-defined]
    yield make
    if request.node.stash.get(FAILED, True) or watch.problems:
        ARTIFACTS.mkdir(exist_ok=True)
        for i, page in enumerate(watch.pages):
            if not page.is_closed():
                page.screenshot(path=str(ARTIFACTS / f"{request.node.name}-{i}.png"), full_page=True)
    for context in contexts:
        context.close()
    assert watch.problems == [], "\n".join(watch.problems)
