"""``--on-start`` with real servers (docs/cron.md): a task runs once for a server start, not again on
each restart of a crash loop (``kill -9``)."""

from __future__ import annotations

import re
import signal
import sqlite3
from pathlib import Path

import httpx
import pytest

from tests.support.server import Server, start_server, stop
from tests.support.waits import wait_for

pytestmark = pytest.mark.slow


def _on_start_runs(home: Path) -> list[str]:
    conn = sqlite3.connect(f"{(home / 'ql3.db').as_uri()}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT idempotency_key FROM runs WHERE idempotency_key LIKE '%:start:%'"
        ).fetchall()
        return sorted(str(r[0]) for r in rows)
    finally:
        conn.close()


def _cron_cycled(server: Server) -> None:
    """Wait until the server's cron loop has finished its first cycle (its on-start decisions made)."""

    def cycled() -> bool:
        body = httpx.get(f"{server.url}/metrics", timeout=5).text
        found = re.search(r'ql3_loop_cycles_total\{loop="cron"\} ([0-9.]+)', body)
        return found is not None and float(found.group(1)) >= 1

    wait_for(cycled, timeout_s=30, what="the cron loop's first cycle")


def test_on_start_fires_once_through_a_crash_loop(tmp_path: Path) -> None:
    # Given a server with an --on-start task added while it runs (after its first cycle)
    home = tmp_path / "home"
    server = start_server(home, new_session=True)
    try:
        server.cli_json("task", "add", "warmup", "--command", "true", "--on-start")
        assert _on_start_runs(home) == []
        # When the server crash-loops: killed, started, killed, started
        for _ in range(2):
            stop(server.process, signal.SIGKILL)
            server = start_server(home, new_session=True)
            _cron_cycled(server)
    finally:
        stop(server.process)

    # Then the task ran once for this start (epoch 1), not once per restart; a clean stop opens the
    # next epoch (tests/contract/test_cron_occurrences.py runs that part)
    assert [k.rsplit(":", 1)[1] for k in _on_start_runs(home)] == ["1"]
