"""The seeded chaos test: a few hundred ledger-writing runs (instant, sleeping, 1 MiB of output,
failing, TERM-ignoring children, timeouts, retries, cron), cancels, and repeated ``kill -9`` of
``ql3 serve`` and of task processes, on SQLite and on PostgreSQL; then 0 duplicates, 0 runs lost
without a record, 0 stuck, 0 orphan processes, exact exit codes and whole logs (the checks are listed
in tests/support/chaos.py and docs/reliability.md).

The seed is printed first and in every failure; ``QL3_CHAOS_SEED=<seed>`` repeats a run's plan.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.chaos import ChaosConfig, run_chaos
from tests.support.databases import PgDatabase

pytestmark = pytest.mark.slow

# "A few hundred runs" per database: about 90-120 s each on 2 cores.
RUNS, SERVER_KILLS, TASK_KILLS, CANCELS = 200, 6, 12, 20


def _chaos(tmp_path: Path, database_url: str | None) -> None:
    config = ChaosConfig(
        runs=RUNS,
        server_kills=SERVER_KILLS,
        task_kills=TASK_KILLS,
        cancels=CANCELS,
        database_url=database_url,
        workdir=tmp_path / "chaos",
    )
    report = run_chaos(config)

    figures = report.figures
    assert report.violations == [], report.summary()
    # The chaos happened: the server was killed and restarted, task processes died, runs were
    # cancelled, and every kind of outcome was reached.
    assert figures["server_kills"] == SERVER_KILLS, report.summary()
    assert figures["task_kills"] >= 1 and figures["cancels"] >= 1, report.summary()
    assert {"succeeded", "failed", "timed_out", "cancelled"} <= set(figures["statuses"]), report.summary()


def test_chaos_on_sqlite(tmp_path: Path) -> None:
    _chaos(tmp_path, None)


@pytest.mark.postgres
def test_chaos_on_postgresql(tmp_path: Path, pg_database: PgDatabase) -> None:
    _chaos(tmp_path, pg_database.url)
