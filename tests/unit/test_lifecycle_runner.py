"""LifecycleRunner: one cycle at a time, woken by notifications, errors contained, bounded stop."""

from __future__ import annotations

import threading
import time

import pytest

from ql3.application.lifecycle import LifecycleRunner
from ql3.domain.errors import ValidationFailed
from ql3.storage.notify import LocalNotifier


def _until(predicate: object, timeout_s: float = 5.0) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def test_an_idle_loop_sleeps_until_notified_then_runs_a_cycle() -> None:
    notifier = LocalNotifier()
    ran: list[float] = []
    runner = LifecycleRunner(
        "t",
        lambda: bool(ran.append(time.monotonic())),
        wake=lambda t: notifier.wait("c", t),
        backstop_s=60,
        interrupt=lambda: notifier.notify("c"),
    )
    runner.start()
    try:
        _until(lambda: len(ran) == 1)
        time.sleep(0.1)
        assert len(ran) == 1  # idle: no polling while nothing happens

        notifier.notify("c")

        _until(lambda: len(ran) == 2)
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
    _until(lambda: count >= 50)
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

    runner = LifecycleRunner("t", cycle, wake=lambda t: time.sleep(0.01) is None and False, backstop_s=0.01)
    runner.start()
    _until(lambda: calls >= 3)
    assert runner.stop()
    assert [d.error for d in runner.diagnostics][:1] == ["RuntimeError"]
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
    _until(lambda: runner.stop())
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
    _until(lambda: "wait" in log)
    assert runner.stop()

    # Then the loop waits right after the unproductive cycle instead of starting another one
    assert log == ["cycle", "cycle", "cycle", "wait"]
