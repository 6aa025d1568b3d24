"""The in-process wake-ups (storage/notify.py): no wake-up is lost, a channel wakes only its own
waiters, and a finished wait leaves nothing registered."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import ql3.storage.notify as notify_module
from ql3.storage.notify import LocalNotifier
from tests.support.waits import wait_for


def _waiting_in_thread(
    notifier: LocalNotifier, channels: tuple[str, ...]
) -> tuple[threading.Thread, list[bool]]:
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(notifier.wait_any(channels, 30.0)), daemon=True)
    thread.start()
    wait_for(lambda: all(c in notifier._waiters for c in channels), what="the waiter to register")
    return thread, result


def test_a_notification_between_two_waits_is_not_lost() -> None:
    notifier = LocalNotifier()
    assert notifier.wait("runs", 0) is False
    notifier.notify("runs")
    assert notifier.wait("runs", 0) is True
    assert notifier.wait("runs", 0) is False  # consumed


def test_another_channel_does_not_satisfy_a_wait() -> None:
    notifier = LocalNotifier()
    notifier.notify("attempts")
    assert notifier.wait("runs", 0) is False
    assert notifier.wait_any(("runs", "attempts"), 0) is True


def test_a_waiter_is_woken_by_its_channel_only_and_unregisters_afterwards() -> None:
    notifier = LocalNotifier()
    runs_thread, runs_result = _waiting_in_thread(notifier, ("runs",))
    both_thread, both_result = _waiting_in_thread(notifier, ("attempts", "cancellations"))
    assert len(notifier._waiters["runs"]) == 1 and "attempts" not in notifier._waiters.get("runs", ())

    notifier.notify("cancellations")
    both_thread.join(30)
    assert both_result == [True]
    assert runs_thread.is_alive() and runs_result == []  # not satisfied by another channel
    assert set(notifier._waiters) == {"runs"}  # the finished waiter left both of its channels

    notifier.notify("runs")
    runs_thread.join(30)
    assert runs_result == [True]
    assert notifier._waiters == {}


def test_wait_past_sees_a_notification_after_its_mark_even_when_another_waiter_consumed_it() -> None:
    notifier = LocalNotifier()
    marks = notifier.counters(("runs",))
    notifier.notify("runs")
    assert notifier.wait("runs", 0) is True  # another loop consumed its own view of it
    assert notifier.wait_past(marks, 0) is True
    assert notifier.wait_past(notifier.counters(("runs",)), 0) is False


def test_a_timed_out_wait_unregisters() -> None:
    notifier = LocalNotifier()
    assert notifier.wait_any(("runs", "attempts"), 0.01) is False
    assert notifier._waiters == {}


class _CountingCondition(threading.Condition):
    """A waiter's condition that counts the wake-ups it is sent."""

    made: list[_CountingCondition] = []

    def __init__(self, lock: Any) -> None:
        super().__init__(lock)
        self.wakeups = 0
        _CountingCondition.made.append(self)

    def notify(self, n: int = 1) -> None:
        self.wakeups += 1
        super().notify(n)


def test_a_notification_wakes_the_waiters_of_its_channel_and_no_other(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given two threads waiting, one on runs and one on attempts, each on a condition of its own
    monkeypatch.setattr(notify_module, "Condition", _CountingCondition)
    _CountingCondition.made = []
    notifier = LocalNotifier()
    runs_thread, runs_result = _waiting_in_thread(notifier, ("runs",))
    attempts_thread, attempts_result = _waiting_in_thread(notifier, ("attempts",))
    runs_waiter, attempts_waiter = _CountingCondition.made

    # When attempts is notified, and twice more once its waiter returned (and so unregistered)
    notifier.notify("attempts")
    attempts_thread.join(30)
    notifier.notify("attempts")
    notifier.notify("attempts")

    # Then only the attempts waiter was woken, once
    assert attempts_result == [True]
    assert attempts_waiter.wakeups == 1
    assert runs_waiter.wakeups == 0 and runs_thread.is_alive()

    # When runs is notified, then its waiter is woken exactly once and returns True
    notifier.notify("runs")
    runs_thread.join(30)
    assert runs_result == [True]
    assert runs_waiter.wakeups == 1


def test_a_notification_from_another_thread_between_a_look_and_the_wait_is_not_lost() -> None:
    # Given a loop thread that consumed its channel, looked (at the database) and is about to wait
    notifier = LocalNotifier()
    looked, go = threading.Event(), threading.Event()
    results: list[bool] = []

    def loop() -> None:
        results.append(notifier.wait("runs", 0))  # the previous wait: nothing pending
        marks = notifier.counters(("runs",))
        looked.set()
        go.wait(30)  # the notification below lands here, after the look and before the waits
        results.append(notifier.wait("runs", 30))
        results.append(notifier.wait_past(marks, 30))

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    assert looked.wait(30)

    # When another thread notifies in that window
    notifier.notify("runs")
    go.set()

    # Then both kinds of wait return at once with True (no backstop timeout needed)
    thread.join(30)
    assert results == [False, True, True]
