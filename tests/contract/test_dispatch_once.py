"""RunDispatcher.dispatch_once(): budgets, placement, claims, recovery and fail-closed cursors."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from ql3.application import cancellation, leases, runs, tasks, workers
from ql3.application import dispatcher as dispatcher_module
from ql3.application.dispatcher import DispatchBudget, DispatchCycleError, RunDispatcher
from ql3.domain.errors import ValidationFailed
from ql3.domain.workers import WorkerSnapshot
from tests.support.builders import count
from tests.support.databases import Harness
from tests.support.execution_builders import dispatcher, queued, register, run_of


def test_empty_first_page_makes_no_worker_plan_or_claim_calls(harness: Harness) -> None:
    register(harness.db)

    result = dispatcher(harness.db).dispatch_once()

    assert result.reason == "no_candidates" and result.offer is None
    assert (result.worker_calls, result.plan_calls, result.claim_calls) == (0, 0, 0)


def test_no_workers_is_reported_without_claims(harness: Harness) -> None:
    queued(harness.db)

    result = dispatcher(harness.db).dispatch_once()

    assert result.reason == "no_workers" and result.claim_calls == 0 and result.offer is None


def test_claim_produces_one_offer_and_moves_the_run_to_dispatching(harness: Harness) -> None:
    register(harness.db)
    project, _, (run,) = queued(harness.db)

    result = dispatcher(harness.db).dispatch_once()

    assert result.reason == "claimed" and result.offer is not None
    offer = result.offer
    assert offer.delivery_kind == "new_claim" and offer.fence.run_id == run.id
    assert offer.spec.command == "echo hello"
    assert run_of(harness.db, project, run.id).status == "dispatching"
    lease = harness.db.transaction(lambda tx: leases.get_lease(tx, offer.fence.attempt_id))
    assert lease is not None and lease.lease_generation == 1
    # only the digest of the token is stored
    assert offer.fence.lease_token not in json.dumps(harness.db.raw("SELECT * FROM run_leases"))


def test_placement_picks_the_required_and_preferred_worker(harness: Harness) -> None:
    register(harness.db, "a-plain", slots=8)
    register(harness.db, "b-gpu", labels={"gpu": "yes", "zone": "eu"})
    register(harness.db, "c-gpu-us", labels={"gpu": "yes", "zone": "us"})
    queued(harness.db, require={"gpu": "yes"}, prefer=[{"labels": {"zone": "us"}, "weight": 10}])

    result = dispatcher(harness.db).dispatch_once()

    assert result.offer is not None and result.offer.fence.worker_id == "c-gpu-us"
    assert result.offer.placement_score == 10
    session = harness.db.raw("SELECT session_id, generation FROM workers WHERE worker_id = 'c-gpu-us'")[0]
    assert (result.offer.fence.session_id, result.offer.fence.worker_generation) == (
        session["session_id"],
        session["generation"],
    )


def test_ties_break_by_free_slots_then_worker_id(harness: Harness) -> None:
    register(harness.db, "b", slots=2)
    register(harness.db, "a", slots=2)
    register(harness.db, "c", slots=3)
    queued(harness.db, n=2)
    d = dispatcher(harness.db)

    first = d.dispatch_once().offer
    second = d.dispatch_once().offer

    assert first is not None and second is not None
    assert (first.fence.worker_id, second.fence.worker_id) == ("c", "a")


def test_no_matching_worker_is_reported(harness: Harness) -> None:
    register(harness.db)
    queued(harness.db, require={"gpu": "yes"})

    result = dispatcher(harness.db).dispatch_once()

    assert result.reason == "no_match" and result.offer is None and result.claim_calls == 0


def test_capacity_exhausted_moves_to_the_next_worker(harness: Harness) -> None:
    # Given worker "a" looks free in the snapshot but is full at claim time
    register(harness.db, "a", slots=1)
    register(harness.db, "b", slots=1)
    queued(harness.db, n=2, prefer=[{"labels": {}, "weight": 1}])
    d = dispatcher(harness.db)
    first = d.dispatch_once().offer
    assert first is not None and first.fence.worker_id == "a"

    # When the next candidate is placed
    second = d.dispatch_once()

    # Then it lands on b
    assert second.offer is not None and second.offer.fence.worker_id == "b"


def test_claim_budget_exhaustion_is_truncated_with_the_reason(harness: Harness) -> None:
    # Given a worker that is already full while the dispatcher's snapshot still shows a free slot
    register(harness.db, slots=1)
    queued(harness.db, n=3)
    d = dispatcher(harness.db, claims=1)
    assert d.dispatch_once().offer is not None
    current, _ = harness.db.transaction(d._workers, write=False)
    stale = [replace(w, free_slots=1) for w in current]
    d._workers = lambda tx: (list(stale), 1)  # type: ignore[method-assign]

    # When the cycle spends its only claim on the capacity race
    result = d.dispatch_once()

    # Then it stops with the exact reason and says the cycle was truncated
    assert result.reason == "claim_budget_exhausted" and result.truncated and result.claim_calls == 1
    assert result.offer is None


def test_scan_budget_exhaustion_is_truncated(harness: Harness) -> None:
    register(harness.db)
    queued(harness.db, n=5, require={"gpu": "yes"})

    result = dispatcher(harness.db, candidate_page=2, candidate_pages=2).dispatch_once()

    assert result.reason == "scan_budget_exhausted" and result.truncated and result.offer is None


def test_paging_finds_a_placeable_candidate_on_the_second_page(harness: Harness) -> None:
    register(harness.db)
    queued(harness.db, n=2, require={"gpu": "yes"}, name="gpu")
    _, _, (ok,) = queued(harness.db, name="plain")

    result = dispatcher(harness.db, candidate_page=2, candidate_pages=2).dispatch_once()

    assert result.offer is not None and result.offer.fence.run_id == ok.id


@pytest.mark.parametrize(
    "budget",
    [
        {"candidate_page": 65},
        {"candidate_pages": 17},
        {"claims": 65},
        {"worker_page": 64, "worker_pages": 2},
        {"recovery_page": 0},
        {"lease_ms": 1000},
    ],
)
def test_invalid_budgets_are_refused_at_start_up(budget: dict[str, int]) -> None:
    with pytest.raises(ValidationFailed):
        DispatchBudget(**budget)


def test_oversized_page_fails_the_cycle_closed(harness: Harness) -> None:
    register(harness.db)
    queued(harness.db, n=3)
    d = dispatcher(harness.db, candidate_page=2)
    real = d._candidates
    d._candidates = lambda tx, cursor: real(tx, cursor) + real(tx, cursor)[:1]  # type: ignore[method-assign]

    with pytest.raises(DispatchCycleError, match=r"^oversized candidate page$"):
        d.dispatch_once()
    assert count(harness.db, "run_leases") == 0


def test_stalled_cursor_fails_the_cycle_closed(harness: Harness) -> None:
    register(harness.db)
    queued(harness.db, n=3, require={"gpu": "yes"})
    d = dispatcher(harness.db, candidate_page=1, candidate_pages=3)
    real = d._candidates
    d._candidates = lambda tx, cursor: real(tx, None)  # type: ignore[method-assign]

    with pytest.raises(DispatchCycleError, match=r"^candidate cursor stalled or repeated$"):
        d.dispatch_once()


def _prioritised(db: Any, n: int, priority: int, **spec: Any) -> None:
    project, task, _ = queued(db, 0, **spec)
    for _ in range(n):
        db.transaction(
            lambda tx: runs.create_run(
                tx, runs.CreateRun(project_id=project.id, task=task, priority=priority)
            )
        )


def test_a_candidate_page_that_does_not_move_past_the_last_cycles_cursor_fails_closed(
    harness: Harness,
) -> None:
    # Given a scan that its budget stopped after one unplaceable run of priority 5
    register(harness.db)
    _prioritised(harness.db, 2, 5, require={"gpu": "yes"})
    d = dispatcher(harness.db, candidate_page=1, candidate_pages=1)
    first = d.dispatch_once()
    assert (first.reason, first.truncated) == ("scan_budget_exhausted", True)

    # When the next cycle's page answers that same run again (the storage ignores the cursor)
    real = d._candidates
    d._candidates = lambda tx, cursor: real(tx, None)  # type: ignore[method-assign]

    # Then the cycle fails closed: the cursor it resumed from did not advance
    with pytest.raises(DispatchCycleError, match=r"^candidate cursor stalled or repeated$"):
        d.dispatch_once()


def test_paging_through_runs_of_one_priority_above_zero_reaches_the_placeable_one(harness: Harness) -> None:
    register(harness.db)
    _prioritised(harness.db, 1, 5, require={"gpu": "yes"}, name="gpu")
    _prioritised(harness.db, 1, 5, name="plain")

    result = dispatcher(harness.db, candidate_page=1, candidate_pages=2).dispatch_once()

    assert result.reason == "claimed" and result.offer is not None


def test_recovery_runs_first_and_keeps_the_offer_id_across_a_restart(harness: Harness) -> None:
    # Given a claim whose offer was never delivered (crash between claim and first send)
    register(harness.db)
    queued(harness.db, n=2)
    before = dispatcher(harness.db, since=0).dispatch_once().offer
    assert before is not None

    # When a new dispatcher incarnation starts
    after_restart = dispatcher(harness.db, since=harness.now_ms()).dispatch_once()

    # Then it recovers the active lease first, with the same offer id and token, before new claims
    assert after_restart.reason == "recovered" and after_restart.offer is not None
    assert after_restart.offer.delivery_kind == "lease_recovery"
    assert after_restart.offer.offer_id == before.offer_id
    assert after_restart.offer.fence.lease_token == before.fence.lease_token
    assert count(harness.db, "run_leases") == 1


def test_recovery_stops_after_cancel_or_session_replacement(harness: Harness) -> None:
    register(harness.db)
    _project, _, (_run, _other) = queued(harness.db, n=2)
    d0 = dispatcher(harness.db, since=0)
    first = d0.dispatch_once().offer
    assert first is not None
    # a session replacement fences the lease: no recovery offer for it
    register(harness.db)

    result = dispatcher(harness.db, since=harness.now_ms()).dispatch_once()

    assert result.reason != "recovered"
    assert result.offer is None or result.offer.fence.run_id != first.fence.run_id


def test_recovery_after_lease_expiry_is_not_offered(harness: Harness) -> None:
    register(harness.db, lease_ms=600_000)
    queued(harness.db)
    assert dispatcher(harness.db, lease_ms=5_000).dispatch_once().offer is not None
    harness.advance_clock(5_001)

    result = dispatcher(harness.db, since=harness.now_ms()).dispatch_once()

    assert result.reason != "recovered"


def test_offer_spec_is_a_deep_copy_unaffected_by_later_edits(harness: Harness) -> None:
    register(harness.db)
    project, task, _ = queued(harness.db)
    offer = dispatcher(harness.db).dispatch_once().offer
    assert offer is not None

    harness.db.transaction(lambda tx: tasks.edit_task(tx, project.id, task.name, {"command": "echo changed"}))

    assert offer.spec.command == "echo hello"
    recovered = dispatcher(harness.db, since=harness.now_ms()).dispatch_once().offer
    assert (
        recovered is not None and recovered.spec == offer.spec and recovered.spec_digest == offer.spec_digest
    )


def test_failed_cycle_results_never_carry_the_command(harness: Harness) -> None:
    register(harness.db)
    queued(harness.db, command="echo CANARY-SECRET", require={"gpu": "yes"})

    result = dispatcher(harness.db).dispatch_once()

    assert result.offer is None and "CANARY-SECRET" not in repr(result)


def test_cancelled_runs_are_not_candidates(harness: Harness) -> None:
    register(harness.db)
    _project, _, (run,) = queued(harness.db)
    harness.db.transaction(lambda tx: runs.transition(tx, run.id, 0, "cancelled", actor_type="user"))

    assert dispatcher(harness.db).dispatch_once().reason == "no_candidates"


def test_candidate_pages_follow_priority_then_queue_order_without_gaps(harness: Harness) -> None:
    # Given runs of mixed priorities queued in order
    project, task, _ = queued(harness.db, n=0)
    expected: list[tuple[int, str]] = []
    for priority in (0, 5, 5, 0, 9, 5, 0):
        run, _ = harness.db.transaction(
            lambda tx, p=priority: runs.create_run(
                tx, runs.CreateRun(project_id=project.id, task=task, priority=p)
            )
        )
        expected.append((-priority, run.id))
        harness.advance_clock(1)
    order = [
        run_id for _, run_id in sorted(expected, key=lambda e: e[0])
    ]  # stable: queue order within a priority

    # When the candidate pages are read with a page size of 3
    d = dispatcher(harness.db, candidate_page=3)
    seen: list[str] = []
    cursor = None
    while True:
        page = harness.db.transaction(lambda tx, c=cursor: d._candidates(tx, c), write=False)
        if not page:
            break
        seen.extend(c.run_id for c in page)
        cursor = page[-1]

    # Then every run appears once, highest priority first, oldest first within a priority
    assert seen == order


def test_a_stalled_worker_cursor_fails_the_cycle_closed(harness: Harness) -> None:
    for i in range(3):
        register(harness.db, f"w{i}")
    queued(harness.db, require={"gpu": "yes"})
    d = dispatcher(harness.db, worker_page=1, worker_pages=3)
    real = workers.snapshot_page

    def stalled(tx: Any, *, after: str, limit: int, last: bool = False) -> list[WorkerSnapshot]:
        return real(tx, after="", limit=limit, last=last)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(workers, "snapshot_page", stalled)
        with pytest.raises(DispatchCycleError, match=r"^worker cursor stalled or repeated$"):
            d.dispatch_once()
    assert count(harness.db, "run_leases") == 0


def test_an_ownership_race_drops_the_candidate_without_reassigning_it(harness: Harness) -> None:
    # Given a candidate page read before another dispatcher claimed that run
    register(harness.db, "a")
    register(harness.db, "b")
    queued(harness.db)
    late = dispatcher(harness.db)
    stale = harness.db.transaction(lambda tx: late._candidates(tx, None), write=False)
    first = dispatcher(harness.db).dispatch_once().offer
    assert first is not None
    late._candidates = lambda tx, cursor: list(stale) if cursor is None else []  # type: ignore[method-assign]

    # When the late dispatcher tries to claim it
    result = late.dispatch_once()

    # Then it drops the candidate: no second lease, no other worker
    assert result.offer is None and result.reason == "claim_raced" and result.claim_calls == 1
    leases_rows = harness.db.raw("SELECT worker_id, lease_generation FROM run_leases")
    assert [(r["worker_id"], r["lease_generation"]) for r in leases_rows] == [(first.fence.worker_id, 1)]


def test_a_revision_that_no_longer_builds_is_refused_before_any_claim(harness: Harness) -> None:
    register(harness.db)
    queued(harness.db)
    d = dispatcher(harness.db)

    def unbuildable(raw: object) -> object:  # the pinned revision no longer passes validation
        raise ValidationFailed("invalid command", field="command")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dispatcher_module, "build_spec", unbuildable)
        result = d.dispatch_once()

    assert result.reason == "plans_unavailable" and result.offer is None and result.claim_calls == 0
    assert count(harness.db, "run_leases") == 0


def test_recovery_stops_once_the_run_is_cancelled(harness: Harness) -> None:
    register(harness.db)
    project, _, (run,) = queued(harness.db)
    assert dispatcher(harness.db).dispatch_once().offer is not None
    harness.db.transaction(
        lambda tx: cancellation.request_cancel(tx, project.id, run.id, reason="user", actor_type="user")
    )

    result = dispatcher(harness.db, since=harness.now_ms()).dispatch_once()

    assert result.reason != "recovered" and result.offer is None


def test_a_repeated_recovery_row_fails_the_cycle_closed(harness: Harness) -> None:
    register(harness.db)
    queued(harness.db, n=2)
    d0 = dispatcher(harness.db)
    assert d0.dispatch_once().offer is not None
    assert d0.dispatch_once().offer is not None
    d = dispatcher(harness.db, since=harness.now_ms(), recovery_page=1, recovery_pages=2)
    real = d._recovery_page
    d._recovery_page = lambda tx, cursor: real(tx, None)  # type: ignore[method-assign]
    d._recovery_offer = lambda tx, attempt_id: None  # type: ignore[method-assign]

    with pytest.raises(DispatchCycleError, match=r"^recovery cursor stalled or repeated$"):
        d.dispatch_once()


def test_a_dispatcher_bound_to_its_local_worker_places_and_recovers_only_for_it(harness: Harness) -> None:
    # Given two workers, and a server whose embedded worker is "b"
    register(harness.db, "a", slots=8)
    register(harness.db, "b", slots=1)
    queued(harness.db, n=2)
    local = RunDispatcher(
        harness.db,
        lease_secret=b"s" * 32,
        budget=DispatchBudget(),
        incarnation_started_ms=0,
        local_worker_id="b",
    )

    # When it dispatches twice
    first = local.dispatch_once()
    second = local.dispatch_once()

    # Then its one slot is used on "b" and the other run waits, although "a" has room
    assert first.offer is not None and first.offer.fence.worker_id == "b"
    assert second.offer is None and second.reason == "no_capacity"
    # and each cycle read the one worker, in one call
    assert (first.worker_calls, second.worker_calls) == (1, 1)
