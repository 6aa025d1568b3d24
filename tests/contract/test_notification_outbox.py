"""The notification outbox: enqueued in the outcome's transaction, unique per outcome, leased, fenced,
backed off and dead after the last attempt. Runs on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest

from ql3.application import notifications, runs
from ql3.application.notifications import DeliveryBudget, NotificationDeliverer
from ql3.domain.egress import EgressPolicy
from ql3.domain.notifications import ChannelTarget, DeliveryFailed, Message
from tests.support.builders import count, seed_project, seed_task, start_run

SECRET = "s3cret-for-the-webhook-0123456789"


class RecordingSender:
    def __init__(self, fail_with: str | None = None) -> None:
        self.sent: list[tuple[ChannelTarget, Message]] = []
        self.fail_with = fail_with

    def send(self, channel: ChannelTarget, message: Message) -> None:
        if self.fail_with is not None:
            raise DeliveryFailed(self.fail_with)
        self.sent.append((channel, message))


def _setup(db: Any, *, events: list[str] | None = None, task_scoped: bool = False) -> tuple[Any, Any]:
    project = seed_project(db)
    task = seed_task(db, project, "nightly")
    db.transaction(
        lambda tx: notifications.create_channel(
            tx,
            project,
            name="hook",
            kind="webhook",
            url="https://example.invalid/h",
            secret=SECRET,
            egress=EgressPolicy(),
        )
    )
    db.transaction(
        lambda tx: notifications.create_rule(
            tx, project, channel="hook", task=task if task_scoped else None, events=events
        )
    )
    return project, task


def _fail(tx: Any, run_id: str) -> Any:
    run = runs.lock_run(tx, run_id)
    run = runs.transition(tx, run.id, run.version, "dispatching", actor_type="system")
    return runs.transition(
        tx, run.id, run.version, "failed", actor_type="system", finished_at_ms=tx.now_ms(), exit_code=3
    )


def _finish(db: Any, project: Any, task: Any, to: str = "failed") -> Any:
    run, _ = start_run(db, project, task)

    def unit(tx: Any) -> Any:
        current = runs.transition(tx, run.id, run.version, "dispatching", actor_type="system")
        current = runs.transition(tx, current.id, current.version, "running", actor_type="system")
        return runs.transition(
            tx, current.id, current.version, to, actor_type="system", finished_at_ms=tx.now_ms()
        )

    return db.transaction(unit)


def test_a_failed_run_enqueues_one_row_in_its_own_transaction(harness: Any) -> None:
    project, task = _setup(harness.db)
    run, _ = start_run(harness.db, project, task)

    # When the transaction that fails the run rolls back, nothing is enqueued
    class Boom(Exception):
        pass

    def failing(tx: Any) -> None:
        _fail(tx, run.id)
        assert tx.one("notify_due_page", {"now": tx.now_ms(), "limit": 8}) is not None
        raise Boom

    with pytest.raises(Boom):
        harness.db.transaction(failing)
    assert count(harness.db, "notification_outbox") == 0

    # When it commits, exactly one row is there with the outcome
    harness.db.transaction(lambda tx: _fail(tx, run.id))
    rows = harness.db.raw("SELECT * FROM notification_outbox")
    assert len(rows) == 1
    assert rows[0]["event"] == "failed" and rows[0]["status"] == "pending"
    assert rows[0]["outcome_key"].startswith(f"run:{run.id}:failed:")
    assert SECRET not in rows[0]["payload_json"] and "example.invalid" not in rows[0]["payload_json"]


def test_one_outcome_enqueues_once(harness: Any) -> None:
    project, task = _setup(harness.db)
    failed = _finish(harness.db, project, task)

    harness.db.transaction(lambda tx: notifications.on_run_status(tx, failed))

    assert count(harness.db, "notification_outbox") == 1


def test_rules_select_events_and_tasks(harness: Any) -> None:
    project, task = _setup(harness.db, task_scoped=True)
    other = seed_task(harness.db, project, "other")

    _finish(harness.db, project, task, "succeeded")  # succeeded is not in the default set
    _finish(harness.db, project, other, "failed")  # the rule names another task
    assert count(harness.db, "notification_outbox") == 0

    _finish(harness.db, project, task, "failed")
    assert count(harness.db, "notification_outbox") == 1


def test_no_rule_no_row(harness: Any) -> None:
    project = seed_project(harness.db)
    task = seed_task(harness.db, project, "quiet")
    _finish(harness.db, project, task)
    assert count(harness.db, "notification_outbox") == 0


def test_delivery_sends_once_and_settles(harness: Any) -> None:
    project, task = _setup(harness.db)
    failed = _finish(harness.db, project, task)
    sender = RecordingSender()
    deliverer = NotificationDeliverer(harness.db, sender, "replica-a")

    first = deliverer.deliver_batch()
    second = deliverer.deliver_batch()

    assert (first.claimed, first.delivered, second.claimed) == (1, 1, 0)
    assert len(sender.sent) == 1
    channel, message = sender.sent[0]
    assert channel.secret == SECRET and message.body["run_id"] == failed.id
    assert message.body["task"] == "nightly" and message.event == "failed"
    row = harness.db.raw("SELECT status, due_at_ms, lease_owner FROM notification_outbox")[0]
    assert (row["status"], row["due_at_ms"], row["lease_owner"]) == ("delivered", None, None)


def test_a_lease_keeps_others_off_until_it_expires_and_fences_the_late_settle(harness: Any) -> None:
    project, task = _setup(harness.db)
    _finish(harness.db, project, task)
    budget = DeliveryBudget(lease_ms=10_000)
    other_db = harness.second_connection()
    try:
        a = NotificationDeliverer(harness.db, RecordingSender(), "replica-a", budget=budget)
        b = NotificationDeliverer(other_db, RecordingSender(), "replica-b", budget=budget)

        # Given A holds the lease (it crashed before sending)
        claimed_a = harness.db.transaction(a.claim)
        assert len(claimed_a) == 1
        # Then B sees nothing due while the lease lasts
        assert other_db.transaction(b.claim) == []

        # When the lease expires, B claims it
        harness.advance_clock(10_001)
        claimed_b = other_db.transaction(b.claim)
        assert [c.id for c in claimed_b] == [claimed_a[0].id]
        assert claimed_b[0].attempts == 2

        # Then A's late settle changes nothing and B's counts
        assert harness.db.transaction(lambda tx: a.settle(tx, claimed_a[0], None)) == "stale"
        assert other_db.transaction(lambda tx: b.settle(tx, claimed_b[0], None)) == "delivered"
    finally:
        other_db.close()


class _StaleDuePage:
    """A transaction whose due page is one read before another deliverer's claim committed (the race
    a single SQLite writer, or PostgreSQL's SKIP LOCKED, never lets a real page see)."""

    def __init__(self, tx: Any, page: list[Any]) -> None:
        self._tx = tx
        self._page = page

    def all(self, query: str, params: Any = None) -> Any:
        return self._page if query == "notify_due_page" else self._tx.all(query, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tx, name)


def test_a_row_claimed_since_the_due_page_was_read_is_not_claimed_again(harness: Any) -> None:
    project, task = _setup(harness.db)
    _finish(harness.db, project, task)
    stale = harness.db.transaction(lambda tx: tx.all("notify_due_page", {"now": tx.now_ms(), "limit": 8}))
    a = NotificationDeliverer(harness.db, RecordingSender(), "replica-a")
    b = NotificationDeliverer(harness.db, RecordingSender(), "replica-b")

    # Given A claimed the row after B read its due page
    assert len(harness.db.transaction(a.claim)) == 1

    # When B claims from that page, its claim (fenced on the attempt count it read) takes nothing
    assert harness.db.transaction(lambda tx: b.claim(_StaleDuePage(tx, stale))) == []

    # Then the row is still A's, with one attempt counted
    row = harness.db.raw("SELECT status, attempts, lease_owner FROM notification_outbox")[0]
    assert (row["status"], row["attempts"], row["lease_owner"]) == ("leased", 1, "replica-a")


def test_failures_back_off_then_go_dead(harness: Any) -> None:
    project, task = _setup(harness.db)
    _finish(harness.db, project, task)
    budget = DeliveryBudget(max_attempts=3, backoff_base_ms=1_000, backoff_max_ms=60_000)
    deliverer = NotificationDeliverer(harness.db, RecordingSender(fail_with="http_500"), "r", budget=budget)

    report = deliverer.deliver_batch()
    row = harness.db.raw("SELECT * FROM notification_outbox")[0]
    assert report.retried == 1
    assert (row["status"], row["attempts"], row["last_error"]) == ("pending", 1, "http_500")
    assert int(row["due_at_ms"]) == int(row["updated_at_ms"]) + 1_000

    # Not due before the backoff passes
    assert deliverer.deliver_batch().claimed == 0
    harness.advance_clock(1_000)
    assert deliverer.deliver_batch().retried == 1
    harness.advance_clock(2_000)
    assert deliverer.deliver_batch().dead == 1

    row = harness.db.raw("SELECT * FROM notification_outbox")[0]
    assert (row["status"], row["attempts"], row["due_at_ms"]) == ("dead", 3, None)
    harness.advance_clock(3_600_000)
    assert deliverer.deliver_batch().claimed == 0


def test_deleting_a_channel_drops_its_unsent_rows_and_rules(harness: Any) -> None:
    project, task = _setup(harness.db)
    _finish(harness.db, project, task)

    harness.db.transaction(lambda tx: notifications.delete_channel(tx, project, "hook"))

    assert count(harness.db, "notification_outbox") == 0
    assert count(harness.db, "notification_rules") == 0
    assert count(harness.db, "notification_channels") == 0


def test_settled_rows_are_pruned_after_a_week_and_unsent_ones_never(harness: Any) -> None:
    from ql3.application.retention import DAY_MS, RetentionPruner

    project, task = _setup(harness.db)
    _finish(harness.db, project, task)
    NotificationDeliverer(harness.db, RecordingSender(), "r").deliver_batch()
    _finish(harness.db, project, task)  # a second outcome stays pending: its channel fails
    NotificationDeliverer(harness.db, RecordingSender(fail_with="timeout"), "r").deliver_batch()
    pruner = RetentionPruner(harness.db, None)

    harness.advance_clock(7 * DAY_MS - 60_000)
    assert pruner.prune_once().outbox_deleted == 0
    harness.advance_clock(120_000)
    assert pruner.prune_once().outbox_deleted == 1

    assert [r["status"] for r in harness.db.raw("SELECT status FROM notification_outbox")] == ["pending"]
