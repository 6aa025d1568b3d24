"""Deadlines are kept on the host while the serving process is gone (docs/reliability.md "Time"):
``ql3 serve`` is killed with -9 one second before a running command's timeout and restarted three
seconds after it; the host executor stops the command within its grace plus one second of its
deadline (read from the command's own timestamps) while no server runs, and the restarted server
records the run as ``timed_out`` with the command's real exit status."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.support.databases import PgDatabase
from tests.support.server import run_json, start_server, stop
from tests.support.waits import wait_for

pytestmark = pytest.mark.slow
TIMEOUT_S = 4
GRACE_S = 2


def _stamp(path: Path) -> str:
    return f"date +%s%3N > {path}"


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_a_timeout_is_enforced_while_the_server_is_dead(
    database: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    extra: list[str] = []
    if database == "postgres":
        pg: PgDatabase = request.getfixturevalue("pg_database")
        extra = ["--database-url", pg.url]
    home = tmp_path / "home"
    started, termed = tmp_path / "started", tmp_path / "termed"
    # The command stamps its start, and the TERM when it comes (then exits 143 as a shell would).
    command = f"{_stamp(started)}; trap '{_stamp(termed)}; exit 143' TERM; sleep 60 & wait"
    server = start_server(home, *extra)
    restarted = None
    try:
        added = server.cli(
            "task", "add", "slow", "--command", command, "--timeout", str(TIMEOUT_S), "--grace", str(GRACE_S)
        )
        assert added.returncode == 0, added.stderr
        run_id = server.cli_json("run", "start", "slow")["id"]
        wait_for(lambda: started.exists() and started.read_text().strip() != "")
        start_ms = int(started.read_text())
        deadline_ms = start_ms + TIMEOUT_S * 1000

        # When the server is killed one second before the deadline and stays down until 3 s after it
        time.sleep(max(0.0, (deadline_ms - 1000) / 1000 - time.time()))
        assert not termed.exists()
        server.process.send_signal(signal.SIGKILL)
        server.process.wait(timeout=10)
        time.sleep(max(0.0, (deadline_ms + 3000) / 1000 - time.time()))

        # Then the command was stopped at its deadline, by nobody but the host's executor
        assert termed.exists(), "the command outlived its deadline while the server was down"
        overshoot_ms = int(termed.read_text()) - deadline_ms
        assert -100 <= overshoot_ms <= GRACE_S * 1000 + 1000, overshoot_ms

        # And the restarted server records it as timed out, with the command's exit status
        restarted = start_server(home, *extra)
        final = wait_for(
            lambda: (r := run_json(restarted, run_id))["status"] not in ("running", "dispatching") and r
        )
        assert (final["status"], final["exit_code"]) == ("timed_out", 143), final
    finally:
        stop(server.process)
        if restarted is not None:
            stop(restarted.process)
