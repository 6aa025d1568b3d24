"""The fence of a recovery offer (``RunDispatcher`` after a restart): a lease of an earlier incarnation
is offered again only while the lease is live, its attempt still claimed, and its worker still the
exact holder (same session and generation, online or draining, session not expired). Each condition
is broken alone here; the lease and the worker's expiry instants are exact on the injected clock."""

from __future__ import annotations

import pytest

from ql3.application import lease_results
from ql3.application.dispatcher import DispatchResult
from ql3.domain.offers import Offer
from tests.support.databases import Harness
from tests.support.execution_builders import dispatcher, queued, register
from tests.support.interleaving import before_unit

LEASE_MS = 5_000
SESSION_MS = 600_000


def _claimed_then_restart(harness: Harness) -> Offer:
    """One claim of an earlier incarnation whose offer was never delivered."""
    register(harness.db, lease_ms=SESSION_MS)
    queued(harness.db)
    offer = dispatcher(harness.db, lease_ms=LEASE_MS).dispatch_once().offer
    assert offer is not None
    return offer


def _restart(harness: Harness) -> DispatchResult:
    return dispatcher(harness.db, since=harness.now_ms(), lease_ms=LEASE_MS).dispatch_once()


WORKER_CHANGES = {
    "session": "UPDATE workers SET session_id = '01a00000-0000-7000-8000-0000000000cc'",
    "generation": "UPDATE workers SET generation = generation + 1",
    "offline": "UPDATE workers SET status = 'offline'",
}


@pytest.mark.parametrize("change", sorted(WORKER_CHANGES))
def test_a_lease_whose_worker_is_no_longer_the_exact_holder_is_not_recovered(
    harness: Harness, change: str
) -> None:
    # Given an undelivered claim, then one fact of its worker changed alone
    _claimed_then_restart(harness)
    harness.db.raw(WORKER_CHANGES[change])

    # Then a new incarnation does not offer it again
    result = _restart(harness)

    assert (result.reason, result.offer) == ("no_candidates", None)


def test_a_draining_worker_still_gets_its_lease_recovered(harness: Harness) -> None:
    offer = _claimed_then_restart(harness)
    harness.db.raw("UPDATE workers SET status = 'draining'")

    result = _restart(harness)

    assert result.reason == "recovered" and result.offer is not None
    assert result.offer.offer_id == offer.offer_id


def test_a_worker_session_at_its_expiry_instant_gets_no_recovery(harness: Harness) -> None:
    # Given an undelivered claim whose worker's session expires exactly now (the lease itself still live)
    _claimed_then_restart(harness)
    harness.db.raw("UPDATE workers SET lease_expires_at_ms = ?", (harness.now_ms(),))
    if harness.dialect == "postgres":  # the database clock moves on: the instant is already behind
        harness.advance_clock(1)

    assert _restart(harness).offer is None


def test_a_lease_at_its_expiry_instant_is_not_recovered_and_one_ms_before_is(harness: Harness) -> None:
    _claimed_then_restart(harness)
    if harness.dialect == "sqlite":
        harness.advance_clock(LEASE_MS - 1)
        assert _restart(harness).reason == "recovered"
        harness.advance_clock(1)
    else:
        harness.advance_clock(LEASE_MS)

    # the run is still dispatching (the expiry loop has not run): nothing to recover or claim
    result = _restart(harness)
    assert (result.reason, result.offer) == ("no_candidates", None)


def test_a_lease_whose_attempt_started_after_the_recovery_page_is_not_offered(harness: Harness) -> None:
    # Given an undelivered claim, and the worker ACKs starting just after the recovery page was read
    offer = _claimed_then_restart(harness)

    def worker_starts() -> None:
        harness.db.transaction(lambda tx: lease_results.ack_starting(tx, offer.fence))

    # unit 1 reads the recovery page, unit 2 builds the offer
    since = harness.now_ms()
    restarted = dispatcher(before_unit(harness.db, 2, worker_starts), since=since, lease_ms=LEASE_MS)

    result = restarted.dispatch_once()

    # Then the started attempt is not offered again: nothing is recovered or claimed
    assert (result.reason, result.offer) == ("no_candidates", None)
