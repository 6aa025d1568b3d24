"""The task's ``--grace`` governs the stop of a real ``ql3 serve``: TERM to the group, the task's grace,
then KILL of whatever is left (issue 8 item 5)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.processes import processes_of_run
from tests.support.server import Server
from tests.support.waits import wait_for

pytestmark = pytest.mark.slow

HANDLER_S = 6  # longer than the old fixed 5 s grace


def _graceful_command(ready: Path, marker: Path) -> str:
    # The TERM handler needs HANDLER_S seconds, then writes the marker and exits 0.
    return (
        f"trap 'sleep {HANDLER_S}; echo done > {marker}; exit 0' TERM; "
        f"echo up > {ready}; while :; do sleep 1; done"
    )


def _cancel_after_ready(server: Server, name: str, grace_s: int, tmp: Path) -> tuple[str, Path]:
    ready, marker = tmp / f"{name}.ready", tmp / f"{name}.marker"
    server.cli_json(
        "task", "add", name, "--command", _graceful_command(ready, marker), "--grace", str(grace_s)
    )
    run = server.cli_json("run", "start", name)
    wait_for(ready.exists, 60)
    done = server.cli("run", "cancel", run["id"], "--wait", "--json")
    assert done.returncode == 0, done.stderr
    wait_for(lambda: server.cli_json("run", "show", run["id"])["status"] in ("cancelled", "succeeded"), 60)
    wait_for(lambda: processes_of_run(run["id"]) == {}, 60)
    return run["id"], marker


def test_a_term_handler_longer_than_five_seconds_finishes_under_a_longer_grace(
    shared_server: Server, tmp_path: Path
) -> None:
    # Given a task whose TERM handler needs 6 s, with an 8 s grace, running
    # When it is cancelled
    run_id, marker = _cancel_after_ready(shared_server, "graceful-8", 8, tmp_path)

    # Then the handler ran to its end before any KILL: its marker is written
    assert marker.read_text().strip() == "done"
    assert shared_server.cli_json("run", "show", run_id)["status"] == "cancelled"


def test_a_term_handler_is_cut_off_after_a_one_second_grace(shared_server: Server, tmp_path: Path) -> None:
    # Given the same handler with a 1 s grace, running
    # When it is cancelled
    run_id, marker = _cancel_after_ready(shared_server, "graceful-1", 1, tmp_path)

    # Then the KILL after 1 s cut the handler short: no marker, and nothing of the run is left
    assert not marker.exists()
    assert shared_server.cli_json("run", "show", run_id)["status"] == "cancelled"
