"""Group commit: journal writes that arrive while a commit is in flight share the next transaction,
each with its own compare-and-set and its own errors, and memory stays what the file holds.

Deterministic, no timing: the first commit is held open by an event until every other writer has
queued its write (the journal's queue signals each arrival)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest

from ql3.domain.journal import AcceptResult, JournalConflict, JournalRecord, JournalUnavailable
from ql3.worker.journal.seal import TokenSeal
from ql3.worker.journal.store import WorkerJournal
from tests.support.journal_builders import LEASE_TOKEN, STEP_FIELDS, Clock, make_offer

_T = TypeVar("_T")
_WAIT_S = 30.0  # a bound on every wait, never a threshold: a healthy run never comes near it
_COLUMNS = ("state", "revision", "updated_at_ms", "completion_token_digest", "executor_handle")


class _Gate:
    """The journal's connection, counting its commits and the synchronous level of each; the first
    COMMIT waits until ``release`` is set, and the commits numbered in ``fail`` raise instead."""

    def __init__(self, conn: sqlite3.Connection, *, fail: frozenset[int] = frozenset()) -> None:
        self._conn = conn
        self._fail = fail
        self.commits = 0
        self.levels: list[int] = []
        self.level_changes: list[str] = []  # the ``PRAGMA synchronous = ...`` statements sent
        self.entered = threading.Event()
        self.release = threading.Event()

    @property
    def in_transaction(self) -> bool:
        return self._conn.in_transaction

    def close(self) -> None:
        self._conn.close()

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if sql.startswith("PRAGMA synchronous ="):
            self.level_changes.append(sql.rsplit(" ", 1)[-1])
        if sql == "COMMIT":
            self.commits += 1
            (level,) = self._conn.execute("PRAGMA synchronous").fetchone()
            self.levels.append(level)
            if self.commits == 1:
                self.entered.set()
                assert self.release.wait(_WAIT_S)
            if self.commits in self._fail:
                raise sqlite3.OperationalError("disk I/O error")
        return self._conn.execute(sql, *args)


class _Arrivals(list[Any]):
    """The journal's queue of writes, signalling every write queued."""

    def __init__(self) -> None:
        super().__init__()
        self.queued = threading.Semaphore(0)

    def append(self, item: Any) -> None:
        super().append(item)
        self.queued.release()


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "journal.db"


@pytest.fixture
def journal(path: Path) -> Iterator[WorkerJournal]:
    with WorkerJournal.open(path, clock=Clock()) as j:
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


def _install(journal: WorkerJournal, *, fail: frozenset[int] = frozenset()) -> tuple[_Gate, _Arrivals]:
    gate = _Gate(journal._conn, fail=fail)
    journal._conn = gate  # type: ignore[assignment]
    arrivals = _Arrivals()
    journal._queue = arrivals
    return gate, arrivals


def _grouped(
    gate: _Gate, arrivals: _Arrivals, first: Callable[[], Any], rest: list[Callable[[], Any]]
) -> list[Future[Any]]:
    """``first`` commits alone and is held in its COMMIT until every call of ``rest`` has queued its
    write; then all complete. Returns the futures, ``first``'s first."""
    with ThreadPoolExecutor(len(rest) + 1) as pool:
        futures = [pool.submit(first)]
        assert gate.entered.wait(_WAIT_S)
        assert arrivals.queued.acquire(timeout=_WAIT_S)  # first's own write
        futures += [pool.submit(call) for call in rest]
        for _ in rest:
            assert arrivals.queued.acquire(timeout=_WAIT_S)
        gate.release.set()
    return futures


def _accepted(journal: WorkerJournal, n: int) -> list[JournalRecord]:
    return [journal.accept(make_offer(f"offer-{i}")).record for i in range(n)]


def _step(
    journal: WorkerJournal, record: JournalRecord, to_state: Any, *, revision: int | None = None
) -> Callable[[], JournalRecord]:
    return lambda: journal.advance(
        record.offer_id,
        expected_revision=record.revision if revision is None else revision,
        to_state=to_state,
        **STEP_FIELDS.get(to_state, {}),
    )


def _value(future: Future[_T]) -> _T:
    return future.result(timeout=0)


def test_concurrent_advances_from_many_threads_share_one_commit(journal: WorkerJournal, path: Path) -> None:
    # Given five accepted records, and a first advance whose commit is held open
    records = _accepted(journal, 5)
    gate, arrivals = _install(journal)

    # When four more threads advance the others while that commit is in flight
    futures = _grouped(
        gate,
        arrivals,
        _step(journal, records[0], "starting_acknowledged"),
        [_step(journal, r, "starting_acknowledged") for r in records[1:]],
    )

    # Then five advances took two commits: the first one's, and one shared by the four others
    assert gate.commits == 2
    for record, future in zip(records, futures, strict=True):
        advanced = _value(future)
        assert (advanced.state, advanced.revision) == ("starting_acknowledged", record.revision + 1)
        # And each is what the file and the memory hold
        assert journal.get(record.offer_id) == advanced
        assert _file_row(path, record.offer_id) == _fields(advanced)


def test_a_conflicting_write_fails_alone_and_the_rest_of_its_group_commits(
    journal: WorkerJournal, path: Path
) -> None:
    # Given three accepted records
    records = _accepted(journal, 3)
    gate, arrivals = _install(journal)

    # When a group holds a stale advance, two advances of one record from the same revision, and a new
    # offer accepted twice
    offer = make_offer("offer-new", lease_token=LEASE_TOKEN)
    futures = _grouped(
        gate,
        arrivals,
        _step(journal, records[0], "starting_acknowledged"),
        [
            _step(journal, records[1], "starting_acknowledged", revision=records[1].revision + 5),
            _step(journal, records[2], "starting_acknowledged"),
            _step(journal, records[2], "start_failed"),
            lambda: journal.accept(offer),
            lambda: journal.accept(offer),
        ],
    )
    first, stale, won, lost, created, again = futures

    # Then the stale one and the second advance of the same record fail, each for its own reason
    assert gate.commits == 2
    with pytest.raises(JournalConflict) as caught:
        _value(stale)
    assert caught.value.details["reason"] == "stale_revision"
    with pytest.raises(JournalConflict) as caught:
        _value(lost)
    assert caught.value.details["reason"] == "stale_revision"
    assert journal.get(records[1].offer_id) == records[1]
    assert _file_row(path, records[1].offer_id) == _fields(records[1])

    # And every other write of the group committed, seen by the later writes of the same group
    assert _value(first).state == "starting_acknowledged"
    advanced = _value(won)
    assert journal.get(records[2].offer_id) == advanced
    assert _file_row(path, records[2].offer_id) == _fields(advanced)
    result: AcceptResult = _value(created)
    duplicate: AcceptResult = _value(again)
    assert (result.created, duplicate.created) == (True, False)
    assert duplicate.record == result.record == journal.get("offer-new")
    assert _file_row(path, "offer-new") == _fields(result.record)


def test_a_write_in_a_group_sees_the_earlier_writes_of_its_group_without_reading_the_file(
    journal: WorkerJournal, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a journal whose every unsealing of a token is counted
    unsealed: list[str] = []
    real_unseal = TokenSeal.unseal

    def counting_unseal(self: TokenSeal, offer_id: str, sealed: str) -> str:
        unsealed.append(offer_id)
        return real_unseal(self, offer_id, sealed)

    monkeypatch.setattr(TokenSeal, "unseal", counting_unseal)
    (record,) = _accepted(journal, 1)
    gate, arrivals = _install(journal)

    # When a group accepts a new offer, then receives it again
    offer = make_offer("offer-new", lease_token=LEASE_TOKEN)
    _, created, again = _grouped(
        gate,
        arrivals,
        _step(journal, record, "starting_acknowledged"),
        [lambda: journal.accept(offer), lambda: journal.accept(offer)],
    )

    # Then the redelivery was answered from the group's own write: nothing was read back and unsealed
    assert _value(again).record == _value(created).record
    assert unsealed == []


def test_a_failed_commit_fails_every_write_of_its_group_and_memory_stays_the_file(
    journal: WorkerJournal, path: Path
) -> None:
    # Given three accepted records, and a connection whose second commit fails
    records = _accepted(journal, 3)
    gate, arrivals = _install(journal, fail=frozenset({2}))

    # When a group of two advances, a stale advance and a new offer is committed in that commit
    futures = _grouped(
        gate,
        arrivals,
        _step(journal, records[0], "starting_acknowledged"),
        [
            _step(journal, records[1], "starting_acknowledged"),
            _step(journal, records[2], "start_failed"),
            _step(journal, records[0], "start_failed", revision=records[0].revision + 5),
            lambda: journal.accept(make_offer("offer-new")),
        ],
    )
    first, one, two, stale, created = futures

    # Then the first (its own commit) stands, and every write of the failed group failed
    assert _value(first).state == "starting_acknowledged"
    for future in (one, two, created):
        with pytest.raises(JournalUnavailable):
            _value(future)
    with pytest.raises(JournalConflict):
        _value(stale)

    # And the memory is exactly the file: nothing of the failed group reached either
    for record in records[1:]:
        assert journal.get(record.offer_id) == record
        assert _file_row(path, record.offer_id) == _fields(record)
    assert journal.get("offer-new") is None
    assert _file_row(path, "offer-new") is None
    # And the journal goes on: the writes can be made again
    again = _step(journal, records[1], "starting_acknowledged")()
    assert _file_row(path, records[1].offer_id) == _fields(again)


def test_a_group_that_holds_the_launching_barrier_commits_with_synchronous_full(
    journal: WorkerJournal, path: Path
) -> None:
    # Given three records, the last one acknowledged (ready for its barrier)
    records = _accepted(journal, 3)
    ready = journal.advance(
        records[2].offer_id, expected_revision=records[2].revision, to_state="starting_acknowledged"
    )
    gate, arrivals = _install(journal)

    # When the barrier shares a group with two writes that need no durability
    _, _, _, barrier = _grouped(
        gate,
        arrivals,
        _step(journal, records[0], "starting_acknowledged"),
        [
            _step(journal, records[1], "starting_acknowledged"),
            lambda: journal.accept(make_offer("offer-new")),
            _step(journal, ready, "launching"),
        ],
    )
    launched = _value(barrier)
    assert launched.state == "launching"
    assert _file_row(path, ready.offer_id) == _fields(launched)

    # Then the group's one commit ran at synchronous=FULL (2), the first one at NORMAL (1)
    assert gate.levels == [1, 2]
    # And the next write without a barrier commits at NORMAL again
    _step(journal, launched, "started")()
    assert gate.levels == [1, 2, 1]


def test_the_synchronous_level_is_set_only_when_a_group_needs_the_other_one(journal: WorkerJournal) -> None:
    # Given three records ready for their barrier, and a connection that holds no commit open
    records = [
        journal.advance(r.offer_id, expected_revision=r.revision, to_state="starting_acknowledged")
        for r in _accepted(journal, 3)
    ]
    gate, _ = _install(journal)
    gate.release.set()

    # When three barriers commit one after another, then three writes that need no durability
    launched = [_step(journal, record, "launching")() for record in records]
    for record in launched:
        _step(journal, record, "started")()

    # Then every commit ran at its level, and the level was changed twice: not once per commit
    assert gate.levels == [2, 2, 2, 1, 1, 1]
    assert gate.level_changes == ["FULL", "NORMAL"]


def test_an_offer_deleted_earlier_in_a_group_is_accepted_again_without_reading_the_file(
    journal: WorkerJournal, path: Path
) -> None:
    # Given a settled record still in the file, and a trace of every statement sent to SQLite
    (record,) = _accepted(journal, 1)
    settled = _step(journal, record, "start_failed")()
    settled = _step(journal, settled, "start_failure_acknowledged")()
    other = journal.accept(make_offer("offer-other")).record
    statements: list[str] = []
    journal._conn.set_trace_callback(statements.append)
    gate, arrivals = _install(journal)

    # When one group deletes it and then receives its offer again
    _, pruned, again = _grouped(
        gate,
        arrivals,
        _step(journal, other, "starting_acknowledged"),
        [lambda: journal.prune(record.offer_id), lambda: journal.accept(make_offer(record.offer_id))],
    )

    # Then the offer is a new row, known absent from the group's own delete: no row was read
    assert _value(pruned) is True
    created: AcceptResult = _value(again)
    assert created.created and created.record.state == "accepted"
    assert not any(s.startswith("SELECT offer_id") for s in statements)
    assert _file_row(path, record.offer_id) == _fields(created.record)
