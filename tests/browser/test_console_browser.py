"""The console as people use it, in headless Chromium against a real ``ql3 serve``.

Tests in this module share one server (distinct task names) and run in file order; the last one
drains the embedded worker.
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.support.console import Console, sign_in
from tests.support.waits import wait_for

# one worker runs the whole module, in file order, on its one server and browser
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("browser")]

DOCS_SHOT = Path(__file__).resolve().parents[2] / "docs" / "console-overview.png"
PAGES = (
    "#/",
    "#/tasks",
    "#/variables",
    "#/runs",
    "#/approvals",
    "#/actions",
    "#/cancellations",
    "#/workers",
    "#/tokens",
    "#/deps",
)
RUN_STATUSES = (
    "created",
    "queued",
    "dispatching",
    "running",
    "waiting_approval",
    "retry_wait",
    "lost",
    "succeeded",
    "failed",
    "cancelled",
    "timed_out",
)


def _wait_for_status(
    console: Console, run_id: str, statuses: set[str], timeout_s: float = 60
) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        run: dict[str, Any] = console.api("GET", f"/runs/{run_id}").json()
        return run if run["status"] in statuses else None

    return wait_for(reached, timeout_s, what=f"run {run_id} to reach {statuses}")


def _no_placeholder_text(page: Any, route: str) -> None:
    text = page.inner_text("body")
    for word in ("null", "undefined", "NaN", "[object Object]"):
        assert word not in text.split(), f"{route}: {word!r} shown"


def _task(console: Console, name: str, command: str, **spec: Any) -> dict[str, Any]:
    resp = console.api("POST", "/tasks", json={"name": name, "command": command, **spec})
    assert resp.status_code == 201, resp.text
    body: dict[str, Any] = resp.json()
    return body


def _start(console: Console, name: str) -> dict[str, Any]:
    resp = console.api("POST", f"/tasks/{name}/runs", json={})
    assert resp.status_code == 201, resp.text
    body: dict[str, Any] = resp.json()
    return body


def test_sign_in_lands_on_the_overview_with_identity_and_language(console: Console, open_page: Any) -> None:
    page = open_page(locale="zh-CN", color_scheme="dark")
    page.goto(f"{console.url}/")

    # A wrong token is refused and stays in the field, so a typo can be fixed
    open_page.allow(401, "/api/v1/projects")  # provoked: the wrong token below
    page.fill("#signin-token", "ql3_wrong")
    with page.expect_response("**/api/v1/projects?limit=200") as answer:
        page.click("form.signin button[type=submit]")
    assert answer.value.status == 401
    page.wait_for_selector("#status.error")
    assert page.input_value("#signin-token") == "ql3_wrong"

    page.fill("#signin-token", console.owner)
    page.click("form.signin button[type=submit]")
    page.wait_for_selector("#signout:not([hidden])")

    # Then the overview is the landing page, in Chinese (from navigator.language), dark, with the role shown
    assert page.locator("main h1").inner_text() == "概览"
    assert "admin" in page.inner_text("#whoami")
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(18, 20, 24)"
    page.click("#lang")
    assert page.locator("main h1").inner_text() == "Overview"
    assert page.locator("nav a[data-page=runs]").inner_text() == "Runs"


def test_create_a_task_in_the_ui_run_it_and_watch_its_live_log_grow(console: Console, open_page: Any) -> None:
    page = open_page()
    sign_in(page, console, console.owner, "#/tasks")

    # When a task is created through the form
    page.click("a[href='#/tasks/new']")
    page.fill("form.task input[name=name]", "ticker")
    page.fill(
        "form.task textarea[name=command]",
        'for i in $(seq 1 60); do echo "line $i"; '
        "printf '\\033[32mgreen %s\\033[0m\\n' $i; sleep 0.4; done",
    )
    page.fill("form.task textarea[name=env]", "GREETING=hello")
    page.click("form.task button[type=submit]")

    # Then its page shows the command (the owner may edit it) and the env key, never the value
    page.wait_for_url("**/#/tasks/ticker")
    page.wait_for_selector("pre.command")
    assert "seq 1 60" in page.inner_text("pre.command")
    assert "GREETING" in page.inner_text("main") and "hello" not in page.inner_text("main")

    # When it is run now, the run page opens at its own address and the log grows while it runs
    page.click("main button.primary:has-text('Run now')")
    page.wait_for_url("**/#/runs/*")
    expect(page.locator("#run-log")).to_contain_text("line 2")
    first = page.inner_text("#run-log")
    seen = max(int(w) for w in re.findall(r"line (\d+)", first))
    assert seen < 60, "the run ended before the page showed it: no live follow to observe"
    later = min(seen + 3, 60)
    expect(page.locator("#run-log")).to_contain_text(f"line {later}\n", timeout=60_000)
    assert len(page.inner_text("#run-log")) > len(first)
    # ANSI colours are rendered as classes, the escape bytes never reach the page
    assert page.locator("#run-log span.ansi-fg-32").count() > 0
    assert "\x1b" not in page.inner_text("#run-log") and "[32m" not in page.inner_text("#run-log")

    # Searching the log highlights matches and pauses the follow
    page.fill("#log-search", "line 1")
    page.wait_for_selector("#run-log mark")
    assert "matches" in page.inner_text("#log-matches")
    page.click("button:has-text('Next')")
    assert page.get_attribute("#log-pause", "aria-pressed") == "true"


def test_edit_publishes_a_revision_and_shows_what_changed(console: Console, open_page: Any) -> None:
    _task(console, "editable", "echo one", timeout_ms=60_000)
    page = open_page()
    sign_in(page, console, console.owner, "#/tasks/editable/edit")

    page.fill("form.task textarea[name=command]", "echo two")
    page.click("form.task button[type=submit]")

    page.wait_for_url("**/#/tasks/editable")
    page.wait_for_selector("text=Revision 2 published: command")
    changes = page.locator("#task-revs + ol li").first.inner_text()
    assert "echo one" in changes and "echo two" in changes
    assert console.api("GET", "/tasks/editable").json()["revision"] == 2


def test_cancel_a_run_after_confirming(console: Console, open_page: Any) -> None:
    _task(console, "sleeper", "echo started; sleep 120")
    run = _start(console, "sleeper")
    _wait_for_status(console, run["id"], {"running"})
    page = open_page()
    sign_in(page, console, console.owner, f"#/runs/{run['id']}")

    # Declining the confirmation changes nothing
    page.click("#run-cancel")
    page.click("#confirm-no")
    assert console.api("GET", f"/runs/{run['id']}").json()["cancel_requested_at_ms"] is None

    page.click("#run-cancel")
    page.click("#confirm-yes")

    page.wait_for_selector("main h1 .badge-cancelled", timeout=60_000)
    assert console.api("GET", f"/runs/{run['id']}").json()["status"] == "cancelled"


def test_a_second_user_approves_and_the_requester_cannot(console: Console, open_page: Any) -> None:
    _task(console, "deploy", "echo deploying", approval="required", env={"TARGET": "prod"})

    # A second admin asks for a run from the task page: no run yet, an approval request (the owner
    # issued the approver's token, so the owner's own requests are not the approver's to decide)
    made = console.api("POST", "/tokens", json={"role": "admin", "name": "adam"})
    assert made.status_code == 201, made.text
    owner = open_page()
    sign_in(owner, console, made.json()["token"], "#/tasks/deploy")
    owner.click("main button.primary:has-text('Run now')")
    owner.wait_for_url("**/#/approvals")
    row = owner.locator("table.cards tbody tr").first
    row.wait_for()
    assert row.locator("[data-action=approve]").count() == 0
    assert "Your own request" in row.inner_text()

    # The task is edited after the request: the request stays bound to revision 1
    pending = console.api("GET", "/approvals", params={"state": "pending"}).json()["items"]
    assert [a["task_revision"] for a in pending] == [1]
    requester = console.api("GET", f"/principals/{pending[0]['requested_by']}").json()["name"]
    edited = console.api("PATCH", "/tasks/deploy", json={"command": "echo deploying v2"})
    assert edited.status_code == 200 and edited.json()["revision"] == 2

    # An approver sees who asked (by name) and what will run (the bound revision), and approves it
    approver = open_page()
    sign_in(approver, console, console.approver, "#/approvals")
    row = approver.locator("table.cards tbody tr").first
    expect(row.locator(f"[data-principal='{pending[0]['requested_by']}']")).to_have_text(requester)
    row.locator("summary").click()
    row.locator("pre.command").wait_for()
    assert row.locator("[data-bound-revision]").get_attribute("data-bound-revision") == "1"
    assert "echo deploying" in row.inner_text() and "TARGET" in row.inner_text()
    assert "v2" not in row.locator("pre.command").inner_text()
    assert "prod" not in row.inner_text().replace("echo deploying", "")
    row.locator("[data-action=approve]").click()
    approver.wait_for_selector("text=Approved.")

    deadline = time.monotonic() + 120  # the approved-action loop creates the run; a loaded box is slow
    while time.monotonic() < deadline:
        runs = console.api("GET", "/runs", params={"task": "deploy", "trigger": "approval"}).json()["items"]
        if runs:
            break
        time.sleep(0.2)
    assert runs and runs[0]["trigger"] == "approval"


def test_a_blocked_action_says_it_is_final_and_offers_to_ask_again(console: Console, open_page: Any) -> None:
    # Given an approved run.create action (approved through the API)
    _task(console, "gated-again", "true", approval="required")
    # (requested by the operator: the approver's token was issued by the owner, docs/security.md)
    requested = console.api("POST", "/tasks/gated-again/runs", token=console.operator, json={})
    assert requested.status_code == 202, requested.text
    approval_id = requested.json()["approval"]["id"]
    decided = console.api(
        "POST", f"/approvals/{approval_id}/approve", token=console.approver, json={"reason_code": "approved"}
    )
    assert decided.status_code == 200, decided.text

    def mine() -> dict[str, Any] | None:
        items = console.api("GET", "/actions").json()["items"]
        return next((a for a in items if a["approval_request_id"] == approval_id), None)

    action: dict[str, Any] = wait_for(mine, 60)
    # ...that the server reports blocked (its handler refused the plan): the page shows the API's answer
    blocked = {**action, "status": "blocked", "effective_status": "blocked", "result_code": "invalid_plan"}
    page = open_page()
    page.route(
        f"**/api/v1/projects/default/actions/{action['dispatch_id']}",
        lambda route: route.fulfill(status=200, json=blocked),
    )
    sign_in(page, console, console.owner, f"#/actions/{action['dispatch_id']}")

    # Then the page says it is final and never retried, and what to do instead
    box = page.locator("#action-blocked")
    expect(box.locator("h2")).to_have_text("Blocked: this is final")
    expect(box).to_contain_text("never retried")
    expect(box).to_contain_text("To run gated-again after all, start it again")
    # And the next step is one click: a new approval request
    page.click("#action-start-again")
    page.wait_for_url("**/#/approvals")
    pending = console.api("GET", "/approvals", params={"state": "pending"}).json()["items"]
    again = [a for a in pending if a["action_ref"] == action["action_ref"] and a["id"] != approval_id]
    assert len(again) == 1, pending


def test_a_rejection_keeps_its_note_and_names_the_decider(console: Console, open_page: Any) -> None:
    _task(console, "risky", "echo risky", approval="required")
    requested = console.api("POST", "/tasks/risky/runs", token=console.operator, json={})
    assert requested.status_code == 202, requested.text
    approval_id = requested.json()["approval"]["id"]

    approver = open_page()
    sign_in(approver, console, console.approver, "#/approvals")
    row = approver.locator("table.cards tbody tr").first
    row.locator("select").select_option("bad_timing")
    row.locator("input[type=text]").fill("Wait for the freeze — ask Ada.")
    row.locator("[data-action=reject]").click()
    approver.wait_for_selector("text=Rejected.")

    stored = console.api("GET", f"/approvals/{approval_id}").json()
    assert (stored["state"], stored["reason_code"], stored["note"]) == (
        "rejected",
        "bad_timing",
        "Wait for the freeze — ask Ada.",
    )
    # the owner sees the note and the decider by name in the recent decisions
    owner = open_page()
    sign_in(owner, console, console.owner, "#/approvals")
    decided = owner.locator("section[aria-labelledby=ap-decided] tbody tr", has_text="risky").first
    expect(decided.locator(".note")).to_have_text("Wait for the freeze — ask Ada.")
    expect(decided.locator(f"[data-principal='{stored['decided_by']}']")).to_have_text("ada")


def test_filter_runs_by_status_and_open_a_run_by_its_url(console: Console, open_page: Any) -> None:
    _task(console, "failer", "echo nope; exit 3")
    failed = _start(console, "failer")
    _wait_for_status(console, failed["id"], {"failed"})
    page = open_page()
    sign_in(page, console, console.owner, "#/runs")

    page.select_option("select[name=status]", "failed")

    page.wait_for_url("**/#/runs?status=failed")
    page.wait_for_selector(f"tr[data-id='{failed['id']}']")
    badges = page.locator("table.cards tbody .badge").all_inner_texts()
    assert badges and set(badges) == {"failed"}

    # The run's own address opens it directly, in a fresh session, after signing in
    other = open_page()
    sign_in(other, console, console.owner, f"#/runs/{failed['id']}")
    other.wait_for_selector("main h1 .badge-failed")
    expect(other.locator("#run-log")).to_contain_text("nope")
    assert "failer" in other.inner_text("main")
    with other.expect_download() as download:
        other.click("#log-download")
    assert Path(download.value.path()).read_text() == "nope\n"

    # Re-run starts a new run of the same task, marked as a retry of this one
    other.click("#run-rerun")
    other.wait_for_url(lambda url: "#/runs/" in url and failed["id"] not in url)
    rerun_id = other.url.rsplit("/", 1)[1]
    assert console.api("GET", f"/runs/{rerun_id}").json()["trigger"] == "retry"
    page.select_option("select[name=trigger]", "retry")
    page.wait_for_selector(f"tr[data-id='{rerun_id}']")


def test_a_run_the_dispatcher_cannot_place_says_what_it_saw(console: Console, open_page: Any) -> None:
    # Given a run whose task requires another executor than its own: the dispatcher never places it
    _task(console, "misplaced", "true", require={"executor": "container"})
    run = _start(console, "misplaced")
    wait_for(lambda: console.api("GET", f"/runs/{run['id']}").json()["dispatch_reasons"])
    try:
        page = open_page()
        sign_in(page, console, console.owner, f"#/runs/{run['id']}")

        # Then its page says what the dispatcher saw, and when
        box = page.locator("#run-dispatch-reasons")
        expect(box).to_be_visible()
        expect(box.locator("h2")).to_have_text("Dispatcher saw")
        expect(box.locator("li[data-value=plans_unavailable]")).to_contain_text("cannot be placed")
        expect(box.locator("li[data-value=plans_unavailable]")).to_contain_text("last seen")
    finally:
        assert console.api("POST", f"/runs/{run['id']}/cancel").status_code in (200, 202)


def test_a_viewer_sees_no_command_and_no_actions(console: Console, open_page: Any) -> None:
    _task(console, "guarded", "echo hidden; exit 3", cwd="/tmp")
    page = open_page()
    sign_in(page, console, console.viewer, "#/tasks/guarded")

    page.wait_for_selector("main h1")
    assert "exit 3" not in page.inner_text("main") and "/tmp" not in page.inner_text("main")
    assert "Hidden for your role" in page.inner_text("main")
    assert page.locator("main button").count() == 0
    assert "viewer" in page.inner_text("#whoami")


def test_a_task_page_lists_its_skipped_occurrences(console: Console, open_page: Any) -> None:
    task = _task(console, "skippy", "true", cron="* * * * *")
    # A record as the scheduler writes it (tests/contract/test_cron_occurrences.py makes real ones).
    with sqlite3.connect(console.server.home / "ql3.db") as conn:
        conn.execute(
            "INSERT INTO cron_skips (task_id, occurrence_ms, project_id, task_revision, last_occurrence_ms,"
            " occurrences, reason, created_at_ms) VALUES (?, ?, ?, 1, ?, 3, 'misfire', ?)",
            (task["id"], 1_800_000_000_000, task["project_id"], 1_800_000_120_000, 1_800_000_180_000),
        )
    page = open_page()
    sign_in(page, console, console.owner, "#/tasks/skippy")

    page.wait_for_selector("#skipped-occurrences")
    text = page.inner_text("#skipped-occurrences")
    assert "misfire" in text and "(3)" in text and "r1" in text


@pytest.mark.parametrize("width", [390])
def test_narrow_viewport_has_no_horizontal_overflow_on_any_page(
    console: Console, open_page: Any, width: int
) -> None:
    _task(console, "narrow", "printf 'a long line without any break %.0s' $(seq 1 40); echo")
    run_id = _start(console, "narrow")["id"]
    _wait_for_status(console, run_id, {"succeeded"})
    page = open_page(width=width, height=844, is_mobile=True, has_touch=True)
    sign_in(page, console, console.owner)

    for route in (*PAGES, "#/tasks/narrow", f"#/runs/{run_id}", "#/tasks/new"):
        page.goto(f"{console.url}/{route}")
        page.wait_for_selector("main h1")
        page.wait_for_load_state("networkidle")
        overflow = page.evaluate("document.documentElement.scrollWidth")
        assert overflow <= width, f"{route}: the page is {overflow} px wide"
        # lists are cards here: nothing in them needs a sideways scroll either
        boxes = page.eval_on_selector_all(".scroll", "els => els.map(e => e.scrollWidth - e.clientWidth)")
        assert all(extra <= 1 for extra in boxes), f"{route}: a list scrolls sideways by {max(boxes)} px"
        _no_placeholder_text(page, route)
    # runs are cards whose status is on screen without scrolling sideways
    page.goto(f"{console.url}/#/runs")
    page.wait_for_selector("table.cards tbody tr[data-id] .badge", state="visible")
    status = page.locator("table.cards tbody tr[data-id] .badge").first.bounding_box()
    assert status is not None and status["x"] + status["width"] <= width
    # the header collapses behind the menu button, and opens on demand
    assert not page.is_visible("nav")
    page.click("#menu")
    assert page.is_visible("nav a[data-page=runs]")


def test_each_page_renders_without_errors_and_the_overview_is_photographed(
    console: Console, open_page: Any
) -> None:
    _task(console, "nightly-backup", "echo backup", cron="0 3 * * *")
    _task(console, "report", "echo report", cron="*/30 * * * *")
    _task(console, "crawler", "sleep 90")
    _start(console, "crawler")
    page = open_page(width=1280, height=800, color_scheme="light", locale="en-US")
    sign_in(page, console, console.owner)
    for route in PAGES:
        page.goto(f"{console.url}/{route}")
        page.wait_for_selector("main h1")
        page.wait_for_load_state("networkidle")
        _no_placeholder_text(page, route)
    page.goto(f"{console.url}/#/tasks/nightly-backup")
    expect(page.locator("#next-fires li")).to_have_count(5)
    page.goto(f"{console.url}/#/")
    page.wait_for_selector("#ov-running")
    page.wait_for_load_state("networkidle")
    assert page.locator("#approvals-badge").is_hidden() or page.inner_text("#approvals-badge").isdigit()
    if os.environ.get("QL3_WRITE_DOCS_SCREENSHOT") == "1":
        page.screenshot(path=str(DOCS_SHOT))


def test_an_unreachable_server_is_said_not_shown_as_stale_green(console: Console, open_page: Any) -> None:
    page = open_page()
    sign_in(page, console, console.owner)
    page.wait_for_selector("#ov-running")
    open_page.expect_offline()

    page.context.set_offline(True)
    page.wait_for_selector("#offline", state="visible", timeout=30_000)  # the next refresh fails

    page.context.set_offline(False)
    page.wait_for_selector("#offline", state="hidden", timeout=30_000)


def test_statuses_event_types_and_triggers_are_labelled_in_chinese_at_390_px(
    console: Console, open_page: Any
) -> None:
    _task(console, "zh-exit", "echo 出错了; exit 2")
    run = _start(console, "zh-exit")
    _wait_for_status(console, run["id"], {"failed"})
    page = open_page(width=390, height=844, is_mobile=True, has_touch=True, locale="zh-CN")
    sign_in(page, console, console.owner, "#/runs?status=failed")

    # The list: the status and the trigger are Chinese labels; the API value stays in data-value
    row = page.locator(f"tr[data-id='{run['id']}']")
    expect(row.locator(".badge")).to_have_text("失败")
    assert row.locator(".badge").get_attribute("data-value") == "failed"
    expect(row).to_contain_text("手动")
    # The status filter sends the API's values under Chinese labels, one for every run status
    options = page.locator("select[name=status] option")
    values = options.evaluate_all("os => os.map(o => o.value)")
    labels = options.evaluate_all("os => os.map(o => o.textContent)")
    assert set(RUN_STATUSES) <= set(values)
    for value, label in zip(values, labels, strict=True):
        assert not re.search(r"[a-z]", label), f"status {value!r} is labelled {label!r}"
    page.select_option("select[name=status]", "succeeded")
    page.wait_for_url("**/#/runs?status=succeeded")

    # The run: status badge and every event type in Chinese, the type itself kept in data-type
    page.goto(f"{console.url}/#/runs/{run['id']}")
    expect(page.locator("main h1 .badge")).to_have_text("失败")
    expect(page.locator("#run-events li[data-type='run.created'] .event-type")).to_have_text("运行已创建")
    expect(page.locator("#run-events li[data-type='run.failed']")).to_have_count(1)
    events = page.locator("#run-events li")
    for i in range(events.count()):
        kind = events.nth(i).get_attribute("data-type")
        label = events.nth(i).locator(".event-type").inner_text()
        assert kind and not re.search(r"[a-z]", label), f"event {kind!r} is labelled {label!r}"
    main = page.inner_text("main").replace("zh-exit", "")
    english = [s for s in RUN_STATUSES if re.search(rf"\b{s}\b", main)]
    assert english == [], f"English status words on the run page: {english}"
    assert page.evaluate("document.documentElement.scrollWidth") <= 390

    # Workers, approvals and actions label their states too
    page.goto(f"{console.url}/#/workers")
    expect(page.locator("main .badge[data-value=online]")).to_have_text("在线")
    page.goto(f"{console.url}/#/actions")
    page.wait_for_selector("main h1")
    assert page.locator("main h1").inner_text() == "已批准的操作"


def test_drain_a_worker_from_the_ui(console: Console, open_page: Any) -> None:
    page = open_page()
    sign_in(page, console, console.owner, "#/workers")

    page.click("main button.danger:has-text('Drain')")
    page.click("#confirm-yes")

    page.wait_for_selector("main .badge-draining")
    workers = console.api("GET", "/workers").json()["items"]
    assert [w["status"] for w in workers] == ["draining"]


def test_identity_and_tokens_pages_list_and_revoke_real_tokens(console: Console, open_page: Any) -> None:
    # Given a token made for a bot
    made = console.api("POST", "/tokens", json={"role": "operator", "name": "deploy-bot"})
    assert made.status_code == 201, made.text
    bot_token = made.json()["token"]
    assert console.api("GET", "/tasks", token=bot_token).status_code == 200

    # When the owner opens the tokens page and revokes it
    page = open_page()
    sign_in(page, console, console.owner, "#/tokens")
    who = page.inner_text("#whoami")
    assert who.startswith("Signed in as ") and who.endswith("(admin)"), who
    row = page.locator("table.cards tbody tr", has_text="deploy-bot").first
    expect(row).to_contain_text("operator")
    row.locator("button:has-text('Revoke')").click()
    page.click("#confirm-yes")

    # Then the page shows it revoked, and the bot's token is refused from the next request on
    expect(row).to_contain_text("revoked")
    assert console.api("GET", "/tasks", token=bot_token).status_code == 401


def test_without_the_token_list_the_tokens_page_says_so(console: Console, open_page: Any) -> None:
    # A server without /whoami and GET .../tokens (an older one) answers 404 there
    page = open_page()
    missing = {"status": 404, "json": {"error": {"code": "not_found", "message": "Not Found"}}}
    page.route("**/api/v1/whoami", lambda route: route.fulfill(**missing))
    page.route("**/api/v1/projects/default/tokens", lambda route: route.fulfill(**missing))
    sign_in(page, console, console.owner, "#/tokens")

    # Then the page says so, and the role comes from the project list
    page.wait_for_selector("#tokens-missing")
    assert page.inner_text("#whoami") == "Signed in (admin)"
