"""The worker pull (ADR-0108, docs/cluster.md "Pull") on SQLite and PostgreSQL: a claim for the
authenticated session only, the identical offer on an identical retry, a conflict on drift, and no
second lease under races between real connections."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from ql3.application import workers
from ql3.cluster.pull import OfferConflict, PullRequest, PullService, pull_offer_id
from ql3.domain.digests import new_token, sha256_hex
from ql3.domain.errors import FenceConflict, ValidationFailed
from tests.support.builders import count, seed_task, start_run
from tests.support.databases import Harness
from tests.support.execution_builders import live_leases, queued, register, request


def test_a_pull_claims_one_run_for_the_registry_session(harness: Harness) -> None:
    # Given one queued run and a registered worker
    _, _, [run] = queued(harness.db)
    session = register(harness.db, "w1")
    req = request(session)

    # When the worker pulls
    result = PullService(harness.db).pull_once(req)

    # Then the run is claimed for exactly that session, and only the token's digest is stored
    assert result.reason == "claimed" and result.offer is not None
    fence = result.offer.fence
    assert (fence.run_id, fence.worker_id, fence.session_id, fence.worker_generation) == (
        run.id,
        "w1",
        session.session_id,
        session.generation,
    )
    assert result.offer.offer_id == req.offer_id
    [lease] = harness.db.raw("SELECT * FROM run_leases")
    assert lease["lease_token_digest"] == sha256_hex(req.lease_token)
    assert req.lease_token not in json.dumps(lease)
    assert harness.db.raw("SELECT status FROM runs")[0]["status"] == "dispatching"


def test_an_identical_retry_returns_the_identical_offer_on_any_replica(harness: Harness) -> None:
    # Given a pull whose response the worker never saw
    queued(harness.db, 2)
    session = register(harness.db, "w1")
    req = request(session)
    first = PullService(harness.db).pull_once(req)
    assert first.offer is not None
    events = count(harness.db, "run_events")

    # When it retries the same pair, on this replica and on another one (a second connection)
    again = PullService(harness.db).pull_once(req)
    other = harness.second_connection()
    try:
        elsewhere = PullService(other).pull_once(req)
    finally:
        other.close()

    # Then both answers are the same offer, and nothing new was leased or recorded
    assert again.reason == elsewhere.reason == "replayed"
    assert again.offer is not None and elsewhere.offer is not None
    assert again.offer.to_json() == first.offer.to_json() == elsewhere.offer.to_json()
    assert live_leases(harness.db) == 1
    assert count(harness.db, "run_events") == events


def test_a_retry_finds_its_offer_when_nothing_else_is_queued(harness: Harness) -> None:
    # Given the only queued run claimed by a pull whose response was lost
    queued(harness.db, 1)
    session = register(harness.db, "w1")
    req = request(session)
    first = PullService(harness.db).pull_once(req)
    assert first.offer is not None

    # When the worker retries: no candidate is left to scan
    again = PullService(harness.db).pull_once(req)

    # Then it still gets its offer back (found by its lease, before any scan)
    assert again.reason == "replayed" and again.offer is not None
    assert again.offer.to_json() == first.offer.to_json()


def test_the_same_offer_id_with_another_token_is_a_conflict_and_changes_nothing(harness: Harness) -> None:
    # Given a claimed pull and another queued run
    queued(harness.db, 2)
    session = register(harness.db, "w1")
    req = request(session)
    assert PullService(harness.db).pull_once(req).offer is not None
    events = count(harness.db, "run_events")

    # When a pull presents that offer id with another token
    drift = PullRequest(
        worker_id=req.worker_id,
        session_id=req.session_id,
        generation=req.generation,
        offer_id=req.offer_id,
        lease_token=new_token(),
    )

    # Then it conflicts, and no second lease or event exists
    with pytest.raises(OfferConflict):
        PullService(harness.db).pull_once(drift)
    assert live_leases(harness.db) == 1
    assert count(harness.db, "run_events") == events


def test_a_pull_for_a_replaced_session_is_fenced_and_claims_nothing(harness: Harness) -> None:
    # Given a worker whose session was replaced by a new registration
    queued(harness.db)
    old = register(harness.db, "w1")
    new = register(harness.db, "w1")
    assert new.generation == old.generation + 1

    # When the old session pulls
    with pytest.raises(FenceConflict) as caught:
        PullService(harness.db).pull_once(request(old))

    # Then it is fenced and the run stays queued
    assert caught.value.details["reason"] == "worker_session_mismatch"
    assert live_leases(harness.db) == 0
    # And a session cannot be claimed for by naming another generation either
    wrong = request(new)
    wrong = PullRequest(
        worker_id=wrong.worker_id,
        session_id=wrong.session_id,
        generation=new.generation + 1,
        offer_id=wrong.offer_id,
        lease_token=wrong.lease_token,
    )
    with pytest.raises(FenceConflict) as caught:
        PullService(harness.db).pull_once(wrong)
    assert caught.value.details["reason"] == "worker_generation_mismatch"
    assert live_leases(harness.db) == 0


def test_a_retry_from_a_new_session_never_takes_over_the_old_sessions_lease(harness: Harness) -> None:
    # Given a pull claimed by one session, which is then replaced
    queued(harness.db, 2)
    old = register(harness.db, "w1")
    token = new_token()
    assert PullService(harness.db).pull_once(request(old, token)).offer is not None
    new = register(harness.db, "w1")

    # When the new session presents the same pair
    with pytest.raises(OfferConflict):
        PullService(harness.db).pull_once(request(new, token))

    # Then there is still exactly the one lease
    assert live_leases(harness.db) == 1


def test_a_draining_or_full_worker_gets_no_new_claim(harness: Harness) -> None:
    queued(harness.db, 3)
    session = register(harness.db, "w1", slots=1)
    service = PullService(harness.db)
    assert service.pull_once(request(session)).reason == "claimed"
    # full: one slot, one lease
    assert service.pull_once(request(session)).reason == "no_capacity"
    harness.db.transaction(lambda tx: workers.drain(tx, "w1"))
    drained = harness.db.transaction(lambda tx: workers.current_session(tx, "w1", session.session_id, 1))
    assert service.pull_once(request(drained)).reason == "draining"
    assert live_leases(harness.db) == 1


def test_placement_is_the_dispatchers_a_run_the_worker_cannot_take_stays_queued(harness: Harness) -> None:
    project, _, _ = queued(harness.db, 0)
    picky = seed_task(harness.db, project, name="picky", require={"zone": "b"})
    start_run(harness.db, project, picky)
    session = register(harness.db, "w1", labels={"zone": "a"})
    assert PullService(harness.db).pull_once(request(session)).reason == "no_match"
    assert live_leases(harness.db) == 0


def test_bad_tokens_and_offer_ids_are_refused(harness: Harness) -> None:
    queued(harness.db)
    session = register(harness.db, "w1")
    short = PullRequest(
        worker_id="w1",
        session_id=session.session_id,
        generation=1,
        offer_id=pull_offer_id("w1", "short"),
        lease_token="short",
    )
    with pytest.raises(ValidationFailed):
        PullService(harness.db).pull_once(short)
    token = new_token()
    other_worker = PullRequest(
        worker_id="w1",
        session_id=session.session_id,
        generation=1,
        offer_id=pull_offer_id("w2", token),  # bound to another worker id
        lease_token=token,
    )
    with pytest.raises(OfferConflict):
        PullService(harness.db).pull_once(other_worker)
    assert live_leases(harness.db) == 0


def _race(harness: Harness, fn: Any, n: int = 2) -> list[Any]:
    dbs = [harness.db, *[harness.second_connection() for _ in range(n - 1)]]
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def go(i: int) -> None:
        try:
            barrier.wait()
            results[i] = fn(dbs[i])
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for db in dbs[1:]:
        db.close()
    assert not errors, errors
    return results


def test_two_replicas_racing_for_the_last_slot_claim_once(harness: Harness) -> None:
    # Given a one-slot worker and many queued runs
    queued(harness.db, 8)
    session = register(harness.db, "w1", slots=1)

    # When two replicas (two real connections) answer two pulls of it at the same time, repeatedly
    def pulls(db: Any) -> list[str]:
        service = PullService(db)
        return [service.pull_once(request(session)).reason for _ in range(4)]

    reasons = _race(harness, pulls)

    # Then exactly one run was claimed; every other pull found the slot taken
    flat = [r for rs in reasons for r in rs]
    assert flat.count("claimed") == 1
    assert set(flat) <= {"claimed", "no_capacity"}
    assert live_leases(harness.db) == 1
    assert int(harness.db.raw("SELECT active_leases AS n FROM workers")[0]["n"]) == 1


def test_the_same_retry_on_two_replicas_at_once_leases_once(harness: Harness) -> None:
    # Given queued runs and one pull pair sent to two replicas at the same instant
    queued(harness.db, 4)
    session = register(harness.db, "w1", slots=4)
    req = request(session)

    offers = _race(harness, lambda db: PullService(db).pull_once(req))

    # Then both answers carry the one offer and one lease exists
    assert {o.reason for o in offers} <= {"claimed", "replayed"}
    assert offers[0].offer.to_json() == offers[1].offer.to_json()
    assert live_leases(harness.db) == 1


def test_a_waiting_pull_is_woken_by_a_new_run(harness: Harness) -> None:
    # Given a worker long-polling an empty queue (it looks again only when woken, or at the end)
    project, task, _ = queued(harness.db, 0)
    session = register(harness.db, "w1")
    service = PullService(harness.db)
    found: list[Any] = []
    started = threading.Event()

    def poll() -> None:
        started.set()
        found.append(service.pull(request(session), wait_ms=20_000))

    thread = threading.Thread(target=poll)
    thread.start()
    started.wait()
    # When a run is created (its commit notifies "runs")
    start_run(harness.db, project, task)
    thread.join(60)

    # Then the pull returned with it
    assert found and found[0].offer is not None and found[0].reason == "claimed"


def test_a_replay_only_pull_re_delivers_a_live_lease_and_never_claims(harness: Harness) -> None:
    # Given a claimed pull, and another queued run
    queued(harness.db, 2)
    session = register(harness.db, "w1")
    req = request(session)
    first = PullService(harness.db).pull_once(req)
    assert first.offer is not None

    # When a restarted worker replays that pair only
    again = PullService(harness.db).pull(req, wait_ms=0, replay_only=True)

    # Then it gets the same offer; and a pair with no live lease gets nothing, and claims nothing
    assert again.offer is not None and again.offer.to_json() == first.offer.to_json()
    nothing = PullService(harness.db).pull(request(session), wait_ms=0, replay_only=True)
    assert nothing.offer is None and nothing.reason == "not_live"
    assert live_leases(harness.db) == 1


class _CountingDb:
    """The harness's database, counting its units by kind."""

    def __init__(self, db: Any) -> None:
        self._db = db
        self.units: list[str] = []
        self.dialect = db.dialect
        self.notifier = getattr(db, "notifier", None)

    def transaction(self, fn: Any, *, write: bool = True) -> Any:
        self.units.append("write" if write else "read")
        return self._db.transaction(fn, write=write)


def test_a_pull_that_claims_from_its_first_page_is_one_transaction(harness: Harness) -> None:
    # Given a queued run whose spec the replica has read once already (the spec cache is warm)
    queued(harness.db, 2)
    session = register(harness.db, "w1")
    counting = _CountingDb(harness.db)
    service = PullService(counting)  # type: ignore[arg-type]
    assert service.pull_once(request(session)).reason == "claimed"
    counting.units.clear()

    # When the worker pulls again
    assert service.pull_once(request(session)).reason == "claimed"

    # Then the session, the live leases, the worker's slots, the first page of candidates and the
    # claim are one unit: the per-pull budget
    assert counting.units == ["write"]


def test_a_new_run_wakes_every_waiting_pull_but_costs_one_pass(harness: Harness) -> None:
    # Given two workers long-polling an empty queue on one replica
    project, task, _ = queued(harness.db, 0)
    sessions = [register(harness.db, "w1"), register(harness.db, "w2")]
    counting = _CountingDb(harness.db)
    service = PullService(counting)  # type: ignore[arg-type]
    found: list[Any] = []

    def poll(session: workers.WorkerSession) -> None:
        found.append(service.pull(request(session), wait_ms=20_000))

    threads = [threading.Thread(target=poll, args=(s,)) for s in sessions]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while harness.db.notifier.waiting("runs") < 2 and time.monotonic() < deadline:  # both wait
        time.sleep(0.01)
    assert counting.units == ["write", "write"]

    # When one run is created (its commit wakes both)
    start_run(harness.db, project, task)
    while not found and time.monotonic() < deadline:
        time.sleep(0.01)
    while service.herd_skips < 1 and time.monotonic() < deadline:
        time.sleep(0.01)

    # Then one pull took it in one pass, and the other went back to waiting without a pass of its own
    assert len(found) == 1 and found[0].reason == "claimed"
    assert counting.units == ["write", "write", "write"]
    assert service.herd_skips == 1
    service.close()
    for thread in threads:
        thread.join(30)
    assert live_leases(harness.db) == 1


def test_a_pass_says_the_queue_is_empty_only_when_it_left_nothing_behind(harness: Harness) -> None:
    # Given a worker without labels, one run it can take and one that needs a label
    project, task, _ = queued(harness.db, 0)
    picky = seed_task(harness.db, project, name="picky", require={"gpu": "yes"})
    w1 = register(harness.db, "w1")
    service = PullService(harness.db)
    assert service.pull_once(request(w1)).queue_empty  # nothing queued at all

    # When it claims from a queue of two, of which the other is one it cannot take
    start_run(harness.db, project, task)
    start_run(harness.db, project, picky)
    claimed = service.pull_once(request(w1))
    left = service.pull_once(request(w1))

    # Then neither pass says empty: a woken pull of another worker must still look
    assert claimed.reason == "claimed" and not claimed.queue_empty
    assert left.reason == "no_match" and not left.queue_empty

    # And a pass that claims the last run says so
    start_run(harness.db, project, task)
    w2 = register(harness.db, "w2", labels={"gpu": "yes"})
    first = service.pull_once(request(w2))
    assert first.reason == "claimed" and not first.queue_empty  # one of two: one remains
    last = service.pull_once(request(w2))
    assert last.reason == "claimed" and last.queue_empty
