"""The worker journal holds no usable secret while an attempt is in flight (issue 9 item 13): the raw
lease token never reaches ``journal.db`` or its WAL, before or after a ``kill -9`` of ``ql3 serve``,
and the restarted server still proves its authority with it and completes the run."""

from __future__ import annotations

import signal
import sqlite3
from pathlib import Path

import pytest

from ql3.application.leases import lease_digest
from ql3.domain.offers import derive_lease_token
from tests.support.server import gated_command, run_json, start_with_env, stop
from tests.support.waits import wait_for

pytestmark = pytest.mark.slow


def _journal_bytes(home: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted((home / "worker").glob("journal.db*")) if p.is_file())


def _lease(home: Path, run_id: str) -> tuple[str, int, str]:
    conn = sqlite3.connect(home / "ql3.db")
    try:
        row = conn.execute(
            "SELECT attempt_id, lease_generation, lease_token_digest FROM run_leases WHERE run_id = ?",
            (run_id,),
        ).fetchone()
    finally:
        conn.close()
    assert row is not None
    return row[0], row[1], row[2]


def test_the_raw_lease_token_never_reaches_the_journal_and_recovery_still_completes(tmp_path: Path) -> None:
    # Given a run in flight (held on a gate), and its raw lease token derived as the control plane does
    home = tmp_path / "home"
    gate = tmp_path / "gate"
    server = start_with_env(home, {})
    try:
        command = gated_command(gate, "before", "after") + "; exit 4"
        assert server.cli("task", "add", "held", "--command", command).returncode == 0
        run_id = server.cli_json("run", "start", "held")["id"]
        wait_for(lambda: run_json(server, run_id)["status"] == "running")
        attempt_id, generation, digest = _lease(home, run_id)
        token = derive_lease_token((home / "lease.secret").read_bytes(), attempt_id, generation)
        assert lease_digest(token) == digest  # it is the very token the fence checks

        # Then the journal's row exists but the token is nowhere in its files
        in_flight = _journal_bytes(home)
        assert attempt_id.encode() in in_flight
        assert token.encode() not in in_flight and bytes.fromhex(token) not in in_flight

        # When ql3 serve is killed with SIGKILL mid-run and restarted on the same home
        server.process.send_signal(signal.SIGKILL)
        server.process.wait(timeout=10)
        assert token.encode() not in _journal_bytes(home)
        restarted = start_with_env(home, {})
        try:
            wait_for(lambda: run_json(restarted, run_id)["status"] == "running")
            assert token.encode() not in _journal_bytes(home)
            gate.write_text("go")
            final = wait_for(
                lambda: (r := run_json(restarted, run_id))["status"] in ("succeeded", "failed") and r
            )
        finally:
            stop(restarted.process)
    finally:
        stop(server.process)  # (a no-op after the kill; a failed assertion must not leak it)
        gate.write_text("go")

    # Then the re-adopted run completed under its original lease, with its real exit code and log
    assert final["status"] == "failed" and final["exit_code"] == 4 and final["attempt"] == 1
    logs = list((home / "worker" / "logs").iterdir())
    assert len(logs) == 1 and logs[0].read_text().splitlines() == ["before", "after"]
    assert token.encode() not in _journal_bytes(home)
