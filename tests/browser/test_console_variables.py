"""The console's Variables page, a task in Chinese with durations in units and its time zone, in
headless Chromium against a real ``ql3 serve`` (issue 30), at 1280 and 390 px."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from tests.support.console import Console, sign_in

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("browser")]
SECRET = "pt_key=console-secret-value;"


@pytest.mark.parametrize("width", [1280, 390])
def test_set_import_and_delete_variables_and_a_secret_is_never_shown(
    console: Console, open_page: Any, width: int
) -> None:
    page = open_page(width=width, height=844, is_mobile=width < 500, has_touch=width < 500)
    sign_in(page, console, console.owner, "#/variables")
    suffix = str(width)

    # When a secret and a plain variable are saved through the form
    page.fill("#variable-form input[name=var_name]", f"JD_COOKIE_{suffix}")
    page.fill("#variable-form textarea[name=var_value]", SECRET)
    page.fill("#variable-form input[name=var_note]", "账号一")
    page.check("#variable-form input[name=var_secret]")
    page.click("#variable-form button[type=submit]")
    expect(page.locator(f"tr[data-id=JD_COOKIE_{suffix}]")).to_be_visible()
    page.fill("#variable-form input[name=var_name]", f"REGION_{suffix}")
    page.fill("#variable-form textarea[name=var_value]", "a-long-value-" * 12)
    page.click("#variable-form button[type=submit]")
    # and two more are imported from KEY=VALUE lines
    page.fill("#variable-import textarea[name=import_text]", f"A_{suffix}=1\nB_{suffix}='two'\n")
    page.click("#variable-import button[type=submit]")
    expect(page.locator(f"tr[data-id=B_{suffix}]")).to_be_visible()

    # Then the secret shows as a badge, never its value, and the API agrees
    secret_row = page.locator(f"tr[data-id=JD_COOKIE_{suffix}]")
    expect(secret_row.locator(".badge-secret")).to_be_visible()
    assert SECRET not in page.content()
    listed = {v["name"]: v for v in console.api("GET", "/variables").json()["items"]}
    assert listed[f"JD_COOKIE_{suffix}"]["value"] is None and listed[f"A_{suffix}"]["value"] == "1"
    # and nothing on the page scrolls sideways at this width
    assert page.evaluate("document.documentElement.scrollWidth") <= width

    # When one is deleted after confirming
    page.locator(f"tr[data-id=A_{suffix}] button.danger").click()
    page.click("#confirm-yes")

    # Then it is gone
    expect(page.locator(f"tr[data-id=A_{suffix}]")).to_have_count(0)
    assert f"A_{suffix}" not in {v["name"] for v in console.api("GET", "/variables").json()["items"]}


def test_a_chinese_task_with_durations_and_its_zone(console: Console, open_page: Any) -> None:
    page = open_page()
    sign_in(page, console, console.owner, "#/tasks/new")

    page.fill("form.task input[name=name]", "京东 签到")
    page.fill("form.task textarea[name=command]", "true")
    page.fill("form.task input[name=cron]", "CRON_TZ=Asia/Shanghai 0 8 * * *")
    page.fill("form.task input[name=timeout]", "1h30m")
    page.fill("form.task input[name=grace]", "10s")
    page.click("form.task button[type=submit]")

    page.wait_for_selector("#task-tz")
    assert page.inner_text("#task-tz") == "(Asia/Shanghai)"
    expect(page.locator("#next-fires li .zone-time").first).to_contain_text("08:00 Asia/Shanghai")
    task = console.api("GET", "/tasks/京东 签到").json()
    assert (task["timeout_ms"], task["grace_ms"]) == (5_400_000, 10_000)
