"""The web console: served with a strict CSP, self-contained, and never renders API data as markup."""

from __future__ import annotations

import re
from importlib import resources
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # the fixture imports it (and silences its deprecation notice)
    from fastapi.testclient import TestClient

STATIC = resources.files("ql3.console").joinpath("static")
FILES = ("index.html", "app.js", "admin.js", "app.css")


def source(name: str) -> str:
    return STATIC.joinpath(name).read_text(encoding="utf-8")


def csp_directives(header: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for part in header.split(";"):
        name, _, value = part.strip().partition(" ")
        if name:
            found[name] = value
    return found


def test_index_is_html_under_a_strict_content_security_policy(client: TestClient) -> None:
    resp = client.get("/")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/html")
    policy = csp_directives(resp.headers["content-security-policy"])
    assert policy["default-src"] == "'self'"
    assert "unsafe-inline" not in resp.headers["content-security-policy"]
    assert "unsafe-eval" not in resp.headers["content-security-policy"]
    assert resp.headers["x-content-type-options"] == "nosniff"
    # admin.js registers its pages before app.js renders the first one
    assert '<script src="/console/admin.js"></script>\n<script src="/console/app.js"></script>' in resp.text
    assert 'href="/console/app.css"' in resp.text


@pytest.mark.parametrize(
    ("path", "media_type", "name"),
    [
        ("/console/app.js", "text/javascript", "app.js"),
        ("/console/admin.js", "text/javascript", "admin.js"),
        ("/console/app.css", "text/css", "app.css"),
    ],
)
def test_script_and_style_are_served(client: TestClient, path: str, media_type: str, name: str) -> None:
    resp = client.get(path)
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith(media_type)
    assert "default-src 'self'" in resp.headers["content-security-policy"]
    assert resp.text == source(name)


def test_every_asset_the_page_references_is_served(client: TestClient) -> None:
    refs = [r for r in re.findall(r'(?:src|href)="([^"]+)"', source("index.html")) if not r.startswith("#/")]
    assert refs, "the page references its script and style"
    for ref in refs:
        assert ref.startswith("/"), ref  # same origin only
        assert client.get(ref).status_code == 200, ref


def test_the_console_needs_no_token_but_the_api_does(client: TestClient) -> None:
    assert client.get("/").status_code == 200
    assert client.get("/api/v1/projects").status_code == 401


@pytest.mark.parametrize("name", FILES)
def test_static_files_fetch_nothing_from_the_network(name: str) -> None:
    text = source(name)
    assert not re.search(r"https?://", text, re.IGNORECASE)
    assert "//cdn" not in text and "@import" not in text


def test_the_page_has_nothing_inline_the_policy_would_block() -> None:
    html = source("index.html")
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), "inline script"
    assert "<style" not in html
    assert not re.search(r"\sstyle=", html), "inline style attribute"
    assert not re.search(r"\son[a-z]+=", html, re.IGNORECASE), "inline event handler"


@pytest.mark.parametrize("name", ["app.js", "admin.js"])
def test_script_never_renders_text_as_markup(name: str) -> None:
    js = source(name)
    sinks = (
        r"\.innerHTML\b",
        r"\.outerHTML\b",
        r"insertAdjacentHTML",
        r"document\.write",
        r"\beval\s*\(",
        r"new\s+Function\b",
        r"createContextualFragment",
        r"DOMParser",
    )
    for sink in sinks:
        assert not re.search(sink, js), sink
    # app.js's el() writes text through textContent; admin.js builds its nodes with that el()
    assert "textContent" in js if name == "app.js" else "const { t, lbl, el, put," in js


def test_script_calls_only_the_api_of_its_own_origin() -> None:
    js = source("app.js")
    assert re.findall(r"fetch\(([^,]+),", js) == ['"/api/v1" + path']
    assert '"Authorization": "Bearer "' in js


def test_the_token_lives_only_for_the_session_and_preferences_hold_no_secret() -> None:
    js = source("app.js")
    assert "const session = window.sessionStorage;" in js and "const prefs = window.localStorage;" in js
    # localStorage (kept across sessions) holds only the language, time zone and theme choices
    assert set(re.findall(r'prefs\.setItem\("([^"]+)"', js)) == {"ql3.lang", "ql3.tz", "ql3.theme"}
    # ...and a hint that a cookie session may exist ("1"): the session's secret is an HttpOnly cookie
    # and its CSRF token lives in memory only
    assert re.findall(r"prefs\.setItem\((\w+), ([^)]+)\)", js) == [("SESSION_HINT", '"1"')]
    assert 'const SESSION_HINT = "ql3.cookie-session";' in js
    assert not re.findall(r"(?:session|prefs)\.setItem\([^)]*csrf", js)
    assert re.findall(r"(\w+)\.setItem\(TOKEN_KEY", js) == ["session", "session"]
    assert "localStorage" not in js.replace("const prefs = window.localStorage;", "")
    admin = source("admin.js")
    assert "Storage" not in admin and "fetch(" not in admin  # admin.js calls the API through app.js


def test_log_text_is_parsed_for_colours_into_fixed_class_names() -> None:
    js = source("app.js")
    # a segment's class is built only from SGR numbers, never from the log's own characters
    assert re.findall(r'out\.push\("ansi-[a-z]+-?" ?\+? ?[a-z.]*\)?', js)
    assert "span.textContent = seg.text" in js
    css = source("app.css")
    for code in (31, 32, 33, 34):
        assert f".ansi-fg-{code}" in css


def test_the_tab_icon_is_served_so_no_page_load_has_a_404(client: TestClient) -> None:
    resp = client.get("/favicon.ico")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("image/svg+xml")
    assert 'href="/favicon.ico"' in source("index.html")


def test_every_element_the_script_looks_up_exists_in_the_page() -> None:
    html_ids = set(re.findall(r'\bid="([^"]+)"', source("index.html")))
    used = set(re.findall(r'\$\("([^"]+)"\)', source("app.js") + source("admin.js")))
    assert used, "the script looks elements up by id"
    assert used <= html_ids, sorted(used - html_ids)


def test_the_api_routes_the_console_uses_exist(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    js = source("app.js")
    used = {
        "/api/v1/projects": '"/projects?limit=200"',
        "/api/v1/projects/{project}/tasks": 'get(pp(listQuery("/tasks", params, TASK_PAGE)))',
        "/api/v1/projects/{project}/next-fires": '"/next-fires?limit=6"',
        "/api/v1/projects/{project}/tasks/{task}": '"/tasks/" + enc(task.id)',
        "/api/v1/projects/{project}/tasks/{task}/revisions": '"/revisions"',
        "/api/v1/projects/{project}/tasks/{task}/enable": '"/enable"',
        "/api/v1/projects/{project}/tasks/{task}/disable": '"/disable"',
        "/api/v1/projects/{project}/tasks/{task}/runs": '"/runs"), rerunOf',
        "/api/v1/projects/{project}/runs": '"/runs?" + q.toString()',
        "/api/v1/projects/{project}/runs/{run_id}": '"/runs/" + enc(runId)',
        "/api/v1/projects/{project}/runs/{run_id}/events": '"/events?after="',
        "/api/v1/projects/{project}/runs/{run_id}/logs": 'enc(runId) + "/logs")',
        "/api/v1/projects/{project}/runs/{run_id}/logs/search": '"/search?q="',
        "/api/v1/projects/{project}/runs/{run_id}/logs/raw": '"/logs/raw"',
        "/api/v1/projects/{project}/runs/{run_id}/cancel": '"/cancel"',
        "/api/v1/projects/{project}/approvals": '"/approvals?state=pending',
        "/api/v1/projects/{project}/approvals/{approval_id}/approve": '"approve"',
        "/api/v1/projects/{project}/approvals/{approval_id}/reject": '"reject"',
        "/api/v1/projects/{project}/workers": '"/workers"',
        "/api/v1/workers/{worker_id}/drain": '"/drain"',
        "/api/v1/projects/{project}/cancellation/summary": '"/cancellation/summary"',
        "/api/v1/projects/{project}/cancellation/blocked": '"/cancellation/blocked"',
        "/api/v1/projects/{project}/runs/{run_id}/cancellation": '"/cancellation"))',
        "/api/v1/projects/{project}/runs/{run_id}/cancellation/rearm": '"/cancellation/rearm"',
        "/api/v1/projects/{project}/actions": '"/actions?limit=50"',
        "/api/v1/projects/{project}/actions/{dispatch_id}": 'pp("/actions/" + enc(id))',
        "/api/v1/projects/{project}/actions/{dispatch_id}/resolve": '"/resolve"',
        "/api/v1/projects/{project}/tokens": 'pp("/tokens")',
        "/api/v1/session": 'post("/session", body)',
        "/api/v1/sessions": 'get("/sessions")',
        "/api/v1/sessions/{session_id}/revoke": '"/sessions/" + enc(x.id) + "/revoke"',
    }
    for route, fragment in used.items():
        assert route in paths, route
        assert fragment in js, fragment
    admin = source("admin.js")
    admin_used = {
        ("get", "/api/v1/projects/{project}/notifications/channels"): 'base + "/channels"',
        ("post", "/api/v1/projects/{project}/notifications/channels/{name}/test"): '"/test"',
        (
            "delete",
            "/api/v1/projects/{project}/notifications/channels/{name}",
        ): '"DELETE", base + "/channels/"',
        ("post", "/api/v1/projects/{project}/notifications/rules"): 'post(base + "/rules"',
        ("delete", "/api/v1/projects/{project}/notifications/rules/{rule_id}"): '"DELETE", base + "/rules/"',
        ("get", "/api/v1/projects/{project}/notifications/deliveries"): '"/deliveries?limit="',
        ("put", "/api/v1/projects/{project}/retention"): '"PUT", pp("/retention")',
        ("get", "/api/v1/backup"): '"GET", "/backup"',
        ("post", "/api/v1/projects"): 'post("/projects"',
        ("post", "/api/v1/projects/{project}/tokens"): "post(base, {",
        ("post", "/api/v1/projects/{project}/tokens/{token_id}/revoke"): '"/revoke"',
    }
    for (method, route), fragment in admin_used.items():
        assert method in paths.get(route, {}), (method, route)
        assert fragment in admin, fragment
    assert "/" not in paths and "/console/app.js" not in paths  # the console is not part of the API
    # an older server lacks them: the console falls back on a 404 or 405
    assert '"/whoami"' in js and 'pp("/tokens/" + enc(k.id) + "/revoke")' in js
    assert "e.status !== 404 && e.status !== 405" in js
