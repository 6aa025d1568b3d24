"""The edges of one supervisor cycle: its report counts every run it handled (each claim, finalized
never-started attempt, signal and fenced result, nothing it handled counted as skipped); a run that
ended between the intent page and its claim is not eligible; the dispatch records whether the
controller ran, backs off by the supervisor's own retry budget, and the crash hook fires once the
claim committed; a failed signal is logged by its kind only."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import pytest

from ql3.application import cancellation_supervisor, lease_results
from ql3.application.cancellation_supervisor import CancellationSupervisor
from ql3.domain.errors import ValidationFailed
from tests.support.cancellation_builders import (
    FakeSignal,
    claim,
    claimed_runs,
    dispatch_row,
    handle_of,
    request,
    running_runs,
    start_fence,
)
from tests.support.databases import Harness
from tests.support.interleaving import before_unit


def _supervisor(db: Any, signal: Any, owner: str = "sup-a", **kw: Any) -> CancellationSupervisor:
    return CancellationSupervisor(db, signal=signal, owner=owner, **kw)


def test_a_cycle_counts_each_claim_each_finalized_attempt_and_each_signal(harness: Harness) -> None:
    # Given four runs with a cancel intent: two started, two never started
    project, fences = claimed_runs(harness.db, 4)
    for i, fence in enumerate(fences[:2]):
        start_fence(harness.db, fence, i)
    for fence in fences:
        request(harness.db, project, fence.run_id)
    signal = FakeSignal()

    # When one cycle handles them all
    report = _supervisor(harness.db, signal).run_cycle()

    # Then the report counts two claims and signals and two finalized attempts, and skips nothing
    assert (report.stop_reason, report.scanned, report.claimed, report.finalized, report.signals) == (
        "complete",
        4,
        2,
        2,
        2,
    )
    assert (report.results, report.skipped, report.fenced) == ({"termination_requested": 2}, {}, 0)
    assert len(signal.calls) == 2


def test_a_run_that_ended_after_the_intent_page_was_read_is_not_eligible(harness: Harness) -> None:
    # Given a running run with an intent, whose completion commits just after the intent page was read
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)

    def completion_commits() -> None:
        harness.db.transaction(
            lambda tx: lease_results.complete(
                tx, fence, callback_sequence=1, callback_token="cb-token", exit_code=0
            )
        )

    signal = FakeSignal()
    report = _supervisor(before_unit(harness.db, 2, completion_commits), signal).run_cycle()

    # Then the supervisor neither claims nor signals it
    assert (report.scanned, report.claimed, report.skipped, signal.calls) == (1, 0, {"not_eligible": 1}, [])


def test_a_timeout_intent_on_a_never_started_attempt_is_finalized(harness: Harness) -> None:
    project, (fence,) = claimed_runs(harness.db)
    request(harness.db, project, fence.run_id, reason="timeout")

    report = _supervisor(harness.db, FakeSignal()).run_cycle()

    assert (report.finalized, report.skipped) == (1, {})
    (run,) = harness.db.raw("SELECT status FROM runs WHERE id = ?", (fence.run_id,))
    assert run["status"] == "timed_out"


@pytest.mark.parametrize("controller", [True, False], ids=["signalled", "no_controller"])
def test_the_dispatch_records_whether_the_controller_ran(harness: Harness, controller: bool) -> None:
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    now = harness.now_ms()

    _supervisor(harness.db, FakeSignal() if controller else None).run_cycle()

    row = dispatch_row(harness.db, fence.run_id)
    assert row["last_result"] == ("termination_requested" if controller else "controller_missing")
    if controller:
        assert row["last_dispatched_at_ms"] is not None and int(row["last_dispatched_at_ms"]) >= now
    else:
        assert row["last_dispatched_at_ms"] is None


def test_a_retry_backs_off_by_the_supervisors_own_retry_budget(harness: Harness) -> None:
    # Given a supervisor without a controller, whose retries start at 4 s and are capped at 5 s
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    supervisor = _supervisor(harness.db, None, retry_base_ms=4_000, retry_max_ms=5_000)
    delays = []
    for _ in range(2):
        supervisor.run_cycle()
        row = dispatch_row(harness.db, fence.run_id)
        assert row["status"] == "retry_wait"
        delays.append(int(row["next_attempt_at_ms"]) - int(row["updated_at_ms"]))
        harness.advance_clock(delays[-1])

    # Then the first retry waits the base and the second the cap (not twice the base)
    assert delays == [4_000, 5_000]


def test_the_crash_hook_fires_once_the_claim_committed(harness: Harness) -> None:
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    points: list[str] = []

    _supervisor(harness.db, FakeSignal(), fault=points.append).run_cycle()

    assert points == ["after_cancel_claim"]


def test_results_fenced_by_takeovers_are_each_counted_fenced_and_not_skipped(harness: Harness) -> None:
    # Given two stops so slow that each claim lease lapses and another supervisor takes the dispatch over
    project, fences = running_runs(harness.db, 2)
    for fence in fences:
        request(harness.db, project, fence.run_id)
        harness.advance_clock(1)
    run_of_handle = {handle_of(i): fence.run_id for i, fence in enumerate(fences)}

    def slow(handle: str, pid: int | None, *, grace_ms: int) -> Any:
        harness.advance_clock(600_000)
        assert claim(harness.db, run_of_handle[handle], owner="sup-b").status == "claimed"
        return FakeSignal()(handle, pid, grace_ms)

    # When the first supervisor records its results
    report = _supervisor(harness.db, slow).run_cycle()

    # Then each is fenced out and counted once as fenced, and both runs still count as claimed
    assert (report.claimed, report.fenced, report.results, report.skipped) == (2, 2, {}, {})
    assert all(dispatch_row(harness.db, f.run_id)["lease_owner"] == "sup-b" for f in fences)


def test_a_failed_signal_is_logged_by_its_kind_only(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)

    def exploding(handle: str, pid: int | None, *, grace_ms: int) -> Any:
        raise OSError(f"cannot signal {handle}")

    with caplog.at_level(logging.WARNING, logger="ql3.cancellation.supervisor"):
        report = _supervisor(harness.db, exploding).run_cycle()

    assert report.results == {"dispatch_error": 1}
    (record,) = [r for r in caplog.records if r.name == "ql3.cancellation.supervisor"]
    assert (record.getMessage(), record.__dict__["action"], record.__dict__["error"]) == (
        "stop signal failed",
        "cancel.signal_failed",
        "OSError",
    )
    assert "ql3lp1" not in caplog.text


def test_the_claim_lease_is_twice_the_tasks_grace_plus_one_second_when_that_is_longer(
    harness: Harness,
) -> None:
    # Given a running run whose task's grace is 20 s, above what the supervisor's 30 s lease covers
    project, (fence,) = running_runs(harness.db, grace_ms=20_000)
    request(harness.db, project, fence.run_id)
    leases_seen: list[int] = []

    def watching(handle: str, pid: int | None, *, grace_ms: int) -> Any:
        row = dispatch_row(harness.db, fence.run_id)
        leases_seen.append(int(row["lease_expires_at_ms"]) - int(row["updated_at_ms"]))
        return FakeSignal()(handle, pid, grace_ms)

    _supervisor(harness.db, watching, lease_ms=30_000).run_cycle()

    # Then the claim's lease (written with the claim's own instant) is 2 x 20 s + 1 s
    assert leases_seen == [41_000]


def test_a_dispatch_claimed_by_another_supervisor_after_the_page_was_read_is_skipped_as_leased(
    harness: Harness,
) -> None:
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)

    def other_supervisor_claims() -> None:
        claim(harness.db, fence.run_id, owner="sup-b")

    signal = FakeSignal()
    report = _supervisor(before_unit(harness.db, 2, other_supervisor_claims), signal).run_cycle()

    assert (report.claimed, report.skipped, signal.calls) == (0, {"leased": 1}, [])


@pytest.mark.parametrize("broken", ["no_intent_time", "no_run_id"])
def test_an_intent_row_without_its_key_fails_the_cycle_closed(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, broken: str
) -> None:
    project, (fence,) = running_runs(harness.db)
    request(harness.db, project, fence.run_id)
    real = cancellation_supervisor._intent_page

    def keyless(tx: Any, *, cursor: Any, limit: int) -> list[Any]:
        found = real(tx, cursor=cursor, limit=limit)
        if broken == "no_intent_time":
            return [replace(key, cancel_requested_at_ms=None) for key in found]
        return [replace(key, run_id="") for key in found]

    monkeypatch.setattr(cancellation_supervisor, "_intent_page", keyless)
    signal = FakeSignal()

    report = _supervisor(harness.db, signal).run_cycle()

    assert (report.stop_reason, report.scanned, signal.calls) == ("cursor_stalled", 0, [])


def test_a_page_that_starts_again_at_the_cursor_fails_the_cycle_closed(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given two intents and a source whose second page repeats the first page's last row
    project, fences = running_runs(harness.db, 2)
    for fence in fences:
        request(harness.db, project, fence.run_id)
        harness.advance_clock(1)
    real = cancellation_supervisor._intent_page

    first: list[Any] = []

    def repeating(tx: Any, *, cursor: Any, limit: int) -> list[Any]:
        if not first:
            first.extend(real(tx, cursor=cursor, limit=limit))
        return list(first)  # the first page's rows again, whatever the cursor

    monkeypatch.setattr(cancellation_supervisor, "_intent_page", repeating)
    signal = FakeSignal()

    report = _supervisor(harness.db, signal, page=1, pages=2).run_cycle()

    # Then the first page's run is handled once, and the repeat stops the cycle
    assert (report.stop_reason, report.pages, report.scanned, len(signal.calls)) == (
        "cursor_stalled",
        2,
        1,
        1,
    )


@pytest.mark.parametrize(
    ("budget", "expected"),
    [
        ({"page": 0}, ("page must be 1-64", "page")),
        ({"page": 65}, ("page must be 1-64", "page")),
        ({"page": True}, ("page must be 1-64", "page")),
        ({"pages": 0}, ("pages must be 1-64", "pages")),
        ({"pages": 65}, ("pages must be 1-64", "pages")),
        ({"pages": True}, ("pages must be 1-64", "pages")),
        ({"grace_ms": -1}, ("grace_ms must be below half the lease", "grace_ms")),
        ({"grace_ms": 60_001, "lease_ms": 300_000}, ("grace_ms must be below half the lease", "grace_ms")),
        ({"grace_ms": 15_000, "lease_ms": 30_000}, ("grace_ms must be below half the lease", "grace_ms")),
    ],
)
def test_a_budget_refusal_names_the_budget_and_its_bounds(
    harness: Harness, budget: dict[str, Any], expected: tuple[str, str]
) -> None:
    with pytest.raises(ValidationFailed) as caught:
        _supervisor(harness.db, FakeSignal(), **budget)

    assert (caught.value.message, caught.value.details["field"]) == expected


@pytest.mark.parametrize(
    "budget",
    [
        {"page": 1, "pages": 1},
        {"page": 64, "pages": 64},
        {"grace_ms": 0},
        {"grace_ms": 14_999, "lease_ms": 30_000},
        {"grace_ms": 60_000, "lease_ms": 120_001},
    ],
)
def test_the_budget_bounds_themselves_are_accepted(harness: Harness, budget: dict[str, Any]) -> None:
    assert _supervisor(harness.db, FakeSignal(), **budget).run_cycle().stop_reason == "complete"
