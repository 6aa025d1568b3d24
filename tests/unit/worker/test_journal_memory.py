"""The journal keeps its unsettled records in memory: read and unsealed once, changed only by what it
commits, never trusted over the file's compare-and-set; and the two shortcuts of ``advance`` (``via``,
``prune``) that save a commit per step they merge."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ql3.domain.journal import (
    JournalConflict,
    JournalInvalid,
    JournalRecord,
    JournalState,
    JournalUnavailable,
)
from ql3.worker.journal.seal import TokenSeal
from ql3.worker.journal.store import WorkerJournal
from tests.support.journal_builders import LEASE_TOKEN, STEP_FIELDS, Clock, make_offer, walk

# What the file holds of a record, column for column with the record's fields.
_COLUMNS = (
    "state",
    "revision",
    "updated_at_ms",
    "executor_started_at_ms",
    "log_artifact_id",
    "completion_callback_sequence",
    "completion_token_digest",
    "executor_handle",
    "recovery_reason",
    "completion_acknowledged_at_ms",
)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "journal.db"


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def journal(path: Path, clock: Clock) -> Iterator[WorkerJournal]:
    with WorkerJournal.open(path, clock=clock) as j:
        yield j


def _file_row(path: Path, offer_id: str) -> tuple[Any, ...] | None:
    probe = sqlite3.connect(path)
    try:
        row: tuple[Any, ...] | None = probe.execute(
            f"SELECT {', '.join(_COLUMNS)} FROM journal WHERE offer_id = ?", (offer_id,)
        ).fetchone()
        return row
    finally:
        probe.close()


def _fields(record: JournalRecord) -> tuple[Any, ...]:
    return tuple(getattr(record, name) for name in _COLUMNS)


def _launch(journal: WorkerJournal, record: JournalRecord) -> JournalRecord:
    return journal.advance(
        record.offer_id,
        expected_revision=record.revision,
        to_state="launching",
        via="starting_acknowledged",
        **STEP_FIELDS["launching"],
    )


class _FailingCommit:
    """The journal's connection, except that COMMIT fails (a full disk, an I/O error)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    @property
    def in_transaction(self) -> bool:
        return self._conn.in_transaction

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if sql == "COMMIT":
            raise sqlite3.OperationalError("disk I/O error")
        return self._conn.execute(sql, *args)


def test_what_is_read_after_every_step_is_what_the_file_holds(
    journal: WorkerJournal, path: Path, clock: Clock
) -> None:
    # Given an offer walked through its whole life, with the clock moving between the steps
    record = journal.accept(make_offer(lease_token=LEASE_TOKEN)).record
    for state in ("launching", "started", "running_acknowledged"):
        clock.now += 7
        record = _launch(journal, record) if state == "launching" else walk(journal, record.offer_id, state)

        # Then each time the record read back is exactly the row committed to the file
        read = journal.get(record.offer_id)
        assert read == record
        assert _file_row(path, record.offer_id) == _fields(record)
        assert journal.find_by_attempt(record.attempt_id) == record
        assert read is not None and read.lease_token == LEASE_TOKEN

    # And the settled record is gone from both at once
    settled = journal.advance(
        record.offer_id,
        expected_revision=record.revision,
        to_state="completion_acknowledged",
        prune=True,
    )
    assert settled.state == "completion_acknowledged"
    assert journal.get(record.offer_id) is None
    assert journal.find_by_attempt(record.attempt_id) is None
    assert _file_row(path, record.offer_id) is None


def test_a_record_is_unsealed_once_however_often_it_is_read_or_advanced(
    path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a journal file holding a record with a sealed lease token, opened again
    with WorkerJournal.open(path, clock=clock) as first:
        first.accept(make_offer(lease_token=LEASE_TOKEN))
    unsealed: list[str] = []
    real_unseal = TokenSeal.unseal

    def counting_unseal(self: TokenSeal, offer_id: str, sealed: str) -> str:
        unsealed.append(offer_id)
        return real_unseal(self, offer_id, sealed)

    monkeypatch.setattr(TokenSeal, "unseal", counting_unseal)
    with WorkerJournal.open(path, clock=clock) as journal:
        # When it is read and advanced through every step of a run
        record = journal.get("offer-1")
        assert record is not None
        record = _launch(journal, record)
        record = walk(journal, "offer-1", "started", "running_acknowledged")
        assert journal.find_by_attempt(record.attempt_id) == record
        assert journal.page() == [record]

        # Then its token was unsealed exactly once, on the first read, and is still the right one
        assert unsealed == ["offer-1"]
        assert record.lease_token == LEASE_TOKEN


def test_a_failed_commit_changes_nothing_the_journal_reads_back(journal: WorkerJournal, path: Path) -> None:
    # Given an accepted record, and a connection whose next commit fails
    record = journal.accept(make_offer()).record
    healthy = journal._conn
    journal._conn = _FailingCommit(healthy)  # type: ignore[assignment]

    # When the journal tries to advance it
    with pytest.raises(JournalUnavailable):
        walk(journal, record.offer_id, "starting_acknowledged")
    journal._conn = healthy

    # Then the record read back is still the accepted one, as in the file, and the step can be retried
    assert journal.get(record.offer_id) == record
    assert _file_row(path, record.offer_id) == _fields(record)
    again = walk(journal, record.offer_id, "starting_acknowledged")
    assert again.revision == record.revision + 1


@pytest.mark.parametrize("to_state", ["starting_acknowledged", "completion_acknowledged"])
def test_a_record_changed_behind_the_journal_is_never_overwritten_from_memory(
    journal: WorkerJournal, path: Path, to_state: JournalState
) -> None:
    # Given a record the journal has in memory, changed in the file by another writer
    record = journal.accept(make_offer()).record
    if to_state == "completion_acknowledged":
        record = walk(journal, record.offer_id, "starting_acknowledged", "launching", "started")
    other = sqlite3.connect(path)
    try:
        other.execute("UPDATE journal SET revision = revision + 1 WHERE offer_id = ?", (record.offer_id,))
        other.commit()
    finally:
        other.close()
    before = _file_row(path, record.offer_id)

    # When the journal advances it from the revision it remembers (settling and deleting it, or not)
    with pytest.raises(JournalConflict) as caught:
        journal.advance(
            record.offer_id,
            expected_revision=record.revision,
            to_state=to_state,
            prune=to_state == "completion_acknowledged",
        )

    # Then the compare-and-set in the file refused it, nothing was written, and the file is read again
    assert caught.value.details["reason"] == "stale_revision"
    assert _file_row(path, record.offer_id) == before
    reread = journal.get(record.offer_id)
    assert reread is not None and reread.revision == record.revision + 1


def test_via_passes_through_a_state_in_the_launching_barriers_own_fsynced_commit(
    journal: WorkerJournal, path: Path
) -> None:
    # Given a trace of every statement the journal sends to SQLite
    record = journal.accept(make_offer()).record
    statements: list[str] = []
    journal._conn.set_trace_callback(statements.append)

    # When an accepted record goes to launching through starting_acknowledged
    launched = _launch(journal, record)

    # Then both transitions were one commit, made under synchronous=FULL, with two revisions
    assert statements.count("COMMIT") == 1
    assert statements[0] == "PRAGMA synchronous = FULL"
    assert statements[1] == "BEGIN IMMEDIATE" and statements[-1] == "COMMIT"
    assert (launched.state, launched.revision) == ("launching", record.revision + 2)
    assert _file_row(path, record.offer_id) == _fields(launched)


@pytest.mark.parametrize(
    ("via", "to_state", "reason"),
    [
        ("launching", "started", "via_invalid"),  # a state that takes fields
        ("not_a_state", "launching", "via_invalid"),
    ],
)
def test_via_is_refused_for_a_state_with_fields_or_none(
    journal: WorkerJournal, path: Path, via: Any, to_state: Any, reason: str
) -> None:
    record = journal.accept(make_offer()).record
    with pytest.raises(JournalInvalid) as caught:
        journal.advance(record.offer_id, expected_revision=record.revision, to_state=to_state, via=via)
    assert caught.value.details["reason"] == reason
    assert _file_row(path, record.offer_id) == _fields(record)


def test_via_must_be_a_legal_path_of_two_transitions(journal: WorkerJournal, path: Path) -> None:
    # Given an accepted record
    record = journal.accept(make_offer()).record

    # When it is asked to reach launching through start_failed (accepted -> start_failed is legal,
    # start_failed -> launching is not), or to reach a state that does not follow the via state
    paths: list[tuple[JournalState, JournalState]] = [
        ("start_failed", "launching"),
        ("starting_acknowledged", "started"),
    ]
    for via, to_state in paths:
        with pytest.raises(JournalConflict) as caught:
            journal.advance(
                record.offer_id,
                expected_revision=record.revision,
                to_state=to_state,
                via=via,
                **STEP_FIELDS.get(to_state, {}),
            )
        # Then it is refused and nothing was written
        assert caught.value.details["reason"] == "invalid_transition"
    assert _file_row(path, record.offer_id) == _fields(record)
    assert journal.get(record.offer_id) == record


def test_prune_settles_and_deletes_in_one_commit_and_only_a_settled_state(
    journal: WorkerJournal, path: Path
) -> None:
    # Given a running record
    record = journal.accept(make_offer()).record
    record = walk(journal, record.offer_id, "starting_acknowledged", "launching", "started")

    # When it is pruned on a step that does not settle it, it is refused and nothing is written
    with pytest.raises(JournalInvalid) as caught:
        journal.advance(
            record.offer_id, expected_revision=record.revision, to_state="running_acknowledged", prune=True
        )
    assert caught.value.details["reason"] == "prune_not_settled"
    assert _file_row(path, record.offer_id) == _fields(record)

    # When it is acknowledged complete with prune, from a stale revision, it is refused too
    with pytest.raises(JournalConflict):
        journal.advance(
            record.offer_id,
            expected_revision=record.revision - 1,
            to_state="completion_acknowledged",
            prune=True,
        )
    assert _file_row(path, record.offer_id) == _fields(record)

    # Then with its revision: one commit settles it and deletes it
    statements: list[str] = []
    journal._conn.set_trace_callback(statements.append)
    settled = journal.advance(
        record.offer_id, expected_revision=record.revision, to_state="completion_acknowledged", prune=True
    )
    journal._conn.set_trace_callback(None)
    assert statements.count("COMMIT") == 1
    assert settled.state == "completion_acknowledged" and settled.completion_acknowledged_at_ms is not None
    assert _file_row(path, record.offer_id) is None
    assert journal.get(record.offer_id) is None


def test_an_unknown_offer_or_attempt_is_answered_without_reading_the_file(journal: WorkerJournal) -> None:
    # Given a journal with one record, and a trace of every statement it sends to SQLite
    journal.accept(make_offer())
    statements: list[str] = []
    journal._conn.set_trace_callback(statements.append)

    # When ids it has no row for are looked up
    assert journal.get("offer-404") is None
    assert journal.find_by_attempt("attempt-404") is None

    # Then no statement was needed: the index holds every row's keys
    assert statements == []


def test_a_new_offer_is_accepted_without_reading_its_row_and_a_known_one_is_read(
    journal: WorkerJournal,
) -> None:
    # Given a journal holding a settled record (no longer kept in memory), and a trace of every
    # statement it sends to SQLite
    settled = journal.accept(make_offer("offer-settled")).record
    walk(journal, settled.offer_id, "start_failed", "start_failure_acknowledged")
    statements: list[str] = []
    journal._conn.set_trace_callback(statements.append)

    # When a new offer is accepted
    assert journal.accept(make_offer("offer-new")).created

    # Then no read of its row was needed: the index holds every row's keys
    assert [s.split(" ")[0] for s in statements] == ["BEGIN", "SELECT", "INSERT", "COMMIT"]
    assert statements[1].startswith("SELECT count(*)")

    # And delivered again it is answered from memory, without a read either
    statements.clear()
    assert not journal.accept(make_offer("offer-new")).created
    assert not any(s.startswith("SELECT") for s in statements)

    # And the settled offer delivered again is read from the file and deduplicated, not inserted
    statements.clear()
    again = journal.accept(make_offer("offer-settled"))
    assert not again.created and again.record.state == "start_failure_acknowledged"
    assert any(s.startswith("SELECT offer_id") for s in statements)


def test_rows_found_at_open_are_indexed_and_the_latest_lease_generation_wins(
    path: Path, clock: Clock
) -> None:
    # Given a file holding two offers of one attempt (the later lease generation settled, so it is
    # not kept in memory) and one of another attempt
    with WorkerJournal.open(path, clock=clock) as first:
        first.accept(make_offer("offer-a", attempt_id="attempt-1", lease_generation=1))
        clock.now += 1
        first.accept(make_offer("offer-b", attempt_id="attempt-1", lease_generation=2))
        walk(first, "offer-b", "start_failed", "start_failure_acknowledged")
        first.accept(make_offer("offer-c", attempt_id="attempt-2"))

    # When it is opened again
    with WorkerJournal.open(path, clock=clock) as journal:
        # Then every row is found, the latest generation of an attempt included (read from the file)
        latest = journal.find_by_attempt("attempt-1")
        assert latest is not None and (latest.offer_id, latest.state) == (
            "offer-b",
            "start_failure_acknowledged",
        )
        other = journal.find_by_attempt("attempt-2")
        assert other is not None and other.offer_id == "offer-c"
        assert {o: r.state for o in ("offer-a", "offer-b") if (r := journal.get(o))} == {
            "offer-a": "accepted",
            "offer-b": "start_failure_acknowledged",
        }

        # And once the latest is pruned the attempt's earlier offer is the one found
        assert journal.prune("offer-b")
        earlier = journal.find_by_attempt("attempt-1")
        assert earlier is not None and earlier.offer_id == "offer-a"
        assert journal.get("offer-b") is None


def test_past_its_limit_the_index_is_dropped_and_rows_are_read_from_the_file(
    path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an index limited to two rows, and a file that grows past it
    monkeypatch.setattr("ql3.worker.journal.store.KEY_INDEX_LIMIT", 2)
    with WorkerJournal.open(path, clock=clock) as journal:
        for n in range(3):
            journal.accept(make_offer(f"offer-{n}"))
        walk(journal, "offer-0", "start_failed", "start_failure_acknowledged")

        # Then every row is still found, by reading the file
        assert [journal.get(f"offer-{n}") is not None for n in range(3)] == [True, True, True]
        found = journal.find_by_attempt("attempt-offer-0")
        assert found is not None and found.state == "start_failure_acknowledged"
        assert journal.get("offer-404") is None
        # And a settled offer delivered again is still found in the file and deduplicated, and a
        # new one is looked for there and inserted
        assert not journal.accept(make_offer("offer-0")).created
        assert journal.accept(make_offer("offer-3")).created

    # And so they are when the file already holds more rows than the limit at open
    with WorkerJournal.open(path, clock=clock) as reopened:
        assert [reopened.get(f"offer-{n}") is not None for n in range(3)] == [True, True, True]
        found = reopened.find_by_attempt("attempt-offer-0")
        assert found is not None and found.offer_id == "offer-0"
