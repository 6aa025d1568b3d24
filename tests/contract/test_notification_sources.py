"""Outcomes besides a run's status that notify: a blocked cancellation and an approval request, each
enqueued in the transaction that commits it, once. SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

from ql3.application import notifications
from ql3.domain.egress import parse_allow
from tests.support.approval_builders import request as request_approval
from tests.support.approval_builders import world
from tests.support.cancellation_builders import claim, record, request, running_runs

LOOPBACK = parse_allow(["127.0.0.0/8"])  # the receiver of these tests is local


def _channel_and_rule(db: Any, project: Any, events: list[str]) -> None:
    db.transaction(
        lambda tx: notifications.create_channel(
            tx, project, name="ops", kind="apprise", url="json://127.0.0.1:9/x", secret=None, egress=LOOPBACK
        )
    )
    db.transaction(lambda tx: notifications.create_rule(tx, project, channel="ops", task=None, events=events))


def _outbox(db: Any) -> list[tuple[str, str]]:
    return [
        (r["event"], r["outcome_key"]) for r in db.raw("SELECT event, outcome_key FROM notification_outbox")
    ]


def test_a_blocked_cancellation_notifies_once_and_a_retryable_result_does_not(harness: Any) -> None:
    project, (fence, other) = running_runs(harness.db, 2)
    _channel_and_rule(harness.db, project, ["cancellation_blocked"])
    for run_id in (fence.run_id, other.run_id):
        request(harness.db, project, run_id)

    record(harness.db, claim(harness.db, other.run_id), "dispatch_error")  # retry_wait: nothing to say
    assert _outbox(harness.db) == []

    record(harness.db, claim(harness.db, fence.run_id), "identity_mismatch")

    assert _outbox(harness.db) == [("cancellation_blocked", f"cancel:{fence.run_id}:2")]


def test_an_approval_request_notifies_once(harness: Any) -> None:
    w = world(harness.db)
    _channel_and_rule(harness.db, w.project, ["approval_requested"])

    first = request_approval(w, approval_id="appr-1")
    request_approval(w, approval_id="appr-1")  # an idempotent replay is the same request

    assert _outbox(harness.db) == [("approval_requested", f"approval:{first.id}")]
    payload = harness.db.raw("SELECT payload_json FROM notification_outbox")[0]["payload_json"]
    assert '"task":"deploy"' in payload and '"approval_id":"appr-1"' in payload
