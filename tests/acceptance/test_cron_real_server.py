"""Cron with real servers (docs/cron.md): ``--on-start`` runs a task once for a server start, not
again on each restart of a crash loop (``kill -9``); edits racing a busy minute lose no occurrence."""

from __future__ import annotations

import re
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from ql3.application import tasks
from ql3.storage.sqlite.adapter import SqliteDatabase
from tests.support.server import Server, start_server, stop
from tests.support.waits import wait_for

pytestmark = pytest.mark.slow


def _on_start_runs(home: Path) -> list[str]:
    conn = sqlite3.connect(f"{(home / 'ql3.db').as_uri()}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT idempotency_key FROM runs WHERE idempotency_key LIKE '%:start:%'"
        ).fetchall()
        return sorted(str(r[0]) for r in rows)
    finally:
        conn.close()


def _cron_cycled(server: Server) -> None:
    """Wait until the server's cron loop has finished its first cycle (its on-start decisions made)."""

    def cycled() -> bool:
        body = httpx.get(f"{server.url}/metrics", timeout=5).text
        found = re.search(r'ql3_loop_cycles_total\{loop="cron"\} ([0-9.]+)', body)
        return found is not None and float(found.group(1)) >= 1

    wait_for(cycled, timeout_s=30, what="the cron loop's first cycle")


def test_on_start_fires_once_through_a_crash_loop(tmp_path: Path) -> None:
    # Given a server with an --on-start task added while it runs (after its first cycle)
    home = tmp_path / "home"
    server = start_server(home, new_session=True)
    try:
        server.cli_json("task", "add", "warmup", "--command", "true", "--on-start")
        assert _on_start_runs(home) == []
        # When the server crash-loops: killed, started, killed, started
        for _ in range(2):
            stop(server.process, signal.SIGKILL)
            server = start_server(home, new_session=True)
            _cron_cycled(server)
    finally:
        stop(server.process)

    # Then the task ran once for this start (epoch 1), not once per restart; a clean stop opens the
    # next epoch (tests/contract/test_cron_occurrences.py runs that part)
    assert [k.rsplit(":", 1)[1] for k in _on_start_runs(home)] == ["1"]


def test_edits_racing_a_busy_minute_on_a_real_server_lose_no_occurrence(tmp_path: Path) -> None:
    # Given a server with 1,000 minute tasks whose cursors all come due at T, 4 s from now
    home = tmp_path / "home"
    server = start_server(home)
    db = SqliteDatabase(home / "ql3.db")
    closing: list[httpx.Client] = []
    try:
        token = server.credentials()["token"]
        api = httpx.Client(base_url=f"{server.url}/api/v1/projects/default", timeout=30)
        closing.append(api)
        api.headers["Authorization"] = f"Bearer {token}"
        project_id = api.post("/tasks", json={"name": "first", "command": "true"}).json()["project_id"]

        def seed(tx: Any) -> None:
            for i in range(1000):
                tasks.create_task(tx, project_id, f"t{i:04d}", {"command": "true", "cron": "* * * * *"})

        db.transaction(seed)
        due = int(time.time() * 1000) + 4_000
        db.raw("UPDATE task_schedules SET next_fire_at_ms = ?, next_occurrence_ms = ?", (due, due))
        api.post("/tasks", json={"name": "wake", "command": "true"})  # the cron loop re-reads its wait
        ids = {t: r for t, r in ((row["name"], row["id"]) for row in db.raw("SELECT id, name FROM tasks"))}

        # When 40 of them (the last in the due order) are edited from the boundary on
        while time.time() * 1000 < due:
            time.sleep(0.005)
        edited = sorted(ids[f"t{i:04d}"] for i in range(1000))[-40:]
        for task_id in reversed(edited):
            assert api.patch(f"/tasks/{task_id}", json={"command": "echo v2"}).status_code == 200

        def admitted() -> bool:
            return (
                int(db.raw("SELECT count(*) AS n FROM runs WHERE scheduled_for_ms = ?", (due,))[0]["n"])
                >= 1000
            )

        wait_for(admitted, timeout_s=60, what="the busy minute's runs")
    finally:
        for client in closing:
            client.close()
        db.close()
        stop(server.process)

    # Then every task has exactly one run for T, at the revision current when T came (revision 1)
    conn = sqlite3.connect(f"{(home / 'ql3.db').as_uri()}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT task_id, count(*), max(task_revision) FROM runs WHERE scheduled_for_ms = ?"
            " GROUP BY task_id",
            (due,),
        ).fetchall()
        second = dict(
            conn.execute("SELECT task_id, created_at_ms FROM task_revisions WHERE revision = 2").fetchall()
        )
    finally:
        conn.close()
    assert len(rows) == 1000 and all(n == 1 for _, n, _ in rows)
    assert len(second) == 40 and min(second.values()) >= due  # every edit came after the boundary
    assert {task_id: rev for task_id, _, rev in rows if task_id in second} == dict.fromkeys(second, 1)
