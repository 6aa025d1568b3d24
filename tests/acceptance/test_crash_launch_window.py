"""Crash tests with real processes for the launch window (issue 9 items 2, 5, 6): ``ql3 serve`` dies
between the spawn and the journal's ``started`` record, or the per-attempt shim is killed alone.

After a restart every ``launching`` record is resolved from evidence, never re-spawned: a receipt
completes the run with its real exit code, a live process proven by its identity is re-adopted (and
can be cancelled), and with neither the run is lost for the reason the worker knows."""

from __future__ import annotations

import os
import signal
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from ql3.execution.receipts import receipt_published
from tests.support.processes import processes_of_run
from tests.support.server import Server, run_json, start_with_env, stop
from tests.support.waits import wait_for

pytestmark = pytest.mark.slow

# A long run lease: on a loaded machine the restart must not race the lease's expiry.
LEASE = {"QL3_RUN_LEASE_MS": "300000"}
TERMINAL = ("succeeded", "failed", "cancelled", "timed_out")


def _crash_at(home: Path, point: str, command: str) -> str:
    server = start_with_env(home, {**LEASE, "QL3_FAULT": point})
    assert server.cli("task", "add", "t", "--command", command).returncode == 0
    server.cli("run", "start", "t")  # the crash may beat the HTTP response
    assert server.process.wait(timeout=30) == 137
    conn = sqlite3.connect(home / "ql3.db")
    try:
        (run_id,) = conn.execute("SELECT id FROM runs").fetchone()
    finally:
        conn.close()
    return str(run_id)


def _evidence_files(home: Path) -> list[str]:
    receipts = home / "worker" / "receipts"
    return sorted(p.name for p in receipts.iterdir() if p.is_file()) if receipts.exists() else []


def _terminal(server: Server, run_id: str) -> dict[str, Any] | None:
    run = run_json(server, run_id)
    return run if run["status"] in TERMINAL else None


def test_a_command_that_exited_while_the_server_was_dead_completes_from_its_receipt(tmp_path: Path) -> None:
    # Given a server killed right after spawning the shim, before journaling `started`
    home, marker = tmp_path / "home", tmp_path / "starts"
    run_id = _crash_at(home, "spawned_before_started", f"echo x >> {marker}; echo out; exit 0")
    # (the command still runs to its end and its shim publishes the receipt into its reservation)
    receipts = home / "worker" / "receipts"
    wait_for(
        lambda: any(receipt_published(receipts / n) for n in _evidence_files(home) if n.endswith(".json"))
    )

    # When the server restarts
    restarted = start_with_env(home, LEASE)
    try:
        final = wait_for(lambda: _terminal(restarted, run_id))

        # Then the run succeeded with the receipt's exit code, ran once, and the evidence is consumed
        assert (final["status"], final["exit_code"]) == ("succeeded", 0)
        assert marker.read_text().splitlines() == ["x"]
        wait_for(lambda: _evidence_files(home) == [])
    finally:
        stop(restarted.process)


def test_a_command_still_running_after_the_crash_is_re_adopted_and_can_be_cancelled(tmp_path: Path) -> None:
    # Given a server killed between the spawn and `started`, and a command that keeps running
    home, marker = tmp_path / "home", tmp_path / "starts"
    run_id = _crash_at(home, "spawned_before_started", f"echo x >> {marker}; sleep 300")
    wait_for(lambda: marker.exists())
    assert processes_of_run(run_id)

    # When the server restarts
    restarted = start_with_env(home, LEASE)
    try:
        # Then the live process is re-adopted: the run is running, with one start only
        wait_for(lambda: run_json(restarted, run_id)["status"] == "running")
        assert marker.read_text().splitlines() == ["x"]

        # And a cancel stops it for real: cancelled, and no process of the run is left
        done = restarted.cli("run", "cancel", run_id, "--wait", "--json")
        assert done.returncode == 0, done.stderr
        final = wait_for(lambda: _terminal(restarted, run_id))
        assert final["status"] == "cancelled"
        wait_for(lambda: processes_of_run(run_id) == {})
        assert marker.read_text().splitlines() == ["x"]
    finally:
        stop(restarted.process)


def test_with_neither_receipt_nor_process_the_run_is_lost_as_launch_outcome_unknown(tmp_path: Path) -> None:
    # Given a server killed after the `launching` barrier, before anything was spawned
    home, marker = tmp_path / "home", tmp_path / "starts"
    run_id = _crash_at(home, "after_launching", f"echo x >> {marker}")

    # When the server restarts
    restarted = start_with_env(home, LEASE)
    try:
        final = wait_for(lambda: _terminal(restarted, run_id))

        # Then it is never spawned, and the run says why it was lost (not a lease expiry)
        assert final["status"] == "failed"
        assert final["error_code"] == "RECOVERY_LAUNCH_OUTCOME_UNKNOWN"
        assert not marker.exists()
    finally:
        stop(restarted.process)


def _shim_of(run_id: str) -> int:
    procs = processes_of_run(run_id)
    leaders = [pid for pid, pgrp in procs.items() if pid == pgrp]
    assert len(leaders) == 1, procs
    return leaders[0]


CHAIN = "sh -c 'sleep 300 & sleep 300; wait' & sleep 300 & wait"


def test_killing_only_the_shim_ends_the_run_lost_and_leaves_no_process(serve: Server) -> None:
    # Given a running chain of shells and sleeps
    assert serve.cli("task", "add", "chain", "--command", CHAIN).returncode == 0
    run_id = serve.cli_json("run", "start", "chain")["id"]
    wait_for(lambda: len(processes_of_run(run_id)) >= 5)

    # When only its shim is killed with SIGKILL
    os.kill(_shim_of(run_id), signal.SIGKILL)

    # Then the run ends lost for the true reason, and no member of its group survives
    final = wait_for(lambda: _terminal(serve, run_id))
    assert (final["status"], final["error_code"]) == ("failed", "RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT")
    wait_for(lambda: processes_of_run(run_id) == {})


def test_a_shim_killed_while_the_server_is_down_takes_its_group_along_after_restart(tmp_path: Path) -> None:
    # Given a running chain, a server killed with SIGKILL, and then the shim killed alone
    home = tmp_path / "home"
    server = start_with_env(home, LEASE)
    assert server.cli("task", "add", "chain", "--command", CHAIN).returncode == 0
    run_id = server.cli_json("run", "start", "chain")["id"]
    wait_for(lambda: run_json(server, run_id)["status"] == "running" and len(processes_of_run(run_id)) >= 5)
    server.process.send_signal(signal.SIGKILL)
    server.process.wait(timeout=10)
    shim = _shim_of(run_id)
    os.kill(shim, signal.SIGKILL)
    # (the orphans outlive the shim)
    wait_for(lambda: shim not in (procs := processes_of_run(run_id)) and len(procs) >= 4)

    # When the server restarts
    restarted = start_with_env(home, LEASE)
    try:
        # Then the re-adopted run ends lost for the true reason, and the orphans are gone too
        final = wait_for(lambda: _terminal(restarted, run_id))
        assert (final["status"], final["error_code"]) == ("failed", "RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT")
        wait_for(lambda: processes_of_run(run_id) == {})
    finally:
        stop(restarted.process)
