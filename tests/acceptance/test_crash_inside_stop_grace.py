"""A ``kill -9`` of ``ql3 serve`` inside a stop's TERM -> KILL grace (found by the chaos test): the TERM
ended the command, so the run is already ``cancelled``, but a child that ignores TERM waits for the
KILL that the dead server would have sent after the grace. After the restart the stop is finished:
the survivor is found by identity and killed, and the cancellation dispatch settles. On SQLite and
PostgreSQL."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest

from tests.support.databases import PgDatabase
from tests.support.server import run_json, start_with_env, stop
from tests.support.waits import wait_for

pytestmark = pytest.mark.slow


def _processes_of(run_id: str) -> list[int]:
    """Live (non-zombie) processes whose environment names the run."""
    needle = f"QL3_RUN_ID={run_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                environ = fh.read().split(b"\0")
            with open(f"/proc/{entry}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in environ and state != b"Z":
            found.append(int(entry))
    return found


def _crash_inside_the_grace(tmp_path: Path, database_url: str | None) -> None:
    home = tmp_path / "home"
    extra = {} if database_url is None else {"QL3_DATABASE_URL": database_url}
    server = start_with_env(home, extra)
    survivors: list[int] = []
    run_id = ""
    try:
        # Given a running command with a child that ignores TERM, and a long grace before the KILL
        command = "(trap '' TERM; sleep 600) & sleep 600; wait"
        added = server.cli("task", "add", "stubborn", "--command", command, "--grace", "60", "--cwd", "/tmp")
        assert added.returncode == 0, added.stderr
        run_id = server.cli_json("run", "start", "stubborn")["id"]
        wait_for(lambda: run_json(server, run_id)["status"] == "running" and len(_processes_of(run_id)) >= 4)

        # When it is cancelled: the TERM ends the shell, so the run ends, while the child waits for its KILL
        assert server.cli("run", "cancel", run_id).returncode == 0
        wait_for(lambda: run_json(server, run_id)["status"] == "cancelled")
        survivors = _processes_of(run_id)
        assert survivors, "the TERM-ignoring child should be waiting for the KILL"

        # and ql3 serve is killed inside the 60 s grace, then restarted on the same home
        server.process.send_signal(signal.SIGKILL)
        server.process.wait(timeout=10)
        assert _processes_of(run_id) == survivors
        restarted = start_with_env(home, extra)
        try:
            # Then the restarted server finishes the stop at once (no grace, no lease expiry to wait)
            wait_for(
                lambda: not _processes_of(run_id),
                20,
                what="the cancelled run's processes to be gone after the restart",
                detail=lambda: f"left: {_processes_of(run_id)}",
            )
            assert _processes_of(run_id) == [], "a process of the cancelled run outlived the restart"
            dispatch = wait_for(
                lambda: (
                    (d := restarted.cli_json("run", "inspect", run_id)).get("dispatch", {}).get("status")
                    == "dispatched"
                    and d
                )
            )
            assert run_json(restarted, run_id)["status"] == "cancelled"
            assert dispatch["runStatus"] == "cancelled"
        finally:
            stop(restarted.process)
    finally:
        stop(server.process)
        for pid in _processes_of(run_id) if run_id else []:  # never leave the stubborn child behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_crash_inside_the_grace_leaves_no_process_behind_on_sqlite(tmp_path: Path) -> None:
    _crash_inside_the_grace(tmp_path, None)


@pytest.mark.postgres
def test_a_crash_inside_the_grace_leaves_no_process_behind_on_postgresql(
    tmp_path: Path, pg_database: PgDatabase
) -> None:
    _crash_inside_the_grace(tmp_path, pg_database.url)
