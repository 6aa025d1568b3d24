"""One bad item never stops a loop: per loop family, a poisoned item is parked and the loop's other
items are handled in the same cycle (the loops exactly as ``ql3 serve`` builds them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ql3.application import auth, cancellation, cron, lease_expiry, notifications, retention, runs
from ql3.application.control_loops import Adapters, control_loops
from ql3.application.lifecycle import LifecycleRunner
from ql3.application.retention import RetentionPruner
from ql3.application.settings import PROFILES, ServeSettings
from ql3.domain.egress import EgressPolicy
from ql3.domain.notifications import ChannelTarget, Message
from ql3.domain.tasks import build_spec
from tests.support.approval_builders import World, approved, user
from tests.support.approval_builders import world as approval_world
from tests.support.builders import count, seed_project, seed_task, start_run
from tests.support.databases import Harness
from tests.support.execution_builders import dispatcher, queued, register, run_of, start

MINUTE = 60_000


class Poison(Exception):
    """A bug met by one item only."""


class _Wakeups:
    def notify(self, channel: str) -> None:
        pass

    def wait_any(self, channels: tuple[str, ...], timeout_s: float) -> bool:
        return False


class _Sender:
    """Delivers every message but the first, which meets a bug in the sender."""

    def __init__(self) -> None:
        self.calls = 0
        self.sent: list[Message] = []

    def send(self, channel: ChannelTarget, message: Message) -> None:
        self.calls += 1
        if self.calls == 1:
            raise Poison("boom")
        self.sent.append(message)


def _loops(harness: Harness, sender: Any = None) -> dict[str, LifecycleRunner]:
    settings = ServeSettings(
        budgets=PROFILES["standalone"],
        home=Path("/nonexistent"),
        database_url="sqlite:///nonexistent",
        slots=1,
        worker_id=None,
    )
    built = control_loops(
        harness.db,
        _Wakeups(),
        settings,
        owner="test-control",
        clock=harness.now_ms,
        fault=lambda _point: None,
        adapters=Adapters(
            sender=sender or _Sender(), logs=None, signal=None, finish=None, local_worker_id="w-test"
        ),
    )
    return {loop.name: loop for loop in built}


def _cycle(loop: LifecycleRunner) -> bool:
    result: bool = loop._cycle()  # one cycle, as the loop's thread runs it
    return result


def _parked(harness: Harness) -> list[tuple[str, str, str, str]]:
    return [
        (r["loop"], r["item_kind"], r["item_key"], r["reason"])
        for r in harness.db.raw("SELECT * FROM parked_items ORDER BY item_key")
    ]


def test_an_approval_of_a_revoked_requester_is_parked_and_the_other_runs(harness: Harness) -> None:
    # Given an approval approved before its requester was revoked, and a healthy one after it
    bad = approval_world(harness.db)
    poisoned = approved(bad)
    admin = user(harness.db, bad.project, "admin", "admin")
    harness.db.transaction(lambda tx: auth.revoke_token(tx, admin, bad.project, bad.requester.id))
    healthy = World(
        db=harness.db,
        project=bad.project,
        task=bad.task,
        requester=user(harness.db, bad.project, "operator", "second-requester"),
        approver=bad.approver,
    )
    fine = approved(healthy)
    loops = _loops(harness)

    # When the approved-actions loop runs one cycle
    _cycle(loops["approved-actions"])

    # Then the poisoned one is parked with its code and the healthy one became a run
    assert _parked(harness) == [("approved-actions", "approval", poisoned.id, "requester_not_allowed")]
    assert [
        r["state"] for r in harness.db.raw("SELECT state FROM approval_requests ORDER BY decided_at_ms")
    ] == [
        "approved",
        "consumed",
    ]
    assert count(harness.db, "runs") == 1
    assert fine.id != poisoned.id
    # And the next cycle skips it (no new failure) while it is parked
    _cycle(loops["approved-actions"])
    assert harness.db.raw("SELECT failures FROM parked_items")[0]["failures"] == 1


def test_an_expired_lease_that_fails_is_parked_and_the_other_is_released(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    register(harness.db)
    project, _task, (one, two) = queued(harness.db, n=2)
    dispatcher(harness.db).dispatch_once()
    dispatcher(harness.db).dispatch_once()
    attempts = {r["run_id"]: r["id"] for r in harness.db.raw("SELECT id, run_id FROM run_attempts")}
    harness.advance_clock(10 * MINUTE)
    real = lease_expiry.expire_lease

    def poisoned(tx: Any, attempt_id: str, **options: Any) -> str:
        if attempt_id == attempts[one.id]:
            raise Poison("boom")
        return real(tx, attempt_id, **options)

    monkeypatch.setattr(lease_expiry, "expire_lease", poisoned)

    _cycle(_loops(harness)["lease-expiry"])

    assert _parked(harness) == [("lease-expiry", "lease", attempts[one.id], "unexpected_error")]
    assert run_of(harness.db, project, two.id).status == "queued"
    assert run_of(harness.db, project, one.id).status == "dispatching"


def test_a_due_schedule_that_fails_is_parked_and_the_other_is_admitted(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = seed_project(harness.db)
    bad = seed_task(harness.db, project, name="bad", cron="* * * * *", command="echo bad")
    good = seed_task(harness.db, project, name="good", cron="* * * * *")
    harness.advance_clock(2 * MINUTE)
    real = build_spec

    def poisoned(raw: Any) -> Any:
        # Read for each task of the page, whether the page is decided at once or task by task (the
        # page that failed is undone, then decided again with a savepoint a task).
        if raw.get("command") == "echo bad":
            raise Poison("boom")
        return real(raw)

    monkeypatch.setattr(cron, "build_spec", poisoned)

    _cycle(_loops(harness)["cron"])

    assert _parked(harness) == [("cron", "schedule", bad.id, "unexpected_error")]
    assert [r["task_id"] for r in harness.db.raw("SELECT task_id FROM runs")] == [good.id]


def test_a_delivery_that_fails_unexpectedly_is_parked_and_the_other_is_sent(harness: Harness) -> None:
    project = seed_project(harness.db)
    task = seed_task(harness.db, project, "nightly")
    harness.db.transaction(
        lambda tx: notifications.create_channel(
            tx,
            project,
            name="hook",
            kind="webhook",
            url="https://example.invalid/h",
            secret="s" * 32,
            egress=EgressPolicy(),
        )
    )
    harness.db.transaction(
        lambda tx: notifications.create_rule(tx, project, channel="hook", task=None, events=None)
    )
    for _ in range(2):
        run, _ = start_run(harness.db, project, task)

        def fail(tx: Any, run_id: str = run.id) -> Any:
            current = runs.lock_run(tx, run_id)
            current = runs.transition(tx, current.id, current.version, "dispatching", actor_type="system")
            return runs.transition(
                tx, current.id, current.version, "failed", actor_type="system", finished_at_ms=tx.now_ms()
            )

        harness.db.transaction(fail)
    sender = _Sender()

    _cycle(_loops(harness, sender)["notifications"])

    parked = _parked(harness)
    assert [(p[0], p[1], p[3]) for p in parked] == [("notifications", "delivery", "unexpected_error")]
    assert len(sender.sent) == 1
    rows = harness.db.raw("SELECT id, status, last_error FROM notification_outbox ORDER BY status")
    assert [(r["status"], r["last_error"]) for r in rows] == [
        ("delivered", None),
        ("pending", "unexpected_error"),
    ]
    assert parked[0][2] == rows[1]["id"]


def test_a_project_whose_pruning_fails_is_parked_and_the_other_is_pruned(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = seed_project(harness.db, "bad")
    good = seed_project(harness.db, "good")
    for project in (bad, good):
        harness.db.transaction(
            lambda tx, p=project: retention.set_policy(
                tx, p, keep_days=1, runs_per_task=None, log_bytes_per_run=None
            )
        )
    pruned: list[str] = []
    real = RetentionPruner._next_page

    def poisoned(self: RetentionPruner, policy: Any) -> list[str]:
        if policy.project_id == bad.id:
            raise Poison("boom")
        pruned.append(policy.project_id)
        return real(self, policy)

    monkeypatch.setattr(RetentionPruner, "_next_page", poisoned)

    _cycle(_loops(harness)["retention"])

    assert _parked(harness) == [("retention", "project", bad.id, "unexpected_error")]
    assert pruned == [good.id]


def test_a_timeout_that_fails_is_parked_and_the_other_gets_its_stop(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    register(harness.db, lease_ms=600_000)
    project, _task, (one, two) = queued(harness.db, n=2, timeout_ms=1_000)
    for _ in range(2):
        offer = dispatcher(harness.db).dispatch_once().offer
        assert offer is not None
        start(harness.db, offer)
    harness.advance_clock(5_000)
    real = cancellation._request_timeout

    def poisoned(tx: Any, *, project_id: str, run_id: str) -> Any:
        if run_id == one.id:
            raise Poison("boom")
        return real(tx, project_id=project_id, run_id=run_id)

    monkeypatch.setattr(cancellation, "_request_timeout", poisoned)

    _cycle(_loops(harness)["cancellation"])

    assert _parked(harness) == [("cancellation", "timeout", one.id, "unexpected_error")]
    assert run_of(harness.db, project, two.id).cancel_requested_at_ms is not None
    assert run_of(harness.db, project, one.id).cancel_requested_at_ms is None
