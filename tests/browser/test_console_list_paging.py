"""The console's task list past one page: server-side search and keyset pages whose state lives in the
URL hash (reload and back keep it), the runs page's typed task filter and the overview's next cron
fires, with 230 tasks made through the API (issue 32), at 1280 and 390 px."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.support.console import Console, sign_in

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("browser")]
TASKS = 230


@pytest.fixture(scope="module")
def many_tasks(console: Console) -> list[str]:
    names = [f"pg-{i:03d}" for i in range(TASKS)]
    for name in names:
        body: dict[str, Any] = {"name": name, "command": "true"}
        if name == "pg-229":  # the last by name: no first page of the list would show its schedule
            body["cron"] = "0 3 * * *"
        resp = console.api("POST", "/tasks", json=body)
        assert resp.status_code == 201, resp.text
    return names


def _names(page: Any) -> list[str]:
    return [str(n) for n in page.locator("#view table tbody tr td:first-child a").all_inner_texts()]


@pytest.mark.parametrize("width", [1280, 390])
def test_tasks_page_and_search_and_the_url_keeps_the_state(
    console: Console, open_page: Any, many_tasks: list[str], width: int
) -> None:
    page = open_page(width=width, height=844, is_mobile=width < 500, has_touch=width < 500)
    sign_in(page, console, console.owner, "#/tasks")
    pager = page.locator("nav.pager")

    # Then the first page shows the first 50 tasks by name, with a next page and no previous one
    expect(page.locator("#view table tbody tr")).to_have_count(50)
    assert _names(page) == many_tasks[:50]
    expect(pager.get_by_role("link", name="Previous page")).to_have_count(0)

    # When the next page is opened
    pager.get_by_role("link", name="Next page").click()
    expect(page.locator("#view table tbody tr").first).to_contain_text("pg-050")
    # Then its cursor is in the URL, and a reload shows the same page
    assert "cursor=pg-049" in page.url
    page.reload()
    expect(page.locator("#view table tbody tr").first).to_contain_text("pg-050")
    assert _names(page) == many_tasks[50:100]

    # When the previous page is opened, the first page is back
    page.locator("nav.pager").get_by_role("link", name="Previous page").click()
    expect(page.locator("#view table tbody tr").first).to_contain_text("pg-000")
    assert _names(page) == many_tasks[:50]
    assert "before=pg-050" in page.url

    # When a search is typed and submitted
    page.fill("form.search input[name=q]", "PG-22")
    page.locator("form.search button[type=submit]").click()
    # Then the server's matches over all 230 tasks show, case ignored, and no pager is needed
    expect(page.locator("#view table tbody tr")).to_have_count(10)
    assert _names(page) == many_tasks[220:230]
    expect(page.locator("nav.pager")).to_have_count(0)
    assert re.search(r"[?&]q=PG-22(&|$)", page.url)
    # and a reload keeps the search in the box and the list
    page.reload()
    expect(page.locator("#view table tbody tr")).to_have_count(10)
    expect(page.locator("form.search input[name=q]")).to_have_value("PG-22")
    # and Back returns to the unsearched first page
    page.go_back()
    expect(page.locator("#view table tbody tr")).to_have_count(50)
    assert _names(page) == many_tasks[:50]
    # and nothing on the page scrolls sideways at this width
    assert page.evaluate("document.documentElement.scrollWidth") <= width


def test_runs_task_filter_takes_any_of_many_tasks_and_the_overview_shows_a_late_schedule(
    console: Console, open_page: Any, many_tasks: list[str]
) -> None:
    # Given a run of a task far past the first 200 by name
    resp = console.api("POST", "/tasks/pg-215/runs", json={})
    assert resp.status_code == 201, resp.text
    page = open_page()
    sign_in(page, console, console.owner, "#/runs")

    # When part of its name is typed into the task filter, the server suggests it
    picker = page.locator("form.filters input[name=task]")
    picker.fill("pg-21")
    expect(page.locator("form.filters datalist option[value='pg-215']")).to_have_count(1)
    # and when it is chosen, the list shows only its runs, and the URL keeps the filter
    picker.fill("pg-215")
    picker.dispatch_event("change")
    expect(page.locator("#view table tbody tr")).to_have_count(1)
    expect(page.locator("#view table tbody tr").first).to_contain_text("pg-215")
    assert "task=pg-215" in page.url
    page.reload()
    expect(page.locator("form.filters input[name=task]")).to_have_value("pg-215")

    # Then the overview's next cron fires card shows the one scheduled task, the last by name
    page.goto(f"{console.url}/#/")
    expect(page.locator("#ov-fires + ul a")).to_have_text(["pg-229"])
