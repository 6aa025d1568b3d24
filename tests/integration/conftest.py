"""HTTP integration fixtures: the real app over a SQLite database in a temp file."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.exceptions import StarletteDeprecationWarning

from ql3.application import auth, tasks
from ql3.domain.errors import NotFound
from ql3.http.app import create_app
from ql3.ports.storage import Transaction
from ql3.storage.sqlite.adapter import SqliteDatabase
from tests.support.http import bearer
from tests.support.worker_agent import Env

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


# -- run logs and workers (test_http_logs*, test_http_workers*) -----------------------------------


@pytest.fixture
def logs_root(tmp_path: Path) -> Path:
    root = tmp_path / "worker" / "logs"
    root.mkdir(parents=True)
    return root


@pytest.fixture
def logs_client(db: SqliteDatabase, owner_token: str, logs_root: Path) -> Iterator[TestClient]:
    """The app with a logs root, like ``ql3 serve`` (whose embedded worker writes there)."""
    with TestClient(create_app(db, logs_root=logs_root)) as test_client:
        yield test_client


@pytest.fixture
def started_run(
    db: SqliteDatabase, logs_client: TestClient, owner: dict[str, str]
) -> Callable[..., dict[str, Any]]:
    """Start a run of task ``name`` (created on first use); returns the run plus its ``attempt_id``."""

    def start(name: str = "job", project: str = "default") -> dict[str, Any]:
        base = f"/api/v1/projects/{project}/tasks"
        if logs_client.get(f"{base}/{name}", headers=owner).status_code == 404:
            created = logs_client.post(base, json={"name": name, "command": "true"}, headers=owner)
            assert created.status_code == 201, created.text
        resp = logs_client.post(f"{base}/{name}/runs", json={}, headers=owner)
        assert resp.status_code == 201, resp.text
        run: dict[str, Any] = resp.json()
        rows = db.raw(
            "SELECT id FROM run_attempts WHERE run_id = ? ORDER BY attempt DESC LIMIT 1", (run["id"],)
        )
        run["attempt_id"] = rows[0]["id"]
        return run

    return start


@pytest.fixture
def register_worker(db: SqliteDatabase) -> Callable[..., None]:
    """Register a worker session directly, as a worker's hello would."""
    from ql3.application import workers
    from ql3.domain.ids import new_id
    from ql3.domain.workers import parse_capabilities

    def register(worker_id: str = "w1", *, slots: int = 2, labels: dict[str, str] | None = None) -> None:
        caps: dict[str, Any] = {"executors": ["local_process"], "labels": labels or {}}
        db.transaction(
            lambda tx: workers.register(
                tx,
                worker_id=worker_id,
                session_id=new_id(),
                capabilities=parse_capabilities(caps),
                max_concurrent_runs=slots,
                session_lease_ms=30_000,
            )
        )

    return register


# -- the CLI in-process against the app (test_http_cancel*, test_http_approval*) --------------------


@pytest.fixture
def cli_main(
    client: TestClient,
    owner: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> Callable[..., tuple[int, str, str]]:
    """Run ``ql3 ARGS`` in-process; its API client talks to ``client``'s app. Returns (exit, out, err).

    ``headers`` replaces the owner's; every request path is appended to ``cli_main.requests``."""
    from ql3.cli import main as cli
    from ql3.cli.client import ApiClient

    requests: list[str] = []

    def run(*args: str, headers: dict[str, str] | None = None) -> tuple[int, str, str]:
        def connect() -> ApiClient:
            api = ApiClient.__new__(ApiClient)
            api.base = "http://testserver"
            api._http = type(client)(
                client.app, base_url="http://testserver/api/v1", headers=headers or owner
            )
            api._http.event_hooks["request"].append(lambda r: requests.append(r.url.path))
            return api

        monkeypatch.setattr(ApiClient, "from_environment", classmethod(lambda cls: connect()))
        capsys.readouterr()
        code = cli.main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    run.requests = requests  # type: ignore[attr-defined]
    return run


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    """A migrated SQLite control plane with the owner's project and a task that marks each start."""
    db = SqliteDatabase(tmp_path / "ql3.db")
    db.migrate()
    owner = db.transaction(auth.bootstrap_owner)
    assert owner is not None
    project = owner.project
    marker = tmp_path / "starts"
    task = db.transaction(
        lambda tx: tasks.create_task(tx, project.id, "t", {"command": f"echo x >> {marker}; sleep 0.3"})
    ).task
    yield Env(db=db, home=tmp_path, marker=marker, project=project, task=task)
    db.close()
