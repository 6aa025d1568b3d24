"""The in-process wake-ups (storage/notify.py): no wake-up is lost, a channel wakes only its own
waiters, and a finished wait leaves nothing registered."""

from __future__ import annotations

import threading

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
