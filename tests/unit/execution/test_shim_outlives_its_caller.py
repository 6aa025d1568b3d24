"""The command and its shim keep running when the process that launched them dies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ql3.execution.identity import ProcessHandle, probe
from tests.support.processes import ExecHarness
from tests.support.waits import wait_for

SRC = Path(__file__).resolve().parents[3] / "src"

# A throwaway "worker": it launches one attempt, prints the handle and exits without waiting.
CALLER = """
import json, sys
from pathlib import Path
from ql3.execution.launcher import LocalLauncher
from ql3.ports.execution import LaunchRequest, ShellCommand
root, token, go = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
script = f"echo before; while [ ! -e '{go}' ]; do sleep 0.01; done; echo after; exit 5"
launched = LocalLauncher().start(LaunchRequest(
    run_id="run-0001", attempt_id="att-orphan", command=ShellCommand(command=script),
    working_directory=None, environment_policy="isolated", environment={}, callback_token=token,
    callback_sequence=1, log_path=root / "logs" / "att-orphan.log", receipt_dir=root / "receipts",
    log_cap_bytes=1 << 20, started_at_ms=1_800_000_000_000))
print(json.dumps({"handle": launched.handle.encode()}), flush=True)
"""


def test_the_attempt_completes_with_a_receipt_after_its_caller_died(ex: ExecHarness) -> None:
    # Given a caller process that launched a command and then exited
    go = ex.root / "go"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    caller = subprocess.run(
        [sys.executable, "-c", CALLER, str(ex.root), ex.token, str(go)],
        env=env,
        capture_output=True,
        check=True,
        timeout=30,
    )
    try:
        handle = ProcessHandle.decode(json.loads(caller.stdout)["handle"])
        assert probe(handle) == "running"
    finally:
        # When the command is allowed to finish after its caller is gone
        go.touch()

    # Then the orphaned shim still publishes the real exit code, and the log holds all output
    assert wait_for(lambda: ex.receipt("att-orphan") is not None)
    receipt = ex.receipt("att-orphan")
    assert receipt is not None and receipt.exit_code == 5
    assert ex.log_path("att-orphan").read_text() == "before\nafter\n"
    assert wait_for(lambda: probe(handle) == "exited")
