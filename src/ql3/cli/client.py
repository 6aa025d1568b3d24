"""A small synchronous client of ``/api/v1`` for the CLI."""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import quote

import httpx

import ql3
from ql3.cli.config import Credentials, resolve_credentials
from ql3.cli.errors import EXIT_ERROR, EXIT_USAGE, USAGE_STATUSES, CliError

TIMEOUT_S: Final = 30.0


def seg(value: str) -> str:
    """One path segment, escaped so a name can never change the route."""
    return quote(value, safe="")


class ApiClient:
    def __init__(self, creds: Credentials) -> None:
        self.base = creds.url
        self._http = httpx.Client(
            base_url=f"{creds.url}/api/v1",
            headers={"Authorization": f"Bearer {creds.token}", "User-Agent": f"ql3-cli/{ql3.__version__}"},
            timeout=TIMEOUT_S,
            follow_redirects=False,
        )

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
        try:
            resp = self._http.request(method, path, json=json, params=query or None)
        except httpx.TimeoutException as exc:
            raise CliError("timeout", f"the API at {self.base} did not answer in time") from exc
        except httpx.HTTPError as exc:
            raise CliError("unreachable", f"cannot reach the API at {self.base}") from exc
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
