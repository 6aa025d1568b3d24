"""LifecycleRunner: one cycle at a time, woken by notifications, errors contained, bounded stop."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from ql3.application.lifecycle import LifecycleRunner
from ql3.domain.errors import StorageUnavailable, ValidationFailed
from ql3.storage.notify import LocalNotifier
from tests.support.waits import wait_for


def test_an_idle_loop_sleeps_until_notified_then_runs_a_cycle() -> None:
    notifier = LocalNotifier()
    ran: list[float] = []

    def cycle() -> bool:
        ran.append(time.monotonic())
        return False

    runner = LifecycleRunner(
        "t",
        cycle,
        wake=lambda t: notifier.wait("c", t),
        backstop_s=60,
        interrupt=lambda: notifier.notify("c"),
    )
    runner.start()
    try:
        wait_for(lambda: len(ran) == 1)
        time.sleep(0.1)
        assert len(ran) == 1  # idle: no polling while nothing happens

        notifier.notify("c")

        wait_for(lambda: len(ran) == 2)
    finally:
        assert runner.stop()


def test_cycles_never_overlap() -> None:
    active = 0
    overlaps = 0
    lock = threading.Lock()
    count = 0

    def cycle() -> bool:
        nonlocal active, overlaps, count
        with lock:
            active += 1
            overlaps += active > 1
        time.sleep(0.001)
        with lock:
            active -= 1
            count += 1
        return True

    runner = LifecycleRunner("t", cycle, wake=lambda t: False, backstop_s=0.01)
    runner.start()
    wait_for(lambda: count >= 50)
    assert runner.stop()
    assert overlaps == 0


def test_a_failing_cycle_is_recorded_and_the_loop_goes_on() -> None:
    calls = 0

    def cycle() -> bool:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("boom with a secret that must not be logged")
        return False

    def wake(timeout_s: float) -> bool:
        time.sleep(0.01)
        return False

    runner = LifecycleRunner("t", cycle, wake=wake, backstop_s=0.01)
    runner.start()
    wait_for(lambda: calls >= 3)
    assert runner.stop()
    assert [(d.code, d.error) for d in runner.diagnostics][:1] == [("internal_error", "RuntimeError")]
    assert all("secret" not in d.error for d in runner.diagnostics)


def test_a_cycle_that_outlives_the_drain_blocks_a_restart_until_it_ends() -> None:
    release = threading.Event()
    started = threading.Event()

    def cycle() -> bool:
        started.set()
        release.wait(10)
        return False

    runner = LifecycleRunner("t", cycle, wake=lambda t: False, backstop_s=0.01, drain_timeout_s=0.05)
    runner.start()
    started.wait(5)

    assert runner.stop() is False
    with pytest.raises(RuntimeError):
        runner.start()

    release.set()
    wait_for(lambda: runner.stop())
    runner.start()
    release.set()
    assert runner.stop()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"backstop_s": 0.0},
        {"backstop_s": 7200.0},
        {"backstop_s": 1.0, "burst": 0},
        {"backstop_s": 1.0, "drain_timeout_s": 0},
    ],
)
def test_invalid_cadences_are_refused_at_construction(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValidationFailed):
        LifecycleRunner("t", lambda: False, wake=lambda t: False, **kwargs)  # type: ignore[arg-type]


def test_a_cycle_without_progress_waits_even_after_a_burst_of_productive_ones() -> None:
    # Given a loop whose cycles report progress twice, then none (a scan that reached its end)
    answers = [True, True, False]
    log: list[str] = []
    runner: LifecycleRunner

    def cycle() -> bool:
        log.append("cycle")
        return answers.pop(0) if answers else False

    def wake(timeout_s: float) -> bool:
        log.append("wait")
        runner._stop.set()  # one wait is all this test needs to see
        return False

    runner = LifecycleRunner("t", cycle, wake=wake, backstop_s=60)
    runner.start()
    wait_for(lambda: "wait" in log)
    assert runner.stop()

    # Then the loop waits right after the unproductive cycle instead of starting another one
    assert log == ["cycle", "cycle", "cycle", "wait"]


def test_a_sleep_decision_that_raises_does_not_kill_the_runner() -> None:
    # Given a loop whose wait (the call that decides how long to sleep) fails twice, like a wait that
    # reads the next deadline over a database connection that was just terminated
    calls = 0
    waits = 0

    def cycle() -> bool:
        nonlocal calls
        calls += 1
        return False

    def wake(timeout_s: float) -> bool:
        nonlocal waits
        waits += 1
        if waits <= 2:
            raise StorageUnavailable()
        time.sleep(0.01)
        return False

    runner = LifecycleRunner("cancellation", cycle, wake=wake, backstop_s=0.05)
    runner.start()
    try:
        # Then the loop goes on cycling after both failures, and says where it failed
        wait_for(lambda: calls >= 5)
        assert runner.health().running and runner.health().consecutive_failures == 0
        assert [(d.code, d.error) for d in runner.diagnostics] == [
            ("storage_unavailable", "StorageUnavailable")
        ] * 2
    finally:
        assert runner.stop()


def test_repeated_failures_back_off_instead_of_spinning() -> None:
    calls = 0

    def cycle() -> bool:
        nonlocal calls
        calls += 1
        raise RuntimeError("down")

    runner = LifecycleRunner("t", cycle, wake=lambda t: False, backstop_s=10)
    runner.start()
    wait_for(lambda: calls >= 2)  # it retries
    time.sleep(1.0)
    assert runner.stop()

    # 0.05 s doubling with jitter: a handful of attempts in a second, not thousands
    assert calls <= 12
    assert runner.health().consecutive_failures == calls


def test_a_loop_without_a_successful_cycle_for_too_long_is_stuck_until_it_succeeds() -> None:
    release = threading.Event()
    entered = threading.Event()
    fail = True

    def cycle() -> bool:
        entered.set()
        if fail:
            release.wait(10)
            raise StorageUnavailable()
        return False

    runner = LifecycleRunner("cron", cycle, wake=lambda t: False, backstop_s=0.05, stuck_after_s=0.2)
    runner.start()
    try:
        entered.wait(5)
        wait_for(lambda: runner.health().stuck)
        assert runner.health().age_s > 0.2

        fail = False
        release.set()

        wait_for(lambda: not runner.health().stuck)
        assert runner.health().consecutive_failures == 0
    finally:
        release.set()
        assert runner.stop()


class _Fatal(BaseException):
    """Not an Exception: the runner does not catch it, so its thread ends."""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_loop_whose_thread_ended_counts_as_stuck() -> None:
    def cycle() -> bool:
        raise _Fatal()

    runner = LifecycleRunner("t", cycle, wake=lambda t: False, backstop_s=0.05)
    runner.start()
    wait_for(lambda: runner.health().age_s == float("inf"))

    assert runner.health().stuck
    assert runner.stop()
    assert not runner.health().stuck  # a stopped loop is not expected to cycle


def test_a_failure_is_logged_with_the_loop_the_code_and_the_type_but_not_the_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    done = threading.Event()

    def cycle() -> bool:
        done.set()
        raise ValueError("postgresql://user:hunter2@db/x")

    runner = LifecycleRunner("dispatcher", cycle, wake=lambda t: False, backstop_s=0.05)
    with caplog.at_level(logging.WARNING, logger="ql3.lifecycle"):
        runner.start()
        done.wait(5)
        wait_for(lambda: bool(caplog.records))
        assert runner.stop()

    record = caplog.records[0]
    fields = {k: getattr(record, k, None) for k in ("loop", "code", "error_type", "stage")}
    assert fields == {
        "loop": "dispatcher",
        "code": "internal_error",
        "error_type": "ValueError",
        "stage": "cycle",
    }
    assert "hunter2" not in caplog.text
