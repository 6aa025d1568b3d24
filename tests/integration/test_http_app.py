"""The app shell: health, readiness, OpenAPI, the lifespan, framework errors and the console."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ql3.domain.errors import StorageUnavailable
from ql3.http.app import create_app


def test_healthz_needs_no_token(client: Any) -> None:
    resp = client.get("/healthz")

    assert (resp.status_code, resp.json()) == (200, {"status": "ok"})


def test_readyz_is_ready_when_the_database_answers(client: Any) -> None:
    resp = client.get("/readyz")

    assert (resp.status_code, resp.json()) == (
        200,
        {"status": "ready", "loops": {}, "schema_version": None},  # None: no expected version given
    )


class _BrokenDatabase:
    dialect = "sqlite"

    def transaction(self, fn: Callable[[Any], Any], *, write: bool = True) -> Any:
        raise StorageUnavailable()

    def wait_for(self, channel: str, timeout_s: float) -> bool:
        return False

    def close(self) -> None:
        pass


def test_readyz_is_503_when_the_database_is_unreachable() -> None:
    with TestClient(create_app(_BrokenDatabase())) as broken:
        resp = broken.get("/readyz")

    assert resp.status_code == 503
    assert resp.json()["error"]["code"] == "storage_unavailable"


def test_openapi_documents_the_api(client: Any) -> None:
    spec = client.get("/openapi.json").json()

    paths = spec["paths"]
    assert "/api/v1/projects/{project}/tasks" in paths
    assert {"get", "patch", "delete"} <= set(paths["/api/v1/projects/{project}/tasks/{task}"])
    assert "post" in paths["/api/v1/projects/{project}/tasks/{task}/runs"]
    assert "/api/v1/projects/{project}/runs/{run_id}/events" in paths
    assert "HTTPBearer" in spec["components"]["securitySchemes"]


def test_openapi_documents_errors_in_their_real_shape(client: Any) -> None:
    spec = client.get("/openapi.json").json()

    responses = spec["paths"]["/api/v1/projects/{project}/tasks"]["post"]["responses"]

    for status in ("401", "403", "404", "413", "422"):
        assert responses[status]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/ErrorOut"
        }


class _Recorder:
    def __init__(self, name: str, log: list[str], fail_start: bool = False) -> None:
        self.name, self.log, self.fail_start = name, log, fail_start

    def start(self) -> None:
        if self.fail_start:
            raise RuntimeError("start failed")
        self.log.append(f"start {self.name}")

    def stop(self) -> None:
        self.log.append(f"stop {self.name}")


def test_lifecycle_starts_in_order_and_stops_in_reverse(db: Any) -> None:
    log: list[str] = []
    app = create_app(db, lifecycle=[_Recorder("a", log), _Recorder("b", log)])

    with TestClient(app):
        assert log == ["start a", "start b"]

    assert log == ["start a", "start b", "stop b", "stop a"]


def test_a_failed_start_stops_what_already_started(db: Any) -> None:
    log: list[str] = []
    app = create_app(db, lifecycle=[_Recorder("a", log), _Recorder("b", log, fail_start=True)])

    with pytest.raises(RuntimeError), TestClient(app):
        pass

    assert log == ["start a", "stop a"]


def test_an_unknown_route_is_a_json_404(client: Any) -> None:
    resp = client.get("/api/v1/nothing-here")

    assert resp.status_code == 404
    assert resp.json()["error"]["code"] == "not_found"


def test_a_wrong_method_is_a_json_405(client: Any, owner: Any) -> None:
    resp = client.put("/api/v1/projects/default/tasks", headers=owner)

    assert resp.status_code == 405
    assert resp.json()["error"]["code"] == "method_not_allowed"


SECRET = "-".join(["SECRET", "42"])  # built at runtime: a traceback's source lines must not contain it


class _ExplodingDatabase(_BrokenDatabase):
    def transaction(self, fn: Callable[[Any], Any], *, write: bool = True) -> Any:
        raise RuntimeError(f"detail {SECRET}")


def test_an_unexpected_error_is_a_500_without_its_message(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with TestClient(create_app(_ExplodingDatabase())) as exploding:
        resp = exploding.get("/api/v1/projects", headers={"Authorization": "Bearer x"})

    assert resp.status_code == 500
    assert resp.json() == {"error": {"code": "internal_error", "message": "ql3 failed."}}
    assert SECRET not in caplog.text
    assert "RuntimeError" in caplog.text


def test_the_console_page_is_served_at_the_root(client: Any) -> None:
    page = client.get("/")
    script = client.get("/console/app.js")

    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "/console/app.js" in page.text
    assert script.status_code == 200
    assert "default-src 'self'" in page.headers["content-security-policy"]
