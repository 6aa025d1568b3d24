"""Cancellation with real processes: a tampered handle gets zero signals; a crash between the claim
and the result is recovered by a fresh claim that re-verifies and stops the process once."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from ql3.application import cancellation, runs
from ql3.execution.identity import ProcessHandle
from ql3.storage.sqlite.adapter import SqliteDatabase
from tests.support.server import run_json, start_with_env, stop
from tests.support.waits import wait_for

pytestmark = pytest.mark.slow


def _db(home: Path) -> SqliteDatabase:
    return SqliteDatabase(home / "ql3.db")


def _attempt(home: Path, run_id: str) -> dict[str, Any]:
    db = _db(home)
    try:
        row: dict[str, Any] = db.raw(
            "SELECT * FROM run_attempts WHERE run_id = ? ORDER BY attempt DESC", (run_id,)
        )[0]
        return row
    finally:
        db.close()


def _dispatch(home: Path, run_id: str) -> dict[str, Any] | None:
    db = _db(home)
    try:
        found = db.raw("SELECT * FROM cancellation_dispatches WHERE run_id = ?", (run_id,))
        return found[0] if found else None
    finally:
        db.close()


def _cancel(home: Path, project_id: str, run_id: str) -> str:
    db = _db(home)
    try:
        result: str = db.transaction(
            lambda tx: cancellation.request_cancel(tx, project_id, run_id, reason="user", actor_type="user")
        )
        return result
    finally:
        db.close()


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _started_running(server: Any, name: str, command: str) -> dict[str, Any]:
    assert server.cli("task", "add", name, "--command", command).returncode == 0
    run: dict[str, Any] = server.cli_json("run", "start", name)
    wait_for(lambda: run_json(server, run["id"])["status"] == "running")
    return run


def test_a_tampered_start_time_sends_zero_signals_and_blocks(tmp_path: Path) -> None:
    # Given a running command whose stored handle no longer matches the live process
    home = tmp_path / "home"
    server = start_with_env(home, {})
    try:
        run = _started_running(server, "victim", "sleep 60")
        attempt = _attempt(home, run["id"])
        handle = ProcessHandle.decode(attempt["executor_handle"])
        forged = ProcessHandle(
            attempt_id=handle.attempt_id,
            boot_id=handle.boot_id,
            pid=handle.pid,
            pgid=handle.pgid,
            start_ticks=str(int(handle.start_ticks) + 100_000),
        )
        db = _db(home)
        db.raw("UPDATE run_attempts SET executor_handle = ? WHERE id = ?", (forged.encode(), attempt["id"]))
        db.close()

        # When the run is cancelled
        assert _cancel(home, run["project_id"], run["id"]) == "requested"

        # Then no signal reaches the process and the dispatch is blocked with identity_mismatch
        dispatch = wait_for(lambda: (d := _dispatch(home, run["id"])) and d["status"] == "blocked" and d)
        assert dispatch["last_result"] == "identity_mismatch"
        assert _alive(handle.pid)
        assert run_json(server, run["id"])["status"] == "running"
    finally:
        stop(server.process)
        with_pgid = ProcessHandle.decode(_attempt(home, run["id"])["executor_handle"]).pgid
        os.killpg(with_pgid, signal.SIGKILL)


def test_a_crash_between_claim_and_result_is_recovered_and_stops_the_process_once(tmp_path: Path) -> None:
    # Given a server that dies right after committing a cancellation claim, before signalling
    home = tmp_path / "home"
    marker = tmp_path / "starts.txt"
    lease = {"QL3_CANCEL_LEASE_MS": "11000"}
    server = start_with_env(home, {**lease, "QL3_FAULT": "after_cancel_claim"})
    run = _started_running(server, "long", f"echo started >> {marker}; sleep 60")
    pid = int(_attempt(home, run["id"])["pid"])
    _cancel(home, run["project_id"], run["id"])
    assert server.process.wait(timeout=30) == 137
    assert _alive(pid), "the claim must not have signalled before the crash"

    # When the server restarts: the claim's lease expires and a new claim re-verifies the handle
    restarted = start_with_env(home, lease)
    try:
        final = wait_for(lambda: (r := run_json(restarted, run["id"]))["status"] == "cancelled" and r, 60)

        # Then the process group is gone, stopped by exactly one signalling claim, and ran once
        assert final["status"] == "cancelled"
        assert not _alive(pid)
        dispatch = _dispatch(home, run["id"])
        assert dispatch is not None and dispatch["status"] == "dispatched" and dispatch["dispatch_count"] == 2
        db = _db(home)
        events = db.transaction(lambda tx: runs.list_events(tx, run["id"], after=0, limit=100), write=False)
        db.close()
        assert dispatch["last_result"] == "termination_requested"
        # At most one event: the run's completion (cancelled) may commit before the supervisor records
        # its result, and a terminal run takes no more events (the dispatch row still settles)
        assert [e.type for e in events].count("run.cancel_dispatched") <= 1
        assert marker.read_text().splitlines() == ["started"]
    finally:
        stop(restarted.process)


def test_a_timeout_ends_the_run_timed_out_within_grace(tmp_path: Path) -> None:
    home = tmp_path / "home"
    server = start_with_env(home, {})
    try:
        assert server.cli("task", "add", "slow", "--command", "sleep 60", "--timeout", "2").returncode == 0
        started = time.monotonic()
        done = server.cli("run", "start", "slow", "--wait")
        elapsed = time.monotonic() - started

        assert done.returncode == 3, done.stderr
        runs_json = server.cli_json("run", "list")
        assert runs_json["items"][0]["status"] == "timed_out"
        # The grace is 5 s; the deadline is 2 s: the bound is generous for a loaded CI machine.
        assert elapsed < 2 + 5 + 5
    finally:
        stop(server.process)
