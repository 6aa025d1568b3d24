"""The edges of the activation ACKs (``lease_results.ack_starting`` / ``ack_running``): input limits, replays,
refusals with their reasons, and exactly what each ACK writes."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from ql3.application import lease_results, leases, runs
from ql3.domain.digests import sha256_hex
from ql3.domain.errors import Conflict, ValidationFailed
from ql3.domain.offers import LeaseFence
from tests.support.databases import Harness
from tests.support.execution_builders import dispatcher, queued, register, run_of

DIGEST = sha256_hex("cb-token")


def _claimed(harness: Harness, **spec: Any) -> tuple[Any, LeaseFence]:
    register(harness.db, lease_ms=600_000)
    project, _, _ = queued(harness.db, **spec)
    offer = dispatcher(harness.db).dispatch_once().offer
    assert offer is not None
    return project, offer.fence


def _events(harness: Harness, run_id: str) -> list[Any]:
    return list(harness.db.transaction(lambda tx: runs.list_events(tx, run_id, after=0, limit=100)))


def _starting(harness: Harness, fence: LeaseFence) -> Any:
    return harness.db.transaction(lambda tx: lease_results.ack_starting(tx, fence))[0]


def _running(harness: Harness, fence: LeaseFence, **overrides: Any) -> Any:
    values: dict[str, Any] = {
        "pid": 4242,
        "handle": "ql3lp1.test",
        "log_artifact_id": "log-a",
        "callback_sequence": 1,
        "callback_token_digest": DIGEST,
    }
    values.update(overrides)
    return harness.db.transaction(lambda tx: lease_results.ack_running(tx, fence, **values))[0]


def test_starting_writes_one_event_and_wakes_the_deadline_planner(harness: Harness) -> None:
    # A task with a timeout: its starting ACK sets a deadline (without one nothing is woken, below)
    project, fence = _claimed(harness, timeout_ms=60_000)
    before = len(_events(harness, fence.run_id))

    woke: list[bool] = []
    harness.db.wait_for("attempts", 0)
    waiter = threading.Thread(target=lambda: woke.append(harness.db.wait_for("attempts", 10)))
    waiter.start()
    assert _starting(harness, fence) == "starting"
    waiter.join(timeout=15)

    assert woke == [True]
    new = _events(harness, fence.run_id)[before:]
    assert [(e.type, e.actor_type, e.actor_id, e.attempt_id) for e in new] == [
        ("attempt.starting", "worker", fence.worker_id, fence.attempt_id)
    ]
    assert new[0].payload == {"attempt": 1}
    assert run_of(harness.db, project, fence.run_id).status == "dispatching"


def test_starting_replays_answer_what_already_happened(harness: Harness) -> None:
    _, fence = _claimed(harness)
    assert _starting(harness, fence) == "starting"
    assert _starting(harness, fence) == "already_starting"
    _running(harness, fence)
    before = len(_events(harness, fence.run_id))

    assert _starting(harness, fence) == "already_running"
    assert len(_events(harness, fence.run_id)) == before


@pytest.mark.parametrize(
    ("table", "column", "value"), [("run_attempts", "status", "lost"), ("runs", "status", "queued")]
)
def test_starting_is_refused_unless_the_attempt_is_claimed_and_the_run_dispatching(
    harness: Harness, table: str, column: str, value: str
) -> None:
    _, fence = _claimed(harness)
    key = fence.attempt_id if table == "run_attempts" else fence.run_id
    harness.db.raw(f"UPDATE {table} SET {column} = ? WHERE id = ?", (value, key))

    with pytest.raises(Conflict) as caught:
        _starting(harness, fence)

    assert caught.value.message == "the attempt cannot start"
    expected = value if table == "run_attempts" else "claimed"
    assert caught.value.details == {"status": expected}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"handle": "h" * 513}, "invalid running ACK"),
        ({"pid": 0}, "invalid running ACK"),
        ({"callback_sequence": 0}, "invalid running ACK"),
        ({"callback_token_digest": "ab" * 31}, "invalid callback digest"),
    ],
    ids=["handle-513-bytes", "pid-0", "sequence-0", "short-digest"],
)
def test_running_refuses_malformed_input_before_anything(
    harness: Harness, overrides: dict[str, Any], message: str
) -> None:
    project, fence = _claimed(harness)
    _starting(harness, fence)
    before = len(_events(harness, fence.run_id))

    with pytest.raises(ValidationFailed) as caught:
        _running(harness, fence, **overrides)

    assert caught.value.message == message
    assert len(_events(harness, fence.run_id)) == before
    assert run_of(harness.db, project, fence.run_id).status == "dispatching"


def test_running_accepts_the_limits_and_records_everything_it_is_told(harness: Harness) -> None:
    project, fence = _claimed(harness)
    _starting(harness, fence)
    handle = "h" * 512
    before = len(_events(harness, fence.run_id))
    now = harness.now_ms()

    assert _running(harness, fence, pid=1, handle=handle, callback_sequence=1) == "running"

    run = run_of(harness.db, project, fence.run_id)
    assert run.status == "running" and run.started_at_ms is not None and run.started_at_ms >= now
    attempt = harness.db.raw(
        "SELECT status, pid, executor_handle, log_artifact_id, callback_sequence, callback_token_hash,"
        " started_at_ms FROM run_attempts WHERE id = ?",
        (fence.attempt_id,),
    )[0]
    assert (
        attempt["status"],
        attempt["pid"],
        attempt["executor_handle"],
        attempt["log_artifact_id"],
        attempt["callback_sequence"],
        attempt["callback_token_hash"],
    ) == ("running", 1, handle, "log-a", 1, DIGEST)
    assert attempt["started_at_ms"] == run.started_at_ms
    new = _events(harness, fence.run_id)[before:]
    assert [(e.type, e.actor_type, e.actor_id, e.attempt_id) for e in new] == [
        ("attempt.running", "worker", fence.worker_id, fence.attempt_id),
        ("run.running", "worker", fence.worker_id, fence.attempt_id),
    ]
    assert new[0].payload == {"attempt": 1}
    assert new[1].payload == {"from": "dispatching", "to": "running"}
    keys = harness.db.raw(
        "SELECT dedupe_key FROM run_events WHERE run_id = ? AND type = 'run.running'", (fence.run_id,)
    )
    assert [k["dedupe_key"] for k in keys] == [f"run-transition:{run.version - 1}:running"]


@pytest.mark.parametrize(
    "change",
    [{"handle": "ql3lp1.other"}, {"pid": 4343}, {"callback_sequence": 2}],
    ids=["handle", "pid", "seq"],
)
def test_running_again_with_other_facts_is_a_handle_mismatch(
    harness: Harness, change: dict[str, Any]
) -> None:
    _, fence = _claimed(harness)
    _starting(harness, fence)
    assert _running(harness, fence) == "running"
    assert _running(harness, fence) == "already_running"

    with pytest.raises(Conflict) as caught:
        _running(harness, fence, **change)

    assert caught.value.message == "a different handle is already running"
    assert caught.value.details == {"reason": "handle_mismatch"}


def test_running_before_starting_names_the_status(harness: Harness) -> None:
    _, fence = _claimed(harness)
    with pytest.raises(Conflict) as caught:
        _running(harness, fence)
    assert caught.value.message == "running requires starting"
    assert caught.value.details == {"status": "claimed"}


class _Channels:
    """The transaction as it is, recording the channels it notifies at commit."""

    def __init__(self, tx: Any) -> None:
        self._tx = tx
        self.dialect = tx.dialect
        self.notified: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tx, name)

    def notify(self, channel: str) -> None:
        self.notified.append(channel)
        self._tx.notify(channel)


@pytest.mark.parametrize("timeout_ms", [None, 60_000])
def test_the_starting_ack_wakes_the_cancellation_loop_only_for_a_deadline(
    harness: Harness, timeout_ms: int | None
) -> None:
    # Given a claimed attempt of a task with or without a timeout
    register(harness.db, lease_ms=600_000)
    spec: dict[str, Any] = {} if timeout_ms is None else {"timeout_ms": timeout_ms}
    queued(harness.db, **spec)
    offer = dispatcher(harness.db).dispatch_once().offer
    assert offer is not None
    seen: list[_Channels] = []

    def ack(tx: Any) -> Any:
        seen.append(_Channels(tx))
        return lease_results.ack_starting(seen[0], offer.fence)

    # When the starting ACK commits
    assert harness.db.transaction(ack)[0] == "starting"

    # Then "attempts" (the cancellation loop's re-plan) is notified exactly when a deadline was set
    attempt = harness.db.transaction(lambda tx: leases.attempt_row(tx, offer.fence.attempt_id))
    assert attempt is not None and (attempt.deadline_at_ms is not None) == (timeout_ms is not None)
    assert ("attempts" in seen[0].notified) == (timeout_ms is not None)
