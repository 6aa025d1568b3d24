"""``ql3 serve`` on PostgreSQL survives its database connections being terminated, again and again:
afterwards every control loop cycles, ``/readyz`` is ready, and cancel, timeout and cron still work."""

from __future__ import annotations

import json
import os
import random
import time
from typing import Any

import httpx
import psycopg
import pytest

from tests.support.databases import PgDatabase
from tests.support.server import Server, start_server, stop
from tests.support.waits import wait_for

pytestmark = pytest.mark.slow


SLOW_LOOPS = frozenset({"retention"})


def _terminate_backends(pg: PgDatabase) -> int:
    """pg_terminate_backend on every other backend of the server's database (pool, LISTEN)."""
    with psycopg.connect(pg.admin_dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            (pg.name,),
        ).fetchall()
    return len(rows)


def _run(server: Server, run_id: str) -> dict[str, Any]:
    done = server.cli("run", "show", run_id, "--json")
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def _readiness(server: Server) -> tuple[int, dict[str, Any]]:
    try:
        resp = httpx.get(f"{server.url}/readyz", timeout=5.0)
    except httpx.HTTPError:
        return 0, {}
    body: dict[str, Any] = resp.json()
    return resp.status_code, body


def test_loops_survive_repeated_backend_terminations(tmp_path: Any, pg_database: PgDatabase) -> None:
    seed = int(os.environ.get("QL3_TEST_SEED") or random.randrange(2**32))
    print(f"seed={seed} (repeat with QL3_TEST_SEED={seed})")
    rng = random.Random(seed)
    server = start_server(tmp_path / "home", "--database-url", pg_database.url)
    try:
        # Given an idle server on PostgreSQL with a quick task, a long one, a timed one and a cron task
        for args in (
            ("quick", "--command", "sleep 0.2"),
            ("long", "--command", "sleep 60"),
            ("timed", "--command", "sleep 30", "--timeout", "1"),
            ("ticker", "--command", "true", "--cron", "* * * * *"),
        ):
            added = server.cli("task", "add", *args)
            assert added.returncode == 0, added.stderr

        # When its backends are terminated six times, at different moments: while idle, right after a
        # run was submitted, right after a cancel was requested (the CLI may see 503s meanwhile)
        terminated = 0
        for i in range(6):
            moment = rng.choice(("idle", "after_submit", "after_cancel"))
            if moment == "after_submit":
                server.cli("run", "start", "quick")
            elif moment == "after_cancel":
                started = server.cli("run", "start", "quick", "--json")
                if started.returncode == 0:
                    server.cli("run", "cancel", json.loads(started.stdout)["id"])
            terminated += _terminate_backends(pg_database)
            print(f"termination {i}: {moment}")
            time.sleep(rng.uniform(0.2, 2.5))
        last_termination = time.monotonic()
        last_termination_ms = time.time_ns() // 1_000_000
        assert terminated >= 6

        # Then every loop completes a cycle after the last termination, and /readyz says ready
        last_seen: dict[str, Any] = {}

        def all_loops_cycled() -> dict[str, Any] | None:
            status, body = _readiness(server)
            last_seen.update(status=status, body=body)
            elapsed = time.monotonic() - last_termination
            loops = body.get("loops", {})
            # Retention sleeps 10 min between idle cycles by design: it must not be stuck, but it
            # is not expected to have cycled within this window.
            frequent = {k: v for k, v in loops.items() if k not in SLOW_LOOPS}
            fresh = frequent and all(
                v["age_s"] is not None and v["age_s"] < elapsed for v in frequent.values()
            )
            calm = all(not v["stuck"] for v in loops.values())
            return body if status == 200 and fresh and calm else None

        ready = wait_for(
            all_loops_cycled,
            60,
            what="every loop to cycle after the terminations",
            detail=lambda: f"last /readyz: {json.dumps(last_seen)}",
        )
        assert {"cancellation", "cron", "dispatcher", "lease-expiry"} <= set(ready["loops"])
        assert "ql3_loop_last_success_age_seconds" in httpx.get(f"{server.url}/metrics").text

        # And a cancel is delivered
        run_id = server.cli_json("run", "start", "long")["id"]
        wait_for(lambda: _run(server, run_id)["status"] == "running", 30, what="the long run to start")
        cancelled = server.cli("run", "cancel", run_id, "--wait", "--timeout-wait", "30")
        assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
        assert _run(server, run_id)["status"] == "cancelled"

        # And a timeout is enforced
        timed = server.cli("run", "start", "timed", "--wait", "--json")
        assert timed.returncode == 3, timed.stdout + timed.stderr

        # And cron fires again
        def cron_run() -> bool:
            items = server.cli_json("run", "list", "--task", "ticker")["items"]
            return any(
                r["trigger_type"] == "cron"
                and r["status"] == "succeeded"
                and r["created_at_ms"] > last_termination_ms
                for r in items
            )

        wait_for(cron_run, 90, what="cron to fire after the terminations")
    finally:
        stop(server.process)
