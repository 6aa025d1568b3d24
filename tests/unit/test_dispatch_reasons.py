"""What the dispatcher saw (application/dispatch_reasons.py): reasons kept per run, deduplicated with
the time each was last seen, bounded in runs and in reasons per run, forgotten once the run is
offered, counted by reason; and the dispatch loop of ``ql3 serve`` logs one line per change of a
run's reason, not one per cycle."""

from __future__ import annotations

import logging

import pytest

from ql3.application.dispatch_reasons import REASONS, DispatchReasons
from ql3.application.dispatcher import DispatchResult
from ql3.application.embedded_dispatch import EmbeddedDispatch
from ql3.domain.errors import ValidationFailed
from ql3.domain.offers import Offer
from ql3.storage.notify import LocalNotifier


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now


def test_a_repeated_reason_is_kept_once_with_its_first_and_last_sighting_and_count() -> None:
    clock = _Clock()
    board = DispatchReasons(clock=clock)
    board.observe([("r1", "no_match")])
    clock.now = 2_000
    board.observe([("r1", "no_match"), ("r1", "claim_raced")])
    clock.now = 3_000
    board.observe([("r1", "no_match")])

    seen = board.for_run("r1")
    assert [(s.reason, s.scope, s.first_seen_ms, s.last_seen_ms, s.count) for s in seen] == [
        ("no_match", "run", 1_000, 3_000, 3),
        ("claim_raced", "run", 2_000, 2_000, 1),
    ]
    assert board.totals() == {r: {"no_match": 3, "claim_raced": 1}.get(r, 0) for r in REASONS}


def test_cycle_reasons_show_on_a_waiting_run_only_when_seen_since_it_was_queued() -> None:
    clock = _Clock()
    board = DispatchReasons(clock=clock)
    board.observe([(None, "no_workers")])
    clock.now = 5_000
    board.observe([(None, "scan_budget_exhausted"), ("r1", "no_match")])

    assert [(s.reason, s.scope) for s in board.for_run("r1", cycle_since_ms=4_000)] == [
        ("no_match", "run"),
        ("scan_budget_exhausted", "cycle"),
    ]
    cycle_only = [s.reason for s in board.for_run("r2", cycle_since_ms=0)]
    assert cycle_only == ["scan_budget_exhausted", "no_workers"]
    assert board.for_run("r2") == []  # not waiting: a cycle's reasons are not its own


def test_an_offered_run_is_forgotten() -> None:
    board = DispatchReasons()
    board.observe([("r1", "no_match"), ("r2", "no_match")])
    board.observe([], offered=["r1"])
    assert board.for_run("r1") == [] and len(board.for_run("r2")) == 1
    # and a reason seen again after the offer is a change again
    assert [c.run_id for c in board.observe([("r1", "no_match")])] == ["r1"]


def test_the_board_holds_at_most_its_runs_and_reasons_per_run_dropping_the_least_recently_seen() -> None:
    clock = _Clock()
    board = DispatchReasons(clock=clock, max_runs=3, max_reasons=2)
    for i in range(5):
        clock.now += 1
        board.observe([(f"r{i}", "no_match")])
    assert board.runs_held() == 3
    assert [bool(board.for_run(f"r{i}")) for i in range(5)] == [False, False, True, True, True]

    clock.now += 1
    board.observe([("r4", "claim_raced")])
    clock.now += 1
    board.observe([("r4", "plans_unavailable")])
    assert [s.reason for s in board.for_run("r4")] == ["plans_unavailable", "claim_raced"]


def test_only_a_change_of_a_runs_latest_reason_is_reported() -> None:
    board = DispatchReasons()
    first = board.observe([("r1", "no_match"), (None, "no_capacity")])
    assert [(c.run_id, c.reason, c.previous) for c in first] == [
        ("r1", "no_match", None),
        (None, "no_capacity", None),
    ]
    assert board.observe([("r1", "no_match"), (None, "no_capacity")]) == []
    changed = board.observe([("r1", "claim_raced")])
    assert [(c.run_id, c.reason, c.previous) for c in changed] == [("r1", "claim_raced", "no_match")]


def test_an_unknown_reason_is_refused() -> None:
    with pytest.raises(ValidationFailed):
        DispatchReasons().observe([("r1", "run-01234 went away")])


def _loop(results: list[DispatchResult], board: DispatchReasons) -> EmbeddedDispatch:
    def submit(offer: Offer, *, asked_at: float | None = None) -> None:
        return None

    return EmbeddedDispatch(
        lambda _free: results.pop(0),
        active_count=lambda: 0,
        slots=2,
        submit=submit,
        wakeups=LocalNotifier(),
        fault=lambda _point: None,
        reasons=board,
    )


def test_the_dispatch_loop_logs_a_runs_reason_once_per_change_not_once_per_cycle(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given ten cycles that each say the same of r1, then one that says something else
    same = DispatchResult(reason="no_match", notes=(("r1", "no_match"),))
    other = DispatchResult(reason="claim_raced", notes=(("r1", "claim_raced"),))
    board = DispatchReasons()
    loop = _loop([same] * 10 + [other], board)

    with caplog.at_level(logging.INFO, logger="ql3.dispatch"):
        for _ in range(11):
            loop.cycle()

    # Then two lines, and every cycle is on the board and in the counts
    lines = [(r.__dict__["run_id"], r.__dict__["reason"], r.__dict__["previous"]) for r in caplog.records]
    assert lines == [("r1", "no_match", "-"), ("r1", "claim_raced", "no_match")]
    assert board.totals()["no_match"] == 10 and board.for_run("r1")[0].reason == "claim_raced"
