"""A 200,000-line (13 MB) log on the run page, at 1280 and 390 px: the page opens at the end of the log
with a handful of requests, scrolling up loads earlier output, "start" and "end" jump with one read
each, and the search runs on the server over the whole log and loads the region around each match."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.support.console import Console, sign_in
from tests.support.waits import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("browser")]

LINES = 200_000
FILLER = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do"
# line 3 and line 150000 carry the marker; the last line says it is the last
COMMAND = (
    f"awk 'BEGIN {{ for (i = 1; i <= {LINES}; i++) "
    f'{{ printf "line %06d %s%s\\n", i, (i == 3 || i == 150000) ? "MARKER-alpha " : "", "{FILLER}" }} '
    'print "the last line of the long log" }\''
)


@pytest.fixture(scope="module")
def long_run(console: Console) -> str:
    created = console.api("POST", "/tasks", json={"name": "long-log", "command": COMMAND})
    assert created.status_code == 201, created.text
    started = console.api("POST", "/tasks/long-log/runs", json={})
    assert started.status_code == 201, started.text
    run_id: str = started.json()["id"]

    def done() -> dict[str, Any] | None:
        run: dict[str, Any] = console.api("GET", f"/runs/{run_id}").json()
        return run if run["status"] in {"succeeded", "failed"} else None

    assert wait_for(done, 120, what="the long run to end")["status"] == "succeeded"
    tail = console.api("GET", f"/runs/{run_id}/logs", params={"from_end": 100}).json()
    assert tail["size"] > 13_000_000 and tail["complete"] is True
    return run_id


# the element is inside the log's scrolled view
IN_VIEW = """m => { const a = m.getBoundingClientRect(), b = m.closest("pre").getBoundingClientRect();
  return a.top >= b.top && a.bottom <= b.bottom; }"""


class LogRequests:
    """The log requests a page makes (reads and searches)."""

    def __init__(self, page: Any) -> None:
        self.urls: list[str] = []
        page.on("request", self._seen)

    def _seen(self, request: Any) -> None:
        if "/logs" in request.url:
            self.urls.append(request.url)

    def since(self, mark: int) -> list[str]:
        return self.urls[mark:]


def _scrolled(page: Any) -> dict[str, float]:
    found: dict[str, float] = page.eval_on_selector(
        "#run-log", "e => ({top: e.scrollTop, height: e.scrollHeight, view: e.clientHeight})"
    )
    return found


@pytest.fixture(params=[1280, 390], ids=["wide", "phone"])
def width(request: pytest.FixtureRequest) -> Iterator[int]:
    yield int(request.param)


def test_a_long_log_opens_at_its_end_jumps_and_finds_across_the_whole_log(
    console: Console, open_page: Any, long_run: str, width: int
) -> None:
    page = open_page(width=width, height=800)
    seen = LogRequests(page)
    log = page.locator("#run-log")

    # When the run page opens
    sign_in(page, console, console.owner, f"#/runs/{long_run}")

    # Then it shows the end of the 13 MB log at once, scrolled to it, after a handful of log requests
    expect(log).to_contain_text("the last line of the long log", timeout=10_000)
    expect(page.locator("#log-follow")).to_have_text("The run has ended.")
    opened = list(seen.urls)
    assert 1 <= len(opened) <= 3, opened
    assert any("from_end=" in url for url in opened)
    text = log.inner_text()
    assert "line 199999 " in text and "line 000001 " not in text
    box = _scrolled(page)
    assert box["top"] + box["view"] >= box["height"] - 4
    if width == 390:
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")

    # When the view is scrolled to its top, the output just before it is loaded with one read
    first_line = min(int(word) for word in text.split() if len(word) == 6 and word.isdigit())
    mark = len(seen.urls)
    page.eval_on_selector("#run-log", "e => { e.scrollTop = 0; }")
    expect(log).to_contain_text(f"line {first_line - 1:06d} ")
    assert [u for u in seen.since(mark) if "before=" in u] and len(seen.since(mark)) <= 2
    assert _scrolled(page)["top"] > 0  # the lines that were in view stay in view

    # When "Jump to start" is pressed, the first line shows after one read
    mark = len(seen.urls)
    page.click("#log-start")
    expect(log).to_contain_text("line 000001 ")
    assert len(seen.since(mark)) == 1
    assert "the last line of the long log" not in log.inner_text()

    # And "Jump to end" goes back to the last line with one read
    mark = len(seen.urls)
    page.click("#log-end")
    expect(log).to_contain_text("the last line of the long log")
    assert "line 000001 " not in log.inner_text()
    assert len(seen.since(mark)) == 1

    # When the whole log is searched from the end of it, the first match (near its start) is loaded
    page.fill("#log-search", "marker-ALPHA")
    page.click("#log-next")
    current = page.locator("#run-log mark.current")
    expect(current).to_have_text("MARKER-alpha")
    expect(log).to_contain_text("line 000003 MARKER-alpha")
    assert "the last line of the long log" not in log.inner_text()
    assert page.get_attribute("#log-pause", "aria-pressed") == "true"  # reading a match pauses the follow
    assert any("/logs/search?" in u for u in seen.urls)

    # And "Next" goes on to the match 150,000 lines further, "Previous" back to the first one
    page.click("#log-next")
    expect(log).to_contain_text("line 150000 MARKER-alpha")
    expect(current).to_have_text("MARKER-alpha")
    assert current.evaluate("m => m.parentElement.textContent.includes('line 150000 MARKER')")
    assert "line 000003 " not in log.inner_text()
    assert current.evaluate(IN_VIEW), "the match is scrolled into the log's view"
    page.click("#log-next")
    expect(page.locator("#log-matches")).to_contain_text("No further match")
    page.click("#log-prev")
    page.click("#log-prev")
    expect(log).to_contain_text("line 000003 MARKER-alpha")
    assert current.evaluate(IN_VIEW), "the match is scrolled into the log's view"
