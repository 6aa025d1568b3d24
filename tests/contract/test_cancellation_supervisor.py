"""The bounded cancellation supervisor: only the lease winner signals, mismatches send nothing, caps hold."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from ql3.application import cancellation, cancellation_supervisor, lease_results
from ql3.domain.errors import FenceConflict, ValidationFailed
from ql3.domain.ids import new_id
from tests.support.builders import count
from tests.support.cancellation_builders import (
    PID_BASE,
    FakeSignal,
    claim,
    claimed_runs,
    dispatch_row,
    events,
    handle_of,
    request,
    running_runs,
)
from tests.support.databases import Harness


def _supervisor(
    db: Any, signal: Any, owner: str = "sup-a", **budget: Any
) -> cancellation_supervisor.CancellationSupervisor:
    return cancellation_supervisor.CancellationSupervisor(db, signal=signal, owner=owner, **budget)


def test_only_a_run_with_an_intent_is_signalled_once_and_recorded_dispatched(harness: Harness) -> None:
    # Given two running runs, one of them with a cancel intent
    project, (target, bystander) = running_runs(harness.db, 2)
    request(harness.db, project, target.run_id)
    signal = FakeSignal()

    # When a cycle runs
    report = _supervisor(harness.db, signal).run_cycle()

    # Then exactly that run's verified handle was signalled, and the result is durable
    assert signal.calls == [(handle_of(0), PID_BASE, 5_000)]
    assert report.stop_reason == "complete" and report.claimed == 1 and report.signals == 1
    assert report.results == {"termination_requested": 1}
    assert dispatch_row(harness.db, target.run_id)["status"] == "dispatched"
    assert count(harness.db, "cancellation_dispatches") == 1

    # And later cycles never signal it again, however much time passes
    harness.advance_clock(3_600_000)
    again = _supervisor(harness.db, signal, owner="sup-b").run_cycle()
    assert len(signal.calls) == 1 and again.scanned == 0
    assert bystander.run_id not in json.dumps(harness.db.raw("SELECT run_id FROM cancellation_dispatches"))


@pytest.mark.parametrize("status", ["identity_mismatch", "pid_mismatch", "unsupported", "invalid"])
def test_an_identity_mismatch_sends_zero_signals_and_blocks_for_good(harness: Harness, status: str) -> None:
    # Given a controller whose proof of identity fails for the run's handle
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    signal = FakeSignal(answers={handle_of(0): status})

    # When cycles run, now and much later
    first = _supervisor(harness.db, signal).run_cycle()
    harness.advance_clock(86_400_000)
    _supervisor(harness.db, signal, owner="sup-b").run_cycle()

    # Then no signal was ever sent, the dispatch is blocked, and it was never retried
    assert signal.signals_sent == 0 and len(signal.calls) == 1
    assert first.results == {status: 1}
    row = dispatch_row(harness.db, fence.run_id)
    assert (row["status"], row["last_result"], row["dispatch_count"]) == ("blocked", status, 1)


def test_a_missing_handle_is_retried_with_backoff_until_the_handle_exists(harness: Harness) -> None:
    # Given an attempt that ACKed starting but has no durable handle yet
    project, (fence,) = claimed_runs(harness.db)
    harness.db.transaction(lambda tx: lease_results.ack_starting(tx, fence))
    request(harness.db, project, fence.run_id)
    signal = FakeSignal()

    # When a cycle runs, the controller is not called and the failure backs off durably
    report = _supervisor(harness.db, signal, retry_base_ms=10_000).run_cycle()
    assert report.results == {"handle_missing": 1} and signal.calls == []
    assert dispatch_row(harness.db, fence.run_id)["status"] == "retry_wait"

    # And a cycle before it is due does nothing
    harness.db.transaction(
        lambda tx: lease_results.ack_running(
            tx,
            fence,
            pid=PID_BASE,
            handle=handle_of(0),
            log_artifact_id="log",
            callback_sequence=1,
            callback_token_digest="0" * 64,
        )
    )
    assert _supervisor(harness.db, signal).run_cycle().claimed == 0 and signal.calls == []

    # Then once due, the now-running process is signalled by its verified handle
    harness.advance_clock(10_000)
    _supervisor(harness.db, signal).run_cycle()
    assert signal.calls == [(handle_of(0), PID_BASE, 5_000)]
    row = dispatch_row(harness.db, fence.run_id)
    assert (row["status"], row["dispatch_count"]) == ("dispatched", 2)


def test_no_controller_means_controller_missing_and_a_retry(harness: Harness) -> None:
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)

    report = _supervisor(harness.db, None).run_cycle()

    assert report.results == {"controller_missing": 1} and report.signals == 0
    row = dispatch_row(harness.db, fence.run_id)
    assert (row["status"], row["last_result"]) == ("retry_wait", "controller_missing")


@pytest.mark.parametrize("failure", ["raises", "unknown_status"])
def test_a_controller_failure_is_a_retryable_dispatch_error(harness: Harness, failure: str) -> None:
    # Given a controller that throws (or answers something it has no status for)
    signal = FakeSignal(raises=True) if failure == "raises" else FakeSignal(answers={handle_of(0): "eperm?"})
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)

    # When cycles run before and after the backoff
    first = _supervisor(harness.db, signal, retry_base_ms=10_000).run_cycle()
    _supervisor(harness.db, signal, retry_base_ms=10_000).run_cycle()
    calls_before_due = len(signal.calls)
    harness.advance_clock(10_000)
    _supervisor(harness.db, signal, retry_base_ms=10_000).run_cycle()

    # Then it is recorded as dispatch_error and retried only when due
    assert first.results == {"dispatch_error": 1}
    assert calls_before_due == 1 and len(signal.calls) == 2
    assert dispatch_row(harness.db, fence.run_id)["dispatch_count"] == 2


def test_a_never_started_attempt_is_cancelled_without_any_signal(harness: Harness) -> None:
    # Given a dispatched run whose attempt never ACKed starting
    project, (fence,) = claimed_runs(harness.db)
    request(harness.db, project, fence.run_id)
    signal = FakeSignal()

    # When a cycle runs
    report = _supervisor(harness.db, signal).run_cycle()

    # Then the run and attempt end as cancelled, the lease completes, nothing is signalled
    assert report.finalized == 1 and signal.calls == []
    run = harness.db.raw("SELECT status FROM runs WHERE id = ?", (fence.run_id,))[0]
    attempt = harness.db.raw("SELECT status FROM run_attempts WHERE id = ?", (fence.attempt_id,))[0]
    lease = harness.db.raw("SELECT status FROM run_leases WHERE attempt_id = ?", (fence.attempt_id,))[0]
    assert (run["status"], attempt["status"], lease["status"]) == ("cancelled", "cancelled", "completed")
    assert count(harness.db, "cancellation_dispatches") == 0
    # And a late starting ACK from the worker is fenced, so nothing can be spawned afterwards
    with pytest.raises(FenceConflict):
        harness.db.transaction(lambda tx: lease_results.ack_starting(tx, fence))


def test_a_crashed_holder_is_taken_over_only_after_its_lease_expires(harness: Harness) -> None:
    # Given a supervisor that claimed (and maybe signalled) then crashed before recording
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    claim(harness.db, fence.run_id, owner="crashed", lease_ms=30_000)
    signal = FakeSignal()

    # When another supervisor runs while the lease is live, it does nothing
    assert _supervisor(harness.db, signal, owner="sup-b").run_cycle().claimed == 0
    assert signal.calls == []

    # Then after expiry it re-claims, re-verifies through the controller and records the result
    harness.advance_clock(30_000)
    report = _supervisor(harness.db, signal, owner="sup-b").run_cycle()
    assert report.claimed == 1 and len(signal.calls) == 1
    row = dispatch_row(harness.db, fence.run_id)
    assert (row["status"], row["dispatch_count"], row["version"]) == ("dispatched", 2, 3)


def test_pages_and_cycles_are_capped(harness: Harness) -> None:
    # Given five runs with intents and a supervisor allowed two pages of two
    project, fences = running_runs(harness.db, 5)
    for fence in fences:
        request(harness.db, project, fence.run_id)
    signal = FakeSignal()

    # When one cycle runs, it stops at its budget
    first = _supervisor(harness.db, signal, page=2, pages=2).run_cycle()
    assert (first.stop_reason, first.pages, first.scanned, len(signal.calls)) == ("page_limit", 2, 4, 4)

    # Then the next cycle picks up the rest and completes
    second = _supervisor(harness.db, signal, page=2, pages=2).run_cycle()
    assert (second.stop_reason, second.scanned) == ("complete", 1)
    assert sorted(c[0] for c in signal.calls) == sorted(handle_of(i) for i in range(5))


@pytest.mark.parametrize(
    "budget",
    [
        {"page": 0},
        {"page": 65},
        {"pages": 0},
        {"pages": 65},
        {"lease_ms": 4_999},
        {"lease_ms": 300_001},
        {"retry_base_ms": 0},
        {"retry_base_ms": 5_000, "retry_max_ms": 1_000},
        {"retry_max_ms": 86_400_001},
        {"grace_ms": 60_001, "lease_ms": 300_000},
        {"grace_ms": 20_000, "lease_ms": 30_000},
    ],
)
def test_budgets_are_validated_at_construction(harness: Harness, budget: dict[str, Any]) -> None:
    with pytest.raises(ValidationFailed):
        _supervisor(harness.db, FakeSignal(), **budget)


def test_an_ambiguous_attempt_set_fails_the_cycle_closed(harness: Harness) -> None:
    # Given a run that (impossibly) has two active attempts, queued ahead of a normal one
    project, (odd, normal) = running_runs(harness.db, 2)
    request(harness.db, project, odd.run_id)
    request(harness.db, project, normal.run_id)
    harness.db.raw(
        "INSERT INTO run_attempts (id, run_id, attempt, status, executor_type, created_at_ms,"
        " callback_sequence) VALUES (?, ?, 2, 'running', 'local_process', 0, 0)",
        (new_id(), odd.run_id),
    )
    signal = FakeSignal()

    # When a cycle runs
    report = _supervisor(harness.db, signal).run_cycle()

    # Then it stops without picking either attempt and without claiming anything
    assert report.stop_reason == "unsafe_attempt_overflow"
    assert signal.calls == [] and count(harness.db, "cancellation_dispatches") == 0


def test_a_cursor_that_does_not_advance_fails_the_cycle_closed(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    real = cancellation_supervisor._intent_page

    def stuck(tx: Any, *, cursor: Any, limit: int) -> list[Any]:
        found = real(tx, cursor=None, limit=limit)
        return found * limit  # the same key over and over

    monkeypatch.setattr(cancellation_supervisor, "_intent_page", stuck)
    signal = FakeSignal()

    report = _supervisor(harness.db, signal, page=2).run_cycle()

    assert report.stop_reason == "cursor_stalled" and signal.calls == []


def test_events_and_reports_hold_no_handle_pid_or_secret(harness: Harness) -> None:
    # Given cycles that produce every kind of result
    project, fences = running_runs(harness.db, 3)
    for fence in fences:
        request(harness.db, project, fence.run_id)
    signal = FakeSignal(answers={handle_of(1): "identity_mismatch", handle_of(2): "boom"})
    tokens: list[str] = []
    original = cancellation.claim

    def spy(tx: Any, **kw: Any) -> Any:
        tokens.append(kw["token"])
        return original(tx, **kw)

    cancellation_supervisor.claim = spy  # type: ignore[attr-defined]  # the supervisor's own reference
    try:
        report = _supervisor(harness.db, signal).run_cycle()
    finally:
        cancellation_supervisor.claim = original  # type: ignore[attr-defined]
    digests = [r["lease_token_digest"] for r in harness.db.raw("SELECT * FROM cancellation_dispatches")]

    # Then nothing secret or identifying reached the event log or the report
    dump = json.dumps(harness.db.raw("SELECT * FROM run_events"))
    assert len(tokens) == 3
    for secret in [
        *tokens,
        *[handle_of(i) for i in range(3)],
        "ql3lp1",
        *[str(PID_BASE + i) for i in range(3)],
    ]:
        assert secret not in dump and secret not in repr(report)
    assert all(d is None for d in digests)
    for fence in fences:
        for event in events(harness.db, fence.run_id):
            if event["type"].startswith("run.cancel_dispatch"):
                assert set(event["payload"]) == {"attempt_id", "dispatch_count", "result"}


def test_two_supervisors_on_two_connections_signal_each_process_once(harness: Harness) -> None:
    # Given six runs with intents and two supervisors on two real connections
    project, fences = running_runs(harness.db, 6)
    for fence in fences:
        request(harness.db, project, fence.run_id)
    other = harness.second_connection()
    signals = [FakeSignal(), FakeSignal()]
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def drive(db: Any, owner: str, signal: FakeSignal) -> None:
        barrier.wait()
        try:
            _supervisor(db, signal, owner=owner, page=1, pages=8).run_cycle()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    # When both run a cycle at the same time
    threads = [
        threading.Thread(target=drive, args=(db, owner, sig))
        for db, owner, sig in ((harness.db, "sup-a", signals[0]), (other, "sup-b", signals[1]))
    ]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        other.close()

    # Then every process was signalled exactly once, by whichever supervisor won its lease
    assert not errors
    handles = [c[0] for s in signals for c in s.calls]
    assert sorted(handles) == sorted(handle_of(i) for i in range(6))
    rows = harness.db.raw("SELECT status, dispatch_count FROM cancellation_dispatches")
    assert [(r["status"], r["dispatch_count"]) for r in rows] == [("dispatched", 1)] * 6
