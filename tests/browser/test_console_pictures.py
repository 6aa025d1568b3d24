"""Pictures in the console (docs/console.md "Pictures"): a task's recent runs as a strip of bars
(colour = outcome, height = duration, each a link with a tooltip), the overview's runs per hour and
per 6 hours by outcome and busy slots, at 1280 and 390 px, light and dark; ids shown by their start
with a button that copies the whole id."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.console import Console, sign_in
from tests.support.waits import wait_for

pytestmark = [pytest.mark.slow]
TERMINAL = {"succeeded", "failed", "cancelled", "timed_out"}
DARK_OK = "rgb(111, 207, 134)"  # app.css: --ok in dark mode
LIGHT_BAD = "rgb(179, 38, 30)"  # app.css: --bad in light mode


def _finish(console: Console, task: str) -> dict[str, Any]:
    resp = console.api("POST", f"/tasks/{task}/runs", json={})
    assert resp.status_code == 201, resp.text
    run_id = resp.json()["id"]

    def done() -> dict[str, Any] | None:
        run: dict[str, Any] = console.api("GET", f"/runs/{run_id}").json()
        return run if run["status"] in TERMINAL else None

    return wait_for(done, 60, what=f"run {run_id} to end")


@pytest.fixture(scope="module")
def history(console: Console, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Four runs of one task, oldest first: succeeded, failed, succeeded, failed (a counter file)."""
    counter: Path = tmp_path_factory.mktemp("pictures") / "n"
    command = (
        f"n=$(cat {counter} 2>/dev/null || echo 0); echo $((n+1)) > {counter}; sleep 0.$n;"
        " [ $((n % 2)) -eq 0 ]"
    )
    made = console.api("POST", "/tasks", json={"name": "pictures", "command": command})
    assert made.status_code == 201, made.text
    return [_finish(console, "pictures") for _ in range(4)]


@pytest.mark.parametrize("width", [1280, 390])
def test_a_task_page_shows_its_recent_runs_as_a_strip(
    console: Console, open_page: Any, history: list[dict[str, Any]], width: int
) -> None:
    assert [r["status"] for r in history] == ["succeeded", "failed", "succeeded", "failed"]
    page = open_page(width=width, height=844)
    sign_in(page, console, console.owner, "#/tasks/pictures")
    page.wait_for_selector("#run-strip svg a")

    bars = page.locator("#run-strip svg a")
    assert bars.count() == 4
    for i, run in enumerate(history):  # oldest left, coloured by outcome, linked to the run
        bar = bars.nth(i)
        assert bar.get_attribute("href") == f"#/runs/{run['id']}"
        assert bar.locator("rect").get_attribute("data-status") == run["status"]
        assert run["id"][:13] in bar.locator("title").text_content()
    fill = page.eval_on_selector("#run-strip rect[data-status=failed]", "e => getComputedStyle(e).fill")
    assert fill == LIGHT_BAD
    # taller is longer: the runs slept 0, 0.1, 0.2 and 0.3 s more
    durations = [r["finished_at_ms"] - r["started_at_ms"] for r in history]
    heights = [float(bars.nth(i).locator("rect").get_attribute("height") or 0) for i in range(4)]
    longest = durations.index(max(durations))
    assert heights[longest] == max(heights)
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    strip = page.locator("#run-strip svg").bounding_box()
    assert strip is not None and strip["x"] + strip["width"] <= width

    bars.nth(1).click()
    page.wait_for_url(f"**/#/runs/{history[1]['id']}")


@pytest.mark.parametrize("width", [1280, 390])
def test_the_overview_draws_runs_by_outcome_and_busy_slots_in_dark_mode(
    console: Console, open_page: Any, history: list[dict[str, Any]], width: int
) -> None:
    day = console.api("GET", "/stats/runs", params={"range": "24h"}).json()
    finished = sum(sum(b["counts"].values()) for b in day["buckets"])
    page = open_page(width=width, height=844, color_scheme="dark")
    sign_in(page, console, console.owner)
    page.wait_for_selector("#chart-runs-24h svg .bar")
    page.wait_for_selector("#chart-busy svg")

    drawn = page.eval_on_selector_all(
        "#chart-runs-24h svg rect.bar", "els => els.reduce((n, e) => n + Number(e.dataset.n), 0)"
    )
    week = page.eval_on_selector_all(
        "#chart-runs-7d svg rect.bar", "els => els.reduce((n, e) => n + Number(e.dataset.n), 0)"
    )
    assert drawn == finished >= 4 and week == drawn
    assert page.locator("#chart-runs-24h svg g.bucket").count() == 24
    assert page.locator("#chart-runs-7d svg g.bucket").count() == 28
    assert page.locator("#chart-busy svg g.bucket").count() == 24
    ok = page.eval_on_selector("#chart-runs-24h rect.c-succeeded", "e => getComputedStyle(e).fill")
    assert ok == DARK_OK
    label = page.get_attribute("#chart-runs-24h svg", "aria-label") or ""
    assert str(finished) in label
    assert page.locator("#chart-runs-24h .legend li").count() >= 2
    for chart in ("#chart-runs-24h svg", "#chart-runs-7d svg", "#chart-busy svg"):
        box = page.locator(chart).bounding_box()
        assert box is not None and box["x"] + box["width"] <= width and box["height"] > 40
    assert page.evaluate("document.documentElement.scrollWidth") <= width


def test_a_run_shows_the_start_of_its_id_and_copies_the_whole_id(
    console: Console, open_page: Any, history: list[dict[str, Any]]
) -> None:
    run_id = history[0]["id"]
    page = open_page(permissions=["clipboard-read", "clipboard-write"])
    sign_in(page, console, console.owner, f"#/runs/{run_id}")
    page.wait_for_selector("main h1 .copy-id")

    assert run_id[:13] in page.inner_text("main h1") and "…" not in page.inner_text("main h1")
    page.click("main h1 .copy-id")
    page.wait_for_selector("#status:has-text('" + run_id + "')")
    assert page.evaluate("navigator.clipboard.readText()") == run_id
    page.goto(f"{console.url}/#/runs")
    row = page.locator(f"tr[data-id='{run_id}']")
    assert run_id[:13] in row.inner_text()
