"""Every console page scanned with axe-core (bundled by axe-playwright-python, so no network at test
time): no serious or critical violation, at 1280 px in light mode and at 390 px in dark mode."""

from __future__ import annotations

from typing import Any

import pytest
from axe_playwright_python.sync_playwright import Axe

from tests.support.console import Console, sign_in
from tests.support.waits import wait_for

pytestmark = [pytest.mark.slow]
BLOCKING = {"serious", "critical"}
TERMINAL = {"succeeded", "failed", "cancelled", "timed_out"}
PAGES = (
    "#/",
    "#/tasks",
    "#/tasks/a11y",
    "#/tasks/a11y/edit",
    "#/tasks/new",
    "#/variables",
    "#/runs",
    "#/approvals",
    "#/actions",
    "#/cancellations",
    "#/scripts",
    "#/subscriptions",
    "#/workers",
    "#/tokens",
    "#/deps",
    "#/nowhere",
)


@pytest.fixture(scope="module")
def world(console: Console) -> dict[str, str]:
    """A task with a finished run and a pending approval, so lists and pages have rows to scan."""
    for spec in (
        {"name": "a11y", "command": "echo accessible", "cron": "0 3 * * *"},
        {"name": "a11y-gated", "command": "true", "approval": "required"},
    ):
        made = console.api("POST", "/tasks", json=spec)
        assert made.status_code == 201, made.text
    started = console.api("POST", "/tasks/a11y/runs", json={})
    assert started.status_code == 201, started.text
    run_id = str(started.json()["id"])
    wait_for(
        lambda: console.api("GET", f"/runs/{run_id}").json()["status"] in TERMINAL, 60, what="the run to end"
    )
    asked = console.api("POST", "/tasks/a11y-gated/runs", json={}, token=console.operator)
    assert asked.status_code == 202, asked.text
    return {"run": run_id}


def _blocking(page: Any) -> list[str]:
    results = Axe().run(page)
    found: list[str] = []
    for violation in results.response["violations"]:
        if violation.get("impact") in BLOCKING:
            targets = [", ".join(node["target"]) for node in violation["nodes"]][:5]
            found.append(f"{violation['impact']} {violation['id']}: {violation['help']} at {targets}")
    return found


@pytest.mark.parametrize(("width", "scheme"), [(1280, "light"), (390, "dark")])
def test_no_page_has_a_serious_or_critical_violation(
    console: Console, open_page: Any, world: dict[str, str], width: int, scheme: str
) -> None:
    page = open_page(width=width, height=844, color_scheme=scheme)
    page.goto(f"{console.url}/")
    page.wait_for_selector("#signin-token")
    problems = {"sign-in": _blocking(page)}
    sign_in(page, console, console.owner)
    for route in (*PAGES, f"#/runs/{world['run']}"):
        page.goto(f"{console.url}/{route}")
        page.wait_for_selector("main h1")
        page.wait_for_load_state("networkidle")
        problems[route] = _blocking(page)
    assert {route: found for route, found in problems.items() if found} == {}
