"""An offer's id names its lease generation (docs/contracts.md §1.7): a lease of the same attempt that
expired unstarted and was claimed again, by the same worker session, is a new offer, never a repeat of
the old one (the worker journal deduplicates offers by their id)."""

from __future__ import annotations

from ql3.application import lease_expiry
from ql3.domain.offers import Offer, offer_id
from tests.support.databases import Harness
from tests.support.execution_builders import dispatcher, queued, register, run_of

LEASE_MS = 5_000


def _claimed(harness: Harness) -> Offer:
    offer = dispatcher(harness.db, lease_ms=LEASE_MS).dispatch_once().offer
    assert offer is not None
    return offer


def test_a_reacquired_lease_of_the_same_attempt_and_session_is_a_new_offer(harness: Harness) -> None:
    # Given a run claimed by w1, whose lease expired before any start, so the run is queued again
    session = register(harness.db, lease_ms=600_000)
    project, _, (run,) = queued(harness.db)
    first = _claimed(harness)
    harness.advance_clock(LEASE_MS)
    assert harness.db.transaction(lambda tx: lease_expiry.expire_lease(tx, first.fence.attempt_id)) == (
        "released"
    )
    assert run_of(harness.db, project, run.id).status == "queued"

    # When the same worker session claims it again
    second = _claimed(harness)

    # Then it is the same attempt and worker session under the next lease generation, and so another
    # offer: its id is the one of its own generation, and differs from the first
    old, new = first.fence, second.fence
    assert (new.attempt_id, new.worker_id, new.session_id, new.worker_generation) == (
        old.attempt_id,
        session.worker_id,
        session.session_id,
        session.generation,
    )
    assert (old.lease_generation, new.lease_generation) == (1, 2)
    assert second.offer_id != first.offer_id
    assert second.offer_id == offer_id(
        new.attempt_id, 2, new.worker_id, new.session_id, new.worker_generation
    )
