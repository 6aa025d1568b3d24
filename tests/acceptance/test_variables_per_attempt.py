"""Which project variables an attempt runs with (docs/variables.md "Which values an attempt gets"),
with real processes: an attempt keeps the values it was launched with through a variable edit and a
``kill -9`` of ``ql3 serve`` (the restarted server re-adopts it, never relaunches it), while a run
dispatched after the edit gets the new value."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tests.support.server import run_json, start_with_env, stop
from tests.support.waits import wait_for

pytestmark = pytest.mark.slow


def test_an_attempt_keeps_its_values_through_an_edit_and_a_crash_and_a_new_run_gets_the_new_ones(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    marker = tmp_path / "starts.txt"
    gate = tmp_path / "gate"
    server = start_with_env(home, {})
    assert server.cli("env", "set", "REGION", "before-edit").returncode == 0
    assert server.cli("env", "set", "TOKEN_V", "old-secret-value", "--secret").returncode == 0
    # The command prints what it got at its start and again once the gate opens (at most 60 s)
    command = (
        f'echo "start $REGION" >> {marker};'
        ' [ "$TOKEN_V" = old-secret-value ] && echo old-secret || echo new-secret;'
        f' echo "first $REGION"; for i in $(seq 600); do [ -e {gate} ] && break; sleep 0.1; done;'
        ' echo "then $REGION"'
    )
    assert server.cli("task", "add", "slow", "--command", command).returncode == 0
    assert server.cli("task", "add", "quick", "--command", 'echo "quick $REGION"').returncode == 0
    slow = server.cli_json("run", "start", "slow")["id"]
    wait_for(lambda: run_json(server, slow)["status"] == "running")

    # When the variables change while it runs, a new run starts (past the once-a-second cache),
    # and ql3 serve is killed and restarted
    assert server.cli("env", "set", "REGION", "after-edit").returncode == 0
    assert server.cli("env", "set", "TOKEN_V", "new-secret-value", "--secret").returncode == 0
    time.sleep(1.1)
    quick = server.cli_json("run", "start", "quick")["id"]
    wait_for(lambda: run_json(server, quick)["status"] == "succeeded")
    server.process.send_signal(signal.SIGKILL)
    server.process.wait(timeout=10)
    restarted = start_with_env(home, {})
    try:
        gate.touch()
        final = wait_for(lambda: (r := run_json(restarted, slow))["status"] in ("succeeded", "failed") and r)
        slow_log = restarted.cli("run", "logs", slow).stdout
        quick_log = restarted.cli("run", "logs", quick).stdout
        again = restarted.cli("--json", "run", "start", "quick", "--wait")
        again_log = restarted.cli("run", "logs", json.loads(again.stdout)["id"]).stdout
    finally:
        stop(restarted.process)

    # Then the attempt ran once, with the values it was launched with, before and after the crash
    assert final["status"] == "succeeded", slow_log
    assert marker.read_text().splitlines() == ["start before-edit"]
    assert slow_log.splitlines() == ["old-secret", "first before-edit", "then before-edit"], slow_log
    # And the runs dispatched after the edit got the new value
    assert quick_log.strip() == "quick after-edit"
    assert again.returncode == 0 and "quick after-edit" in again_log
