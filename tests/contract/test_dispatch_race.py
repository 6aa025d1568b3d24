"""Two dispatchers on one database over 1,000 runs: every attempt is claimed exactly once."""

from __future__ import annotations

from typing import Any

from tests.support.builders import seed_project, seed_task
from tests.support.databases import Harness
from tests.support.execution_builders import race_two_dispatchers, register

RUNS = 1000


def test_two_dispatchers_claim_every_attempt_exactly_once(harness: Harness) -> None:
    # Given 1,000 queued runs and workers with room for all of them
    project = seed_project(harness.db)
    task = seed_task(harness.db, project)
    for i in range(4):
        register(harness.db, f"w{i}", slots=1024, lease_ms=600_000)

    def create_all(tx: Any) -> None:
        from ql3.application import runs

        for _ in range(RUNS):
            runs.create_run(tx, runs.CreateRun(project_id=project.id, task=task))

    harness.db.transaction(create_all)
    # When two dispatchers on two real connections race over them
    claimed = race_two_dispatchers(harness)

    # Then every attempt was claimed once, by exactly one of them
    assert len(claimed) == RUNS and len(set(claimed)) == RUNS
    leases = harness.db.raw("SELECT count(*) AS n, max(lease_generation) AS g FROM run_leases")[0]
    assert leases["n"] == RUNS and leases["g"] == 1
    statuses = harness.db.raw("SELECT status, count(*) AS n FROM runs GROUP BY status")
    assert [(r["status"], r["n"]) for r in statuses] == [("dispatching", RUNS)]
