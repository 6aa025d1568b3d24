"""Nothing secret leaves the trusted process: a planted command, env value and token never show up in
API responses, run events, the server's own log, or the control-plane tables other than the task
definition itself (the worker's journal never stores the command or env values either)."""

from __future__ import annotations

import json
import sqlite3

import httpx
import pytest

from tests.support.server import Server

pytestmark = pytest.mark.slow
CANARY_CMD = "canary-cmd-7f3a"
CANARY_ENV = "canary-env-9b1c"
ALLOWED_TABLES = {"task_revisions"}  # the task definition is where the command lives


def test_planted_secrets_appear_nowhere_outside_their_home(serve: Server) -> None:
    # Given a task whose command and environment carry canaries, run to completion
    serve.cli_json(
        "task",
        "add",
        "secretive",
        "--command",
        f"echo {CANARY_CMD} > /dev/null; exit 3",
        "--env",
        f"TOKEN={CANARY_ENV}",
    )
    done = serve.cli("run", "start", "secretive", "--wait", "--json")
    assert done.returncode == 2, done.stderr  # the run's outcome: failed
    run = json.loads(done.stdout)
    assert run["status"] == "failed"
    token = serve.credentials()["token"]
    # a viewer: the role that never sees a command (editors and approvers do, docs/console.md)
    viewer = serve.cli_json("token", "create", "--role", "viewer", "--name", "looker")["token"]
    headers = {"Authorization": f"Bearer {viewer}"}

    # When every read surface is collected
    bodies: list[str] = []
    for path in (
        "/api/v1/projects/default/tasks",
        "/api/v1/projects/default/tasks/secretive",
        "/api/v1/projects/default/runs",
        f"/api/v1/projects/default/runs/{run['id']}",
        f"/api/v1/projects/default/runs/{run['id']}/events",
        f"/api/v1/projects/default/runs/{run['id']}/cancellation",
        "/api/v1/projects/default/workers",
        "/api/v1/projects/default/cancellation/summary",
        "/openapi.json",
    ):
        response = httpx.get(serve.url + path, headers=headers, timeout=10)
        assert response.status_code == 200, path
        bodies.append(response.text)
    db = sqlite3.connect(serve.home / "ql3.db")
    leaked_tables = []
    for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
        if table in ALLOWED_TABLES:
            continue
        dump = json.dumps(db.execute(f'SELECT * FROM "{table}"').fetchall())
        if CANARY_CMD in dump or CANARY_ENV in dump or token in dump:
            leaked_tables.append(table)
    db.close()

    # Then no canary and no raw token appears in any of them
    for body in bodies:
        assert CANARY_CMD not in body and CANARY_ENV not in body
    assert token not in "".join(bodies)
    assert leaked_tables == []
    server_log = serve.log()
    assert CANARY_CMD not in server_log and CANARY_ENV not in server_log and token not in server_log
    # and the task's own revision does hold the command (so the scan above was looking at real data)
    db = sqlite3.connect(serve.home / "ql3.db")
    (spec,) = db.execute("SELECT spec_json FROM task_revisions").fetchone()
    db.close()
    assert CANARY_CMD in spec and CANARY_ENV in spec
