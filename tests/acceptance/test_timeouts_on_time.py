"""A timeout stops the run at its deadline, not at the next idle backstop of the cancellation loop
(5 s on standalone, 30 s on edge): the new deadline wakes the loop, which sleeps until it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.databases import PgDatabase
from tests.support.server import start_server, stop

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("profile", ["standalone", "edge"])
@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_a_timeout_stops_the_run_soon_after_its_deadline(
    database: str, profile: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    extra = ["--profile", profile]
    if database == "postgres":
        pg: PgDatabase = request.getfixturevalue("pg_database")
        extra += ["--database-url", pg.url]
    server = start_server(tmp_path / "home", *extra)
    try:
        # Given an idle server and a 30 s command with a 1 s timeout
        added = server.cli("task", "add", "slow", "--command", "sleep 30", "--timeout", "1", "--grace", "1")
        assert added.returncode == 0, added.stderr

        # When it runs
        done = server.cli("run", "start", "slow", "--wait", "--json")

        # Then it ends timed_out, long before the command would have ended and before the edge
        # profile's 30 s backstop would have noticed the deadline
        assert done.returncode == 3, done.stdout + done.stderr
        run = json.loads(server.cli("run", "show", json.loads(done.stdout)["id"], "--json").stdout)
        assert run["status"] == "timed_out"
        assert run["finished_at_ms"] - run["started_at_ms"] < 10_000
    finally:
        stop(server.process)
