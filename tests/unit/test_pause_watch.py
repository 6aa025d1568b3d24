"""``lease_expiry.PauseWatch``: the lease-expiry loop notices that its own process was not running
(SIGSTOP, a VM pause), on an injected monotonic clock."""

from __future__ import annotations

import pytest

from ql3.application.lease_expiry import PauseWatch
from ql3.domain.errors import ValidationFailed


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_first_mark_only_starts_the_watch() -> None:
    clock = Clock()
    watch = PauseWatch(1.0, clock)
    clock.now += 1_000  # a slow start-up is never a pause
    assert watch.paused() is False


def test_a_wait_the_loop_announced_is_no_pause_and_a_longer_silence_is() -> None:
    clock = Clock()
    watch = PauseWatch(1.0, clock)
    watch.paused()
    watch.waiting(5.0)
    clock.now += 6.0  # the announced wait plus the slack
    assert watch.paused() is False
    watch.waiting(5.0)
    clock.now += 6.5
    assert watch.paused() is True
    clock.now += 0.5  # the next mark counts from the last one, with nothing announced
    assert watch.paused() is False


def test_a_silence_between_two_marks_of_one_cycle_is_a_pause() -> None:
    clock = Clock()
    watch = PauseWatch(1.0, clock)
    watch.paused()
    clock.now += 1.5
    assert watch.paused() is True


def test_the_slack_must_be_positive() -> None:
    with pytest.raises(ValidationFailed):
        PauseWatch(0.0)
