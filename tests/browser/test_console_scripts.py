"""The Scripts and Subscriptions pages in headless Chromium against a real ``ql3 serve``: write a
script in the editor (line numbers, colouring), run it and see its log, read a revision's diff; add a
subscription to a local bare git repository and sync it; both pages fit a 390 px phone."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.support.console import Console, sign_in

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("browser")]


def _bare_repository(root: Path) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "PATH": os.environ["PATH"],
    }
    work = root / "work"
    work.mkdir()
    (work / "daily.sh").write_text("# cron: 0 7 * * *\necho daily\n")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "one"]):
        subprocess.run(["git", *args], cwd=work, env=env, check=True, capture_output=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(root / "r.git")], env=env, check=True)
    return f"file://{root / 'r.git'}"


def test_write_a_script_run_it_and_read_its_diff(console: Console, open_page: Any) -> None:
    page = open_page(width=1280, height=800, locale="en-US")
    open_page.allow(404, "/api/v1/projects/default/scripts/hello.py")  # a new script: not there yet
    sign_in(page, console, console.owner, "#/scripts")

    page.fill("#new-script-path", "hello.py")
    page.click("form.inline button[type=submit]")
    page.wait_for_selector("#script-content")
    page.fill("#script-content", "# greet\nprint('hi from the editor')\n")
    expect(page.locator(".editor .gutter")).to_have_text("1\n2\n3")
    expect(page.locator(".editor .shade .tk-comment")).to_have_text("# greet")
    expect(page.locator(".editor .shade .tk-string")).to_have_text("'hi from the editor'")
    page.click("#script-save")
    page.wait_for_url("**/#/scripts/hello.py")
    expect(page.locator("#status")).to_contain_text("revision 1")

    page.fill("#script-content", "# greet\nprint('hi again')\n")
    page.click("#script-save")
    expect(page.locator("#script-history tbody tr")).to_have_count(2)
    page.click("#script-history tbody tr[data-id='2'] button")
    expect(page.locator("#script-diff .del")).to_have_text("-print('hi from the editor')")
    expect(page.locator("#script-diff .add")).to_have_text("+print('hi again')")

    page.click("#script-run")
    page.wait_for_url("**/#/runs/*")
    expect(page.locator("#run-log")).to_contain_text("hi again", timeout=30_000)


def test_add_and_sync_a_subscription(console: Console, open_page: Any, tmp_path: Path) -> None:
    url = _bare_repository(tmp_path)
    page = open_page(width=1280, height=800, locale="en-US")
    sign_in(page, console, console.owner, "#/subscriptions")

    page.fill("#sub-name", "upstream")
    page.fill("#sub-repo", url)
    page.click("form.stack button[type=submit]")
    row = page.locator("tr[data-id='upstream']")
    expect(row).to_contain_text(url)
    # The sync is a run (of the task ql3-sync-upstream): its page streams git's output.
    row.locator("button:has-text('Sync now')").click()
    page.wait_for_url("**/#/runs/*")
    expect(page.locator("#run-log")).to_contain_text("created task daily.sh", timeout=30_000)
    run_id = page.url.rsplit("/", 1)[1]
    assert console.api("GET", "/tasks/daily.sh").json()["cron"] == "0 7 * * *"
    # The subscription's last sync says how it went and links its run.
    page.goto(f"{console.url}/#/subscriptions")
    page.locator("tr[data-id='upstream'] button:has-text('Last sync')").click()
    expect(page.locator("#sync-log h2")).to_have_text("Sync succeeded")
    expect(page.locator(f"#sync-log a[href='#/runs/{run_id}']")).to_be_visible()


def test_scripts_pages_fit_a_phone(console: Console, open_page: Any) -> None:
    # (its own script: the tests of this module may run on other workers, each with its own server)
    made = console.api("PUT", "/scripts/phone.py", json={"content": "print('phone')\n"})
    assert made.status_code in (200, 201), made.text
    page = open_page(width=390, height=844, is_mobile=True, has_touch=True, locale="zh-CN")
    sign_in(page, console, console.owner, "#/scripts")
    for route in ("#/scripts", "#/scripts/phone.py", "#/subscriptions"):
        page.goto(f"{console.url}/{route}")
        page.wait_for_selector("main h1")
        page.wait_for_load_state("networkidle")
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"{route}: the page is {width} px wide"
    assert "订阅" in page.inner_text("main h1")
