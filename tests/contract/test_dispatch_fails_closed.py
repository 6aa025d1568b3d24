"""The dispatcher fails closed: oversized worker and recovery pages, recovery plans that cannot be
rebuilt and recovery pages that run out all stop the cycle with a reason, before any new claim."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from ql3.application import dispatcher as dispatcher_module
from ql3.application import leases, workers
from ql3.application.dispatcher import DispatchBudget, DispatchCycleError, RunDispatcher
from ql3.domain.errors import NotFound, ValidationFailed
from ql3.repositories import runs as run_repo
from ql3.repositories.dispatch import RecoverableLease, recoverable_leases
from tests.support.builders import count
from tests.support.databases import Harness
from tests.support.execution_builders import SECRET, dispatcher, queued, register
from tests.support.interleaving import Interleaved, before_unit


def _leased(harness: Harness) -> int:
    return int(harness.db.raw("SELECT count(*) AS n FROM run_leases WHERE status = 'leased'")[0]["n"])


def _two_claims_then_restart(harness: Harness, **budget: Any) -> RunDispatcher:
    """Two claims of an earlier incarnation, one run still queued, then a new incarnation."""
    register(harness.db)
    queued(harness.db, n=3)
    d0 = dispatcher(harness.db)
    assert d0.dispatch_once().offer is not None
    assert d0.dispatch_once().offer is not None
    return dispatcher(harness.db, since=harness.now_ms(), **budget)


def test_a_missing_recovery_plan_fails_closed_before_any_new_claim(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = _two_claims_then_restart(harness)

    def missing(*_args: Any, **_kw: Any) -> Any:
        raise NotFound("task revision not found")

    monkeypatch.setattr(dispatcher_module, "get_revision", missing)

    result = d.dispatch_once()

    assert (result.reason, result.truncated, result.offer) == ("recovery_plans_unavailable", True, None)
    assert result.plan_calls == 1  # the one plan it tried to rebuild
    assert _leased(harness) == 2  # the queued run was not claimed behind the failed recovery


def test_a_recovery_whose_run_cannot_be_read_fails_closed_before_any_new_claim(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given leases of an earlier incarnation whose run the repository no longer returns (the schema's
    # foreign key keeps the row, so only a storage fault reads it as missing)
    d = _two_claims_then_restart(harness)
    monkeypatch.setattr(run_repo, "get_run", lambda tx, run_id: None)

    # When the new incarnation dispatches
    result = d.dispatch_once()

    # Then the plan is reported unavailable, never skipped as a lease that needs no recovery
    assert (result.reason, result.truncated, result.offer) == ("recovery_plans_unavailable", True, None)
    assert _leased(harness) == 2


def test_a_recovery_plan_that_no_longer_builds_fails_closed_and_the_next_cycle_moves_on(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = _two_claims_then_restart(harness)

    def unbuildable(raw: Any) -> Any:  # the pinned revision no longer passes validation
        raise ValidationFailed("invalid command", field="command")

    monkeypatch.setattr(dispatcher_module, "build_spec", unbuildable)

    first = d.dispatch_once()
    monkeypatch.undo()
    second = d.dispatch_once()
    third = d.dispatch_once()

    assert (first.reason, first.truncated, first.offer) == ("recovery_plans_unavailable", True, None)
    # the cursor moved past the failed row: the other lease is recovered, then new claims resume
    assert (second.reason, second.plan_calls) == ("recovered", 1)
    assert third.reason == "claimed" and _leased(harness) == 3


def test_recovery_pages_that_run_out_are_truncated_and_claim_nothing_new(harness: Harness) -> None:
    # Given two leases of worker "a" from an earlier incarnation, and a server whose worker is "b"
    register(harness.db, "a", slots=8)
    queued(harness.db, n=2)
    d0 = dispatcher(harness.db)
    assert d0.dispatch_once().offer is not None and d0.dispatch_once().offer is not None
    register(harness.db, "b", slots=8)
    queued(harness.db, n=1, name="later")
    d = RunDispatcher(
        harness.db,
        lease_secret=SECRET,
        budget=DispatchBudget(recovery_page=1, recovery_pages=1),
        incarnation_started_ms=harness.now_ms(),
        local_worker_id="b",
    )

    # When it dispatches with a recovery budget of one row per cycle
    results = [d.dispatch_once() for _ in range(3)]

    # Then each cycle that used its whole budget says so and claims nothing; the walk advances and,
    # once it reached the end, the queued run is placed on "b"
    assert [(r.reason, r.truncated) for r in results[:2]] == [("recovery_budget_exhausted", True)] * 2
    assert results[2].reason == "claimed" and results[2].offer is not None
    assert results[2].offer.fence.worker_id == "b"


def test_an_oversized_recovery_page_fails_the_cycle_closed(harness: Harness) -> None:
    d = _two_claims_then_restart(harness, recovery_page=1)
    since = harness.now_ms()

    def oversized(tx: Any, cursor: Any) -> list[RecoverableLease]:
        return recoverable_leases(tx, since=since, after=None, limit=2)

    d._recovery_page = oversized  # type: ignore[method-assign]

    with pytest.raises(DispatchCycleError, match=r"^oversized recovery page$"):
        d.dispatch_once()
    assert _leased(harness) == 2


def test_a_lease_seen_twice_in_one_recovery_walk_fails_the_cycle_closed(harness: Harness) -> None:
    # Given one lease of an earlier incarnation, which this incarnation has recovered once already
    register(harness.db)
    queued(harness.db, n=2)
    claimed = dispatcher(harness.db).dispatch_once().offer
    assert claimed is not None
    fence = claimed.fence

    def renew(times: int, lease_ms: int) -> None:
        held = replace(fence, lease_version=fence.lease_version + times)
        harness.db.transaction(lambda tx: leases.renew(tx, held, lease_ms))

    # (the next walk's second page is read after one more renewal: its 5th unit of work)
    db: Any = before_unit(harness.db, 5, lambda: renew(1, 50_000))
    d = RunDispatcher(
        db,
        lease_secret=SECRET,
        budget=DispatchBudget(recovery_page=1, recovery_pages=2),
        incarnation_started_ms=harness.now_ms(),
    )
    assert d.dispatch_once().reason == "recovered"
    # and its holder renews it between the pages of the next walk, each time past the walk's cursor
    renew(0, 40_000)

    # When the walk meets the same lease on its first page and again on its second
    with pytest.raises(DispatchCycleError, match=r"^recovery cursor stalled or repeated$"):
        d.dispatch_once()

    # Then the cycle failed closed, and nothing was claimed behind it
    assert _leased(harness) == 1


def test_a_recovery_page_that_does_not_move_past_the_last_cycles_cursor_fails_closed(
    harness: Harness,
) -> None:
    # Given a walk that a budget stopped after one lease (which needed no offer)
    d = _two_claims_then_restart(harness, recovery_page=1, recovery_pages=1)
    real = d._recovery_page
    d._recovery_offer = lambda tx, attempt_id: None  # type: ignore[method-assign]
    first = d.dispatch_once()
    assert (first.reason, first.truncated) == ("recovery_budget_exhausted", True)

    # When the next cycle's page answers that same lease again (the storage ignores the cursor)
    d._recovery_page = lambda tx, cursor: real(tx, None)  # type: ignore[method-assign]

    # Then the cycle fails closed: the cursor it resumed from did not advance
    with pytest.raises(DispatchCycleError, match=r"^recovery cursor stalled or repeated$"):
        d.dispatch_once()


def test_the_memory_of_recovered_offers_stays_within_its_bound(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = _two_claims_then_restart(harness)
    monkeypatch.setattr(dispatcher_module, "MAX_RECOVERED_MEMORY", 1)

    assert [d.dispatch_once().reason for _ in range(2)] == ["recovered", "recovered"]

    assert len(d._recovered) == 1  # full: forgotten before the second offer was remembered


def test_once_a_recovery_walk_reached_the_end_no_later_cycle_reads_a_recovery_page(harness: Harness) -> None:
    # Given a new incarnation that recovered both leases of the earlier one and then claimed the
    # queued run (its walk reached the end)
    register(harness.db)
    queued(harness.db, n=3)
    d0 = dispatcher(harness.db)
    assert d0.dispatch_once().offer is not None and d0.dispatch_once().offer is not None
    counted = Interleaved(harness.db, lambda unit: None)
    db: Any = counted
    d = RunDispatcher(db, lease_secret=SECRET, incarnation_started_ms=harness.now_ms())
    assert [d.dispatch_once().reason for _ in range(3)] == ["recovered", "recovered", "claimed"]

    # When it dispatches with nothing queued
    before = counted.units
    result = d.dispatch_once()

    # Then the cycle is one unit of work, the candidate page: the old leases are not walked again
    assert result.reason == "no_candidates"
    assert counted.units - before == 1


def test_an_oversized_worker_page_fails_the_cycle_closed(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("a", "b", "c"):
        register(harness.db, name)
    queued(harness.db)
    real = workers.snapshot_page

    def oversized(tx: Any, *, after: str, limit: int, last: bool = False) -> list[Any]:
        return real(tx, after=after, limit=limit + 1, last=last)

    monkeypatch.setattr(workers, "snapshot_page", oversized)

    with pytest.raises(DispatchCycleError, match=r"^oversized worker page$"):
        dispatcher(harness.db, worker_page=2).dispatch_once()
    assert count(harness.db, "run_leases") == 0
