"""A queued run says why it waits: no worker, no worker with the required labels, only draining
workers, no free slot, or nothing (``queued``, its turn comes). Counted by reason for /metrics."""

from __future__ import annotations

from typing import Any

from ql3.application import workers
from ql3.domain.model import Run
from tests.support.databases import Harness
from tests.support.execution_builders import dispatcher, queued, register, run_of


def _reason(harness: Harness, run: Run) -> Any:
    return harness.db.transaction(lambda tx: workers.WaitingReasons(tx).reason(run), write=False)


def _counts(harness: Harness) -> dict[str, int]:
    counts: dict[str, int] = harness.db.transaction(workers.queued_by_reason, write=False)
    return {k: v for k, v in counts.items() if v}


def test_no_registered_worker_is_no_worker(harness: Harness) -> None:
    _, _, (run,) = queued(harness.db)

    assert _reason(harness, run) == "no_worker"
    assert _counts(harness) == {"no_worker": 1}


def test_a_requirement_no_worker_meets_is_no_matching_worker(harness: Harness) -> None:
    register(harness.db, "plain")
    _, _, (run, _) = queued(harness.db, 2, require={"gpu": "yes"})

    assert _reason(harness, run) == "no_matching_worker"
    assert _counts(harness) == {"no_matching_worker": 2}


def test_a_matching_worker_that_drains_is_worker_draining(harness: Harness) -> None:
    register(harness.db, "gpu", labels={"gpu": "yes"})
    register(harness.db, "plain")
    harness.db.transaction(lambda tx: workers.drain(tx, "gpu"))
    _, _, (run,) = queued(harness.db, require={"gpu": "yes"})

    assert _reason(harness, run) == "worker_draining"


def test_matching_workers_that_are_full_is_no_free_slot(harness: Harness) -> None:
    register(harness.db, slots=1)
    project, _, (first, second) = queued(harness.db, 2)
    assert _reason(harness, second) == "queued"  # a free slot: only its turn is missing
    assert dispatcher(harness.db).dispatch_once().offer is not None

    assert run_of(harness.db, project, first.id).status == "dispatching"
    assert _reason(harness, run_of(harness.db, project, first.id)) is None  # not queued: no reason
    assert _reason(harness, second) == "no_free_slot"
    assert _counts(harness) == {"no_free_slot": 1}


def test_an_expired_worker_session_does_not_count(harness: Harness) -> None:
    register(harness.db, lease_ms=5_000)
    _, _, (run,) = queued(harness.db)
    harness.advance_clock(5_001)

    assert _reason(harness, run) == "no_worker"
