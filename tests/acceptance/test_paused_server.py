"""A whole ``ql3 serve`` paused (SIGSTOP, as a paused VM) for longer than its run lease, then resumed:
every run keeps its exit code, and its own lease-expiry scanner must not fence its own embedded worker
before that worker had its chance to renew (docs/reliability.md, "A paused server"). Real processes,
SQLite and PostgreSQL."""

from __future__ import annotations

import signal
import sqlite3
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.acceptance.test_serve_postgres import pg_url as pg_url  # the fixture: a fresh database
from tests.support.server import Server, run_json, start_server, stop
from tests.support.waits import wait_for

pytestmark = pytest.mark.slow

LEASE_MS = 5_000  # the shortest run lease QL3_RUN_LEASE_MS allows
PAUSE_S = 12.0  # more than twice the lease: every lease of the paused server expires meanwhile


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest) -> Iterator[str | None]:
    if request.param == "sqlite":
        yield None
    else:
        yield request.getfixturevalue("pg_url")


def _event_types(home: Path, url: str | None, run_id: str) -> list[str]:
    sql = "SELECT type FROM run_events WHERE run_id = %s ORDER BY sequence"
    if url is None:
        conn = sqlite3.connect(home / "ql3.db")
        try:
            return [r[0] for r in conn.execute(sql.replace("%s", "?"), (run_id,))]
        finally:
            conn.close()
    with psycopg.connect(url) as pg:
        return [r[0] for r in pg.execute(sql, (run_id,)).fetchall()]


def test_a_paused_server_keeps_every_exit_code_of_its_own_worker(
    tmp_path: Path, database: str | None
) -> None:
    # Given ql3 serve with a 5 s run lease running two commands that exit 5: one that ends while the
    # server is paused, one that is still running when it resumes
    home = tmp_path / "home"
    extra = () if database is None else ("--database-url", database)
    server: Server = start_server(home, *extra, env={"QL3_RUN_LEASE_MS": str(LEASE_MS)})
    try:
        assert server.cli("task", "add", "short", "--command", "sleep 4; exit 5").returncode == 0
        assert server.cli("task", "add", "long", "--command", "sleep 20; exit 5").returncode == 0
        runs = [server.cli_json("run", "start", name)["id"] for name in ("short", "long")]
        wait_for(lambda: all(run_json(server, r)["status"] == "running" for r in runs))

        # When the whole server is stopped for longer than twice the lease, then continued
        server.process.send_signal(signal.SIGSTOP)
        time.sleep(PAUSE_S)
        server.process.send_signal(signal.SIGCONT)

        # Then every run keeps its exit code. The one that ended during the pause was neither lost nor
        # stopped. On SQLite (this process the only control plane) the other one was not stopped
        # either; on PostgreSQL another server sharing the database could have taken its run over, so
        # the host executor stopped it at its local fence deadline, and the run says so with the
        # exit status the stop caused (docs/reliability.md "Time").
        def final(run_id: str) -> dict[str, Any] | None:
            found = run_json(server, run_id)
            return found if found["status"] in ("succeeded", "failed") else None

        finals = [wait_for(partial(final, r), timeout_s=90) for r in runs]
        outcomes = [(f["status"], f["exit_code"], f["error_code"]) for f in finals]
        if database is None:
            assert outcomes == [("failed", 5, "EXIT_NONZERO"), ("failed", 5, "EXIT_NONZERO")]
            ended_by_itself = runs
        else:
            assert outcomes[0] == ("failed", 5, "EXIT_NONZERO"), outcomes
            assert outcomes[1] == ("failed", 143, "LEASE_FENCED"), outcomes
            ended_by_itself = runs[:1]
        for run_id in ended_by_itself:
            types = _event_types(home, database, run_id)
            assert "attempt.lost" not in types and "attempt.late_fact_recorded" not in types, types
    finally:
        server.process.send_signal(signal.SIGCONT)
        stop(server.process)
