"""A pull that proposes several pairs (docs/cluster.md "Pull") on SQLite and PostgreSQL: one run per
pair and per free slot in one transaction, each offer under its own pair, a retry that re-delivers
without claiming more, refused drift, and a fresh pull that asks again without a transaction when
the queue is known to be empty."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import pytest

from ql3.application import workers
from ql3.cluster.pull import MAX_PULL_PAIRS, OfferConflict, PullPair, PullRequest, PullService, pull_offer_id
from ql3.domain.digests import new_token, sha256_hex
from ql3.domain.errors import ValidationFailed
from tests.support.builders import start_run
from tests.support.databases import Harness
from tests.support.execution_builders import live_leases, queued, register, request


class _CountingDb:
    """The harness's database, counting its units."""

    def __init__(self, db: Any) -> None:
        self._db = db
        self.units: list[str] = []
        self.dialect = db.dialect
        self.notifier = getattr(db, "notifier", None)

    def transaction(self, fn: Any, *, write: bool = True) -> Any:
        self.units.append("write" if write else "read")
        return self._db.transaction(fn, write=write)


def _pair(worker_id: str) -> PullPair:
    token = new_token()
    return PullPair(pull_offer_id(worker_id, token), token)


def several(session: workers.WorkerSession, n: int) -> PullRequest:
    return dataclasses.replace(request(session), more=tuple(_pair(session.worker_id) for _ in range(n - 1)))


def test_a_pull_of_three_pairs_claims_three_runs_in_one_transaction(harness: Harness) -> None:
    # Given five queued runs and a worker with four free slots
    queued(harness.db, 5)
    session = register(harness.db, "w1", slots=4)
    counting = _CountingDb(harness.db)
    service = PullService(counting)  # type: ignore[arg-type]
    service.pull_once(request(session))  # warms the spec cache; takes one slot
    counting.units.clear()

    # When it pulls with three pairs
    req = several(session, 3)
    result = service.pull_once(req)

    # Then three runs are claimed in one write transaction, each under its own pair
    assert result.reason == "claimed" and result.offer is not None
    offers = [result.offer, *result.more_offers]
    assert counting.units == ["write"]
    assert [o.offer_id for o in offers] == [p.offer_id for p in req.pairs()]
    digests = {
        row["attempt_id"]: row["lease_token_digest"] for row in harness.db.raw("SELECT * FROM run_leases")
    }
    for offer, pair in zip(offers, req.pairs(), strict=True):
        assert offer.fence.lease_token == pair.lease_token
        assert digests[offer.fence.attempt_id] == sha256_hex(pair.lease_token)
    assert len({o.fence.run_id for o in offers}) == 3
    assert live_leases(harness.db) == 4


def test_a_pull_claims_no_more_runs_than_the_worker_has_free_slots(harness: Harness) -> None:
    # Given four queued runs and a worker with two slots
    queued(harness.db, 4)
    session = register(harness.db, "w1", slots=2)

    # When it proposes four pairs
    result = PullService(harness.db).pull_once(several(session, 4))

    # Then it gets two offers, and two runs stay queued
    assert result.reason == "claimed" and len(result.more_offers) == 1
    assert live_leases(harness.db) == 2
    again = PullService(harness.db).pull_once(several(session, 2))
    assert again.reason == "no_capacity" and again.offer is None


def test_a_retry_of_several_pairs_re_delivers_them_and_claims_nothing_more(harness: Harness) -> None:
    # Given a pull of three pairs that claimed two runs (only two were queued) and whose response
    # was lost, and a run queued after it
    project, task, _ = queued(harness.db, 2)
    session = register(harness.db, "w1", slots=8)
    req = several(session, 3)
    first = PullService(harness.db).pull_once(req)
    assert first.offer is not None and len(first.more_offers) == 1
    start_run(harness.db, project, task)

    # When the worker retries the same three pairs, here and on another replica
    again = PullService(harness.db).pull_once(req)
    other = harness.second_connection()
    try:
        elsewhere = PullService(other).pull_once(req)
    finally:
        other.close()

    # Then both answers are the two offers it claimed, and the new run is not taken by the unused
    # third pair (a pull still in flight and its retry never both claim)
    for answer in (again, elsewhere):
        assert answer.reason == "replayed" and answer.offer is not None
        assert [o.to_json() for o in (answer.offer, *answer.more_offers)] == [
            o.to_json() for o in (first.offer, *first.more_offers)
        ]
    assert live_leases(harness.db) == 2


def test_bad_pairs_are_refused_and_nothing_is_claimed(harness: Harness) -> None:
    queued(harness.db, 3)
    session = register(harness.db, "w1", slots=32)
    service = PullService(harness.db)
    base = request(session)

    duplicate = dataclasses.replace(base, more=(PullPair(base.offer_id, base.lease_token),))
    with pytest.raises(ValidationFailed):
        service.pull_once(duplicate)
    too_many = several(session, MAX_PULL_PAIRS + 1)
    with pytest.raises(ValidationFailed):
        service.pull_once(too_many)
    drift = dataclasses.replace(base, more=(PullPair(_pair("w1").offer_id, new_token()),))
    with pytest.raises(OfferConflict):
        service.pull_once(drift)
    assert live_leases(harness.db) == 0


def test_a_fresh_pull_after_the_queue_was_left_empty_waits_without_a_transaction(harness: Harness) -> None:
    # Given a worker that just took the last queued run (the pass noted the queue empty)
    project, task, _ = queued(harness.db, 1)
    session = register(harness.db, "w1")
    counting = _CountingDb(harness.db)
    service = PullService(counting)  # type: ignore[arg-type]
    took = service.pull(request(session), wait_ms=0)
    assert took.reason == "claimed" and took.queue_empty
    counting.units.clear()

    # When it pulls again with fresh pairs, long-polling
    found: list[Any] = []
    thread = threading.Thread(
        target=lambda: found.append(service.pull(request(session), wait_ms=20_000, fresh=True))
    )
    thread.start()
    deadline = time.monotonic() + 30
    while service.herd_skips < 1 and time.monotonic() < deadline:
        time.sleep(0.01)

    # Then it waits without having opened a transaction
    assert service.herd_skips == 1 and counting.units == [] and not found

    # And a new run wakes it, and it claims the run in one pass
    start_run(harness.db, project, task)
    thread.join(30)
    assert found and found[0].reason == "claimed"
    assert counting.units == ["write"]
    service.close()


def test_a_retried_pull_is_never_skipped(harness: Harness) -> None:
    # Given a pull that claimed the last run and whose response was lost
    queued(harness.db, 1)
    session = register(harness.db, "w1")
    service = PullService(harness.db)
    req = request(session)
    took = service.pull(req, wait_ms=0)
    assert took.queue_empty

    # When the worker retries the same pair (not fresh), with the queue known to be empty
    again = service.pull(req, wait_ms=20_000)

    # Then the first pass runs and re-delivers the offer at once
    assert again.reason == "replayed" and again.offer is not None
    assert took.offer is not None and again.offer.to_json() == took.offer.to_json()
