"""Reads: keyset paging, lookup by attempt, and the read-only startup audit with its fail-closed budget."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ql3.domain.journal import JournalBudgetExceeded, JournalRecord
from ql3.worker.journal.store import WorkerJournal
from tests.support.journal_builders import (
    LEASE_TOKEN,
    PATH_TO,
    Clock,
    make_offer,
    walk,
)


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[WorkerJournal]:
    with WorkerJournal.open(tmp_path / "worker.db", clock=Clock(), capacity=1024) as opened:
        yield opened


def _seed(journal: WorkerJournal, states: list[str]) -> dict[str, JournalRecord]:
    records = {}
    for index, state in enumerate(states):
        offer_id = f"offer-{index:04d}"
        journal.accept(make_offer(offer_id))
        records[offer_id] = walk(journal, offer_id, *PATH_TO[state])
    return records


def test_pages_follow_the_offer_id_keyset_to_the_end(journal: WorkerJournal) -> None:
    # Given five records accepted out of id order
    for offer_id in ["offer-c", "offer-a", "offer-e", "offer-b", "offer-d"]:
        journal.accept(make_offer(offer_id))

    # When they are read two at a time, each page starting after the last id seen
    pages: list[list[str]] = []
    after = ""
    while True:
        page = journal.page(after_offer_id=after, limit=2)
        pages.append([r.offer_id for r in page])
        if not page:
            break
        after = page[-1].offer_id

    # Then every record appears once, in id order
    assert pages == [["offer-a", "offer-b"], ["offer-c", "offer-d"], ["offer-e"], []]


def test_a_page_can_be_filtered_by_state(journal: WorkerJournal) -> None:
    records = _seed(journal, ["accepted", "started", "launching", "started", "completion_acknowledged"])

    page = journal.page(states={"started", "launching"})

    assert page == [records["offer-0001"], records["offer-0002"], records["offer-0003"]]
    assert journal.page(states=["recovery_required"]) == []


def test_a_page_is_capped_at_64(journal: WorkerJournal) -> None:
    _seed(journal, ["accepted"] * 70)

    assert len(journal.page()) == 64
    assert len(journal.page(limit=64)) == 64
    assert [r.offer_id for r in journal.page(after_offer_id="offer-0064")] == [
        f"offer-{i:04d}" for i in range(65, 70)
    ]


@pytest.mark.parametrize(
    "arguments",
    [
        {"limit": 0},
        {"limit": 65},
        {"limit": -1},
        {"states": "accepted"},
        {"states": []},
        {"states": ["accepted", "done"]},
        {"after_offer_id": "x" * 256},
    ],
)
def test_out_of_range_page_arguments_are_refused(journal: WorkerJournal, arguments: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        journal.page(**arguments)


def test_get_and_find_by_attempt_return_none_for_unknown_ids(journal: WorkerJournal) -> None:
    assert journal.get("offer-404") is None
    assert journal.find_by_attempt("attempt-404") is None


def test_find_by_attempt_returns_the_highest_lease_generation(journal: WorkerJournal) -> None:
    # Given two offers for one attempt, from lease generations 2 and 1
    newer = journal.accept(make_offer("offer-a", attempt_id="attempt-7", lease_generation=2)).record
    journal.accept(make_offer("offer-b", attempt_id="attempt-7", lease_generation=1))

    # When the attempt is looked up
    found = journal.find_by_attempt("attempt-7")

    # Then the record of the newer lease comes back
    assert found == newer


def test_the_audit_classifies_every_state_without_writing(journal: WorkerJournal) -> None:
    # Given one record in each of the nine states
    records = _seed(journal, list(PATH_TO))
    ids = {r.state: r.offer_id for r in records.values()}

    # When the journal is audited
    audit = journal.audit()

    # Then each state lands in its class and only reconciler classes are listed for reconciliation
    assert dict(audit.counts) == {
        "no_local_execution": 3,
        "converged": 1,
        "settled": 1,
        "launch_reconciler": 2,
        "execution_reconciler": 2,
    }
    assert audit.total == 9
    assert audit.needs_reconciliation == tuple(
        sorted(ids[s] for s in ("launching", "recovery_required", "started", "running_acknowledged"))
    )
    assert {k: journal.get(k) for k in records} == records
    assert LEASE_TOKEN not in repr(audit)


def test_an_empty_journal_audits_clean(journal: WorkerJournal) -> None:
    audit = journal.audit()

    assert audit.total == 0
    assert set(audit.counts.values()) == {0}
    assert audit.needs_reconciliation == ()


def test_the_audit_fits_exactly_its_budget(journal: WorkerJournal) -> None:
    _seed(journal, ["accepted"] * 9)

    assert journal.audit(page_size=3, max_pages=3).total == 9


def test_the_audit_fails_closed_one_record_past_its_budget(journal: WorkerJournal) -> None:
    # Given ten records and a budget of three pages of three
    _seed(journal, ["started"] * 10)

    # When the journal is audited
    with pytest.raises(JournalBudgetExceeded) as caught:
        journal.audit(page_size=3, max_pages=3)

    # Then no partial audit is returned
    assert caught.value.code == "journal_budget_exceeded"


def test_the_default_audit_budget_is_16_by_4(journal: WorkerJournal) -> None:
    _seed(journal, ["accepted"] * 64)
    assert journal.audit().total == 64

    journal.accept(make_offer("offer-9999"))
    with pytest.raises(JournalBudgetExceeded):
        journal.audit()
    assert journal.audit(page_size=64, max_pages=16).total == 65


@pytest.mark.parametrize(("page_size", "max_pages"), [(0, 4), (65, 4), (16, 0), (16, 17)])
def test_the_audit_budget_has_hard_limits(journal: WorkerJournal, page_size: int, max_pages: int) -> None:
    with pytest.raises(ValueError):
        journal.audit(page_size=page_size, max_pages=max_pages)
