"""Retention deletes only settled records past their age, a bounded number per call."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ql3.domain.journal import JournalRecord
from ql3.worker.journal.store import WorkerJournal
from tests.support.journal_builders import (
    PATH_TO,
    Clock,
    make_offer,
    walk,
)

HOUR_MS = 3_600_000


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def journal(tmp_path: Path, clock: Clock) -> Iterator[WorkerJournal]:
    with WorkerJournal.open(tmp_path / "worker.db", clock=clock) as opened:
        yield opened


def _put(journal: WorkerJournal, offer_id: str, state: str) -> JournalRecord:
    journal.accept(make_offer(offer_id))
    return walk(journal, offer_id, *PATH_TO[state])


def test_retention_deletes_only_settled_records(journal: WorkerJournal, clock: Clock) -> None:
    # Given an old record in every state
    for state in PATH_TO:
        _put(journal, state, state)
    clock.now += 2 * HOUR_MS

    # When retention runs with room for all of them
    deleted = journal.retention(older_than_ms=HOUR_MS, limit=64)

    # Then only the two settled ones are gone; running_acknowledged is never cleaned
    assert deleted == 2
    assert {r.offer_id for r in journal.page()} == set(PATH_TO) - {
        "completion_acknowledged",
        "start_failure_acknowledged",
    }
    assert journal.retention(older_than_ms=HOUR_MS, limit=64) == 0


def test_retention_keeps_settled_records_younger_than_the_age(journal: WorkerJournal, clock: Clock) -> None:
    # Given one record settled exactly an hour ago and one settled a millisecond later
    _put(journal, "offer-old", "completion_acknowledged")
    clock.now += 1
    _put(journal, "offer-young", "start_failure_acknowledged")
    clock.now += HOUR_MS - 1

    # When retention runs for records older than an hour
    deleted = journal.retention(older_than_ms=HOUR_MS)

    # Then the boundary record goes and the younger one stays
    assert deleted == 1
    assert [r.offer_id for r in journal.page()] == ["offer-young"]


def test_retention_deletes_at_most_limit_per_call_oldest_first(journal: WorkerJournal, clock: Clock) -> None:
    # Given five settled records, settled one minute apart, all older than the age
    for index in range(5):
        _put(journal, f"offer-{4 - index}", "completion_acknowledged")
        clock.now += 60_000
    clock.now += HOUR_MS

    # When retention runs with a limit of two, repeatedly
    first = journal.retention(older_than_ms=HOUR_MS, limit=2)
    left = [r.offer_id for r in journal.page()]
    rest = [journal.retention(older_than_ms=HOUR_MS, limit=2) for _ in range(3)]

    # Then it deletes two, two, one, none, oldest first
    assert [first, *rest] == [2, 2, 1, 0]
    assert left == ["offer-0", "offer-1", "offer-2"]
    assert journal.page() == []


def test_the_default_limit_is_eight(journal: WorkerJournal, clock: Clock) -> None:
    for index in range(10):
        _put(journal, f"offer-{index}", "start_failure_acknowledged")
    clock.now += HOUR_MS

    assert journal.retention(older_than_ms=HOUR_MS) == 8
    assert len(journal.page()) == 2


@pytest.mark.parametrize(
    "arguments",
    [
        {"older_than_ms": HOUR_MS, "limit": 0},
        {"older_than_ms": HOUR_MS, "limit": 65},
        {"older_than_ms": 59_999},
        {"older_than_ms": 30 * 86_400_000 + 1},
    ],
)
def test_retention_arguments_have_hard_limits(
    journal: WorkerJournal, clock: Clock, arguments: dict[str, Any]
) -> None:
    _put(journal, "offer-1", "completion_acknowledged")
    clock.now += 31 * 86_400_000

    with pytest.raises(ValueError):
        journal.retention(**arguments)

    assert len(journal.page()) == 1


def test_prune_deletes_a_settled_record_at_once_and_never_an_in_flight_one(journal: WorkerJournal) -> None:
    # Given one record in every state, all of them fresh
    for state in PATH_TO:
        _put(journal, f"offer-{state}", state)

    # When each is pruned right away
    pruned = {state for state in PATH_TO if journal.prune(f"offer-{state}")}

    # Then only the settled ones (and recovery_required, whose outcome the caller says is recorded) went
    assert pruned == {"completion_acknowledged", "start_failure_acknowledged", "recovery_required"}
    for state in PATH_TO:
        assert (journal.get(f"offer-{state}") is None) == (state in pruned)
    assert journal.prune("offer-missing") is False
