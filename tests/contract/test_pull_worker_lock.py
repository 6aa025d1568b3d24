"""The pull's claim locks the worker's registry row before it looks for a live lease under the pulled
token (docs/cluster.md "Pull"): two replicas answering the same retry at once serialise there, so the
second finds the first one's lease and replays it instead of claiming another run under the same token.

The race is forced with two real connections. Replica B's walk for the worker resumes behind the head
of the queue (its per-replica scan cursor), so without the lock it would claim a different run than
replica A, and neither claim would wait on the other's run row. On SQLite every write transaction is
``BEGIN IMMEDIATE``, so the writers serialise on the database lock whether or not the row is locked;
the same interleaving must still lease once there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from ql3.application import lease_claims
from ql3.cluster.pull import PullResult, PullService
from ql3.ports.storage import Transaction
from ql3.repositories import runs as run_repo
from tests.support.databases import Harness
from tests.support.execution_builders import live_leases, queued, register, request
from tests.support.waits import wait_for

T = TypeVar("T")


class _WriteSignal:
    """A database that reports when a write transaction is asked for (before it begins)."""

    def __init__(self, db: Any) -> None:
        self._db = db
        self.dialect: str = db.dialect
        self.writing = threading.Event()

    def transaction(self, fn: Callable[[Transaction], T], *, write: bool = True) -> T:
        if write:
            self.writing.set()
        result: T = self._db.transaction(fn, write=write)
        return result

    def wait_for(self, channel: str, timeout_s: float) -> bool:
        return bool(self._db.wait_for(channel, timeout_s))

    def close(self) -> None:
        self._db.close()


def _waiting_on_a_lock(harness: Harness) -> bool:
    if harness.dialect != "postgres":
        return True  # B's write transaction queues on the database lock A holds (BEGIN IMMEDIATE)
    rows = harness.db.raw(
        "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock'"
    )
    return int(rows[0]["n"]) >= 1


def test_one_retry_on_two_replicas_with_different_walks_leases_once(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given three queued runs, a worker with a slot for each, and one pull pair (a retry)
    queued(harness.db, 3)
    session = register(harness.db, "w1", slots=4)
    req = request(session)
    [head] = harness.db.transaction(
        lambda tx: run_repo.queued_candidates(tx, after=None, limit=1), write=False
    )
    # and replica A stopped inside its claim transaction, just before it claims the head run
    real_claim = lease_claims.claim
    paused = threading.Event()
    release = threading.Event()
    claims: list[str] = []
    guard = threading.Lock()

    def held_claim(tx: Transaction, **kwargs: Any) -> lease_claims.RunClaim:
        with guard:
            claims.append(str(kwargs["run_id"]))
            first = len(claims) == 1
        if first:
            paused.set()
            assert release.wait(60)
        return real_claim(tx, **kwargs)

    monkeypatch.setattr(lease_claims, "claim", held_claim)
    other = _WriteSignal(harness.second_connection())
    results: dict[str, PullResult] = {}
    errors: list[BaseException] = []
    b_done = threading.Event()

    def replica_a() -> None:
        try:
            results["a"] = PullService(harness.db).pull_once(req)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    def replica_b() -> None:
        try:
            results["b"] = PullService(other).pull_once(req, head)  # resumes behind the head
        except BaseException as exc:
            errors.append(exc)
        finally:
            b_done.set()

    a = threading.Thread(target=replica_a)
    a.start()
    b = threading.Thread(target=replica_b)
    try:
        assert paused.wait(60)
        # When replica B answers the same pair while A's claim is in flight
        b.start()
        wait_for(
            lambda: b_done.is_set() or (other.writing.is_set() and _waiting_on_a_lock(harness)),
            what="replica B to finish or to wait on replica A's lock",
        )
    finally:
        release.set()
        a.join(60)
        if b.ident is not None:
            b.join(60)
        other.close()
    assert not errors, errors

    # Then A claimed the head run and B, which waited for A's commit, replayed A's offer: one lease
    assert (results["a"].reason, results["b"].reason) == ("claimed", "replayed")
    assert results["a"].offer is not None and results["b"].offer is not None
    assert results["a"].offer.to_json() == results["b"].offer.to_json()
    assert results["a"].offer.fence.run_id == head.run_id
    assert claims == [head.run_id]
    assert live_leases(harness.db) == 1
