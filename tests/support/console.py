"""The console's test world: a server with an owner, an approver, a viewer and an operator, and signing
in a page."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from tests.support.server import Server

START_TIMEOUT_S = 120.0  # a loaded CI box can take well over the usual 30 s to start a server


@dataclass
class Console:
    """The server, its tokens and the API, for setting up what a test then does in the browser."""

    server: Server
    owner: str
    approver: str
    viewer: str
    # Asks for approval-required runs: the owner issued the approver's token, so the owner's own requests
    # are not the approver's to decide (docs/security.md "Separation of duty").
    operator: str = ""

    @property
    def url(self) -> str:
        return self.server.url

    def api(self, method: str, path: str, token: str | None = None, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token or self.owner}"}
        return httpx.request(
            method, f"{self.url}/api/v1/projects/default{path}", headers=headers, timeout=10, **kwargs
        )


def sign_in(page: Any, console: Console, token: str, route: str = "#/") -> None:
    """Sign in through the form, landing on ``route``."""
    page.goto(f"{console.url}/{route}")
    page.fill("#signin-token", token)
    page.click("form.signin button[type=submit]")
    page.wait_for_selector("#signout:not([hidden])", state="attached")
    page.wait_for_selector("main h1")
