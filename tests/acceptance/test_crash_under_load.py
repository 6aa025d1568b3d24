"""Crash under load: 1,000 runs submitted through the API while ``ql3 serve`` executes them, the
server killed with ``kill -9`` twice mid-load and restarted; every run executed exactly once.

Each run's command is the chaos driver's ledger prologue and epilogue (tests/support/chaos.py): it
takes an ``flock`` named after its run and appends ``S <run> <attempt>`` when it starts and
``E <run> <attempt>`` before it exits, ``OVERLAP`` if an earlier copy of the run still holds the lock.
The task is retry-safe (3 attempts) so that a launch cut by a kill, whose command provably never
started, is retried instead of failing: then the only correct outcome for every run is ``succeeded``
with exactly one ``S`` and one ``E`` line in the ledger, both of its last attempt, and no other.
Submissions carry an idempotency key, so a POST repeated after a kill never creates a second run.
"""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.support.chaos import _EPILOGUE, _PROLOGUE, Api, ServerProcess, _attempts
from tests.support.databases import PgDatabase

pytestmark = pytest.mark.slow

RUNS = 1000
KILL_AFTER = (333, 666)  # submissions after which the server is killed (the queue is never empty then)
SETTLE_TIMEOUT_S = 120.0
PROJECT = "/api/v1/projects/default"


def _terminal_count(server: ServerProcess) -> int:
    query = "SELECT count(*) FROM runs WHERE status IN ('succeeded', 'failed', 'cancelled', 'timed_out')"
    if server.database_url:
        import psycopg

        with psycopg.connect(server.database_url) as conn:
            row = conn.execute(query).fetchone()
    else:
        lite = sqlite3.connect(server.home / "ql3.db", timeout=30)
        try:
            row = lite.execute(query).fetchone()
        finally:
            lite.close()
    assert row is not None
    return int(row[0])


def _ledger_lines(ledger: Path) -> list[list[str]]:
    return [line.split() for line in (ledger / "ledger").read_text().splitlines()]


class _Producer:
    """Submits runs over one kept-alive connection (a new one after each restart); a request that
    fails or gets a 5xx is repeated with the same idempotency key, for at most a minute."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.client = self._connect()

    def _connect(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.server.token()}"}
        return httpx.Client(base_url=self.server.url, headers=headers, timeout=30.0)

    def reconnect(self) -> None:
        self.client.close()
        self.client = self._connect()

    def submit(self, key: str) -> str:
        deadline = time.monotonic() + 60
        while True:
            try:
                response = self.client.post(f"{PROJECT}/tasks/load/runs", json={"idempotency_key": key})
                if response.status_code < 500:
                    response.raise_for_status()
                    run_id: str = response.json()["id"]
                    return run_id
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"run {key} not accepted within 60 s")
            time.sleep(0.2)

    def close(self) -> None:
        self.client.close()


def _crash_under_load(tmp_path: Path, database_url: str | None) -> None:
    home, ledger = tmp_path / "home", tmp_path / "ledger"
    ledger.mkdir()
    (ledger / "ledger").touch()
    server = ServerProcess(home, database_url, slots=8)
    api = Api(server)
    server.start()
    try:
        # Given a retry-safe task whose every execution writes a ledger line
        api.json(
            "POST",
            f"{PROJECT}/tasks",
            {
                "name": "load",
                "command": _PROLOGUE + _EPILOGUE,
                "env": {"CHAOS_LEDGER": str(ledger)},
                "environment_policy": "isolated",
                "cwd": str(ledger),
                "retry_safe": True,
                "max_attempts": 3,
            },
        )

        # When 1,000 runs are submitted through the API while the server runs them, and the server is
        # killed with SIGKILL twice mid-load (runs submitted but not yet executed) and restarted
        run_ids: list[str] = []
        pending_at_kill: list[int] = []
        producer = _Producer(server)
        kills_due = 0
        try:
            for i in range(RUNS):
                run_ids.append(producer.submit(f"load-{i}"))
                kills_due += i + 1 in KILL_AFTER
                if kills_due:
                    # killed once runs are waiting (a fast server may have started all it was given)
                    started = sum(1 for words in _ledger_lines(ledger) if words[0] == "S")
                    if len(run_ids) - started > 0:
                        kills_due -= 1
                        pending_at_kill.append(len(run_ids) - started)
                        server.kill9()
                        server.start()
                        producer.reconnect()
        finally:
            producer.close()
        assert len(set(run_ids)) == RUNS
        assert len(pending_at_kill) == 2 and all(p > 0 for p in pending_at_kill), pending_at_kill

        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while _terminal_count(server) < RUNS and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _terminal_count(server) == RUNS, f"not every run ended {SETTLE_TIMEOUT_S:.0f} s after the load"
    finally:
        server.stop()

    # Then every run succeeded, and each was executed exactly once: one S and one E line, of its last
    # attempt, no overlapping copy, no execution of a run or attempt the database does not know
    attempts = _attempts(server)
    assert sorted(attempts) == sorted(run_ids)
    lines = _ledger_lines(ledger)
    assert [w for w in lines if w[0] not in ("S", "E")] == []
    starts = Counter(w[1] for w in lines if w[0] == "S")
    ends = Counter(w[1] for w in lines if w[0] == "E")
    assert set(starts) == set(run_ids) and set(ends) == set(run_ids)
    assert [r for r, c in starts.items() if c != 1] == []
    assert [r for r, c in ends.items() if c != 1] == []
    last_attempt = {run_id: rows[-1] for run_id, rows in attempts.items()}
    for words in lines:
        assert words[2] == last_attempt[words[1]]["id"], words
    assert {a["status"] for a in last_attempt.values()} == {"succeeded"}
    assert {a["exit_code"] for a in last_attempt.values()} == {0}
    # (an earlier attempt exists only for a launch a kill cut short, before its command started)
    for rows in attempts.values():
        assert all(a["status"] == "lost" for a in rows[:-1]), rows
    assert server.starts == 3


def test_kill_9_twice_under_load_runs_every_run_once_on_sqlite(tmp_path: Path) -> None:
    _crash_under_load(tmp_path, None)


@pytest.mark.postgres
def test_kill_9_twice_under_load_runs_every_run_once_on_postgresql(
    tmp_path: Path, pg_database: PgDatabase
) -> None:
    _crash_under_load(tmp_path, pg_database.url)
