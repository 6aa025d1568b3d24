"""Shipped attempt logs (docs/cluster.md "Log shipping") on SQLite and PostgreSQL: appends idempotent
by offset, the gap and overlap conflicts, the quota and its marker, the lease fence of the shipping
session, keyset pages of reads, and retention deleting the chunks with their runs."""

from __future__ import annotations

import threading
from functools import partial
from typing import Any

import pytest

from ql3.application import attempt_logs, retention
from ql3.application.attempt_logs import AppendResult, LogGap, LogOverlap
from ql3.application.retention import DAY_MS, RetentionPruner
from ql3.cluster.pull import PullRequest, PullService, pull_offer_id
from ql3.domain.digests import new_token
from ql3.domain.errors import FenceConflict, ValidationFailed
from ql3.domain.offers import LeaseFence
from tests.support.builders import count, seed_history, seed_project, seed_task
from tests.support.databases import Harness
from tests.support.execution_builders import queued, register

CAP = 16 * 1024


def leased(db: Any, worker_id: str = "w1") -> tuple[Any, LeaseFence]:
    """A run claimed by a registered session of ``worker_id``: (session, fence)."""
    queued(db)
    session = register(db, worker_id)
    token = new_token()
    result = PullService(db).pull_once(
        PullRequest(
            worker_id=worker_id,
            session_id=session.session_id,
            generation=session.generation,
            offer_id=pull_offer_id(worker_id, token),
            lease_token=token,
        )
    )
    assert result.offer is not None
    return session, result.offer.fence


def ship(
    db: Any,
    session: Any,
    attempt_id: str,
    offset: int,
    data: bytes,
    *,
    final: bool = False,
    cap: int = CAP,
    worker_id: str | None = None,
) -> AppendResult:
    result: AppendResult = db.transaction(
        lambda tx: attempt_logs.append(
            tx,
            worker_id=worker_id or session.worker_id,
            session_id=session.session_id,
            generation=session.generation,
            attempt_id=attempt_id,
            offset=offset,
            data=data,
            final=final,
            cap_bytes=cap,
        )
    )
    return result


def read_all(db: Any, attempt_id: str, max_bytes: int = 1000) -> tuple[bytes, int]:
    """The whole shipped log through bounded pages; (bytes, pages read)."""
    head = db.transaction(lambda tx: attempt_logs.head(tx, attempt_id), write=False)
    assert head is not None
    out, offset, pages = b"", 0, 0
    while True:
        page = db.transaction(
            partial(attempt_logs.read, log=head, offset=offset, max_bytes=max_bytes), write=False
        )
        pages += 1
        assert len(page.data) <= max_bytes
        out += page.data
        offset = page.next_offset
        if page.eof:
            return out, pages
        assert pages < 10_000


def test_chunks_append_in_order_and_read_back_whole(harness: Harness) -> None:
    session, fence = leased(harness.db)

    first = ship(harness.db, session, fence.attempt_id, 0, b"line 1\n")
    second = ship(harness.db, session, fence.attempt_id, 7, b"line 2\n")

    assert (first.outcome, second.outcome) == ("appended", "appended")
    assert second.head.stored_bytes == 14 and not second.head.truncated and not second.head.closed
    assert read_all(harness.db, fence.attempt_id)[0] == b"line 1\nline 2\n"
    assert count(harness.db, "attempt_log_chunks") == 2


def test_a_replayed_chunk_is_accepted_once_and_a_different_one_at_its_offset_is_an_overlap(
    harness: Harness,
) -> None:
    # Given two stored chunks
    session, fence = leased(harness.db)
    ship(harness.db, session, fence.attempt_id, 0, b"abc")
    ship(harness.db, session, fence.attempt_id, 3, b"def")

    # When the first is sent again (its response was lost), and then other bytes at its offset
    again = ship(harness.db, session, fence.attempt_id, 0, b"abc")
    with pytest.raises(LogOverlap) as overlap:
        ship(harness.db, session, fence.attempt_id, 3, b"xyz")
    with pytest.raises(LogOverlap):
        ship(harness.db, session, fence.attempt_id, 1, b"bc")  # inside a chunk, not a chunk

    # Then the replay changed nothing, the overlap was refused with the stored length
    assert again.outcome == "replayed" and again.head.stored_bytes == 6
    assert overlap.value.code == "log_overlap" and overlap.value.details["stored_bytes"] == 6
    assert count(harness.db, "attempt_log_chunks") == 2
    assert read_all(harness.db, fence.attempt_id)[0] == b"abcdef"
    # And an empty chunk at any stored offset is a probe that answers the stored length
    assert ship(harness.db, session, fence.attempt_id, 0, b"").head.stored_bytes == 6


def test_a_chunk_past_the_stored_end_is_a_gap_and_stores_nothing(harness: Harness) -> None:
    session, fence = leased(harness.db)
    ship(harness.db, session, fence.attempt_id, 0, b"12345")

    with pytest.raises(LogGap) as gap:
        ship(harness.db, session, fence.attempt_id, 9, b"later")

    assert gap.value.code == "log_gap" and gap.value.http_status == 409
    assert gap.value.details["stored_bytes"] == 5
    assert count(harness.db, "attempt_log_chunks") == 1
    assert read_all(harness.db, fence.attempt_id)[0] == b"12345"


def test_the_quota_keeps_the_first_cap_bytes_then_the_marker_then_nothing_more(harness: Harness) -> None:
    # Given a 1 KiB quota
    session, fence = leased(harness.db)
    cap = 1024
    ship(harness.db, session, fence.attempt_id, 0, b"a" * 1000, cap=cap)

    # When a chunk crosses it, and more chunks follow (at and past the worker's offset)
    crossing = ship(harness.db, session, fence.attempt_id, 1000, b"b" * 100, cap=cap)
    after = ship(harness.db, session, fence.attempt_id, 1100, b"c" * 50, cap=cap)
    anywhere = ship(harness.db, session, fence.attempt_id, 99_999, b"d", cap=cap)

    # Then exactly cap bytes are stored, the rest dropped without an error
    assert crossing.outcome == "truncated" and crossing.head.truncated
    assert after.outcome == anywhere.outcome == "dropped"
    assert after.head.stored_bytes == cap
    stored = harness.db.raw("SELECT SUM(length(data)) AS n FROM attempt_log_chunks")[0]["n"]
    assert int(stored) == cap
    # And readers see the first cap bytes followed by the marker, once
    whole, _ = read_all(harness.db, fence.attempt_id, max_bytes=100)
    assert whole == b"a" * 1000 + b"b" * 24 + b"\n[ql3: log truncated at 1024 bytes]\n"
    # And a truncated log counts as closed (a follower stops)
    head = harness.db.transaction(lambda tx: attempt_logs.head(tx, fence.attempt_id))
    page = harness.db.transaction(lambda tx: attempt_logs.read(tx, head, len(whole), 10))
    assert page.data == b"" and page.eof and page.closed


def test_final_closes_the_log_and_later_chunks_still_append(harness: Harness) -> None:
    session, fence = leased(harness.db)
    closed = ship(harness.db, session, fence.attempt_id, 0, b"done\n", final=True)
    late = ship(harness.db, session, fence.attempt_id, 5, b"child\n")

    assert closed.head.closed and late.head.closed and late.outcome == "appended"
    assert read_all(harness.db, fence.attempt_id)[0] == b"done\nchild\n"


def test_another_workers_session_or_a_replaced_session_is_refused(harness: Harness) -> None:
    # Given w1's lease, and w2 registered too
    session, fence = leased(harness.db, "w1")
    other = register(harness.db, "w2")

    # When w2 ships to w1's attempt with its own (current) session
    with pytest.raises(FenceConflict) as foreign:
        ship(harness.db, other, fence.attempt_id, 0, b"not mine")
    # Or presents w1's session under its own credential
    with pytest.raises(FenceConflict):
        ship(harness.db, session, fence.attempt_id, 0, b"not mine", worker_id="w2")

    # Then nothing was stored
    assert foreign.value.details["reason"] in ("log_not_leased", "worker_session_mismatch")
    assert count(harness.db, "attempt_logs") == count(harness.db, "attempt_log_chunks") == 0

    # And once w1's session is replaced, its late chunks are refused, the new session holds no lease
    replaced = register(harness.db, "w1")
    with pytest.raises(FenceConflict):
        ship(harness.db, session, fence.attempt_id, 0, b"late")
    with pytest.raises(FenceConflict) as fresh:
        ship(harness.db, replaced, fence.attempt_id, 0, b"not leased to me")
    assert fresh.value.details["reason"] == "log_not_leased"
    assert count(harness.db, "attempt_log_chunks") == 0


def test_bad_input_is_refused_before_anything_is_written(harness: Harness) -> None:
    session, fence = leased(harness.db)
    too_big = b"x" * (attempt_logs.MAX_CHUNK_BYTES + 1)

    cases: list[dict[str, Any]] = [
        {"offset": 0, "data": too_big},
        {"offset": -1, "data": b"x"},
        {"offset": 0, "data": b"x", "cap": 10},
        {"offset": 0, "data": b"x", "cap": (1 << 40) + 1},
    ]
    for kwargs in cases:
        with pytest.raises(ValidationFailed):
            ship(harness.db, session, fence.attempt_id, **kwargs)
    with pytest.raises(ValidationFailed):
        ship(harness.db, session, "../../etc/passwd", 0, b"x")

    assert count(harness.db, "attempt_logs") == 0


def test_reads_are_bounded_keyset_pages_from_any_offset(harness: Harness) -> None:
    # Given more small chunks than one page of rows holds
    session, fence = leased(harness.db)
    n = attempt_logs.PAGE_ROWS * 3 + 5
    expected = b""
    for i in range(n):
        piece = f"{i:05d}\n".encode()
        ship(harness.db, session, fence.attempt_id, len(expected), piece)
        expected += piece

    # When it is read in pages of any size, from the start and from inside a chunk
    whole, pages = read_all(harness.db, fence.attempt_id, max_bytes=256 * 1024)
    head = harness.db.transaction(lambda tx: attempt_logs.head(tx, fence.attempt_id))
    middle = harness.db.transaction(lambda tx: attempt_logs.read(tx, head, 14, 9))

    # Then the bytes come back whole and in order, no page reads more than PAGE_ROWS chunks
    assert whole == expected
    assert pages == 4  # 64 chunks of 6 bytes per page, never the whole log at once
    assert middle.data == expected[14:23] and middle.next_offset == 23 and not middle.eof
    past = harness.db.transaction(lambda tx: attempt_logs.read(tx, head, len(expected) + 10, 9))
    assert past.data == b"" and past.eof


def test_two_replicas_shipping_the_same_chunk_store_it_once(harness: Harness) -> None:
    # Given the same chunk sent through two connections at once (a retry on another replica)
    session, fence = leased(harness.db)
    other = harness.second_connection()
    outcomes: list[str] = []
    errors: list[BaseException] = []

    def send(db: Any) -> None:
        try:
            outcomes.append(ship(db, session, fence.attempt_id, 0, b"once\n").outcome)
        except BaseException as exc:  # recorded and asserted below
            errors.append(exc)

    try:
        threads = [threading.Thread(target=send, args=(db,)) for db in (harness.db, other)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    finally:
        other.close()

    # Then one appended, the other replayed it
    assert errors == []
    assert sorted(outcomes) == ["appended", "replayed"]
    assert count(harness.db, "attempt_log_chunks") == 1


def test_retention_deletes_the_chunks_with_their_runs_in_bounded_batches(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given old finished runs whose attempts shipped logs, and a recent one that did too
    project = seed_project(harness.db)
    task = seed_task(harness.db, project, "shipped")
    now = harness.now_ms()
    old = seed_history(harness.db, project, task, 3, start_ms=now - 40 * DAY_MS, step_ms=60_000)
    recent = seed_history(harness.db, project, task, 1, start_ms=now - DAY_MS, step_ms=60_000)
    session = register(harness.db, "w1")
    assert session.generation == 1  # the seeded leases name generation 1: give them this session
    harness.db.raw("UPDATE run_leases SET worker_session_id = ?", (session.session_id,))
    for _, attempt_id in old + recent:
        for i in range(5):
            ship(harness.db, session, attempt_id, i * 4, b"%03d\n" % i)
    assert count(harness.db, "attempt_log_chunks") == 20
    monkeypatch.setattr(retention, "CHUNK_BATCH", 2)
    harness.db.transaction(
        lambda tx: retention.set_policy(tx, project, keep_days=30, runs_per_task=None, log_bytes_per_run=None)
    )

    # When the pruner runs
    report = RetentionPruner(harness.db, None).prune_once()

    # Then the old runs went with their heads and chunks; the recent run's log is whole
    assert report.runs_deleted == 3
    assert count(harness.db, "attempt_logs") == 1
    assert count(harness.db, "attempt_log_chunks") == 5
    assert read_all(harness.db, recent[0][1])[0] == b"000\n001\n002\n003\n004\n"


@pytest.mark.parametrize(
    ("column", "value"),
    [("worker_session_id", "'another-session'"), ("worker_generation", "worker_generation + 1")],
)
def test_each_field_of_the_lease_is_checked_before_a_chunk_is_stored(
    harness: Harness, column: str, value: str
) -> None:
    # Given w1's lease, whose session or generation no longer names w1's current session (the
    # registry still does: only the lease's own field differs)
    session, fence = leased(harness.db, "w1")
    harness.db.raw(f"UPDATE run_leases SET {column} = {value} WHERE attempt_id = ?", (fence.attempt_id,))

    # When w1's current session ships a chunk of that attempt
    with pytest.raises(FenceConflict) as refused:
        ship(harness.db, session, fence.attempt_id, 0, b"not leased to this session")

    # Then it is refused and nothing is stored
    assert refused.value.details["reason"] == "log_not_leased"
    assert count(harness.db, "attempt_logs") == count(harness.db, "attempt_log_chunks") == 0
