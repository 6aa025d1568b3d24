"""A small synchronous client of ``/api/v1`` for the CLI.

``QL3_URL`` may name several replicas of a cluster, comma-separated (docs/cluster.md "6. The CLI on
several replicas"): a liveness probe picks the first that answers ``/healthz`` within
``PROBE_TIMEOUT_S``, and a request that cannot reach it moves on to the next one. Only a request that
is safe to send twice moves on after it may have arrived (a GET, or a write whose connection was
never made); a write that timed out is reported, never sent again."""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import quote

import httpx

import ql3
from ql3.cli.config import Credentials, resolve_credentials
from ql3.cli.errors import EXIT_ERROR, EXIT_USAGE, USAGE_STATUSES, CliError

TIMEOUT_S: Final = 30.0
# With several replicas: a hung one (accepts, never answers) is left within these.
PROBE_TIMEOUT_S: Final = 2.0
CONNECT_TIMEOUT_S: Final = 2.0
CLUSTER_READ_TIMEOUT_S: Final = 10.0
_SAFE_METHODS: Final = frozenset({"GET", "HEAD"})
_MOVE_ON_STATUSES: Final = frozenset({502, 503, 504})


def seg(value: str) -> str:
    """One path segment, escaped so a name can never change the route."""
    return quote(value, safe="")


def split_urls(url: str) -> list[str]:
    """``QL3_URL``'s replicas: one URL, or several separated by commas."""
    return [part.strip().rstrip("/") for part in url.split(",") if part.strip()]


class ApiClient:
    def __init__(self, creds: Credentials) -> None:
        self.urls = split_urls(creds.url)
        self.base = self.urls[0]
        several = len(self.urls) > 1
        timeout = httpx.Timeout(CLUSTER_READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S) if several else TIMEOUT_S
        self._http = httpx.Client(
            base_url=f"{self.base}/api/v1",
            headers={"Authorization": f"Bearer {creds.token}", "User-Agent": f"ql3-cli/{ql3.__version__}"},
            timeout=timeout,
            follow_redirects=False,
        )
        self._probed = not several

    def _pick(self) -> None:
        """Before the first request to several replicas: the first that answers its liveness probe."""
        self._probed = True
        for url in self.urls:
            try:
                self._http.get(f"{url}/healthz", timeout=httpx.Timeout(PROBE_TIMEOUT_S))
            except httpx.HTTPError:
                continue
            self.base = url
            return

    @classmethod
    def from_environment(cls) -> ApiClient:
        return cls(resolve_credentials())

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(
        self, method: str, path: str, *, json: Any = None, params: dict[str, Any] | None = None
    ) -> tuple[int, Any]:
        """Send one request; return ``(status, decoded body or None)``; raise CliError for >= 400."""
        query = {k: v for k, v in (params or {}).items() if v is not None}
        if not getattr(self, "_probed", True):
            self._pick()
        urls = getattr(self, "urls", [self.base])
        order = [self.base, *(u for u in urls if u != self.base)]
        for i, base in enumerate(order):
            last = i == len(order) - 1
            try:
                resp = self._http.request(method, f"{base}/api/v1{path}", json=json, params=query or None)
            except httpx.TimeoutException as exc:
                if not last and (method in _SAFE_METHODS or isinstance(exc, httpx.ConnectTimeout)):
                    continue
                raise CliError("timeout", f"the API at {base} did not answer in time") from exc
            except httpx.HTTPError as exc:
                if not last and (method in _SAFE_METHODS or isinstance(exc, httpx.ConnectError)):
                    continue
                raise CliError("unreachable", f"cannot reach the API at {base}") from exc
            if not last and method in _SAFE_METHODS and resp.status_code in _MOVE_ON_STATUSES:
                continue
            self.base = base
            break
        body: Any = None
        if resp.content:
            try:
                body = resp.json()
            except ValueError:
                body = None
        if resp.status_code >= 400:
            error = body.get("error") if isinstance(body, dict) else None
            code = str(error.get("code")) if isinstance(error, dict) else f"http_{resp.status_code}"
            message = str(error.get("message")) if isinstance(error, dict) else resp.reason_phrase
            details: dict[str, Any] = {}
            if isinstance(error, dict) and isinstance(error.get("details"), dict):
                details = error["details"]
                message = f"{message} {_details(details)}"
            exit_code = EXIT_USAGE if resp.status_code in USAGE_STATUSES else EXIT_ERROR
            raise CliError(code, message, exit_code, details=details)
        return resp.status_code, body


def _details(details: dict[str, Any]) -> str:
    parts = []
    for key, value in details.items():
        shown = ",".join(str(v) for v in value) if isinstance(value, list) else str(value)
        parts.append(f"{key}={shown}")
    return f"({'; '.join(parts)})"
