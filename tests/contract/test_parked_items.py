"""Parked items: the repository and the guard every control loop hands its items to (both databases)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from ql3.application import parking
from ql3.application.parking import ItemGuard, Parked
from ql3.domain.errors import NotFound, PermissionDenied, StorageUnavailable
from tests.support.builders import count, seed_project
from tests.support.databases import Harness


class Boom(Exception):
    pass


@pytest.fixture(autouse=True)
def _frozen(harness: Harness) -> None:
    harness.freeze_clock()  # exact backoff instants on PostgreSQL's moving clock too


def _fail(exc: Exception) -> Any:
    def handle() -> Any:
        raise exc

    return handle


def _row(harness: Harness, key: str) -> dict[str, Any]:
    rows: list[dict[str, Any]] = harness.db.raw("SELECT * FROM parked_items WHERE item_key = ?", (key,))
    assert len(rows) == 1
    return rows[0]


def test_a_failing_item_is_parked_with_its_code_and_backs_off_exponentially(harness: Harness) -> None:
    guard = ItemGuard(harness.db, "approved-actions")
    start = harness.now_ms()

    # When an item fails with a ql3 error
    first = guard.run("approval", "a-1", _fail(PermissionDenied("secret text in the message")))

    # Then it is parked with the error's code, never its message, and retried 1 s later
    assert isinstance(first, Parked) and not first.skipped
    row = _row(harness, "a-1")
    assert (row["loop"], row["item_kind"], row["reason"], row["error_type"]) == (
        "approved-actions",
        "approval",
        "permission_denied",
        "PermissionDenied",
    )
    assert (row["failures"], row["first_failed_at_ms"], row["next_retry_at_ms"]) == (1, start, start + 1_000)
    assert "secret" not in str(row)

    # And a second failure, once due, doubles the backoff and keeps the first failure time
    harness.advance_clock(1_000)
    guard.new_cycle()
    guard.run("approval", "a-1", _fail(Boom("x")))
    row = _row(harness, "a-1")
    now = harness.now_ms()
    assert (row["failures"], row["reason"], row["error_type"]) == (2, "unexpected_error", "Boom")
    assert (row["first_failed_at_ms"], row["last_failed_at_ms"], row["next_retry_at_ms"]) == (
        start,
        now,
        now + 2_000,
    )


def test_a_parked_item_is_skipped_until_its_retry_time_and_a_success_unparks_it(harness: Harness) -> None:
    guard = ItemGuard(harness.db, "cron")
    guard.run("schedule", "t-1", _fail(Boom()))
    calls: list[str] = []

    def ok() -> str:
        calls.append("t-1")
        return "admitted"

    # While parked, the item is not handled
    guard.new_cycle()
    skipped = guard.run("schedule", "t-1", ok)
    assert isinstance(skipped, Parked) and skipped.skipped and calls == []

    # Once due, it is handled; its success un-parks it
    harness.advance_clock(1_000)
    guard.new_cycle()
    assert guard.run("schedule", "t-1", ok) == "admitted"
    assert calls == ["t-1"] and count(harness.db, "parked_items") == 0


def test_an_outage_is_not_parked_it_fails_the_cycle(harness: Harness) -> None:
    guard = ItemGuard(harness.db, "lease-expiry")

    def outage() -> None:
        try:
            raise OSError("connection reset")
        except OSError as exc:
            raise StorageUnavailable() from exc

    with pytest.raises(StorageUnavailable):
        guard.run("lease", "at-1", outage)

    # A driver-level error chained under another exception is still an outage
    def chained() -> None:
        try:
            outage()
        except StorageUnavailable as exc:
            raise RuntimeError("wrapped") from exc

    with pytest.raises(RuntimeError):
        guard.run("lease", "at-1", chained)
    assert count(harness.db, "parked_items") == 0


def test_backoff_is_bounded_at_fifteen_minutes() -> None:
    assert [parking.retry_delay_ms(n) for n in (1, 2, 3, 10, 11, 1_000)] == [
        1_000,
        2_000,
        4_000,
        512_000,
        900_000,
        900_000,
    ]


def test_each_loop_keeps_at_most_its_cap_dropping_the_least_recently_failed(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parking, "MAX_PARKED_PER_LOOP", 3)
    guard = ItemGuard(harness.db, "retention")
    for key in ("p-1", "p-2", "p-3", "p-4"):
        guard.run("project", key, _fail(Boom()))
        harness.advance_clock(10)
    other = ItemGuard(harness.db, "cron")
    other.run("schedule", "t-1", _fail(Boom()))

    keys = sorted(r["item_key"] for r in harness.db.raw("SELECT item_key FROM parked_items"))
    assert keys == ["p-2", "p-3", "p-4", "t-1"]


def test_a_row_whose_item_never_came_back_is_dropped_as_stale(harness: Harness) -> None:
    guard = ItemGuard(harness.db, "notifications")
    guard.run("delivery", "gone", _fail(Boom()))
    harness.advance_clock(parking.STALE_AFTER_MS + 2_000)

    guard.new_cycle()
    assert not guard.skip("delivery", "another")

    assert count(harness.db, "parked_items") == 0


def test_two_connections_parking_one_item_count_two_failures(harness: Harness) -> None:
    other = harness.second_connection()
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def park(db: Any) -> None:
        try:
            barrier.wait(timeout=30)
            db.transaction(
                lambda tx: parking.park(
                    tx, item_kind="lease", item_key="at-race", reason="conflict", error_type="Conflict"
                )
            )
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=park, args=(db,)) for db in (harness.db, other)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    finally:
        other.close()

    assert errors == []
    row = _row(harness, "at-race")
    assert row["failures"] == 2
    assert row["next_retry_at_ms"] == row["last_failed_at_ms"] + 2_000


def test_items_are_listed_by_project_and_server_wide_and_can_be_retried_now(harness: Harness) -> None:
    project = seed_project(harness.db)
    guard = ItemGuard(harness.db, "retention")
    guard.run("project", project.id, _fail(Boom()))
    ItemGuard(harness.db, "cron").run("schedule", "no-such-task", _fail(Boom()))

    mine = harness.db.transaction(lambda tx: parking.list_project(tx, project), write=False)
    everything = harness.db.transaction(lambda tx: parking.list_all(tx, limit=1), write=False)
    counts = harness.db.transaction(parking.counts, write=False)

    assert [(i.item_key, i.project_id) for i in mine.items] == [(project.id, project.id)]
    assert len(everything.items) == 1 and everything.truncated
    assert counts == {("retention", "unexpected_error"): 1, ("cron", "unexpected_error"): 1}

    # Retry now makes it due at once; another project's scope cannot see an item of no project
    retried = harness.db.transaction(
        lambda tx: parking.retry_now(tx, item_kind="project", item_key=project.id, project=project)
    )
    assert retried.next_retry_at_ms == harness.now_ms()
    with pytest.raises(NotFound):
        harness.db.transaction(
            lambda tx: parking.retry_now(tx, item_kind="schedule", item_key="no-such-task", project=project)
        )
