"""HTTP integration fixtures: the real app over a SQLite database in a temp file."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.exceptions import StarletteDeprecationWarning

from ql3.application import auth
from ql3.domain.errors import NotFound
from ql3.http.app import create_app
from ql3.ports.storage import Transaction
from ql3.storage.sqlite.adapter import SqliteDatabase

with warnings.catch_warnings():
    # starlette announces a future switch of its test client's HTTP library; nothing to act on here
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from fastapi.testclient import TestClient

TABLES = (
    "projects",
    "principals",
    "role_bindings",
    "tasks",
    "task_revisions",
    "runs",
    "run_attempts",
    "run_events",
)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[SqliteDatabase]:
    database = SqliteDatabase(tmp_path / "ql3.db")
    database.migrate()
    yield database
    database.close()


@pytest.fixture
def owner_token(db: SqliteDatabase) -> str:
    issued = db.transaction(auth.bootstrap_owner)
    assert issued is not None
    return issued.token


@pytest.fixture
def client(db: SqliteDatabase, owner_token: str) -> Iterator[TestClient]:
    with TestClient(create_app(db)) as test_client:
        yield test_client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def owner(owner_token: str) -> dict[str, str]:
    """Headers of the owner (admin everywhere)."""
    return bearer(owner_token)


@pytest.fixture
def make_token(db: SqliteDatabase) -> Callable[..., dict[str, str]]:
    """Headers for a new principal holding ``role`` in ``project`` (created if missing)."""

    def make(role: str, project: str = "default", name: str = "member") -> dict[str, str]:
        def unit(tx: Transaction) -> str:
            try:
                found = auth.resolve_project(tx, project)
            except NotFound:
                found = auth.create_project(tx, project)
            return auth.issue_token(tx, name=name, role=role, project=found).token

        return bearer(db.transaction(unit))

    return make


@pytest.fixture
def counts(db: SqliteDatabase) -> Callable[[], dict[str, int]]:
    """Row counts of every table a request could write to."""

    def read() -> dict[str, int]:
        return {table: int(db.raw(f"SELECT count(*) AS n FROM {table}")[0]["n"]) for table in TABLES}

    return read


@pytest.fixture
def make_task(client: TestClient, owner: dict[str, str]) -> Callable[..., dict[str, Any]]:
    def make(name: str = "job", project: str = "default", **spec: Any) -> dict[str, Any]:
        body = {"name": name, "command": "echo hello", **spec}
        resp = client.post(f"/api/v1/projects/{project}/tasks", json=body, headers=owner)
        assert resp.status_code == 201, resp.text
        result: dict[str, Any] = resp.json()
        return result

    return make
