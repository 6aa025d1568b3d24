"""Every reason the dispatcher gives for not placing a run reaches its result (``DispatchResult.notes``):
per run for the runs a cycle examined, per cycle for what stopped it as a whole, so the dispatch loop
can show them (application/dispatch_reasons.py, docs/dispatch.md "What the dispatcher saw")."""

from __future__ import annotations

from typing import Any

import pytest

from ql3.application import dispatcher as dispatcher_module
from ql3.domain.errors import NotFound
from tests.support.databases import Harness
from tests.support.execution_builders import dispatcher, queued, register


def test_a_run_no_worker_matches_is_noted_with_its_id(harness: Harness) -> None:
    register(harness.db)
    _, _, (run,) = queued(harness.db, require={"gpu": "yes"})

    result = dispatcher(harness.db).dispatch_once()

    assert result.notes == ((run.id, "no_match"),)


def test_a_run_whose_placement_conflicts_is_noted_as_plans_unavailable(harness: Harness) -> None:
    register(harness.db)
    _, _, (run,) = queued(harness.db, require={"executor": "container"})

    assert dispatcher(harness.db).dispatch_once().notes == ((run.id, "plans_unavailable"),)


def test_a_cycle_without_workers_is_noted_for_the_cycle(harness: Harness) -> None:
    queued(harness.db)

    assert dispatcher(harness.db).dispatch_once().notes == ((None, "no_workers"),)


def test_a_scan_cut_by_its_budget_notes_the_runs_it_saw_and_the_cut(harness: Harness) -> None:
    register(harness.db)
    _, _, (first, _second) = queued(harness.db, n=2, require={"gpu": "yes"})

    result = dispatcher(harness.db, candidate_page=1, candidate_pages=1).dispatch_once()

    assert result.truncated and result.notes == ((first.id, "no_match"), (None, "scan_budget_exhausted"))


def test_a_claim_that_lost_its_race_is_noted(harness: Harness) -> None:
    # Given a candidate page read before another dispatcher claimed that run
    register(harness.db)
    _, _, (run,) = queued(harness.db)
    late = dispatcher(harness.db)
    stale = harness.db.transaction(lambda tx: late._candidates(tx, None), write=False)
    assert dispatcher(harness.db).dispatch_once().offer is not None
    late._candidates = lambda tx, cursor: list(stale) if cursor is None else []  # type: ignore[method-assign]

    result = late.dispatch_once()

    assert result.offer is None and result.notes == ((run.id, "claim_raced"),)


def test_a_recovery_plan_that_cannot_be_rebuilt_is_noted_with_its_run(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a claim of an earlier incarnation whose pinned revision can no longer be read
    register(harness.db)
    queued(harness.db)
    offer = dispatcher(harness.db).dispatch_once().offer
    assert offer is not None
    d = dispatcher(harness.db, since=harness.now_ms())

    def missing(*_args: Any, **_kw: Any) -> Any:
        raise NotFound("task revision not found")

    monkeypatch.setattr(dispatcher_module, "get_revision", missing)

    # Then the new incarnation's cycle names that run, sitting in dispatching
    assert d.dispatch_once().notes == ((offer.fence.run_id, "recovery_plans_unavailable"),)
