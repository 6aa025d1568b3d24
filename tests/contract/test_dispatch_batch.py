"""Several offers per dispatch cycle (docs/dispatch.md, "Several offers per cycle"): one scan, one worker
snapshot and one write transaction for the whole batch, each claim with its own fences, the worker's
slots checked per claim, and a claim that loses its race leaving the others in place."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from ql3.application import cancellation, lease_claims, runs
from ql3.application.dispatcher import DispatchBudget
from ql3.domain.errors import NotFound, ValidationFailed
from ql3.domain.offers import derive_lease_token
from tests.support.builders import count, seed_project, seed_task, start_run
from tests.support.databases import Harness
from tests.support.execution_builders import SECRET, busy_and_leased, dispatcher, queued, register

LEASE_MS = 5_000


def _write_transactions(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Records ``write`` of every transaction the database runs from now on."""
    real = harness.db.transaction
    seen: list[bool] = []

    def spy(fn: Any, *, write: bool = True) -> Any:
        seen.append(write)
        return real(fn, write=write)

    monkeypatch.setattr(harness.db, "transaction", spy)
    return seen


def test_one_cycle_claims_several_runs_in_one_write_transaction(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a worker with room for all of them and more runs queued than one cycle may offer
    register(harness.db, slots=16)
    _, _, queued_runs = queued(harness.db, n=6)
    d = dispatcher(harness.db, max_offers_per_cycle=4)
    d._cached_spec(queued_runs[0].task_id, queued_runs[0].task_revision)  # the spec cache is warm
    writes = _write_transactions(harness, monkeypatch)

    # When one cycle runs
    result = d.dispatch_once()

    # Then it offers the first four runs in queue order, claimed in one write transaction
    assert result.reason == "claimed" and len(result.offers) == 4
    assert [o.fence.run_id for o in result.offers] == [r.id for r in queued_runs[:4]]
    assert writes.count(True) == 1
    assert (result.worker_calls, result.plan_calls, result.claim_calls) == (1, 4, 4)
    # The batch stopped before the end of the queue: the loop runs the next cycle at once
    assert result.truncated and not result.drained
    assert len({o.fence.lease_token for o in result.offers}) == 4
    assert all(o.fence.lease_generation == 1 for o in result.offers)
    assert busy_and_leased(harness.db) == [("w1", 4, 4)]
    assert count(harness.db, "run_leases") == 4

    # And the next cycle takes the rest from one read (candidates and workers) and one write,
    # reaches the end of the queue and says it drained it
    writes.clear()
    rest = d.dispatch_once()
    assert writes == [False, True]
    assert [o.fence.run_id for o in rest.offers] == [r.id for r in queued_runs[4:]]
    assert (rest.truncated, rest.drained) == (False, True)
    assert d.dispatch_once().reason == "no_candidates"


def test_a_batch_spread_over_two_workers_claims_each_run_under_its_own_workers_session(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given two one-slot workers and two queued runs
    register(harness.db, "a", slots=1)
    register(harness.db, "b", slots=1)
    queued(harness.db, n=2)
    d = dispatcher(harness.db, max_offers_per_cycle=8)
    writes = _write_transactions(harness, monkeypatch)

    # When one cycle places both
    result = d.dispatch_once()

    # Then each worker got one, with its own session and generation in the fence, in one transaction
    sessions = {str(r["worker_id"]): str(r["session_id"]) for r in harness.db.raw("SELECT * FROM workers")}
    assert sorted(o.fence.worker_id for o in result.offers) == ["a", "b"]
    assert all(o.fence.session_id == sessions[o.fence.worker_id] for o in result.offers)
    assert result.claim_calls == 2 and writes.count(True) == 1
    assert busy_and_leased(harness.db) == [("a", 1, 1), ("b", 1, 1)]


@pytest.mark.parametrize("stale", [False, True])
def test_three_free_slots_and_ten_queued_runs_give_exactly_three_offers(
    harness: Harness, stale: bool
) -> None:
    # Given a worker with 3 free slots (or a snapshot that wrongly shows 10) and 10 queued runs
    register(harness.db, slots=3)
    queued(harness.db, n=10)
    d = dispatcher(harness.db, max_offers_per_cycle=8)
    if stale:
        current, _ = harness.db.transaction(d._workers, write=False)
        wrong = [replace(w, free_slots=10) for w in current]
        d._workers = lambda tx: (list(wrong), 1)  # type: ignore[method-assign]

    # When the dispatcher runs until it has nothing more to offer
    results = [d.dispatch_once() for _ in range(3)]

    # Then exactly three runs are offered, never four: each claim checks the slots the ones before
    # it in the batch took
    offered = [o for r in results for o in r.offers]
    assert len(offered) == 3
    assert busy_and_leased(harness.db) == [("w1", 3, 3)]
    statuses = [str(r["status"]) for r in harness.db.raw("SELECT status FROM runs ORDER BY status")]
    assert statuses.count("dispatching") == 3 and statuses.count("queued") == 7
    if stale:
        # The worker row refused the claims the snapshot would have allowed, in the same batch
        assert len(results[0].offers) == 3 and results[0].claim_calls == 8
    else:
        assert [len(r.offers) for r in results] == [3, 0, 0]
        assert results[1].reason == "no_capacity"


def test_a_claim_that_loses_its_race_does_not_undo_the_others(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given three queued runs, the middle one cancelled after the dispatcher read the queue
    register(harness.db, slots=8)
    project, _, (first, middle, last) = queued(harness.db, n=3)
    d = dispatcher(harness.db, max_offers_per_cycle=8)
    real = d._claim_planned

    def cancel_then_claim(*args: Any) -> Any:
        harness.db.transaction(
            lambda tx: cancellation.request_cancel(
                tx, project.id, middle.id, reason="user", actor_type="user"
            )
        )
        return real(*args)

    monkeypatch.setattr(d, "_claim_planned", cancel_then_claim)

    # When the cycle claims all three in one transaction
    result = d.dispatch_once()

    # Then the other two are claimed and the cancelled one is left alone
    assert [o.fence.run_id for o in result.offers] == [first.id, last.id]
    assert result.claim_calls == 3 and not result.drained
    rows = {str(r["id"]): str(r["status"]) for r in harness.db.raw("SELECT id, status FROM runs")}
    assert rows[first.id] == rows[last.id] == "dispatching" and rows[middle.id] != "dispatching"
    assert busy_and_leased(harness.db) == [("w1", 2, 2)]


def test_a_worker_that_refuses_its_claims_sends_them_to_the_next_worker_in_one_more_transaction(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given two workers, the better-ranked one replaced by a new session after the snapshot
    register(harness.db, "a", slots=8, labels={"zone": "eu"})
    register(harness.db, "b", slots=8)
    queued(harness.db, n=2, prefer=[{"labels": {"zone": "eu"}, "weight": 10}])
    d = dispatcher(harness.db, max_offers_per_cycle=8)
    snapshot, _ = harness.db.transaction(d._workers, write=False)
    d._workers = lambda tx: (list(snapshot), 1)  # type: ignore[method-assign]
    register(harness.db, "a", slots=8, labels={"zone": "eu"})
    writes = _write_transactions(harness, monkeypatch)

    # When one cycle claims both runs
    result = d.dispatch_once()

    # Then the session fence refused both on "a", and both landed on "b" in a second transaction
    assert [o.fence.worker_id for o in result.offers] == ["b", "b"]
    assert result.claim_calls == 4 and writes.count(True) == 2
    assert busy_and_leased(harness.db) == [("a", 0, 0), ("b", 2, 2)]
    # with b's placement score (a, preferred, scored 10)
    assert [o.placement_score for o in result.offers] == [0, 0]


def test_a_refused_claim_with_no_other_worker_does_not_drop_the_rest_of_the_batch(harness: Harness) -> None:
    # Given a run only worker a may take, queued before one any worker may take, and a replaced by
    # a new session after the snapshot
    register(harness.db, "a", slots=8, labels={"zone": "eu"})
    register(harness.db, "b", slots=8)
    project = seed_project(harness.db)
    only_a, anywhere = (
        start_run(harness.db, project, seed_task(harness.db, project, name=name, **spec))[0]
        for name, spec in (("eu", {"require": {"zone": "eu"}}), ("any", {}))
    )
    d = dispatcher(harness.db, max_offers_per_cycle=8)
    snapshot, _ = harness.db.transaction(d._workers, write=False)
    d._workers = lambda tx: (list(snapshot), 1)  # type: ignore[method-assign]
    register(harness.db, "a", slots=8, labels={"zone": "eu"})

    # When one cycle claims both
    result = d.dispatch_once()

    # Then the run for a finds no other worker and waits; the other one is still offered, on b
    assert [(o.fence.run_id, o.fence.worker_id) for o in result.offers] == [(anywhere.id, "b")]
    assert count(harness.db, "run_leases") == 1
    assert only_a.id not in {o.fence.run_id for o in result.offers}


def test_a_refused_claim_past_the_budget_does_not_drop_a_claim_after_it(harness: Harness) -> None:
    # Given two runs preferring worker a, one more only b may take, a budget of three claims, and a
    # replaced by a new session after the snapshot
    register(harness.db, "a", slots=8, labels={"zone": "eu"})
    register(harness.db, "b", slots=8, labels={"zone": "us"})
    project = seed_project(harness.db)
    prefer_a = seed_task(harness.db, project, name="eu", prefer=[{"labels": {"zone": "eu"}, "weight": 10}])
    only_b = seed_task(harness.db, project, name="us", require={"zone": "us"})
    for task in (prefer_a, prefer_a, only_b):
        start_run(harness.db, project, task)
    d = dispatcher(harness.db, max_offers_per_cycle=8, claims=3)
    snapshot, _ = harness.db.transaction(d._workers, write=False)
    d._workers = lambda tx: (list(snapshot), 1)  # type: ignore[method-assign]
    register(harness.db, "a", slots=8, labels={"zone": "eu"})

    # When one cycle claims all three: the two on a are refused, and the budget allows no retry
    result = d.dispatch_once()

    # Then the claim on b is still offered
    assert [o.fence.worker_id for o in result.offers] == ["b"]
    assert result.claim_calls == 3 and count(harness.db, "run_leases") == 1


@pytest.mark.parametrize("claims", [2, 3])
def test_retries_of_refused_claims_stop_at_the_claim_budget(harness: Harness, claims: int) -> None:
    # Given the refusing worker above, two runs for it, and a budget of two or three claims a cycle
    register(harness.db, "a", slots=8, labels={"zone": "eu"})
    register(harness.db, "b", slots=8)
    queued(harness.db, n=2, prefer=[{"labels": {"zone": "eu"}, "weight": 10}])
    d = dispatcher(harness.db, max_offers_per_cycle=8, claims=claims)
    snapshot, _ = harness.db.transaction(d._workers, write=False)
    d._workers = lambda tx: (list(snapshot), 1)  # type: ignore[method-assign]
    register(harness.db, "a", slots=8, labels={"zone": "eu"})

    # When one cycle claims both, and both claims are refused
    result = d.dispatch_once()

    # Then the budget holds the retries: with three claims one run is retried on b, with two none,
    # and the cycle says why it stopped; the rest waits for the next cycle
    assert result.claim_calls == claims
    if claims == 3:
        assert [o.fence.worker_id for o in result.offers] == ["b"]
        assert (result.truncated, result.drained) == (True, False)  # the next cycle runs at once
        assert busy_and_leased(harness.db) == [("a", 0, 0), ("b", 1, 1)]
    else:
        assert (result.reason, result.offers) == ("claim_budget_exhausted", ())
        assert busy_and_leased(harness.db) == [("a", 0, 0), ("b", 0, 0)]


def test_a_batch_reacquires_an_expired_lease_row_next_to_first_leases(harness: Harness) -> None:
    # Given a queued run whose attempt still has w1's expired lease row, and two fresh runs
    register(harness.db, "w1", slots=8, lease_ms=600_000)
    _, _, (old, *fresh) = queued(harness.db, n=3)
    attempt = harness.db.transaction(lambda tx: runs.latest_attempt(tx, old.id), write=False)
    (w,) = harness.db.raw("SELECT * FROM workers WHERE worker_id = ?", ("w1",))
    first = harness.db.transaction(
        lambda tx: lease_claims.claim(
            tx,
            run_id=old.id,
            attempt_id=attempt.id,
            worker_id="w1",
            session_id=str(w["session_id"]),
            worker_generation=int(w["generation"]),
            token_for_generation=lambda g: derive_lease_token(SECRET, attempt.id, g),
            lease_ms=LEASE_MS,
        )
    )
    assert first.status == "claimed"
    harness.db.raw("UPDATE runs SET status = 'queued' WHERE id = ?", (old.id,))
    harness.advance_clock(LEASE_MS)

    # When one cycle claims the three
    result = dispatcher(harness.db, max_offers_per_cycle=8).dispatch_once()

    # Then the old attempt's row is its next generation and the others are first leases; the slot
    # of the expired row moved, so the counter equals the leased rows
    generations = {o.fence.run_id: o.fence.lease_generation for o in result.offers}
    assert generations == {old.id: 2, fresh[0].id: 1, fresh[1].id: 1}
    assert busy_and_leased(harness.db) == [("w1", 3, 3)]


def test_claim_many_refuses_an_empty_or_oversized_batch_and_a_run_named_twice(harness: Harness) -> None:
    register(harness.db)
    _, _, (run,) = queued(harness.db)
    attempt = harness.db.transaction(lambda tx: runs.latest_attempt(tx, run.id), write=False)
    (w,) = harness.db.raw("SELECT * FROM workers WHERE worker_id = ?", ("w1",))
    one = lease_claims.ClaimRequest(
        run_id=run.id,
        attempt_id=attempt.id,
        worker_id="w1",
        session_id=str(w["session_id"]),
        worker_generation=int(w["generation"]),
        token_for_generation=lambda g: derive_lease_token(SECRET, attempt.id, g),
    )
    too_many = [replace(one, run_id=f"r{i}") for i in range(lease_claims.MAX_CLAIM_BATCH + 1)]
    refused = {
        "a claim batch holds 1-64 claims": ([], too_many),
        "a claim batch names each run once": ([one, one],),
    }
    for message, batches in refused.items():
        for batch in batches:
            with pytest.raises(ValidationFailed) as caught:
                harness.db.transaction(
                    lambda tx, batch=batch: lease_claims.claim_many(tx, batch, lease_ms=LEASE_MS)
                )
            assert (caught.value.message, dict(caught.value.details)) == (message, {"field": "claims"})
    # The largest batch is taken: its first claim names a run that does not exist
    with pytest.raises(NotFound):
        harness.db.transaction(
            lambda tx: lease_claims.claim_many(
                tx, too_many[: lease_claims.MAX_CLAIM_BATCH], lease_ms=LEASE_MS
            )
        )
    assert count(harness.db, "run_leases") == 0


def test_max_offers_per_cycle_is_validated_at_start_up() -> None:
    for bad in (0, 65):
        with pytest.raises(ValidationFailed, match="max_offers_per_cycle"):
            DispatchBudget(max_offers_per_cycle=bad)
    assert DispatchBudget(max_offers_per_cycle=64).max_offers_per_cycle == 64
