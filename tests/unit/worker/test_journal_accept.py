"""Accepting offers: dedupe by offer id, identity drift, lease-recovery refresh, capacity, validation."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ql3.domain.journal import JournalConflict, JournalFull, JournalInvalid, JournalState
from ql3.worker.journal.store import WorkerJournal
from tests.support.journal_builders import (
    LEASE_TOKEN,
    SPEC_DIGEST,
    STEP_FIELDS,
    Clock,
    make_offer,
    walk,
)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def journal(tmp_path: Path, clock: Clock) -> Iterator[WorkerJournal]:
    with WorkerJournal.open(tmp_path / "journal" / "worker.db", clock=clock) as opened:
        yield opened


def test_a_new_offer_is_accepted_at_revision_one(journal: WorkerJournal, clock: Clock) -> None:
    offer = make_offer()

    result = journal.accept(offer)

    assert result.created is True
    assert result.record.state == "accepted"
    assert result.record.revision == 1
    assert result.record.accepted_at_ms == result.record.updated_at_ms == clock.now
    assert result.record.offer_json == offer.offer_json
    assert journal.get("offer-1") == result.record


def test_a_redelivered_offer_returns_the_stored_record_without_a_write(
    journal: WorkerJournal, clock: Clock
) -> None:
    # Given an offer that already moved on to starting_acknowledged
    journal.accept(make_offer())
    stored = walk(journal, "offer-1", "starting_acknowledged")
    clock.now += 5_000

    # When the same offer arrives again
    result = journal.accept(make_offer())

    # Then the stored record comes back unchanged and is not re-created
    assert result.created is False
    assert result.record == stored
    assert journal.get("offer-1") == stored


@pytest.mark.parametrize(
    "drift",
    [
        {"execution_spec_digest": hashlib.sha256(b"other spec").hexdigest()},
        {"run_id": "run-2"},
        {"attempt_id": "attempt-other"},
        {"lease_generation": 2},
    ],
    ids=["digest", "run", "attempt", "lease_generation"],
)
def test_the_same_offer_id_with_another_identity_is_a_conflict_and_writes_nothing(
    journal: WorkerJournal, clock: Clock, drift: dict[str, Any]
) -> None:
    # Given an accepted offer
    original = journal.accept(make_offer()).record
    clock.now += 1_000

    # When the same offer id arrives with a different identity (as a recovery, to try the refresh path)
    with pytest.raises(JournalConflict) as caught:
        journal.accept(
            make_offer(delivery_kind="lease_recovery", offer_json='{"lease":{"version":9}}', **drift)
        )

    # Then it is refused and the stored record is untouched
    assert caught.value.code == "journal_conflict"
    assert caught.value.details["reason"] == "identity_mismatch"
    assert journal.get("offer-1") == original
    assert len(journal.page()) == 1


def test_a_lease_recovery_redelivery_refreshes_the_offer_before_anything_is_spawned(
    journal: WorkerJournal, clock: Clock
) -> None:
    # Given an offer that is starting_acknowledged at revision 2
    journal.accept(make_offer())
    before = walk(journal, "offer-1", "starting_acknowledged")
    clock.now += 1_000
    newer = json.dumps({"lease": {"token": LEASE_TOKEN, "version": 2}})

    # When a lease_recovery redelivery carries a newer lease version
    result = journal.accept(make_offer(delivery_kind="lease_recovery", offer_json=newer))

    # Then the stored offer is replaced under a new revision and the old revision is stale
    assert result.created is False
    assert result.record.offer_json == newer
    assert result.record.revision == before.revision + 1
    assert result.record.updated_at_ms == clock.now
    assert result.record.state == "starting_acknowledged"
    assert journal.get("offer-1") == result.record
    with pytest.raises(JournalConflict):
        journal.advance(
            "offer-1", expected_revision=before.revision, to_state="launching", **STEP_FIELDS["launching"]
        )


def test_a_redelivery_after_launch_keeps_the_stored_offer(journal: WorkerJournal) -> None:
    # Given an offer whose launch was already recorded
    journal.accept(make_offer())
    launching = walk(journal, "offer-1", "starting_acknowledged", "launching")

    # When a lease_recovery redelivery carries a different offer body
    result = journal.accept(make_offer(delivery_kind="lease_recovery", offer_json='{"lease":{"version":7}}'))

    # Then nothing changes: only pre-spawn records may be refreshed
    assert result.created is False
    assert result.record == launching
    assert journal.get("offer-1") == launching


def test_a_new_claim_duplicate_never_replaces_the_stored_offer(journal: WorkerJournal) -> None:
    stored = journal.accept(make_offer()).record

    result = journal.accept(make_offer(offer_json='{"lease":{"version":3}}'))

    assert result.record == stored
    assert journal.get("offer-1") == stored


def test_a_full_journal_refuses_a_new_offer_and_evicts_nothing(tmp_path: Path, clock: Clock) -> None:
    with WorkerJournal.open(tmp_path / "worker.db", clock=clock, capacity=2) as journal:
        # Given two active offers in a journal of capacity 2
        first = journal.accept(make_offer("offer-1")).record
        second = journal.accept(make_offer("offer-2")).record

        # When a third offer arrives
        with pytest.raises(JournalFull) as caught:
            journal.accept(make_offer("offer-3"))

        # Then it is refused, nothing was evicted, and redeliveries of stored offers still dedupe
        assert caught.value.code == "journal_full"
        assert journal.page() == [first, second]
        assert journal.accept(make_offer("offer-1")).created is False


@pytest.mark.parametrize(
    "path_to_terminal",
    [
        ("start_failed", "start_failure_acknowledged"),
        ("starting_acknowledged", "launching", "started", "running_acknowledged", "completion_acknowledged"),
    ],
    ids=["start_failure_acknowledged", "completion_acknowledged"],
)
def test_a_terminal_record_frees_capacity(
    tmp_path: Path, clock: Clock, path_to_terminal: tuple[JournalState, ...]
) -> None:
    with WorkerJournal.open(tmp_path / "worker.db", clock=clock, capacity=1) as journal:
        # Given a full journal whose only record then reaches a terminal state
        journal.accept(make_offer("offer-1"))
        with pytest.raises(JournalFull):
            journal.accept(make_offer("offer-2"))
        walk(journal, "offer-1", *path_to_terminal)

        # When another offer arrives
        result = journal.accept(make_offer("offer-2"))

        # Then it fits, and the terminal record is still kept
        assert result.created is True
        assert [r.offer_id for r in journal.page()] == ["offer-1", "offer-2"]


def test_recovery_required_still_counts_against_capacity(tmp_path: Path, clock: Clock) -> None:
    with WorkerJournal.open(tmp_path / "worker.db", clock=clock, capacity=1) as journal:
        journal.accept(make_offer("offer-1"))
        walk(journal, "offer-1", "starting_acknowledged", "launching", "recovery_required")

        with pytest.raises(JournalFull):
            journal.accept(make_offer("offer-2"))


@pytest.mark.parametrize("capacity", [0, -1, 1025, True])
def test_capacity_outside_1_to_1024_is_refused_before_the_file_exists(
    tmp_path: Path, clock: Clock, capacity: int
) -> None:
    with pytest.raises(ValueError):
        WorkerJournal.open(tmp_path / "journal" / "worker.db", clock=clock, capacity=capacity)

    assert not (tmp_path / "journal").exists()


def test_the_hard_capacity_cap_is_accepted(tmp_path: Path, clock: Clock) -> None:
    with WorkerJournal.open(tmp_path / "worker.db", clock=clock, capacity=1024) as journal:
        assert journal.capacity == 1024


@pytest.mark.parametrize(
    "bad",
    [
        {"execution_spec_digest": SPEC_DIGEST.upper()},
        {"execution_spec_digest": SPEC_DIGEST[:-1]},
        {"offer_id": ""},
        {"offer_id": "offer/../1"},
        {"run_id": "run 1"},
        {"lease_generation": -1},
        {"lease_generation": "1"},
        {"delivery_kind": "push"},
        {"offer_json": "not json"},
        {"offer_json": "[1, 2]"},
        {"offer_json": json.dumps({"pad": "x" * (192 * 1024)})},
    ],
)
def test_an_invalid_offer_is_refused_before_any_write(journal: WorkerJournal, bad: dict[str, Any]) -> None:
    with pytest.raises(JournalInvalid) as caught:
        journal.accept(make_offer(**bad))

    assert isinstance(caught.value, ValueError)
    assert journal.page() == []


def test_the_lease_token_never_appears_in_a_repr_or_an_error(journal: WorkerJournal) -> None:
    record = journal.accept(make_offer()).record
    with pytest.raises(JournalConflict) as caught:
        journal.accept(make_offer(run_id="run-2"))

    assert LEASE_TOKEN not in repr(make_offer())
    assert LEASE_TOKEN not in repr(record)
    assert LEASE_TOKEN not in str(caught.value)
    assert str(caught.value) == "The journal record does not match the expected identity, revision or state."
