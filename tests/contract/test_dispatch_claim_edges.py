"""The new-claim half of dispatch_once(): the claim budget between two workers, what a claimed
result reports and carries, and the reason of each candidate that cannot be claimed."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from ql3.application import dispatcher as dispatcher_module
from ql3.application import lease_claims, leases
from ql3.application.dispatcher import DispatchCycleError
from ql3.domain.errors import ValidationFailed
from ql3.domain.offers import offer_id
from tests.support.builders import count
from tests.support.databases import Harness
from tests.support.execution_builders import dispatcher, queued, register


def test_the_claim_budget_stops_the_cycle_before_the_next_worker(harness: Harness) -> None:
    # Given two full workers that a stale snapshot still shows with a free slot each
    register(harness.db, "a", slots=1)
    register(harness.db, "b", slots=1)
    queued(harness.db, n=3)
    d = dispatcher(harness.db, claims=1)
    assert d.dispatch_once().offer is not None and d.dispatch_once().offer is not None
    current, _ = harness.db.transaction(d._workers, write=False)
    stale = [replace(w, free_slots=1) for w in current]
    d._workers = lambda tx: (list(stale), 1)  # type: ignore[method-assign]

    # When the only claim of the cycle loses the capacity race on the first worker
    result = d.dispatch_once()

    # Then the second worker is not tried: the budget is spent
    assert (result.reason, result.truncated, result.claim_calls) == ("claim_budget_exhausted", True, 1)


def test_a_cycle_stopped_by_its_claim_budget_resumes_behind_that_candidate(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a full one-slot worker that a stale snapshot shows with a free slot, and runs behind it
    register(harness.db, "a", slots=1)
    _, _, queued_runs = queued(harness.db, n=4)
    d = dispatcher(harness.db, claims=1)
    assert d.dispatch_once().offer is not None
    current, _ = harness.db.transaction(d._workers, write=False)
    stale = [replace(w, free_slots=1) for w in current]
    d._workers = lambda tx: (list(stale), 1)  # type: ignore[method-assign]
    real_claim_many = lease_claims.claim_many
    tried: list[str] = []

    def recording(
        tx: Any, requests: list[lease_claims.ClaimRequest], **kwargs: Any
    ) -> list[lease_claims.RunClaim]:
        tried.extend(r.run_id for r in requests)
        return real_claim_many(tx, requests, **kwargs)

    monkeypatch.setattr(lease_claims, "claim_many", recording)

    # When two cycles each spend their only claim on the capacity race
    results = [d.dispatch_once() for _ in range(2)]

    # Then the second one tried the next run, not the one the first stopped on
    assert [r.reason for r in results] == ["claim_budget_exhausted"] * 2
    assert tried == [queued_runs[1].id, queued_runs[2].id]


def test_the_all_full_check_is_made_once_on_the_snapshot_as_read(harness: Harness) -> None:
    # Given two full workers, and a stale snapshot that still shows a free slot on "a" only
    register(harness.db, "a", slots=1)
    register(harness.db, "b", slots=1)
    queued(harness.db, n=4)
    d = dispatcher(harness.db)
    assert d.dispatch_once().offer is not None and d.dispatch_once().offer is not None
    current, _ = harness.db.transaction(d._workers, write=False)
    stale = [replace(w, free_slots=1 if w.worker_id == "a" else 0) for w in current]
    d._workers = lambda tx: (list(stale), 1)  # type: ignore[method-assign]

    # When the first candidate loses the capacity race on "a"
    result = d.dispatch_once()

    # Then the later candidates find no worker to match; the cycle is not re-judged as all full
    assert (result.reason, result.claim_calls, result.offer) == ("no_match", 1, None)


def test_a_run_met_again_later_in_one_scan_fails_the_cycle_closed(harness: Harness) -> None:
    # Given an unplaceable run, which the second page answers again behind the cursor (as if it had
    # been queued anew between the two reads)
    register(harness.db)
    queued(harness.db, n=1, require={"gpu": "yes"})
    d = dispatcher(harness.db, candidate_page=1, candidate_pages=2)
    [head] = harness.db.transaction(lambda tx: d._candidates(tx, None), write=False)
    again = replace(head, queued_at_ms=head.queued_at_ms + 1)
    d._candidates = lambda tx, cursor: [head] if cursor is None else [again]  # type: ignore[method-assign]

    # When one cycle scans both pages, then the cycle fails closed on the repeated run
    with pytest.raises(DispatchCycleError, match=r"^candidate cursor stalled or repeated$"):
        d.dispatch_once()


def test_a_claimed_result_reports_its_calls_and_its_offer_carries_the_lease(harness: Harness) -> None:
    register(harness.db, "a")
    queued(harness.db)

    result = dispatcher(harness.db).dispatch_once()

    assert result.reason == "claimed" and result.offer is not None
    assert (result.worker_calls, result.plan_calls, result.claim_calls) == (1, 1, 1)
    offer = result.offer
    lease = harness.db.transaction(lambda tx: leases.get_lease(tx, offer.fence.attempt_id))
    assert lease is not None
    assert offer.lease_expires_at_ms == lease.expires_at_ms
    assert offer.offer_id == offer_id(
        lease.attempt_id, lease.lease_generation, lease.worker_id, lease.worker_session_id, 1
    )
    assert offer.fence.lease_generation == lease.lease_generation == 1
    assert offer.spec_digest == offer.spec.digest()


def test_a_placement_that_cannot_be_built_is_plans_unavailable_without_a_claim(harness: Harness) -> None:
    register(harness.db)
    queued(harness.db)

    def broken(*args: Any) -> Any:
        raise ValidationFailed("placement", field="require")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dispatcher_module, "effective_placement", broken)
        result = dispatcher(harness.db).dispatch_once()

    assert (result.reason, result.offer, result.claim_calls) == ("plans_unavailable", None, 0)
    assert count(harness.db, "run_leases") == 0


def test_a_candidate_whose_attempt_is_no_longer_claimed_is_a_lost_race(harness: Harness) -> None:
    register(harness.db)
    queued(harness.db)
    d = dispatcher(harness.db)
    page = harness.db.transaction(lambda tx: d._candidates(tx, None), write=False)
    moved = [replace(c, attempt_status="running") for c in page]
    d._candidates = lambda tx, cursor: list(moved) if cursor is None else []  # type: ignore[method-assign]

    result = d.dispatch_once()

    assert (result.reason, result.offer, result.claim_calls) == ("claim_raced", None, 0)


def test_an_offer_whose_token_does_not_match_the_stored_digest_fails_the_cycle(harness: Harness) -> None:
    register(harness.db)
    queued(harness.db)
    d = dispatcher(harness.db)
    real = dispatcher_module.derive_lease_token  # type: ignore[attr-defined]
    calls: list[int] = []

    def second_differs(secret: bytes, attempt_id: str, generation: int) -> str:
        calls.append(generation)
        token = real(secret, attempt_id, generation)
        return token if len(calls) == 1 else real(b"another secret" * 3, attempt_id, generation)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dispatcher_module, "derive_lease_token", second_differs)
        with pytest.raises(DispatchCycleError, match=r"^lease token does not match its digest$"):
            d.dispatch_once()
    assert len(calls) == 2
