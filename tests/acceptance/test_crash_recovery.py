"""Crash tests with real processes: kill -9 of ``ql3 serve`` mid-run, and a crash between claim and spawn."""

from __future__ import annotations

import json
import signal
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.support.server import run_json, start_with_env, stop
from tests.support.waits import wait_for

pytestmark = pytest.mark.slow


def journal_rows(home: Path) -> list[dict[str, Any]]:
    conn = sqlite3.connect(home / "worker" / "journal.db")
    conn.row_factory = sqlite3.Row
    try:
        return [
            dict(r) for r in conn.execute("SELECT offer_id, attempt_id, lease_generation, state FROM journal")
        ]
    finally:
        conn.close()


def test_kill_9_mid_run_completes_with_the_real_exit_code_and_runs_once(tmp_path: Path) -> None:
    # Given a task that records each start in a marker file, then waits for a gate (at most 60 s) and
    # exits 7: the test sees it running however slowly its CLI polls start on a loaded machine
    home = tmp_path / "home"
    marker = tmp_path / "starts.txt"
    gate = tmp_path / "gate"
    server = start_with_env(home, {})
    command = (
        f"echo started >> {marker}; echo before;"
        f" for i in $(seq 600); do [ -e {gate} ] && break; sleep 0.1; done; echo after; exit 7"
    )
    assert server.cli("task", "add", "slow", "--command", command).returncode == 0
    run_id = server.cli_json("run", "start", "slow")["id"]
    wait_for(lambda: run_json(server, run_id)["status"] == "running")

    # When ql3 serve is killed with SIGKILL while the command runs, then restarted
    server.process.send_signal(signal.SIGKILL)
    server.process.wait(timeout=10)
    restarted = start_with_env(home, {})
    try:
        gate.touch()  # the command, still running under the restarted server, may finish now
        final = wait_for(
            lambda: (r := run_json(restarted, run_id))["status"] in ("succeeded", "failed") and r
        )

        # Then the run completes from the receipt with the real exit code, once
        assert final["status"] == "failed" and final["exit_code"] == 7
        assert marker.read_text().splitlines() == ["started"]
        logs = list((home / "worker" / "logs").iterdir())
        assert len(logs) == 1 and logs[0].read_text().splitlines() == ["before", "after"]
    finally:
        gate.touch()
        stop(restarted.process)


def test_crash_between_claim_and_spawn_recovers_the_same_offer_and_spawns_once(tmp_path: Path) -> None:
    # Given a server that dies right after committing a claim, before the offer reaches the worker
    home = tmp_path / "home"
    marker = tmp_path / "starts.txt"
    # (a long run lease: on a loaded machine the restart must not race the lease's expiry)
    lease = {"QL3_RUN_LEASE_MS": "300000"}
    server = start_with_env(home, {**lease, "QL3_FAULT": "after_claim"})
    assert server.cli("task", "add", "once", "--command", f"echo x >> {marker}").returncode == 0
    # (the crash may even beat the HTTP response, so the run id is read from the database)
    server.cli("run", "start", "once")
    assert server.process.wait(timeout=30) == 137
    assert not marker.exists()
    conn = sqlite3.connect(home / "ql3.db")
    (run_id,) = conn.execute("SELECT id FROM runs").fetchone()
    conn.close()

    # When it restarts without the fault
    restarted = start_with_env(home, lease)
    try:
        final = wait_for(lambda: (r := run_json(restarted, run_id))["status"] == "succeeded" and r)

        # Then the claimed lease was recovered (one attempt, one lease, same generation, same session)
        # and the command ran once; its journal row was pruned as soon as it settled
        assert final["exit_code"] == 0
        assert marker.read_text().splitlines() == ["x"]
        session = json.loads((home / "worker" / "session.json").read_text())
        db = sqlite3.connect(home / "ql3.db")
        leases = db.execute(
            "SELECT lease_generation, worker_session_id, worker_generation, status FROM run_leases"
        ).fetchall()
        (worker_gen,) = db.execute("SELECT generation FROM workers").fetchone()
        db.close()
        # (the offer id is derived from exactly these: the same lease was offered again)
        assert leases == [(1, session["session_id"], worker_gen, "completed")]
        assert journal_rows(home) == []
    finally:
        stop(restarted.process)
