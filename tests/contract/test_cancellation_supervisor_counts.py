"""One supervisor cycle's report counts every run it handled: each claim, each never-started attempt
it finalized and each signal, with nothing it handled counted as skipped."""

from __future__ import annotations

from ql3.application import cancellation_supervisor
from tests.support.cancellation_builders import FakeSignal, claimed_runs, request, start_fence
from tests.support.databases import Harness


def test_a_cycle_counts_each_claim_each_finalized_attempt_and_each_signal(harness: Harness) -> None:
    # Given four runs with a cancel intent: two started, two never started
    project, fences = claimed_runs(harness.db, 4)
    for i, fence in enumerate(fences[:2]):
        start_fence(harness.db, fence, i)
    for fence in fences:
        request(harness.db, project, fence.run_id)
    signal = FakeSignal()

    # When one cycle handles them all
    report = cancellation_supervisor.CancellationSupervisor(
        harness.db, signal=signal, owner="sup-a"
    ).run_cycle()

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
