"""``ql3 serve`` on PostgreSQL with real processes, and two servers sharing one database: every run
executes exactly once, on one of them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from ql3.storage.postgres.adapter import PostgresDatabase
from tests.support.databases import pg_admin_dsn
from tests.support.server import Server, start_server, stop
from tests.support.waits import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def pg_url() -> Iterator[str]:
    admin = pg_admin_dsn()  # skips on a laptop without PostgreSQL; fails under CI=true
    if admin is None:
        pytest.skip("PostgreSQL not configured (QL3_TEST_PG_DSN)")
    name = f"ql3_serve_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"'.encode())
    info = psycopg.conninfo.conninfo_to_dict(admin)
    user = info.get("user") or "postgres"
    host = info.get("host") or "127.0.0.1"
    port = info.get("port") or "5432"
    url = f"postgresql://{quote(str(user))}@{quote(str(host), safe='')}:{port}/{name}"
    try:
        yield url
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


def start(home: Path, pg_url: str, *extra: str, env: dict[str, str] | None = None) -> Server:
    return start_server(home, "--database-url", pg_url, *extra, env=env)


def test_serve_on_postgresql_runs_a_task_end_to_end(tmp_path: Path, pg_url: str) -> None:
    server = start(tmp_path / "home", pg_url)
    try:
        assert server.cli("task", "add", "pg", "--command", "echo from-postgres; exit 6").returncode == 0

        done = server.cli("run", "start", "pg", "--follow")

        assert done.returncode == 2 and "from-postgres" in done.stdout
        runs = server.cli_json("run", "list")["items"]
        assert (runs[0]["status"], runs[0]["exit_code"]) == ("failed", 6)
    finally:
        stop(server.process)


def test_two_servers_sharing_one_database_run_each_run_exactly_once(tmp_path: Path, pg_url: str) -> None:
    # Given two servers, each with its own embedded worker, on one PostgreSQL database
    marker = tmp_path / "starts"
    first = start(tmp_path / "a", pg_url, "--worker-id", "alpha", "--slots", "4")
    second = start(tmp_path / "b", pg_url, "--worker-id", "beta", "--slots", "4")
    try:
        token = first.credentials()["token"]
        env = {"QL3_URL": first.url, "QL3_TOKEN": token}
        assert (
            first.cli(
                "task", "add", "shared", "--command", f'echo "$QL3_RUN_ID" >> {marker}', env=env
            ).returncode
            == 0
        )

        # When 40 runs are started through the first server
        run_ids = {first.cli_json("run", "start", "shared", env=env)["id"] for _ in range(40)}

        # Then each run succeeds exactly once, and both workers took part
        wait_for(
            lambda: (
                sum(
                    r["status"] == "succeeded"
                    for r in first.cli_json("run", "list", "--limit", "100", env=env)["items"]
                )
                == 40
            ),
            60,
            what="the 40 runs to succeed",
        )
        started = marker.read_text().split()
        assert sorted(started) == sorted(run_ids)
        workers = {w["id"]: w for w in first.cli_json("worker", "list", env=env)["items"]}
        assert set(workers) == {"alpha", "beta"}
    finally:
        stop(second.process)
        stop(first.process)


def _shift_database_clock(pg_url: str, offset_ms: int) -> None:
    """Migrate, then run the database clock ``offset_ms`` away from this host's (``ql3_now_ms()``)."""
    db = PostgresDatabase(pg_url, min_size=1, max_size=1)
    try:
        db.migrate()
        db.raw("UPDATE ql3_clock SET offset_ms = ?", (offset_ms,))
    finally:
        db.close()


def test_a_database_clock_behind_this_hosts_does_not_delay_a_timeout(tmp_path: Path, pg_url: str) -> None:
    # Given a database whose clock runs ten minutes behind this host's
    _shift_database_clock(pg_url, -600_000)
    server = start(tmp_path / "home", pg_url)
    try:
        assert server.cli("task", "add", "slow", "--command", "sleep 60", "--timeout", "1").returncode == 0

        # When a run of a task with a 1 s timeout outlives it
        done = server.cli("run", "start", "slow", "--wait", "--timeout-wait", "45", "--json")

        # Then it is timed out after its timeout, not ten minutes later
        assert done.returncode == 3, done.stderr
        assert server.cli_json("run", "list")["items"][0]["status"] == "timed_out"
    finally:
        stop(server.process)


def test_a_database_clock_ahead_of_this_hosts_still_recovers_a_claim_after_a_crash(
    tmp_path: Path, pg_url: str
) -> None:
    # Given a database clock ten minutes ahead of this host's, and a server that dies right after
    # committing a claim, before the offer reaches its worker
    _shift_database_clock(pg_url, 600_000)
    home, marker = tmp_path / "home", tmp_path / "starts"
    lease = {"QL3_RUN_LEASE_MS": "300000"}  # the restart must not race the lease's expiry
    server = start(home, pg_url, env={**lease, "QL3_FAULT": "after_claim"})
    assert server.cli("task", "add", "once", "--command", f"echo x >> {marker}").returncode == 0
    server.cli("run", "start", "once")
    assert server.process.wait(timeout=30) == 137
    assert not marker.exists()

    # When it restarts without the fault
    restarted = start(home, pg_url, env=lease)
    try:
        # Then the restarted server recovers the claim it made before and the command runs once
        wait_for(
            lambda: restarted.cli_json("run", "list")["items"][0]["status"] == "succeeded",
            60,
            what="the recovered run to succeed",
        )
        assert marker.read_text().splitlines() == ["x"]
    finally:
        stop(restarted.process)
